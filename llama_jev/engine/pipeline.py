"""The one implementation of a judged retrieval: ACL, judgement, mode logic, ordering, limit.

``JevRetriever``, ``JevNodePostprocessor`` and ``JevKnowledgeTool`` all call :class:`JudgedRetrieval`;
its sync and async paths share every step except the judge call itself. Its parts live beside it:
the final check in ``authorization.py``, what the judge sees of a node and what a node carries
back in ``nodes.py``, a failure's facts and advice in ``failures.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.schema import NodeWithScore
from llama_index_instrumentation import get_dispatcher

from llama_jev.acl.batch import BatchAcl, batch_acl
from llama_jev.acl.diagnostics import diagnose_denials, nothing_to_diagnose
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.context import RuntimeContext, resolve_runtime_context
from llama_jev.core.errors import RetrievalInconclusiveError, RetrievalUnavailableError
from llama_jev.core.records import Decision, DecisionRecord, Mode, RetrievalFacts, Status
from llama_jev.core.telemetry import observe_decision, observe_unjudged
from llama_jev.engine.authorization import AnyAcl, aauthorize_batch, authorize, authorize_batch
from llama_jev.engine.failures import JudgeFailure, describe_failure
from llama_jev.engine.nodes import PROBABILITY_KEY, to_candidates, with_probability
from llama_jev.engine.rerank import JudgementSpan, judgement_span, listening
from llama_jev.engine.selector import RELEVANCE_QUESTION, CandidateSelector

# The final check (authorization.py), the node side (nodes.py) and the failure's facts
# (failures.py) are re-exported: this module was their home, and callers import them from here.
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
        return self._authorized(nodes, ctx, await aauthorize_batch(nodes, ctx, self.batch))

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
        if isinstance(self.acl, MetadataAcl) and not nothing_to_diagnose(self.acl, ctx, len(nodes), len(authorized)):
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


def _limit(nodes: list[NodeWithScore], limit: int | None) -> list[NodeWithScore]:
    return nodes if limit is None else nodes[:limit]


def _were_uncertain(count: int) -> str:
    return "1 was uncertain" if count == 1 else f"{count} were uncertain"
