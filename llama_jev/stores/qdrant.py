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
from collections.abc import Sequence
from typing import Any, ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import KeyCensus, Pushdown, Seen, restrict_filters, vector_store_of

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
        restrict_filters(self.retriever, upstream, self.acl.filters(ctx, store="qdrant"))

    @classmethod
    def census(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus | None:
        """One ``limit=1`` scroll per key, without payload, asks whether any point holds it.

        Plus one scroll of :data:`_KEY_SAMPLE` points for the key names the data does use; only
        the names are read (a payload also holds the node's text, which goes nowhere).
        """
        store = vector_store_of(retriever)
        client = getattr(store, "_client", None)
        if client is None:
            return None
        name = store.collection_name
        if not client.collection_exists(name):
            return KeyCensus(absent=(), nodes=0, where=f"Qdrant collection {name!r}")
        sample, _ = client.scroll(name, limit=_KEY_SAMPLE, with_payload=True, with_vectors=False)
        absent = [
            key
            for key in keys
            if sample and not client.scroll(name, scroll_filter=_holds(key), limit=1, with_payload=False)[0]
        ]
        return _census(name, sample, absent)

    @classmethod
    async def acensus(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus | None:
        """:meth:`census` over the store's async client, or the sync one in a thread."""
        store = vector_store_of(retriever)
        client = getattr(store, "_aclient", None)
        if client is None:
            return await asyncio.to_thread(cls.census, retriever, keys)
        name = store.collection_name
        if not await client.collection_exists(name):
            return KeyCensus(absent=(), nodes=0, where=f"Qdrant collection {name!r}")
        sample, _ = await client.scroll(name, limit=_KEY_SAMPLE, with_payload=True, with_vectors=False)
        absent = [
            key
            for key in keys
            if sample and not (await client.scroll(name, scroll_filter=_holds(key), limit=1, with_payload=False))[0]
        ]
        return _census(name, sample, absent)


# How many points' payload key names show which keys the data does use.
_KEY_SAMPLE = 32


def _holds(key: str) -> Any:
    """A Qdrant filter matching the points whose payload holds ``key`` (not missing, null or empty)."""
    from qdrant_client import models  # only reached with a Qdrant store, so the extra is installed

    return models.Filter(must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=key))])


def _census(name: str, sample: Sequence[Any], absent: Sequence[str]) -> KeyCensus:
    present = sorted({key for point in sample for key in (point.payload or {})})
    return KeyCensus(
        absent=tuple(absent),
        nodes=len(sample),
        where=f"the points of Qdrant collection {name!r}",
        present=tuple(present),
    )


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
