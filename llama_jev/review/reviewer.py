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

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.llms import LLM
from llama_index.core.schema import NodeWithScore
from llama_index_instrumentation import get_dispatcher

from llama_jev.core.errors import EvidenceTooLargeError, ResponseWithheldError
from llama_jev.core.records import (
    DEFAULT_ACCEPT,
    DEFAULT_REJECT,
    Budget,
    Decision,
    DecisionRecord,
    ExecutionOptions,
    Mode,
    Reason,
    Status,
)
from llama_jev.engine.failures import describe_failure
from llama_jev.engine.pipeline import JevDecisionEvent
from llama_jev.engine.selector import Candidate, CandidateSelector, estimate_tokens
from llama_jev.review.outcome import (
    DRAFT_ID,
    GROUNDED_QUESTION,
    REVISION_PROMPT,
    ReviewOutcome,
    ReviewStatus,
    WithheldReason,
    _Evidence,
    _Judge,
    _Reply,
    _Revise,
    _Revision,
    _Steps,
)
from llama_jev.review.verdicts import (
    _probability,
    _read_revision,
    _revision_problem,
    _verdict,
    _withheld,
    revision_messages,
)
from llama_jev.systemone.judge import Judge

if TYPE_CHECKING:
    from llama_jev.core.context import RuntimeContext

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

logger = logging.getLogger("llama_jev")
dispatcher = get_dispatcher(__name__)


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
        reject: float = DEFAULT_REJECT,
        accept: float = DEFAULT_ACCEPT,
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
        self.selector.observe(ctx, Decision(Status.SKIPPED, Reason.NO_EVIDENCE, record=record))
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
        does not pass (:class:`~llama_jev.errors.EvidenceTooLargeError` when it cannot be judged in one
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
