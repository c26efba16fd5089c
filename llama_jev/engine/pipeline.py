"""The one implementation of a judged retrieval: ACL, judgement, mode logic, ordering, limit.

``JevRetriever``, ``JevNodePostprocessor`` and ``JevKnowledgeTool`` all call :class:`JudgedRetrieval`;
its sync and async paths share every step except the judge call itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeAlias

from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.schema import BaseNode, NodeWithScore, TextNode
from llama_index_instrumentation import get_dispatcher

from llama_jev.acl.batch import BatchAcl, acheck_allowed, batch_acl, checked_allowed
from llama_jev.acl.diagnostics import diagnose_denials
from llama_jev.acl.rules import Acl, MetadataAcl
from llama_jev.core.context import RuntimeContext, resolve_runtime_context
from llama_jev.core.errors import (
    JevAPIError,
    LocalJudgeTimeoutError,
    RetrievalInconclusiveError,
    RetrievalUnavailableError,
)
from llama_jev.core.models import copy_with
from llama_jev.core.records import Decision, DecisionRecord, Mode, Reason, RetrievalFacts, Status
from llama_jev.core.telemetry import observe_decision, observe_unjudged
from llama_jev.engine.rerank import JudgementSpan, judgement_span, listening
from llama_jev.engine.selector import RELEVANCE_QUESTION, Candidate, CandidateSelector

__all__ = [
    "PROBABILITY_KEY",
    "JudgeFailure",
    "JevDecisionEvent",
    "AnyAcl",
    "JudgedRetrieval",
    "authorize",
    "check_query",
    "describe_failure",
    "to_candidates",
    "with_probability",
]

PROBABILITY_KEY = "jev_probability"

AnyAcl: TypeAlias = Acl | BatchAcl
"""What the LlamaIndex components accept as an ACL: ``acl(ctx, node) -> bool`` or a :class:`~llama_jev.acl.BatchAcl`."""

dispatcher = get_dispatcher(__name__)
logger = logging.getLogger(__name__)
# The contract names the logger of a SHADOW judge failure: exactly "llama_jev", so a handler or a
# test that listens there (not to a submodule) sees it.
shadow_failure_logger = logging.getLogger("llama_jev")


class JevDecisionEvent(BaseEvent):
    """Instrumentation event carrying the :class:`DecisionRecord` of one judged retrieval."""

    record: DecisionRecord

    @classmethod
    def class_name(cls) -> str:
        """The event's name in LlamaIndex instrumentation."""
        return "JevDecisionEvent"


def authorize(nodes: Sequence[NodeWithScore], ctx: RuntimeContext, acl: AnyAcl) -> list[NodeWithScore]:
    """The nodes ``ctx`` may read, in their order. An ACL that raises fails the whole retrieval.

    ``acl`` is a plain ``acl(ctx, node) -> bool`` or any :class:`~llama_jev.acl.BatchAcl`
    (``MetadataAcl``, an engine), asked through :func:`~llama_jev.acl.checked_allowed`.
    """
    return authorize_batch(nodes, ctx, batch_acl(acl))


def authorize_batch(nodes: Sequence[NodeWithScore], ctx: RuntimeContext, batch: BatchAcl) -> list[NodeWithScore]:
    """:func:`authorize` for an ACL already read as a :class:`~llama_jev.acl.BatchAcl` (``batch_acl``).

    ``JudgedRetrieval`` reads its ACL once, when it is built: the protocol's ``isinstance`` check
    is a structural one, about as costly as the whole check of 20 nodes.
    """
    plan = _asking(nodes)
    return _kept(nodes, plan, [checked_allowed(batch, ctx, asked) for asked in plan.asked])


def _asking(nodes: Sequence[NodeWithScore]) -> _Asking:
    """What to ask the ACL about ``nodes``: one batch, or one per repeat of an id.

    ``allowed`` answers with ids, so two different nodes sharing an id (two stores fused, say)
    cannot be told apart in one answer; each repeat goes into a batch of its own, so every node
    is decided on its own metadata, as a per-node check would.
    """
    ids = [node.node.node_id for node in nodes]
    if len(set(ids)) == len(ids):  # the usual case: one batch
        return _Asking(ids=ids, rounds=None, asked=[[node.node for node in nodes]])
    rounds: list[list[int]] = []
    repeats: dict[str, int] = {}
    for index, node_id in enumerate(ids):
        count = repeats.get(node_id, 0)
        repeats[node_id] = count + 1
        if count == len(rounds):
            rounds.append([])
        rounds[count].append(index)
    return _Asking(ids=ids, rounds=rounds, asked=[[nodes[index].node for index in indices] for indices in rounds])


