"""The one implementation of a judged retrieval: ACL, judgement, mode logic, ordering, limit.

``JevRetriever``, ``JevNodePostprocessor`` and ``JevKnowledgeTool`` all call :class:`JudgedRetrieval`;
its sync and async paths share every step except the judge call itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.schema import NodeWithScore
from llama_index_instrumentation import get_dispatcher

from llama_jev.acl import Acl, check_acl
from llama_jev.context import RuntimeContext
from llama_jev.errors import RetrievalInconclusiveError, RetrievalUnavailableError
from llama_jev.execution import Decision, DecisionRecord, Mode, Reason, Status
from llama_jev.selector import RELEVANCE_QUESTION, Candidate, CandidateSelector

__all__ = ["PROBABILITY_KEY", "JevDecisionEvent", "JudgedRetrieval", "authorize", "to_candidates", "with_probability"]

PROBABILITY_KEY = "jev_probability"

dispatcher = get_dispatcher(__name__)


class JevDecisionEvent(BaseEvent):
    """Instrumentation event carrying the :class:`DecisionRecord` of one judged retrieval."""

    record: DecisionRecord

    @classmethod
    def class_name(cls) -> str:
        """The event's name in LlamaIndex instrumentation."""
        return "JevDecisionEvent"


def authorize(nodes: Sequence[NodeWithScore], ctx: RuntimeContext, acl: Acl) -> list[NodeWithScore]:
    """The nodes ``ctx`` may read, in their order. An ACL that raises fails the whole retrieval."""
    return [node for node in nodes if check_acl(acl, ctx, node.node)]


def to_candidates(nodes: Sequence[NodeWithScore]) -> list[Candidate]:
    """What the judge sees of each node: its id and its content, without any metadata."""
    return [Candidate(id=node.node.node_id, text=node.node.get_content()) for node in nodes]


def with_probability(node: NodeWithScore, probability: float) -> NodeWithScore:
    """A copy of ``node`` carrying ``metadata["jev_probability"]``, hidden from LLM and embeddings.

    The upstream node (often a docstore object shared across queries and users) is not touched:
    ``model_copy`` shares the metadata dict and the exclusion lists, so new ones are given to the
    copy. They are set through ``update`` rather than validated assignments: the values are a
    fresh dict and fresh lists of the same types the node already validated, and three
    validated assignments per node cost more than the rest of the judgement's client CPU.
    """
    source = node.node
    copy = source.model_copy(
        update={
            "metadata": {**source.metadata, PROBABILITY_KEY: probability},
            "excluded_llm_metadata_keys": _with_key(source.excluded_llm_metadata_keys),
            "excluded_embed_metadata_keys": _with_key(source.excluded_embed_metadata_keys),
        }
    )
    return NodeWithScore(node=copy, score=node.score)


def _with_key(keys: list[str]) -> list[str]:
    return list(keys) if PROBABILITY_KEY in keys else [*keys, PROBABILITY_KEY]


class JudgedRetrieval:
    """ACL -> independent judgements -> order by probability -> limit, for one selector and ACL."""

    def __init__(self, selector: CandidateSelector, acl: Acl, *, question: str = RELEVANCE_QUESTION) -> None:
        if not isinstance(selector, CandidateSelector):
            raise TypeError("selector must be a CandidateSelector")
        if not callable(acl):
            raise TypeError("acl must be callable as acl(ctx, node) -> bool (for example a MetadataAcl)")
        if not question.strip():
            raise ValueError("question must not be blank")
        self.selector = selector
        self.acl = acl
        self.question = question

    @property
    def mode(self) -> Mode:
        """The selector's mode."""
        return self.selector.mode

    def run(
        self, query: str, nodes: Sequence[NodeWithScore], ctx: RuntimeContext, limit: int | None
    ) -> list[NodeWithScore]:
        """Apply the ACL and, unless the mode is OFF, the judgement; return at most ``limit`` nodes."""
        authorized = authorize(nodes, ctx, self.acl)
        if self.mode is Mode.OFF:
            return _limit(authorized, limit)
        decision = self.selector.select(
            query, self.question, to_candidates(authorized), ctx=ctx, **_counts(nodes, authorized)
        )
        return self._apply(authorized, decision, limit)

    async def arun(
        self, query: str, nodes: Sequence[NodeWithScore], ctx: RuntimeContext, limit: int | None
    ) -> list[NodeWithScore]:
        """The async twin of :meth:`run`."""
        authorized = authorize(nodes, ctx, self.acl)
        if self.mode is Mode.OFF:
            return _limit(authorized, limit)
        decision = await self.selector.aselect(
            query, self.question, to_candidates(authorized), ctx=ctx, **_counts(nodes, authorized)
        )
        return self._apply(authorized, decision, limit)

    def _apply(self, authorized: list[NodeWithScore], decision: Decision, limit: int | None) -> list[NodeWithScore]:
        if decision.record is not None:
            dispatcher.event(JevDecisionEvent(record=decision.record))
        if self.mode is Mode.SHADOW:
            return _limit(authorized, limit)
        if decision.status is Status.ERROR:
            raise RetrievalUnavailableError(_unavailable_message(decision.reason), reason=decision.reason.value) from (
                decision.error
            )
        selection = decision.selection
        if selection is None:  # only ERROR, CANCELLED and MODE_OFF lack one; none gets here
            return []
        if decision.status is Status.INCONCLUSIVE:
            raise RetrievalInconclusiveError(
                f"no passage was clearly relevant and {len(selection.uncertain)} were uncertain",
                uncertain=selection.uncertain,
            )
        by_id = {node.node.node_id: node for node in authorized}
        chosen = [with_probability(by_id[node_id], selection.scores[node_id]) for node_id in selection.selected]
        return _limit(chosen, limit)


def _unavailable_message(reason: Reason) -> str:
    if reason is Reason.CANDIDATE_TOO_LARGE:
        return (
            "a candidate is too large to judge in one request (CANDIDATE_TOO_LARGE); this is not an "
            "empty result: split the documents into smaller nodes"
        )
    return (
        f"the relevance judge failed ({reason.value}); this is not an empty result: the knowledge "
        "base was not searched to a conclusion, retry later"
    )


def _counts(nodes: Sequence[NodeWithScore], authorized: Sequence[NodeWithScore]) -> dict[str, int]:
    """What the record says the retrieval did before the judge: retrieved, and denied by the ACL."""
    return {"retrieved": len(nodes), "denied": len(nodes) - len(authorized)}


def _limit(nodes: list[NodeWithScore], limit: int | None) -> list[NodeWithScore]:
    return nodes if limit is None else nodes[:limit]
