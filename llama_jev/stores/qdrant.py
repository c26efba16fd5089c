"""Pushdown into Qdrant (``QdrantVectorStore``): the ACL as metadata filters, ANDed with the caller's.

:func:`qdrant_filters` (also ``MetadataAcl.filters(ctx, store="qdrant")``) states the ACL as
LlamaIndex ``MetadataFilters``; the Qdrant integration turns them into Qdrant's native
``Filter`` with every value a typed field of the request, never part of a query string. The
store's class is recognised by name, so ``llama_jev`` imports without the ``qdrant`` extra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.rules import AclTerms, MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import KeyCensus, Pushdown, Seen, acl_metadata_filters, restrict_filters, vector_store_of

__all__ = ["QdrantPushdown", "is_qdrant", "qdrant_filters", "sync_only"]

_SYNC_ONLY_WARNING = (
    "aretrieve over a QdrantVectorStore without an async client: running the sync retrieval in a "
    "worker thread. Pass aclient=AsyncQdrantClient(...) to QdrantVectorStore for native async retrieval."
)


def is_qdrant(retriever: BaseRetriever) -> bool:
    """Whether ``retriever`` reads a ``QdrantVectorStore``."""
    store = vector_store_of(retriever)
    return store is not None and type(store).__name__ == "QdrantVectorStore"


def qdrant_filters(acl: MetadataAcl, ctx: RuntimeContext) -> MetadataFilters:
    """``acl`` for ``ctx`` as ``MetadataFilters`` for a ``QdrantVectorStore``: exact on well-formed metadata.

    ``tenant EQ`` AND a nested OR of ``users IN [user_id]``, ``roles IN ctx.roles``,
    ``public EQ "true"``, ``public EQ 1``, ``public EQ True``. Qdrant matches a condition on a list
    field when any element matches, so string and list values are both exact, and it tells
    ``True`` from ``1`` (the boolean filter is built without LlamaIndex's validation, which
    refuses boolean values; Qdrant's filter builder passes it through). A caller who can match
    nothing gets a filter no node satisfies.

    Example::

        retriever = index.as_retriever(similarity_top_k=20, filters=qdrant_filters(acl, ctx))
    """
    return acl_metadata_filters(acl, ctx, lambda terms: _qdrant_grants(acl, terms))


def _qdrant_grants(acl: MetadataAcl, terms: AclTerms) -> list[MetadataFilter]:
    grants: list[MetadataFilter] = []
    # Qdrant's IN becomes MatchAny, which on a list payload matches any element.
    if acl.users_key is not None and terms.user is not None:
        grants.append(MetadataFilter(key=acl.users_key, operator=FilterOperator.IN, value=[terms.user]))
    if acl.roles_key is not None and terms.roles:
        grants.append(MetadataFilter(key=acl.roles_key, operator=FilterOperator.IN, value=list(terms.roles)))
    if acl.public_key is not None:
        grants.extend(_equals(acl.public_key, value) for value in terms.public)
    return grants


def _equals(key: str, value: str | int | bool) -> MetadataFilter:
    if isinstance(value, bool):
        # LlamaIndex's MetadataFilter refuses a boolean (its value types are strict int / float /
        # str); Qdrant matches it natively (MatchValue(value=True)), and tells it from 1.
        return MetadataFilter.model_construct(key=key, operator=FilterOperator.EQ, value=value)
    return MetadataFilter(key=key, operator=FilterOperator.EQ, value=value)


class QdrantPushdown(Pushdown):
    """The ACL as Qdrant metadata filters, ANDed with the retriever's own ``filters``."""

    name: ClassVar[str] = "qdrant"

    def __init__(self, retriever: BaseRetriever, acl: MetadataAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        # Fail now, not on the first query, when this store cannot express the ACL.
        qdrant_filters(acl, RuntimeContext(user_id="probe", tenant_id="probe", roles=frozenset({"probe"})))

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return is_qdrant(retriever) and hasattr(retriever, "_filters")

    def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
        restrict_filters(self.retriever, upstream, qdrant_filters(self.acl, ctx))

    @classmethod
    def in_thread(cls, retriever: BaseRetriever) -> tuple[bool, str | None]:
        """A store with a sync client only: LlamaIndex's async Qdrant path needs an ``AsyncQdrantClient``.

        Qdrant local mode cannot open one folder with both clients, and agents call
        ``aretrieve``, so the sync retrieval runs in a worker thread (with a warning once).
        """
        return (True, _SYNC_ONLY_WARNING) if sync_only(retriever) else (False, None)

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