@dataclass(frozen=True)
class _Asking:
    ids: list[str]  # each node's id, in order (read once: node_id is a property)
    rounds: list[list[int]] | None  # the indices of each batch; None: one batch of every node
    asked: list[list[BaseNode]]


def _kept(nodes: Sequence[NodeWithScore], plan: _Asking, answers: Sequence[set[str]]) -> list[NodeWithScore]:
    """The nodes whose id the ACL's answer for their batch holds, in their order."""
    if plan.rounds is None:
        (allowed,) = answers
        return [node for node, node_id in zip(nodes, plan.ids, strict=True) if node_id in allowed]
    keep = [False] * len(nodes)
    for indices, allowed in zip(plan.rounds, answers, strict=True):
        for index in indices:
            keep[index] = plan.ids[index] in allowed
    return [node for node, kept in zip(nodes, keep, strict=True) if kept]


def to_candidates(nodes: Sequence[NodeWithScore]) -> list[Candidate]:
    """What the judge sees of each node: its id and its content, without any metadata."""
    # A plain TextNode's content without metadata is its text; get_content would first format
    # the metadata string it then drops (most of this step's time). Subclasses may say otherwise.
    return [
        Candidate(id=node.node.node_id, text=node.node.text if type(node.node) is TextNode else node.node.get_content())
        for node in nodes
    ]


def with_probability(node: NodeWithScore, probability: float) -> NodeWithScore:
    """A copy of ``node`` carrying ``metadata["jev_probability"]``, hidden from LLM and embeddings.

    The upstream node (often a docstore object shared across queries and users) is not touched:
    a shallow copy shares the metadata dict and the exclusion lists, so new ones are given to
    the copy. They are set without validation (:func:`copy_with`): the values are a fresh dict
    and fresh lists of the same types the node already validated.
    """
    source = node.node
    copy = copy_with(
        source,
        {
            "metadata": {**source.metadata, PROBABILITY_KEY: probability},
            "excluded_llm_metadata_keys": _with_key(source.excluded_llm_metadata_keys),
            "excluded_embed_metadata_keys": _with_key(source.excluded_embed_metadata_keys),
        },
    )
    return NodeWithScore(node=copy, score=node.score)  # validating two fields costs less than copying


def _with_key(keys: list[str]) -> list[str]:
    return list(keys) if PROBABILITY_KEY in keys else [*keys, PROBABILITY_KEY]


