"""``CandidateSelector``: one independent yes/no judgement per candidate, batched and concurrent.

The rules live in pure functions (:func:`plan_batches`, :func:`classify` in ``batching.py``; the
requests and the answers read back in ``plan.py``) and in the selector's ``_start`` / ``_finish`` /
``_failed`` steps; ``select`` and ``aselect`` differ only in how they wait for the batches
(``gather.py``: a thread pool shared by the process, or asyncio tasks).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llama_jev.core.errors import (
    CandidateTooLargeError,
    LocalJudgeTimeoutError,
    MissingRuntimeContextError,
    QueryTooLargeError,
    UnencodableTextError,
)
from llama_jev.core.records import (
    DEFAULT_ACCEPT,
    DEFAULT_REJECT,
    Budget,
    Decision,
    DecisionRecord,
    ExecutionOptions,
    Mode,
    Reason,
    RetrievalFacts,
    Selection,
    Status,
)
from llama_jev.engine.batching import (
    _UNSENDABLE_REASONS,
    MAX_CANDIDATES,
    Candidate,
    _unencodable,
    classify,
    estimate_tokens,
    even_out,
    plan_batches,
)
from llama_jev.engine.gather import agather, gather
from llama_jev.engine.plan import Plan, plan_judgement, read_scores
from llama_jev.systemone.judge import RELEVANCE_QUESTION, Judge, runs_in_process
from llama_jev.systemone.wire import Instructions

if TYPE_CHECKING:
    from llama_jev.core.context import RuntimeContext

__all__ = [
    "MAX_CANDIDATES",
    "RELEVANCE_QUESTION",
    "Candidate",
    "CandidateSelector",
    "classify",
    "estimate_tokens",
    "even_out",
    "plan_batches",
]

logger = logging.getLogger("llama_jev.selector")


class CandidateSelector:
    """Asks a :class:`~llama_jev.Judge` one independent yes/no question per candidate.

    Args:
        judge: a :class:`~llama_jev.JevClient`, :class:`~llama_jev.ScriptedJudge` or any ``Judge``.
        options: the :class:`~llama_jev.ExecutionOptions` (mode, budget, version, observer).
        reject: ``p <= reject`` is rejected. accept: ``p >= accept`` is selected. Between is uncertain.
        batch_size: most questions per request (default 1024: the token budget decides).
        max_request_tokens: estimated token budget per request (state + questions); TypeSafe
            allows about 32k, the default 30,000 keeps a margin. Requests are packed up to this
            budget and then evened out, so 1,024 passages of ~100 tokens make 4 requests of 256.
        max_concurrency: most requests in flight at once for one judgement (default 16, so up
            to 16 x 30k estimated tokens, e.g. 1,024 passages of ~450 tokens, go out in one
            wave). The client's own bound (``JevClient(max_in_flight=16)``) is shared by every
            judgement using it and adapts to 429/529.
        purpose: the label written into records.

    Example:
        >>> judge = ScriptedJudge(lambda state, qid, ins: 0.9 if "refund" in ins["candidate"] else 0.1)
        >>> selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE))
        >>> decision = selector.select(
        ...     "What are the refund conditions?",
        ...     RELEVANCE_QUESTION,
        ...     [Candidate("a", "Refunds within seven days."), Candidate("b", "Shipping takes 3 days.")],
        ... )
        >>> decision.selection.selected
        ('a',)
    """

    def __init__(
        self,
        judge: Judge,
        options: ExecutionOptions,
        reject: float = DEFAULT_REJECT,
        accept: float = DEFAULT_ACCEPT,
        *,
        batch_size: int = MAX_CANDIDATES,
        max_request_tokens: int = 30_000,
        max_concurrency: int = 16,
        purpose: str = "retrieval_relevance",
    ) -> None:
        if not isinstance(judge, Judge):
            raise TypeError("judge must provide system_one() and asystem_one() (see llama_jev.Judge)")
        if not isinstance(options, ExecutionOptions):
            raise TypeError("options must be an ExecutionOptions")
        for name, value in (("reject", reject), ("accept", accept)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not 0.0 <= reject < accept <= 1.0:
            raise ValueError(f"thresholds must satisfy 0 <= reject < accept <= 1, got reject={reject}, accept={accept}")
        for name, number, low in (
            ("batch_size", batch_size, 1),
            ("max_concurrency", max_concurrency, 1),
            ("max_request_tokens", max_request_tokens, 64),
        ):
            if isinstance(number, bool) or not isinstance(number, int) or number < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {number!r}")
        if not purpose.strip():
            raise ValueError("purpose must not be blank")
        self.judge = judge
        self.options = options
        self.reject = float(reject)
        self.accept = float(accept)
        self.batch_size = batch_size
        self.max_request_tokens = max_request_tokens
        self.max_concurrency = max_concurrency
        self.purpose = purpose

    def __repr__(self) -> str:
        return (
            f"CandidateSelector(judge={self.judge!r}, mode={self.options.mode.value}, "
            f"reject={self.reject}, accept={self.accept})"
        )

    @property
    def mode(self) -> Mode:
        """The mode of :attr:`options`."""
        return self.options.mode

    # --- the shared steps -----------------------------------------------------------------

    def _record(
        self,
        plan: Plan,
        budget: Budget,
        status: Status,
        reason: Reason,
        selection: Selection | None = None,
        model: str | None = None,
    ) -> DecisionRecord:
        return DecisionRecord(
            purpose=self.purpose,
            version=self.options.version,
            mode=self.options.mode,
            status=status,
            reason=reason,
            elapsed_ms=budget.elapsed_ms(),
            candidates=plan.count,
            judged=len(selection.scores) if selection else 0,
            requests=len(plan.requests),
            **plan.retrieval.record_fields(),
            query_key=plan.query_key,
            model=model,
            selected=selection.selected if selection else (),
            uncertain=selection.uncertain if selection else (),
            rejected=selection.rejected if selection else (),
            scores=dict(selection.scores) if selection else {},
            queue_ms=plan.queue.ms,
        )

    def _finish(self, plan: Plan, budget: Budget, scores: dict[str, float], model: str | None) -> Decision:
        selection = classify(scores, reject=self.reject, accept=self.accept)
        nothing_chosen = not selection.selected and selection.uncertain
        status = Status.INCONCLUSIVE if nothing_chosen else Status.DECIDED
        record = self._record(plan, budget, status, Reason.CLASSIFIED, selection, model)
        return Decision(status=status, reason=Reason.CLASSIFIED, selection=selection, record=record)

    def _failed(self, plan: Plan, budget: Budget, error: BaseException) -> Decision:
        reason = Reason.TIMEOUT if isinstance(error, TimeoutError) else Reason.CALL_OR_RESPONSE_ERROR
        if reason is Reason.TIMEOUT and runs_in_process(self.judge) and not isinstance(error, LocalJudgeTimeoutError):
            # Nothing remote was slow: the judge's own work outgrew the budget, and would again.
            timed_out = error
            error = LocalJudgeTimeoutError(budget=self.options.budget, candidates=plan.count)
            error.__cause__ = timed_out
        record = self._record(plan, budget, Status.ERROR, reason)
        return Decision(status=Status.ERROR, reason=reason, record=record, error=error)

    def _skipped(self, plan: Plan, budget: Budget) -> Decision:
        selection = Selection()
        record = self._record(plan, budget, Status.SKIPPED, Reason.NO_CANDIDATES, selection)
        return Decision(status=Status.SKIPPED, reason=Reason.NO_CANDIDATES, selection=selection, record=record)

    def _start(
        self,
        state: Instructions,
        question: str,
        candidates: Sequence[Candidate],
        ctx: RuntimeContext | None,
        retrieval: RetrievalFacts,
    ) -> Decision | tuple[Plan, Budget]:
        """A finished decision when nothing is to be asked (mode OFF, no candidate), else the plan."""
        if self.options.mode is Mode.OFF:
            return Decision(status=Status.SKIPPED, reason=Reason.MODE_OFF)
        if isinstance(state, str) and not state.strip():
            raise ValueError("the query (state) must not be blank: there is nothing to judge against")
        budget = Budget(self.options.budget)
        key = self._query_key(state)
        unsendable: CandidateTooLargeError | QueryTooLargeError | UnencodableTextError | None
        try:
            unsendable = _unencodable(state, candidates)
            if unsendable is None:
                plan = plan_judgement(
                    state,
                    question,
                    candidates,
                    batch_size=self.batch_size,
                    max_request_tokens=self.max_request_tokens,
                    retrieval=retrieval,
                    query_key=key,
                )
        except (CandidateTooLargeError, QueryTooLargeError) as error:
            unsendable = error
        if unsendable is not None:
            # Data the judge cannot take is an unavailable judgement, not bad arguments: SHADOW
            # keeps serving, ENFORCE reports it, nothing is truncated or skipped.
            reason = _UNSENDABLE_REASONS[type(unsendable)]
            empty = Plan((), (), len(candidates), retrieval=retrieval, query_key=key)
            record = self._record(empty, budget, Status.ERROR, reason)
            return self.observe(ctx, Decision(Status.ERROR, reason, record=record, error=unsendable))
        if not plan.requests:
            return self.observe(ctx, self._skipped(plan, budget))
        return plan, budget

    def _query_key(self, state: Instructions) -> str | None:
        # The query is the state of a retrieval, or the "query" field of a structured state.
        query = state.get("query") if isinstance(state, Mapping) else state
        return self.options.query_key(query) if isinstance(query, str) else None

    def observe(self, ctx: RuntimeContext | None, decision: Decision) -> Decision:
        """Hand ``decision``'s record to the options' observer, as every judgement does, and return it.

        For a component that decides without asking the judge (the draft review with no evidence)
        and still owes the observer its one record. An observer that raises is logged and never
        changes the outcome.
        """
        observer = self.options.observer
        if observer is not None and decision.record is not None:
            try:
                observer(ctx if ctx is not None else _bound_context(), decision.record)
            except Exception:
                # An audit hook must never change what the user gets; its failure is still visible.
                logger.exception("the decision observer raised; the decision stands")
        return decision

    def _sample(self, state: Instructions, candidates: Sequence[Candidate], decision: Decision) -> Decision:
        """Offer the judged candidates to the opt-in label sampler (the query and their text)."""
        sampler = self.options.label_sampler
        query = state.get("query") if isinstance(state, Mapping) else state
        if sampler is None or decision.record is None or not isinstance(query, str):
            return decision
        try:
            sampler.offer(decision.record, query, [(candidate.id, candidate.text) for candidate in candidates])
        except Exception:
            # Like an observer: a sampling failure (a full disk) never changes what the user gets.
            logger.exception("the label sampler raised; the decision stands")
        return decision

    # --- sync -----------------------------------------------------------------------------

    def select(
        self,
        state: Instructions,
        question: str,
        candidates: Sequence[Candidate],
        ctx: RuntimeContext | None = None,
        *,
        retrieved: int | None = None,
        denied: int | None = None,
        pushdown: bool = False,
        retrieval: RetrievalFacts | None = None,
    ) -> Decision:
        """Judge ``candidates`` against ``state`` (the query) with the yes/no ``question``.

        Never raises for a judge failure: that is a decision with status ``ERROR``, as is text the
        judge cannot take (``CANDIDATE_TOO_LARGE``, ``QUERY_TOO_LARGE``, ``UNENCODABLE_TEXT``).
        Raises ``ValueError`` for bad input (a blank query, question or id, duplicate ids, more
        than 1024 candidates). In mode ``OFF`` nothing is asked and nothing recorded.
        ``retrieved`` / ``denied`` (what the upstream retriever returned and the ACL removed) and
        ``pushdown`` (whether the store applied the ACL first) are written into the record by the
        LlamaIndex components; ``retrieval`` (:class:`~llama_jev.core.RetrievalFacts`), when given,
        says all of it at once (with the engine, the restriction kind and the widening counts) and
        takes the place of the three.
        """
        facts = retrieval or RetrievalFacts(retrieved=retrieved, denied=denied, pushdown=pushdown)
        started = self._start(state, question, candidates, ctx, facts)
        if isinstance(started, Decision):
            return started
        plan, budget = started
        try:
            scores, model = read_scores(plan, gather(self.judge, plan, budget, self.max_concurrency))
        except Exception as error:
            return self.observe(ctx, self._failed(plan, budget, error))
        return self._sample(state, candidates, self.observe(ctx, self._finish(plan, budget, scores, model)))

    # --- async ----------------------------------------------------------------------------

    async def aselect(
        self,
        state: Instructions,
        question: str,
        candidates: Sequence[Candidate],
        ctx: RuntimeContext | None = None,
        *,
        retrieved: int | None = None,
        denied: int | None = None,
        pushdown: bool = False,
        retrieval: RetrievalFacts | None = None,
    ) -> Decision:
        """The async twin of :meth:`select`. A cancellation is recorded as ``CANCELLED`` and re-raised."""
        facts = retrieval or RetrievalFacts(retrieved=retrieved, denied=denied, pushdown=pushdown)
        started = self._start(state, question, candidates, ctx, facts)
        if isinstance(started, Decision):
            return started
        plan, budget = started
        try:
            scores, model = read_scores(plan, await agather(self.judge, plan, budget, self.max_concurrency))
        except asyncio.CancelledError:
            record = self._record(plan, budget, Status.CANCELLED, Reason.CANCELLED)
            self.observe(ctx, Decision(status=Status.CANCELLED, reason=Reason.CANCELLED, record=record))
            raise
        except Exception as error:
            return self.observe(ctx, self._failed(plan, budget, error))
        return self._sample(state, candidates, self.observe(ctx, self._finish(plan, budget, scores, model)))


def _bound_context() -> RuntimeContext | None:
    from llama_jev.core.context import current_runtime_context

    try:
        return current_runtime_context()
    except MissingRuntimeContextError:
        return None
