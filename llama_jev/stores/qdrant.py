"""Pushdown into Qdrant (``QdrantVectorStore``): the ACL as metadata filters, ANDed with the caller's.

``MetadataAcl.filters(ctx, store="qdrant")`` states the ACL as LlamaIndex ``MetadataFilters``;
the Qdrant integration turns them into Qdrant's native ``Filter`` with every value a typed
field of the request, never part of a query string. The store's class is recognised by name,
so ``llama_jev`` imports without the ``qdrant`` extra.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from typing import ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.diagnostics import explaining_denial, warn_keys_absent
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import Pushdown, Seen, vector_store_of

__all__ = ["QdrantPushdown", "is_qdrant", "retrieve_in_thread", "sync_only"]


def is_qdrant(retriever: BaseRetriever) -> bool:
    """Whether ``retriever`` reads a ``QdrantVectorStore``."""
    store = vector_store_of(retriever)
    return store is not None and type(store).__name__ == "QdrantVectorStore"


class QdrantPushdown(Pushdown):
    """The ACL as Qdrant metadata filters, ANDed with the retriever's own ``filters``."""

    name: ClassVar[str] = "qdrant"

    def __init__(self, retriever: BaseRetriever, acl: MetadataAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        # Fail now, not on the first query, when this store cannot express the ACL.
        acl.filters(RuntimeContext(user_id="probe", tenant_id="probe", roles=frozenset({"probe"})), store="qdrant")

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return is_qdrant(retriever) and hasattr(retriever, "_filters")

    def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
        existing: MetadataFilters | None = getattr(self.retriever, "_filters", None)
        acl_filters = self.acl.filters(ctx, store="qdrant")
        # The caller's own filters still apply: both must hold.
        combined = (
            acl_filters
            if existing is None
            else MetadataFilters(filters=[existing, acl_filters], condition=FilterCondition.AND)
        )
        upstream._filters = combined  # type: ignore[attr-defined]

    def diagnose_empty(self) -> None:
        """One ``limit=1`` scroll per configured key asks whether any point holds it.

        The node fetched stays in this method (no event, no log carries it).
        """
        store = vector_store_of(self.retriever)
        if getattr(store, "_client", None) is None:
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
            warn_keys_absent(missing, f"the points of Qdrant collection {store.collection_name!r}", seen=self.seen)


def sync_only(retriever: BaseRetriever) -> bool:
    """A retriever over a ``QdrantVectorStore`` built with a sync client only (no ``aclient``)."""
    if not is_qdrant(retriever):
        return False
    store = vector_store_of(retriever)
    return getattr(store, "_aclient", None) is None and getattr(store, "_client", None) is not None


async def retrieve_in_thread(
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