class JudgedRetrieval:
    """ACL -> independent judgements -> order by probability -> limit, for one selector and ACL.

    ``acl`` is a plain ``acl(ctx, node) -> bool``, a :class:`~llama_jev.acl.MetadataAcl` or any
    :class:`~llama_jev.acl.BatchAcl` (an authorization engine): the final check asks it once per
    batch of nodes (:func:`~llama_jev.acl.checked_allowed`, awaited on the async path). What it
    raises, ``PermissionsUnavailableError`` included, propagates in every mode: no node is returned.
    """

    def __init__(
        self,
        selector: CandidateSelector,
        acl: AnyAcl,
        *,
        question: str = RELEVANCE_QUESTION,
        pushdown: bool = False,
        component: str = "JudgedRetrieval",
    ) -> None:
        if not isinstance(selector, CandidateSelector):
            raise TypeError("selector must be a CandidateSelector")
        if not isinstance(acl, BatchAcl) and not callable(acl):
            raise TypeError(
                "acl must be callable as acl(ctx, node) -> bool (for example a MetadataAcl) or a BatchAcl "
                "(allowed / restriction, for example a CerbosAcl)"
            )
        if not question.strip():
            raise ValueError("question must not be blank")
        self.selector = selector
        self.acl = acl
        # The ACL as the protocol the final check and the pushdown ask (itself, or a CallableAcl).
        self.batch = batch_acl(acl)
        # Its name in records and spans, read once; a name that is not a plain string is the class's.
        engine = getattr(self.batch, "engine", None)
        self.engine = engine if isinstance(engine, str) and engine else type(self.batch).__name__
        self.question = question
        # Who judges, as traces name the judgement's span (``JevRetriever.judge``).
        self.component = component
        # Whether the store applies the ACL before retrieval (DecisionRecord.pushdown), for run().
        self.pushdown = pushdown
        # Whether the whole store was asked which configured keys it lacks (then the returned
        # nodes are not asked again; see diagnose_denials).
        self.store_checked = False
        # The ACL misconfiguration warnings already given by this retrieval (each once, not per query).
        self.warned: set[tuple[str, ...]] = set()

    @property
    def mode(self) -> Mode:
        """The selector's mode."""
        return self.selector.mode

    def run(
        self, query: str, nodes: Sequence[NodeWithScore], ctx: RuntimeContext, limit: int | None
    ) -> list[NodeWithScore]:
        """Apply the ACL and, unless the mode is OFF, the judgement; return at most ``limit`` nodes."""
        check_query(query)
        authorized = self.authorize(nodes, ctx)
        return self.judge(query, authorized, ctx, limit, self.facts(nodes, authorized))

    async def arun(
        self, query: str, nodes: Sequence[NodeWithScore], ctx: RuntimeContext, limit: int | None
    ) -> list[NodeWithScore]:
        """The async twin of :meth:`run`."""
        check_query(query)
        authorized = await self.aauthorize(nodes, ctx)
        return await self.ajudge(query, authorized, ctx, limit, self.facts(nodes, authorized))

    def authorize(self, nodes: Sequence[NodeWithScore], ctx: RuntimeContext) -> list[NodeWithScore]:
        """The final check: the nodes ``ctx`` may read, in their order (the ACL asked once per batch)."""
        return self._authorized(nodes, ctx, authorize_batch(nodes, ctx, self.batch))

    async def aauthorize(self, nodes: Sequence[NodeWithScore], ctx: RuntimeContext) -> list[NodeWithScore]:
        """The async :meth:`authorize`: the engine is awaited, the event loop never blocked by it."""
        plan = _asking(nodes)
        answers = [await acheck_allowed(self.batch, ctx, asked) for asked in plan.asked]
        return self._authorized(nodes, ctx, _kept(nodes, plan, answers))

    def facts(self, nodes: Sequence[NodeWithScore], authorized: Sequence[NodeWithScore], **more: Any) -> RetrievalFacts:
        """What the record says of a retrieval of ``nodes`` of which ``authorized`` passed the final check."""
        fields: dict[str, Any] = {
            "retrieved": len(nodes),
            "denied": len(nodes) - len(authorized),
            "pushdown": self.pushdown,
            "engine": self.engine,
            **more,
        }
        return RetrievalFacts(**fields)

    def judge(
        self,
        query: str,
        authorized: list[NodeWithScore],
        ctx: RuntimeContext,
        limit: int | None,
        facts: RetrievalFacts,
    ) -> list[NodeWithScore]:
        """Unless the mode is OFF, judge the ``authorized`` nodes; return at most ``limit`` nodes."""
        check_query(query)
        if self.mode is Mode.OFF:
            return self._unjudged(authorized, limit, facts)
        with self._span(query, authorized, limit) as span:
            candidates = to_candidates(authorized)
            decision = self.selector.select(query, self.question, candidates, ctx=ctx, retrieval=facts)
            return span.returned(self._apply(authorized, decision, limit))

    async def ajudge(
        self,
        query: str,
        authorized: list[NodeWithScore],
        ctx: RuntimeContext,
        limit: int | None,
        facts: RetrievalFacts,
    ) -> list[NodeWithScore]:
        """The async twin of :meth:`judge`."""
        check_query(query)
        if self.mode is Mode.OFF:
            return self._unjudged(authorized, limit, facts)
        with self._span(query, authorized, limit) as span:
            candidates = to_candidates(authorized)
            decision = await self.selector.aselect(query, self.question, candidates, ctx=ctx, retrieval=facts)
            return span.returned(self._apply(authorized, decision, limit))

    def identity(self, ctx: RuntimeContext | None) -> RuntimeContext:
        """The caller to act for: ``ctx``, else the bound one; the error names what this ACL needs.

        Raises:
            MissingRuntimeContextError: nothing is bound; with a ``MetadataAcl`` that checks a tenant
                the hint shows ``tenant_id`` too, since an identity without one is denied everything.
        """
        needs_tenant = isinstance(self.acl, MetadataAcl) and self.acl.tenant_key is not None
        return resolve_runtime_context(ctx, needs_tenant=needs_tenant)

    def _span(
        self, query: str, authorized: list[NodeWithScore], limit: int | None
    ) -> AbstractContextManager[JudgementSpan]:
        """The judgement's RERANKER span: the authorized candidates in, the nodes returned out."""
        top_n = len(authorized) if limit is None else limit
        return judgement_span(self.component, query, authorized, top_n, self.selector.judge)

    def _unjudged(
        self, authorized: list[NodeWithScore], limit: int | None, facts: RetrievalFacts
    ) -> list[NodeWithScore]:
        """Mode OFF: the ACL only; counted and described like a judgement, with nothing judged."""
        observe_unjudged(self.mode, facts.retrieved or 0, facts.denied or 0, facts.pushdown, facts=facts)
        return _limit(authorized, limit)

    def _authorized(
        self, nodes: Sequence[NodeWithScore], ctx: RuntimeContext, authorized: list[NodeWithScore]
    ) -> list[NodeWithScore]:
        """``authorized``, after telling a ``MetadataAcl``'s user why nodes were denied (once per cause)."""
        if isinstance(self.acl, MetadataAcl):
            diagnose_denials(
                self.acl,
                ctx,
                [node.node.metadata for node in nodes],
                len(authorized),
                seen=self.warned,
                store_checked=self.store_checked,
            )
        return authorized

    def _apply(self, authorized: list[NodeWithScore], decision: Decision, limit: int | None) -> list[NodeWithScore]:
        failure = describe_failure(decision) if decision.status is Status.ERROR else None
        if decision.record is not None:
            spans, events = listening(dispatcher)
            if events:
                dispatcher.event(JevDecisionEvent(record=decision.record))
            observe_decision(decision.record, failure.facts() if failure is not None else None, crowded=spans)
        if failure is not None:
            if self.mode is Mode.SHADOW:
                # SHADOW serves as if OFF; without this line a judge failing on every call (a
                # wrong key) would leave only error records and nobody would notice.
                shadow_failure_logger.warning(
                    "SHADOW judgement failed (decision %s): %s; the nodes were served unjudged",
                    decision.record.decision_id if decision.record else "-",
                    failure.summary,
                    extra={
                        "jev_reason": failure.reason,
                        "jev_error_type": failure.error_type,
                        "jev_status_code": failure.status_code,
                        "jev_retryable": failure.retryable,
                    },
                )
                return _limit(authorized, limit)
            raise RetrievalUnavailableError(
                failure.message(),
                reason=failure.reason,
                status_code=failure.status_code,
                retryable=failure.retryable,
                error_type=failure.error_type,
            ) from decision.error
        if self.mode is Mode.SHADOW:
            return _limit(authorized, limit)
        selection = decision.selection
        if selection is None:  # only ERROR, CANCELLED and MODE_OFF lack one; none gets here
            return []
        if decision.status is Status.INCONCLUSIVE:
            raise RetrievalInconclusiveError(
                # The whole message reaches an agent's model as the tool error: say what to do too.
                f"no passage was clearly relevant and {_were_uncertain(len(selection.uncertain))}; this is "
                "not an empty result, the knowledge base may hold the answer but the judge could not "
                "confirm it, so do not answer from it. Retrying the same query is unlikely to help; a "
                "more specific one may.",
                uncertain=selection.uncertain,
            )
        by_id = {node.node.node_id: node for node in authorized}
        chosen = [with_probability(by_id[node_id], selection.scores[node_id]) for node_id in selection.selected]
        return _limit(chosen, limit)


