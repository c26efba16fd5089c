"""The review's pure rules: the reviser's prompt, reading a revision, a judgement's verdict, whether
a retry can help, and the ``ResponseWithheldError`` that says why, without any text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, ToolCallBlock

from llama_jev.core.errors import ResponseWithheldError
from llama_jev.core.records import Decision, DecisionRecord, Reason, Status
from llama_jev.engine.failures import describe_failure
from llama_jev.review.outcome import REVISION_PROMPT, WithheldReason, _Revision

if TYPE_CHECKING:
    pass


def revision_messages(query: str, draft: str, evidence: Sequence[tuple[str, str]]) -> list[ChatMessage]:
    """The chat messages of a revision request: the instructions, then the query, evidence and draft."""
    passages = "\n".join(f"[{node_id}] {text}" for node_id, text in evidence)
    user = f"Question:\n{query}\n\nEvidence:\n{passages}\n\nDraft answer:\n{draft}"
    return [
        ChatMessage(role=MessageRole.SYSTEM, content=REVISION_PROMPT),
        ChatMessage(role=MessageRole.USER, content=user),
    ]


def _read_revision(response: object) -> _Revision:
    """The revised text, and whether the LLM called tools instead of (or besides) answering."""
    if not isinstance(response, ChatResponse):
        return _Revision(error=TypeError(f"the LLM returned {type(response).__name__}, not a ChatResponse"))
    message = response.message
    tool_calls = any(isinstance(block, ToolCallBlock) for block in message.blocks) or bool(
        message.additional_kwargs.get("tool_calls")
    )
    return _Revision(text=message.content or "", tool_calls=tool_calls)


def _revision_problem(answer: _Revision) -> WithheldReason | None:
    if answer.error is not None:
        return WithheldReason.REVISION_FAILED
    if answer.tool_calls:
        return WithheldReason.REVISION_HAS_TOOL_CALLS
    if not answer.text.strip():
        return WithheldReason.REVISION_EMPTY
    return None


def _verdict(decision: Decision, candidate_id: str) -> WithheldReason | None:
    """``None`` when the text passed, else why it did not."""
    if decision.status is Status.ERROR:
        if decision.reason is Reason.TIMEOUT:
            return WithheldReason.TIMEOUT
        if decision.reason in (Reason.CANDIDATE_TOO_LARGE, Reason.QUERY_TOO_LARGE):
            # The evidence travels in the request's state: the selector calls that the query.
            return WithheldReason.EVIDENCE_TOO_LARGE
        return WithheldReason.CALL_OR_RESPONSE_ERROR
    selection = decision.selection
    if selection is not None and candidate_id in selection.selected:
        return None
    if selection is not None and candidate_id in selection.rejected:
        return WithheldReason.UNSUPPORTED
    return WithheldReason.UNCERTAIN


def _probability(decision: Decision, candidate_id: str) -> float | None:
    if decision.selection is None:
        return None
    return decision.selection.scores.get(candidate_id)


def _status_code(error: BaseException | None) -> int | None:
    code = getattr(error, "status_code", None)
    return code if isinstance(code, int) else None


def _retryable(decision: Decision | None, llm_error: BaseException | None) -> bool:
    if llm_error is not None:
        # The reviser's own exception (any LLM client's): transient by type or by HTTP status.
        code = _status_code(llm_error)
        return (
            isinstance(llm_error, (TimeoutError, ConnectionError))
            or getattr(llm_error, "retryable", False) is True
            or (code is not None and (code in (408, 429) or code >= 500))
        )
    if decision is not None and decision.status is Status.ERROR:
        # A judge failure: the same rule as a failed retrieval's.
        return describe_failure(decision).retryable
    return False


_EXPLANATIONS = {
    WithheldReason.UNSUPPORTED: "the judge found a claim or condition the evidence does not support",
    WithheldReason.UNCERTAIN: "the judge could not confirm the answer is supported by the evidence",
    WithheldReason.NO_EVIDENCE: "there is no evidence to check the answer against",
    WithheldReason.TIMEOUT: "the judge did not answer within the budget",
    WithheldReason.CALL_OR_RESPONSE_ERROR: "the judge call failed",
    WithheldReason.REVISION_FAILED: "the LLM failed while revising the draft",
    WithheldReason.REVISION_EMPTY: "the LLM returned an empty revision",
    WithheldReason.REVISION_HAS_TOOL_CALLS: "the LLM answered the revision request with tool calls",
}


def _withheld(
    reason: WithheldReason,
    decision: Decision | None,
    probability: float | None,
    revisions: int,
    records: tuple[DecisionRecord, ...],
    *,
    cause: BaseException | None = None,
) -> ResponseWithheldError:
    """The error of a withheld answer; its message names types, statuses and numbers, never text."""
    error = cause if cause is not None else (decision.error if decision is not None else None)
    retryable = _retryable(decision, cause)
    details = [f"reason {reason.value}"]
    if probability is not None:
        details.append(f"p={probability:.3f}")
    if error is not None:
        details.append(type(error).__name__)
    if _status_code(error) is not None:
        details.append(f"HTTP {_status_code(error)}")
    details.append(f"{revisions} revision{'s' if revisions != 1 else ''}")
    details.append("retry may help" if retryable else "a retry will not help")
    withheld = ResponseWithheldError(
        f"the answer was withheld: {_EXPLANATIONS[reason]} ({', '.join(details)})",
        reason=reason.value,
        status=decision.status if decision is not None else (records[-1].status if records else None),
        probability=probability,
        revisions=revisions,
        retryable=retryable,
        status_code=_status_code(error),
        record=records[-1] if records else None,
    )
    if error is not None:
        withheld.__cause__ = error
    return withheld
