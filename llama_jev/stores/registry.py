"""Which adapter speaks a retriever's store, and the pushdown it builds; ``JevRetriever`` asks here."""


from __future__ import annotations

import threading

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_jev.acl.rules import Acl, MetadataAcl
from llama_jev.stores import qdrant
from llama_jev.stores.base import Pushdown, Seen
from llama_jev.stores.memory import MemoryPushdown
from llama_jev.stores.postgres import PostgresPushdown
from llama_jev.stores.qdrant import QdrantPushdown

__all__ = ["ADAPTERS", "adapter_for", "advice_for", "aretrieve", "pushdown_for"]

ADAPTERS: tuple[type[Pushdown], ...] = (MemoryPushdown, QdrantPushdown, PostgresPushdown)
"""Every store adapter, asked in order which one speaks a retriever's store."""


def adapter_for(retriever: BaseRetriever) -> type[Pushdown] | None:
    """The adapter that speaks ``retriever``'s store, or ``None`` when pushdown does not."""
    return next((adapter for adapter in ADAPTERS if adapter.recognises(retriever)), None)


def advice_for(retriever: BaseRetriever) -> str | None:
    """What to use instead when ``retriever``'s store could have pushdown in another form, else ``None``.

    E.g. a plain ``PGVectorStore``, whose SQL pastes filter values: ``AclPGVectorStore`` pushes
    the ACL down safely.
    """
    return next((advice for adapter in ADAPTERS if (advice := adapter.advice(retriever)) is not None), None)


def pushdown_for(retriever: BaseRetriever, acl: Acl, seen: Seen) -> Pushdown:
    """The pushdown of ``acl`` into ``retriever``'s store.

    Raises:
        TypeError: ``acl`` is not a :class:`MetadataAcl` (only a declarative ACL can be pushed
            into a store), or no adapter speaks this retriever's store.
        ValueError: the store cannot express this ACL's configuration.
    """
    if not isinstance(acl, MetadataAcl):
        raise TypeError("prefilter needs a MetadataAcl: only a declarative ACL can be pushed into a store")
    adapter = adapter_for(retriever)
    if adapter is None:
        names = ", ".join(adapter.name for adapter in ADAPTERS)
        advice = advice_for(retriever)
        raise TypeError(
            f"prefilter supports these stores: {names}; {type(retriever).__name__} reads none of them "
            + (
                f"({advice})"
                if advice
                else "(pass your own filters to the wrapped retriever, the ACL still checks every node)"
            )
        )
    return adapter(retriever, acl, seen)


async def aretrieve(
    retriever: BaseRetriever, query_bundle: QueryBundle, warned: threading.Event
) -> list[NodeWithScore]:
    """``retriever.aretrieve``, or its sync retrieval in a thread where the store has no async client."""
    if qdrant.sync_only(retriever):
        return await qdrant.retrieve_in_thread(retriever, query_bundle, warned)
    return await retriever.aretrieve(query_bundle)
