"""``JevRetriever``: wrap any LlamaIndex retriever with the ACL and the relevance judgement."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import inspect
import logging
import threading
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.schema import NodeWithScore, QueryBundle, QueryType
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
from llama_index_instrumentation import get_dispatcher

from llama_jev.acl import Acl, FilterStore, MetadataAcl
from llama_jev.context import RuntimeContext, bind_if_given, resolve_runtime_context
from llama_jev.diagnostics import explaining_denial, missing_everywhere, warn_keys_absent, warn_malformed
from llama_jev.execution import Mode
from llama_jev.pipeline import JudgedRetrieval, check_query
from llama_jev.selector import MAX_CANDIDATES, RELEVANCE_QUESTION, CandidateSelector

__all__ = ["JevRetriever"]

dispatcher = get_dispatcher(__name__)
logger = logging.getLogger(__name__)
_TOP_K_ATTRIBUTE = "similarity_top_k"
# Keyword arguments VectorIndexRetriever takes through **kwargs rather than by name.
_PASS_THROUGH_KWARGS = frozenset({"vector_store_kwargs"})


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
        prefilter: also push the ACL down into the vector store, so nodes the caller may not
            read never leave the store: they do not crowd authorized ones out of the candidates,
            and the wrapped retriever's own instrumentation events (``RetrievalEndEvent``) carry
            only readable nodes. Needs a :class:`MetadataAcl` and a ``VectorIndexRetriever`` over
            Qdrant (as metadata filters, ANDed with the retriever's own) or the in-memory
            ``SimpleVectorStore`` (as a node-id restriction computed by the same ACL from the
            store's metadata, so any configuration and any own flat filters work). The
            post-filter stays on. Defaults to ``False``; :meth:`from_index` turns it on for both.

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
        self._keys_checked = False
        self._values_checked = False
        # Once per retriever (not per process): every retriever over a sync-only store is told.
        self._warned_sync_only = threading.Event()
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
        question: str = RELEVANCE_QUESTION,
        **retriever_kwargs: Any,
    ) -> JevRetriever:
        """Wrap ``index.as_retriever(similarity_top_k=top_k, **retriever_kwargs)``.

        ``prefilter`` defaults to on for a :class:`MetadataAcl` over Qdrant or the in-memory
        store (the store pre-filters, the ACL post-filters again), off otherwise (logged once at
        INFO: then the wrapped retriever's events carry nodes the caller may not read).
        ``question`` is the yes/no question asked per node. A keyword the index's retriever does
        not take is a ``TypeError`` (LlamaIndex would swallow a misspelled one silently).

        Example:
            >>> retriever = JevRetriever.from_index(index, selector, acl, top_k=5)  # doctest: +SKIP
        """
        inner = index.as_retriever(similarity_top_k=top_k, **retriever_kwargs)
        _check_retriever_kwargs(index, inner, retriever_kwargs)
        if prefilter is None:
            # On by default wherever the store applies the ACL exactly.
            expressible = _store_dialect(inner) is not None and hasattr(inner, "_filters")
            prefilter = isinstance(acl, MetadataAcl) and expressible
            if not prefilter:
                logger.info(
                    "JevRetriever.from_index: the ACL is applied after retrieval only (no pushdown for %s with %s); "
                    "the wrapped retriever's RetrievalEndEvent carries nodes the caller may not read",
                    type(inner).__name__,
                    type(acl).__name__,
                )
        return cls(
            inner, selector, acl, candidate_limit=candidate_limit, top_k=top_k, prefilter=prefilter, question=question
        )

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
        check_query(query_bundle.query_str)
        ctx = resolve_runtime_context(None)
        nodes = self._upstream(ctx).retrieve(query_bundle)
        if not nodes and self._dialect == "qdrant" and not self._keys_checked:
            self._check_qdrant_keys()
        return self._judged.run(query_bundle.query_str, nodes, ctx, self.top_k)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        check_query(query_bundle.query_str)
        ctx = resolve_runtime_context(None)
        upstream = self._upstream(ctx)
        if _sync_only_qdrant(upstream):
            nodes = await _retrieve_in_thread(upstream, query_bundle, self._warned_sync_only)
        else:
            nodes = await upstream.aretrieve(query_bundle)
        if not nodes and self._dialect == "qdrant" and not self._keys_checked:
            await asyncio.get_running_loop().run_in_executor(None, self._check_qdrant_keys)
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
        if self._dialect == "simple" and isinstance(self.acl, MetadataAcl):
            upstream._node_ids = self._readable_ids(ctx)  # type: ignore[attr-defined]
        elif self._dialect is not None and isinstance(self.acl, MetadataAcl):
            existing: MetadataFilters | None = getattr(self.retriever, "_filters", None)
            acl_filters = self.acl.filters(ctx, store=self._dialect)
            upstream._filters = _combine(existing, acl_filters)  # type: ignore[attr-defined]
        return upstream

    def _readable_ids(self, ctx: RuntimeContext) -> list[str]:
        """For the in-memory store: the ids, among the retriever's own, that ``ctx`` may read.

        Decided by the ACL itself over the metadata the store keeps, so it is exact for every
        configuration and leaves the caller's own ``filters`` untouched (that store rejects
        nested filters). An id the store holds no metadata for is kept: the post-filter decides.
        """
        assert isinstance(self.acl, MetadataAcl)
        store: SimpleVectorStore = self.retriever._vector_store  # type: ignore[attr-defined]
        metadata = store.data.metadata_dict
        own: list[str] | None = getattr(self.retriever, "_node_ids", None)
        ids = list(store.data.embedding_dict) if own is None else own
        readable = [node_id for node_id in ids if node_id not in metadata or self.acl.allows(ctx, metadata[node_id])]
        if len(readable) < len(ids) and not self._values_checked:
            # Denied in the store, so the post-filter never sees them: say if unreadable ACL data
            # is in it. One scan per retriever, not per query (the store may hold many tenants).
            self._values_checked = True
            warn_malformed(
                self.acl, (metadata[node_id] for node_id in ids if node_id in metadata), seen=self._judged.warned
            )
        if ids and not readable and not self._keys_checked:
            # The store denied everything, so the post-filter's diagnosis never sees a node.
            self._keys_checked = True
            stored = [metadata[node_id] for node_id in ids if node_id in metadata]
            missing = missing_everywhere(self.acl, stored)
            if missing:
                present = (key for entry in stored for key in entry)
                warn_keys_absent(missing, f"the {len(ids)} nodes in the store", present, seen=self._judged.warned)
        return readable

    def _check_qdrant_keys(self) -> None:
        """After Qdrant returned nothing under the ACL's filters: is a configured key absent everywhere?

        Once per retriever. One ``limit=1`` scroll per configured key asks whether any point holds
        it; the node fetched stays in this method (no event, no log carries it).
        """
        self._keys_checked = True
        store = self.retriever._vector_store  # type: ignore[attr-defined]
        if not isinstance(self.acl, MetadataAcl) or getattr(store, "_client", None) is None:
            return
        if not store.get_nodes(limit=1):
            return  # an empty collection: nothing was denied
        missing = explaining_denial(
            self.acl,
            (
                key
                for key in self.acl.keys
                if not store.get_nodes(
                    filters=MetadataFilters(
                        filters=[MetadataFilter(key=key, operator=FilterOperator.IS_EMPTY, value=None)],
                        condition=FilterCondition.NOT,
                    ),
                    limit=1,
                )
            ),
        )
        if missing:
            warn_keys_absent(
                missing, f"the points of Qdrant collection {store.collection_name!r}", seen=self._judged.warned
            )

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
        raise TypeError("prefilter needs a MetadataAcl: only a declarative ACL can be pushed into a store")
    dialect = _store_dialect(retriever)
    if dialect is None or not hasattr(retriever, "_filters"):
        raise TypeError(
            f"prefilter supports Qdrant and the in-memory vector store; {type(retriever).__name__} is neither "
            "(pass your own filters to the wrapped retriever, the ACL still checks every node)"
        )
    if dialect == "qdrant":
        # Fail now, not on the first query, when this store cannot express the ACL.
        acl.filters(RuntimeContext(user_id="probe", tenant_id="probe", roles=frozenset({"probe"})), store=dialect)
    return dialect


def _check_retriever_kwargs(index: BaseIndex[Any], retriever: BaseRetriever, kwargs: dict[str, Any]) -> None:
    """Refuse keywords neither ``index.as_retriever`` nor the retriever's constructor names.

    Both accept ``**kwargs`` and drop what they do not know, so a typo (``similarty_top_k``)
    would otherwise change nothing and say nothing.
    """
    known = set(_PASS_THROUGH_KWARGS)
    for function in (index.as_retriever, type(retriever).__init__):
        known.update(
            name
            for name, parameter in inspect.signature(function).parameters.items()
            if parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        )
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"JevRetriever.from_index got keyword argument(s) {', '.join(map(repr, unknown))} that "
            f"{type(index).__name__}.as_retriever / {type(retriever).__name__} do not take; "
            f"known: {', '.join(sorted(known - {'self', 'index'}))}"
        )


def _sync_only_qdrant(retriever: BaseRetriever) -> bool:
    """A retriever over a ``QdrantVectorStore`` built with a sync client only (no ``aclient``)."""
    store = getattr(retriever, "_vector_store", None)
    if store is None or type(store).__name__ != "QdrantVectorStore":
        return False
    return getattr(store, "_aclient", None) is None and getattr(store, "_client", None) is not None


async def _retrieve_in_thread(
    retriever: BaseRetriever, query_bundle: QueryBundle, warned: threading.Event
) -> list[NodeWithScore]:
    """Run the sync retrieval in a worker thread, with this task's context (identity, spans) copied.

    LlamaIndex's async Qdrant path needs an ``AsyncQdrantClient``, and Qdrant local mode cannot
    open one folder with both clients; agents call ``aretrieve``, so this keeps them working.
    """
    if not warned.is_set():
        warned.set()
        logging.getLogger("llama_jev").warning(  # the package logger DESIGN names for warnings
            "aretrieve over a QdrantVectorStore without an async client: running the sync retrieval in a "
            "worker thread. Pass aclient=AsyncQdrantClient(...) to QdrantVectorStore for native async retrieval."
        )
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, context.run, retriever.retrieve, query_bundle)


def _top_k_of(retriever: BaseRetriever) -> int | None:
    value = getattr(retriever, _TOP_K_ATTRIBUTE, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _combine(existing: MetadataFilters | None, acl_filters: MetadataFilters) -> MetadataFilters:
    # The caller's own filters still apply: both must hold.
    if existing is None:
        return acl_filters
    return MetadataFilters(filters=[existing, acl_filters], condition=FilterCondition.AND)