def check_query(query: str) -> None:
    """Refuse a blank query before anything is retrieved or sent: there is nothing to judge against.

    Raises:
        ValueError: ``query`` is not a string, or is empty or whitespace only.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError("the query must be a non-blank string: a blank query cannot be judged for relevance")


@dataclass(frozen=True)
class JudgeFailure:
    """What a failed judgement can tell a user, without any text: the facts of the error."""

    reason: str
    error_type: str
    status_code: int | None
    retryable: bool
    # What failed, when the error says it better than the reason's headline (an in-process timeout).
    detail: str | None = None

    def facts(self) -> dict[str, Any]:
        """``error_type``, ``status_code`` and ``retryable``: what telemetry may say of the failure."""
        return {"error_type": self.error_type, "status_code": self.status_code, "retryable": self.retryable}

    @property
    def summary(self) -> str:
        """``reason, error class, HTTP status, retryable`` in one phrase (for logs)."""
        status = f"HTTP {self.status_code}" if self.status_code is not None else "no HTTP status"
        hint = "retryable" if self.retryable else "not retryable"
        return f"{self.reason}, {self.error_type}, {status}, {hint}"

    def message(self) -> str:
        """The message of :class:`RetrievalUnavailableError`: what failed, whether to retry, what to do."""
        status = f"HTTP {self.status_code}" if self.status_code is not None else "no HTTP status"
        what = self.detail or _HEADLINES.get(self.reason, "the relevance judge failed")
        return (
            f"{what} ({self.reason}: {self.error_type}, {status}); this is not an empty result, the "
            f"knowledge base was not searched to a conclusion. {self._advice()}"
        )

    def _advice(self) -> str:
        if self.reason == "CANDIDATE_TOO_LARGE":
            return "Retrying will not help: split the documents into smaller nodes."
        if self.reason == "QUERY_TOO_LARGE":
            return "Retrying will not help: shorten the query."
        if self.reason == "UNENCODABLE_TEXT":
            return "Retrying will not help: repair the lone surrogate where the text is decoded or ingested."
        if self.reason == "TIMEOUT" and self.detail is not None:
            return (
                "Retrying will not help: the judge runs in this process and the same work takes as long again; "
                "raise ExecutionOptions(budget=...) or judge fewer or shorter candidates."
            )
        if self.retryable:
            return "Retrying later may help (the judge timed out, was rate limited, overloaded or unreachable)."
        return f"Retrying will not help: {_not_retryable_advice(self.status_code)}"


_HEADLINES = {
    "CANDIDATE_TOO_LARGE": "a candidate is too large to judge in one request",
    "QUERY_TOO_LARGE": "the query is too large to judge in one request",
    "UNENCODABLE_TEXT": "the query or a candidate holds text that cannot be encoded",
}


def _not_retryable_advice(status: int | None) -> str:
    if status in (401, 403):
        return "the judge refused the API key; check TYPESAFE_API_KEY (or api_key=) and its permissions."
    if status == 404:
        return "the judge's endpoint or model was not found; check base_url and model."
    if status in (400, 422):
        return "the judge rejected the request; check the selector's configuration (question, request size)."
    return "the judge could not answer this request; check its configuration (or the server's answers)."


def describe_failure(decision: Decision) -> JudgeFailure:
    """The facts of an ``ERROR`` decision: reason, error class, HTTP status, whether retrying can help.

    Only a timeout (of the budget or an attempt) and errors the client marks retryable (408, 429,
    529, 5xx, connection failures) count as retryable; a wrong key, a rejected request, an
    invalid answer, data the judge cannot take or an unknown error do not.

    Example:
        >>> from llama_jev.core import Reason
        >>> describe_failure(Decision(Status.ERROR, Reason.TIMEOUT, error=TimeoutError())).retryable
        True
    """
    error = decision.error
    status_code = error.status_code if isinstance(error, JevAPIError) else None
    if isinstance(error, LocalJudgeTimeoutError):
        # The judge computes in this process: the same work would run out of the same budget again.
        return JudgeFailure(
            reason=decision.reason.value,
            error_type=type(error).__name__,
            status_code=None,
            retryable=False,
            detail=error.message,
        )
    if isinstance(error, JevAPIError):
        retryable = error.retryable or decision.reason is Reason.TIMEOUT
    else:
        retryable = isinstance(error, TimeoutError)
    return JudgeFailure(
        reason=decision.reason.value,
        error_type=type(error).__name__ if error is not None else "unknown error",
        status_code=status_code,
        retryable=retryable,
    )


def _limit(nodes: list[NodeWithScore], limit: int | None) -> list[NodeWithScore]:
    return nodes if limit is None else nodes[:limit]


def _were_uncertain(count: int) -> str:
    return "1 was uncertain" if count == 1 else f"{count} were uncertain"
