"""``JevNodePostprocessor``: the ACL and the relevance judgement as a LlamaIndex node postprocessor."""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_jev.core.context import RuntimeContext, bind_if_given
from llama_jev.engine.pipeline import AnyAcl, JudgedRetrieval
from llama_jev.engine.selector import RELEVANCE_QUESTION, CandidateSelector

__all__ = ["JevNodePostprocessor"]


class JevNodePostprocessor(BaseNodePostprocessor):
    """For ``index.as_query_engine(node_postprocessors=[...])``: ACL, judgement, order, ``top_n``.

    Same semantics as :class:`JevRetriever` without recall expansion: it judges the nodes the
    query engine retrieved. Give the engine a larger ``similarity_top_k`` than ``top_n`` so
    ENFORCE has candidates to choose from.

    Example:
        >>> engine = index.as_query_engine(  # doctest: +SKIP
        ...     similarity_top_k=20, node_postprocessors=[JevNodePostprocessor(selector, acl, top_n=5)]
        ... )
        >>> with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme")):  # doctest: +SKIP
        ...     response = engine.query("What are the refund conditions?")
    """

    top_n: int | None = Field(default=None, description="How many nodes to return at most (None: no limit).")
    question: str = Field(default=RELEVANCE_QUESTION, description="The yes/no question asked per node.")
    _judged: JudgedRetrieval = PrivateAttr()

    def __init__(
        self,
        selector: CandidateSelector,
        acl: AnyAcl,
        top_n: int | None = None,
        *,
        question: str = RELEVANCE_QUESTION,
        **kwargs: Any,
    ) -> None:
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise ValueError(f"top_n must be a positive integer or None, got {top_n!r}")
        super().__init__(top_n=top_n, question=question, **kwargs)
        self._judged = JudgedRetrieval(selector, acl, question=question, component=self.class_name())

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "JevNodePostprocessor"

    @property
    def selector(self) -> CandidateSelector:
        """The selector judging the nodes."""
        return self._judged.selector

    def postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
        query_str: str | None = None,
        ctx: RuntimeContext | None = None,
    ) -> list[NodeWithScore]:
        """Filter ``nodes`` for the bound identity, or for ``ctx`` when given."""
        with bind_if_given(ctx):
            return super().postprocess_nodes(nodes, query_bundle, query_str)

    async def apostprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
        query_str: str | None = None,
        ctx: RuntimeContext | None = None,
    ) -> list[NodeWithScore]:
        """Async :meth:`postprocess_nodes`."""
        with bind_if_given(ctx):
            return await super().apostprocess_nodes(nodes, query_bundle, query_str)

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        ctx = self._judged.identity(None)
        return self._judged.run(_query(query_bundle), nodes, ctx, self.top_n)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        ctx = self._judged.identity(None)
        return await self._judged.arun(_query(query_bundle), nodes, ctx, self.top_n)


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError("JevNodePostprocessor needs the query (query_bundle or query_str) to judge relevance")
    return query_bundle.query_str
