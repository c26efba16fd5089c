"""``JevRetriever``: wrap any LlamaIndex retriever with the ACL and the relevance judgement."""

from __future__ import annotations

import copy
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.schema import NodeWithScore, QueryBundle, QueryType
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import FilterCondition, MetadataFilters
from llama_index_instrumentation import get_dispatcher

from llama_jev.acl import Acl, FilterStore, MetadataAcl
from llama_jev.context import RuntimeContext, bind_if_given, resolve_runtime_context
from llama_jev.execution import Mode
from llama_jev.pipeline import JudgedRetrieval
from llama_jev.selector import MAX_CANDIDATES, RELEVANCE_QUESTION, CandidateSelector

__all__ = ["JevRetriever"]

dispatcher = get_dispatcher(__name__)
_TOP_K_ATTRIBUTE = "similarity_top_k"


class JevRetriever(BaseRetriever):
    """A retriever that returns only what the caller may read and the judge finds relevant.

    Order of work: upstream recall -> ACL -> one independent judgement per authorized node ->
    order by probability -> ``top_k``. The identity is the bound :class:`RuntimeContext` (or
    ``ctx=`` on :meth:`retrieve`).

    Args:
        retriever: any LlamaIndex retriever (vector store, BM25, fusion, ...). It is never mutated.
        selector: the :class:`CandidateSelector`; its mode decides what happens.
        acl: ``acl(ctx, node) -> bool``, e.g. a :class:`MetadataAcl`.
        candidate_limit: in ENFORCE, how many candidates to recall for judgement (1..1024).
        top_k: how many nodes to return; defaults to the wrapped retriever's ``similarity_top_k``
            (no limit for retrievers without one).
        prefilter: also push the ACL down into the vector store as metadata filters, so nodes
            the caller may not read do not crowd authorized ones out of the candidates. Needs a
            :class:`MetadataAcl` and a retriever with ``filters`` (``VectorIndexRetriever``). The
            post-filter stays on. Supported for Qdrant and the in-memory store. Defaults to ``False``;
            :meth:`from_index` turns it on for Qdrant.

    Recall expansion: a retriever with a ``similarity_top_k`` (VectorIndexRetriever, Qdrant,
    BM25, ...) is asked, per query and on a private shallow copy, for ``max(candidate_limit,
    top_k)`` nodes in ENFORCE and ``top_k`` in OFF / SHADOW. Any other retriever is used as it is:
    its own limit decides how many candidates there are.

    Example:
        >>> retriever = JevRetriever(index.as_retriever(similarity_top_k=5), selector, acl)  # doctest: +SKIP
        >>> with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme")):  # doctest: +SKIP
        ...     nodes = retriever.retrieve("What are the refund conditions?")
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        selector: CandidateSelector,
        acl: Acl,
        candidate_limit: int = 20,
        top_k: int | None = None,
        *,
        prefilter: bool = False,
        question: str = RELEVANCE_QUESTION,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError("retriever must be a LlamaIndex BaseRetriever")
        if isinstance(candidate_limit, bool) or not isinstance(candidate_limit, int):
            raise TypeError("candidate_limit must be an integer")
        if not 1 <= candidate_limit <= MAX_CANDIDATES:
            raise ValueError(f"candidate_limit must be between 1 and {MAX_CANDIDATES}, got {candidate_limit}")
        own_top_k = _top_k_of(retriever)
        top_k = own_top_k if top_k is None else top_k
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        self._dialect = _check_prefilter(retriever, acl) if prefilter else None
        self._judged = JudgedRetrieval(selector, acl, question=question)
        self.retriever = retriever
        self.candidate_limit = candidate_limit
        self.top_k = top_k
        super().__init__(callback_manager=callback_manager or retriever.callback_manager, verbose=verbose)

    @classmethod
    def from_index(
        cls,
        index: BaseIndex[Any],
        selector: CandidateSelector,
        acl: Acl,
        candidate_limit: int = 20,
        top_k: int = 5,
        *,
        prefilter: bool | None = None,
        **retriever_kwargs: Any,
    ) -> JevRetriever:
        """Wrap ``index.as_retriever(similarity_top_k=top_k, **retriever_kwargs)``.

        ``prefilter`` defaults to on for a :class:`MetadataAcl` (the store pre-filters, the ACL
        post-filters again), off otherwise.
        """
        inner = index.as_retriever(similarity_top_k=top_k, **retriever_kwargs)
        if prefilter is None:
            # On by default where the store is known to apply the ACL's filters exactly.
            prefilter = isinstance(acl, MetadataAcl) and _store_dialect(inner) == "qdrant"
        return cls(inner, selector, acl, candidate_limit=candidate_limit, top_k=top_k, prefilter=prefilter)

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "JevRetriever"

    @property
    def selector(self) -> CandidateSelector:
        """The selector judging the candidates."""
        return self._judged.selector

    @property
    def acl(self) -> Acl:
        """The ACL applied to every candidate."""
        return self._judged.acl

    @property
    def prefilter(self) -> bool:
        """Whether the ACL is also pushed down into the vector store as metadata filters."""
        return self._dialect is not None

    @property
    def recall_k(self) -> int | None:
        """How many nodes the wrapped retriever is asked for in the current mode."""
        if self._judged.mode is Mode.ENFORCE:
            return max(self.candidate_limit, self.top_k or 0)
        return self.top_k

    def retrieve(self, str_or_query_bundle: QueryType, ctx: RuntimeContext | None = None) -> list[NodeWithScore]:
        """Retrieve for the bound identity, or for ``ctx`` when given."""
        with bind_if_given(ctx):
            return super().retrieve(str_or_query_bundle)

    async def aretrieve(self, str_or_query_bundle: QueryType, ctx: RuntimeContext | None = None) -> list[NodeWithScore]:
        """Async :meth:`retrieve`."""
        with bind_if_given(ctx):
            return await super().aretrieve(str_or_query_bundle)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        ctx = resolve_runtime_context(None)
        nodes = self._upstream(ctx).retrieve(query_bundle)
        return self._judged.run(query_bundle.query_str, nodes, ctx, self.top_k)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        ctx = resolve_runtime_context(None)
        nodes = await self._upstream(ctx).aretrieve(query_bundle)
        return await self._judged.arun(query_bundle.query_str, nodes, ctx, self.top_k)

    def _upstream(self, ctx: RuntimeContext) -> BaseRetriever:
        """The wrapped retriever, or a per-query shallow copy with this query's k and filters.

        A copy, never a mutation: the caller's retriever may serve other queries concurrently.
        """
        k = self.recall_k
        change_k = k is not None and _top_k_of(self.retriever) not in (None, k)
        if not change_k and self._dialect is None:
            return self.retriever
        upstream = copy.copy(self.retriever)
        if change_k:
            setattr(upstream, _TOP_K_ATTRIBUTE, k)
        if self._dialect is not None and isinstance(self.acl, MetadataAcl):
            existing: MetadataFilters | None = getattr(self.retriever, "_filters", None)
            acl_filters = self.acl.filters(ctx, store=self._dialect)
            upstream._filters = _combine(existing, acl_filters)  # type: ignore[attr-defined]
        return upstream

    def _handle_recursive_retrieval(self, query_bundle: QueryBundle, nodes: list[NodeWithScore]) -> list[NodeWithScore]:
        # The wrapped retriever already expanded IndexNodes; expanding again here would put
        # objects behind the ACL and the judge into the result.
        return nodes

    async def _ahandle_recursive_retrieval(
        self, query_bundle: QueryBundle, nodes: list[NodeWithScore]
    ) -> list[NodeWithScore]:
        return nodes


def _store_dialect(retriever: BaseRetriever) -> FilterStore | None:
    """Which filter dialect the retriever's vector store speaks, when it is one we know."""
    store = getattr(retriever, "_vector_store", None)
    if isinstance(store, SimpleVectorStore):
        return "simple"
    if store is not None and type(store).__name__ == "QdrantVectorStore":
        return "qdrant"
    return None


def _check_prefilter(retriever: BaseRetriever, acl: Acl) -> FilterStore:
    if not isinstance(acl, MetadataAcl):
        raise TypeError("prefilter needs a MetadataAcl: only a declarative ACL can become store filters")
    dialect = _store_dialect(retriever)
    if dialect is None or not hasattr(retriever, "_filters"):
        raise TypeError(
            f"prefilter supports Qdrant and the in-memory vector store; {type(retriever).__name__} is neither "
            "(pass your own filters to the wrapped retriever, the ACL still checks every node)"
        )
    # Fail now, not on the first query, when this store cannot express the ACL.
    acl.filters(RuntimeContext(user_id="probe", tenant_id="probe", roles=frozenset({"probe"})), store=dialect)
    return dialect


def _top_k_of(retriever: BaseRetriever) -> int | None:
    value = getattr(retriever, _TOP_K_ATTRIBUTE, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _combine(existing: MetadataFilters | None, acl_filters: MetadataFilters) -> MetadataFilters:
    # The caller's own filters still apply: both must hold.
    if existing is None:
        return acl_filters
    return MetadataFilters(filters=[existing, acl_filters], condition=FilterCondition.AND)
