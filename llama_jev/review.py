"""``DraftReviewer``: the final draft is checked against the evidence it was written from.

One System One yes/no question per review, asked through a :class:`CandidateSelector` (its
budget, record, observer, classification and error handling), with the draft as the single
candidate. A draft that fails or stays uncertain may be revised by an LLM (no tools) and is then
reviewed again; in ENFORCE a draft that still does not pass is withheld, never published.

The mode logic is written once, in :meth:`DraftReviewer._steps`: a generator that yields what it
needs (a judgement of a text, a revision of a text) and receives the answer. ``review`` and
``areview`` only drive it, doing the I/O synchronously or with ``await``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, ToolCallBlock
from llama_index.core.llms import LLM
from llama_index.core.schema import NodeWithScore
from llama_index_instrumentation import get_dispatcher

from llama_jev.errors import EvidenceTooLargeError, ResponseWithheldError
from llama_jev.execution import Budget, Decision, DecisionRecord, ExecutionOptions, Mode, Reason, Status
from llama_jev.judge import Judge
from llama_jev.pipeline import JevDecisionEvent, describe_failure
from llama_jev.selector import Candidate, CandidateSelector, estimate_tokens

if TYPE_CHECKING:
    from llama_jev.context import RuntimeContext

__all__ = [
    "DRAFT_ID",
    "GROUNDED_QUESTION",
    "REVISION_PROMPT",
    "DraftReviewer",
    "ResponseWithheldError",
    "ReviewOutcome",
    "ReviewStatus",
    "WithheldReason",
    "revision_messages",
]

GROUNDED_QUESTION = (
    "Is every factual claim in this answer supported by the evidence, and does the answer keep every "
    "condition, limit and exception the evidence states for what it claims or promises? "
    "If the evidence is empty, answer no."
)
"""The yes/no question asked about a draft. The draft is the question's candidate; the state holds
``{"query", "answer", "evidence": [{"id", "text"}]}``. "Keep every condition" is asked on its own
because an unconditional promise ("you can always get a refund") has no false fact in it: what is
wrong is what it leaves out."""

REVISION_PROMPT = (
    "You revise a draft answer so that it says only what the evidence supports. Revise only the draft: "
    "keep every claim the evidence supports, correct or remove any claim it does not support, and keep "
    "every condition, limit and exception the evidence states for what the answer claims or promises. "
    "Add nothing the evidence does not state. Do not call tools. Reply with the revised answer only."
)
"""The system message of a revision request; the user message carries the query, evidence and draft."""

DRAFT_ID = "draft"
"""The candidate id of the draft in records; revisions are ``revision_1``, ``revision_2``, ..."""

# The contract's logger for SHADOW judge failures is "llama_jev" itself (not a submodule's).
logger = logging.getLogger("llama_jev")
dispatcher = get_dispatcher(__name__)


class ReviewStatus(str, Enum):
    """What a review did to the draft.

    ``PASSED``: the draft passed as written. ``REVISED``: a revision passed; ``text`` is the
    revision. ``WITHHELD``: SHADOW only, the draft would have been withheld in ENFORCE (the draft
    is still shown; ENFORCE raises :class:`~llama_jev.ResponseWithheldError` instead).
    ``SKIPPED``: mode OFF, nothing was asked.
    """

    PASSED = "passed"
    REVISED = "revised"
    WITHHELD = "withheld"
    SKIPPED = "skipped"


class WithheldReason(str, Enum):
    """Why a draft did not pass (``ResponseWithheldError.reason``, ``ReviewOutcome.reason``)."""

    UNSUPPORTED = "UNSUPPORTED"
    """The judge said no (``p <= reject``): a claim or a condition is not supported by the evidence."""
    UNCERTAIN = "UNCERTAIN"
    """The judge was not sure either way (``reject < p < accept``)."""
    NO_EVIDENCE = "NO_EVIDENCE"
    """There was no evidence to check the draft against; the judge was not asked."""
    TIMEOUT = "TIMEOUT"
    """The judge did not answer within the budget (retry may help)."""
    CALL_OR_RESPONSE_ERROR = "CALL_OR_RESPONSE_ERROR"
    """The judge call failed (HTTP error after retries, invalid answer)."""
    EVIDENCE_TOO_LARGE = "EVIDENCE_TOO_LARGE"
    """The evidence and the draft do not fit in one request (:class:`~llama_jev.EvidenceTooLargeError`)."""
    REVISION_FAILED = "REVISION_FAILED"
    """The LLM raised while revising."""
    REVISION_EMPTY = "REVISION_EMPTY"
    """The LLM returned an empty revision."""
    REVISION_HAS_TOOL_CALLS = "REVISION_HAS_TOOL_CALLS"
    """The LLM answered the revision request with tool calls."""


@dataclass(frozen=True)
class ReviewOutcome:
    """The result of one review.

    ``text`` is what may be shown: the draft (PASSED, SKIPPED, and always in SHADOW) or the
    revision that passed (REVISED). ``probability`` is the judge's last ``p`` (``None`` when it
    was not asked or failed), ``revisions`` how many revisions were asked, ``record`` the last
    :class:`~llama_jev.DecisionRecord` (ids and probabilities, no text) and ``records`` all of
    them, one per judgement. ``reason`` says why a SHADOW draft would have been withheld.
    """

    status: ReviewStatus
    text: str
    probability: float | None = None
    revisions: int = 0
    record: DecisionRecord | None = None
    records: tuple[DecisionRecord, ...] = ()
    reason: WithheldReason | None = None

    def as_metadata(self) -> dict[str, Any]:
        """The ``metadata["jev_review"]`` entry: ``{"status", "probability", "revisions"}``."""
        return {"status": self.status.value, "probability": self.probability, "revisions": self.revisions}


# --- what the pure step logic asks of the I/O edges -----------------------------------------


@dataclass(frozen=True)
class _Judge:
    """Ask the judge about ``text`` (candidate id ``candidate_id``)."""

    text: str
    candidate_id: str


@dataclass(frozen=True)
class _Revise:
    """Ask the LLM to revise ``text``."""

    text: str


@dataclass(frozen=True)
class _Revision:
    """What the LLM answered: its text and whether it called tools, or the exception it raised."""

    text: str = ""
    tool_calls: bool = False
    error: Exception | None = field(default=None, compare=False)


_Step = _Judge | _Revise
_Reply = Decision | _Revision | None
_Steps = Generator[_Step, _Reply, ReviewOutcome]


@dataclass(frozen=True)
class _Evidence:
    """The evidence as the judge and the reviser see it: node id and content only."""

    items: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, evidence: Sequence[NodeWithScore]) -> _Evidence:
        if isinstance(evidence, (str, bytes)) or not isinstance(evidence, Sequence):
            raise TypeError("evidence must be a list of NodeWithScore (the nodes the draft was written from)")
        seen: dict[str, str] = {}
        for node in evidence:
            if not isinstance(node, NodeWithScore):
                raise TypeError(f"evidence must hold NodeWithScore objects, got {type(node).__name__}")
            # The same passage returned twice (two searches of one agent run) is one piece of evidence.
            seen.setdefault(node.node.node_id, node.node.get_content())
        return cls(tuple(seen.items()))

    def state(self, query: str, answer: str) -> dict[str, Any]:
        return {"query": query, "answer": answer, "evidence": [{"id": i, "text": t} for i, t in self.items]}


class DraftReviewer:
    """Reviews a final draft against its evidence; revises it at most ``max_revisions`` times.

    Args:
        judge: any :class:`~llama_jev.Judge` (``JevClient``, ``ScriptedJudge``, a local model).
        options: mode, budget (per judgement), version and observer, as for retrieval.
        question: the yes/no question (default :data:`GROUNDED_QUESTION`).
        reject / accept: ``p >= accept`` passes, ``p <= reject`` fails, between is uncertain.
        max_revisions: how many times a failing or uncertain draft may be revised (0: never).
        purpose: the label of this reviewer's records.

    Modes: OFF returns the draft as ``SKIPPED`` without asking anything. SHADOW asks the judge
    about the draft once (never the LLM) and returns the draft, with the status ENFORCE would give
    it without revising (``PASSED`` or ``WITHHELD``). ENFORCE returns ``PASSED`` or ``REVISED``
    text, or raises :class:`~llama_jev.ResponseWithheldError`.

    Example:
        >>> reviewer = DraftReviewer(judge, ExecutionOptions(mode=Mode.ENFORCE))  # doctest: +SKIP
        >>> outcome = reviewer.review(query, draft, response.source_nodes, llm=llm)  # doctest: +SKIP
        >>> outcome.status, outcome.text  # doctest: +SKIP
        (<ReviewStatus.REVISED: 'revised'>, 'Refunds are available for unused items ... seven days ...')
    """

    def __init__(
        self,
        judge: Judge,
        options: ExecutionOptions,
        *,
        question: str = GROUNDED_QUESTION,
        reject: float = 0.2,
        accept: float = 0.8,
        max_revisions: int = 1,
        purpose: str = "draft_review",
    ) -> None:
        if not isinstance(question, str) or not question.strip():
            raise ValueError("question must be a non-blank string")
        if isinstance(max_revisions, bool) or not isinstance(max_revisions, int) or max_revisions < 0:
            raise ValueError(f"max_revisions must be an integer >= 0, got {max_revisions!r}")
        # The selector validates judge, options, thresholds and purpose, and owns the judgement.
        self.selector = CandidateSelector(judge, options, reject, accept, purpose=purpose)
        self.question = question
        self.max_revisions = max_revisions

    @property
    def options(self) -> ExecutionOptions:
        """The execution options (mode, budget, version, observer)."""
        return self.selector.options

    @property
    def mode(self) -> Mode:
        """The mode of :attr:`options`."""
        return self.selector.mode

    def __repr__(self) -> str:
        return (
            f"DraftReviewer(judge={self.selector.judge!r}, mode={self.mode.value}, reject={self.selector.reject}, "
            f"accept={self.selector.accept}, max_revisions={self.max_revisions})"
        )

    # --- the shared logic -------------------------------------------------------------------

    def _steps(
        self, query: str, draft: str, evidence: _Evidence, ctx: RuntimeContext | None, can_revise: bool
    ) -> _Steps:
        """The review as a sequence of asks; returns the outcome or raises ``ResponseWithheldError``."""
        if self.mode is Mode.OFF:
            return ReviewOutcome(ReviewStatus.SKIPPED, draft)
        if not evidence.items:
            record = self._no_evidence(query, ctx)
            return self._not_passed(query, draft, evidence, WithheldReason.NO_EVIDENCE, None, 0, (record,), None)
        text, revisions, records = draft, 0, []
        while True:
            candidate_id = DRAFT_ID if revisions == 0 else f"revision_{revisions}"
            decision = yield _Judge(text, candidate_id)
            assert isinstance(decision, Decision)
            if decision.record is not None:
                records.append(decision.record)
            probability = _probability(decision, candidate_id)
            verdict = _verdict(decision, candidate_id)
            if verdict is None:
                status = ReviewStatus.PASSED if revisions == 0 else ReviewStatus.REVISED
                return ReviewOutcome(status, text, probability, revisions, decision.record, tuple(records))
            revisable = verdict in (WithheldReason.UNSUPPORTED, WithheldReason.UNCERTAIN)
            if self.mode is Mode.SHADOW or not (can_revise and revisable and revisions < self.max_revisions):
                return self._not_passed(
                    query, draft, evidence, verdict, probability, revisions, tuple(records), decision, text
                )
            answer = yield _Revise(text)
            assert isinstance(answer, _Revision)
            revisions += 1
            problem = _revision_problem(answer)
            if problem is not None:
                raise _withheld(problem, decision, probability, revisions, tuple(records), cause=answer.error)
            text = answer.text.strip()

    def _not_passed(
        self,
        query: str,
        draft: str,
        evidence: _Evidence,
        reason: WithheldReason,
        probability: float | None,
        revisions: int,
        records: tuple[DecisionRecord, ...],
        decision: Decision | None,
        text: str | None = None,
    ) -> ReviewOutcome:
        """SHADOW: the draft, marked as what ENFORCE would withhold. ENFORCE: raise withheld."""
        too_large = reason is WithheldReason.EVIDENCE_TOO_LARGE
        if self.mode is Mode.SHADOW:
            if too_large:
                logger.warning(
                    "draft review in SHADOW: %s; the draft is shown unreviewed",
                    self._too_large_message(query, text or draft, evidence),
                )
            elif decision is not None and decision.status is Status.ERROR:
                # A judge failure is never silent, even when nothing changes for the user.
                logger.warning(
                    "draft review failed in SHADOW (%s); the draft is shown unreviewed",
                    describe_failure(decision).summary,
                )
            record = records[-1] if records else None
            return ReviewOutcome(ReviewStatus.WITHHELD, draft, probability, revisions, record, records, reason)
        if too_large and decision is not None:
            error = EvidenceTooLargeError(
                f"the answer was withheld: {self._too_large_message(query, text or draft, evidence)}",
                reason=reason.value,
                status=decision.status,
                revisions=revisions,
                record=records[-1] if records else None,
            )
            error.__cause__ = decision.error
            raise error
        raise _withheld(reason, decision, probability, revisions, records)

    def _too_large_message(self, query: str, text: str, evidence: _Evidence) -> str:
        evidence_tokens = sum(estimate_tokens(passage) for _, passage in evidence.items)
        # The draft travels twice: as the state's "answer" and as the question's candidate.
        rest = estimate_tokens(query) + 2 * estimate_tokens(text) + estimate_tokens(self.question)
        return (
            f"the evidence ({len(evidence.items)} passages, about {evidence_tokens} tokens) with the draft and "
            f"the query (about {rest} tokens) exceeds the {self.selector.max_request_tokens}-token budget of one "
            "review request; nothing was truncated: pass fewer or smaller passages (a smaller top_k or smaller nodes)"
        )

    def _no_evidence(self, query: str, ctx: RuntimeContext | None) -> DecisionRecord:
        """The record of a review with no evidence: the draft is rejected without asking the judge."""
        options = self.options
        record = DecisionRecord(
            purpose=self.selector.purpose,
            version=options.version,
            mode=options.mode,
            status=Status.SKIPPED,
            reason=Reason.NO_EVIDENCE,
            elapsed_ms=Budget(options.budget).elapsed_ms(),
            candidates=1,
            requests=0,
            rejected=(DRAFT_ID,),
            query_key=options.query_key(query),
        )
        # The selector's observer call, so a raising observer is handled in one place.
        self.selector._observe(ctx, Decision(Status.SKIPPED, Reason.NO_EVIDENCE, record=record))
        dispatcher.event(JevDecisionEvent(record=record))
        return record

    def _start(
        self, query: str, draft: str, evidence: Sequence[NodeWithScore], ctx: RuntimeContext | None, llm: LLM | None
    ) -> tuple[_Steps, _Evidence]:
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        if not isinstance(draft, str):
            raise TypeError(f"draft must be a string, got {type(draft).__name__}")
        if not draft.strip():
            raise ValueError("the draft is empty: there is nothing to review (an empty answer is not an answer)")
        if llm is not None and not isinstance(llm, LLM):
            raise TypeError("llm must be a LlamaIndex LLM (llama_index.core.llms.LLM) or None")
        view = _Evidence.of(evidence)
        return self._steps(query, draft, view, ctx, llm is not None), view

    # --- sync ---------------------------------------------------------------------------------

    def review(
        self,
        query: str,
        draft: str,
        evidence: Sequence[NodeWithScore],
        *,
        llm: LLM | None = None,
        ctx: RuntimeContext | None = None,
    ) -> ReviewOutcome:
        """Review ``draft`` (the answer to ``query``) against ``evidence``, the nodes it was written from.

        ``llm`` (a LlamaIndex ``LLM``) is asked for revisions in ENFORCE; ``ctx`` is passed to the
        observer (default: the bound ``RuntimeContext``, if any). Raises ``ValueError`` for an
        empty draft and, in ENFORCE, :class:`~llama_jev.ResponseWithheldError` when the answer
        does not pass (:class:`~llama_jev.EvidenceTooLargeError` when it cannot be judged in one
        request).
        """
        steps, evidence_view = self._start(query, draft, evidence, ctx, llm)
        reply: _Reply = None
        while True:
            try:
                step = steps.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, _Judge):
                reply = self._judged(self.selector.select(*self._ask(query, step, evidence_view), ctx=ctx))
            else:
                assert llm is not None
                try:
                    response = llm.chat(revision_messages(query, step.text, evidence_view.items))
                except Exception as error:
                    reply = _Revision(error=error)
                else:
                    reply = _read_revision(response)

    # --- async --------------------------------------------------------------------------------

    async def areview(
        self,
        query: str,
        draft: str,
        evidence: Sequence[NodeWithScore],
        *,
        llm: LLM | None = None,
        ctx: RuntimeContext | None = None,
    ) -> ReviewOutcome:
        """The async twin of :meth:`review`. A cancelled judgement is recorded as ``CANCELLED`` and re-raised."""
        steps, evidence_view = self._start(query, draft, evidence, ctx, llm)
        reply: _Reply = None
        while True:
            try:
                step = steps.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, _Judge):
                reply = self._judged(await self.selector.aselect(*self._ask(query, step, evidence_view), ctx=ctx))
            else:
                assert llm is not None
                try:
                    response = await llm.achat(revision_messages(query, step.text, evidence_view.items))
                except Exception as error:
                    reply = _Revision(error=error)
                else:
                    reply = _read_revision(response)

    # --- the thin edges -----------------------------------------------------------------------

    def _ask(self, query: str, step: _Judge, evidence: _Evidence) -> tuple[dict[str, Any], str, list[Candidate]]:
        # The draft is the candidate, so the question ("this answer") names what is judged, exactly
        # as a passage is the candidate of the relevance question; the state is the contract's.
        return evidence.state(query, step.text), self.question, [Candidate(step.candidate_id, step.text)]

    @staticmethod
    def _judged(decision: Decision) -> Decision:
        if decision.record is not None:
            dispatcher.event(JevDecisionEvent(record=decision.record))
        return decision


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


# DESIGN's "Final-draft review (`llama_jev.review`)" names the reviewed query engine too, and the
# agent and evaluator belong with it; they live in their own modules, which import this one, so
# they are re-exported lazily (PEP 562) rather than imported here (a cycle).
_LAZY = {
    "JevReviewedQueryEngine": "llama_jev.reviewed_engine",
    "JevReviewedAgent": "llama_jev.review_agent",
    "JevGroundingEvaluator": "llama_jev.evaluation",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
