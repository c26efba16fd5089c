"""Which adapter speaks a retriever's store, and the pushdown it builds; ``JevRetriever`` asks here.

The adapters are asked in the order they were registered: the package's own (in-memory,
Qdrant, PostgreSQL, Chroma, Milvus), then any a program adds with :func:`register`.
"""

from __future__ import annotations

import threading

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_jev.acl.batch import BatchAcl, CallableAcl, batch_acl
from llama_jev.acl.rules import Acl
from llama_jev.stores.base import Pushdown, Seen, retrieve_in_thread
from llama_jev.stores.chroma import ChromaPushdown
from llama_jev.stores.memory import MemoryPushdown
from llama_jev.stores.milvus import MilvusPushdown
from llama_jev.stores.postgres.pushdown import PostgresPushdown
from llama_jev.stores.qdrant import QdrantPushdown

__all__ = ["adapter_for", "adapters", "advice_for", "aretrieve", "pushdown_for", "register"]

_ADAPTERS: list[type[Pushdown]] = [MemoryPushdown, QdrantPushdown, PostgresPushdown, ChromaPushdown, MilvusPushdown]
_LOCK = threading.Lock()


def register(adapter: type[Pushdown]) -> type[Pushdown]:
    """Add ``adapter`` to the adapters ``JevRetriever`` asks; returns it, so it works as a class decorator.

    Asked after those registered before it, so it cannot take over a store another adapter
    already speaks. Registering the same class again changes nothing.

    Raises:
        TypeError: ``adapter`` is not a concrete :class:`Pushdown` subclass with a ``name``.
        ValueError: another registered adapter has the same ``name``.

    Example::

        @register
        class MyStorePushdown(Pushdown):
            name = "mystore"
            ...
    """
    if not (isinstance(adapter, type) and issubclass(adapter, Pushdown)):
        raise TypeError(f"register() takes a Pushdown subclass, not {adapter!r}")
    missing = sorted(getattr(adapter, "__abstractmethods__", ()))
    if not adapter.implements():
        missing.append("restrict (or apply)")
    if missing:
        raise TypeError(f"{adapter.__qualname__} does not implement {', '.join(missing)}: it cannot push an ACL down")
    name = getattr(adapter, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"{adapter.__qualname__} needs a class attribute name (the store's name in messages)")
    with _LOCK:
        if adapter in _ADAPTERS:
            return adapter
        if any(known.name == name for known in _ADAPTERS):
            raise ValueError(
                f"an adapter named {name!r} is already registered; give {adapter.__qualname__} another name"
            )
        _ADAPTERS.append(adapter)
    return adapter


def adapters() -> tuple[type[Pushdown], ...]:
    """Every registered adapter, in the order they are asked which one speaks a retriever's store."""
    return tuple(_ADAPTERS)


def adapter_for(retriever: BaseRetriever) -> type[Pushdown] | None:
    """The adapter that speaks ``retriever``'s store, or ``None`` when pushdown does not."""
    return next((adapter for adapter in adapters() if adapter.recognises(retriever)), None)


def advice_for(retriever: BaseRetriever) -> str | None:
    """Why pushdown is off for ``retriever`` although its store could have it, else ``None``.

    E.g. a plain ``PGVectorStore``, whose SQL pastes filter values: ``AclPGVectorStore`` pushes
    the ACL down safely; or a Chroma retriever with a filter Chroma's ``where`` cannot state exactly.
    """
    return next((advice for adapter in adapters() if (advice := adapter.advice(retriever)) is not None), None)


def pushdown_for(retriever: BaseRetriever, acl: BatchAcl | Acl, seen: Seen) -> Pushdown:
    """The pushdown of ``acl`` (a ``MetadataAcl`` or an engine's :class:`BatchAcl`) into ``retriever``'s store.

    Raises:
        TypeError: ``acl`` is a plain callable (a function cannot be stated as a store filter;
            only an ACL that says its restriction can be pushed down), or no adapter speaks this
            retriever's store.
        ValueError: the store cannot express this ACL's configuration.
    """
    if isinstance(batch_acl(acl), CallableAcl):
        raise TypeError(
            "prefilter needs a MetadataAcl (or an engine's BatchAcl, such as CerbosAcl): only an ACL that states "
            "its restriction can be pushed into a store"
        )
    adapter = adapter_for(retriever)
    if adapter is None:
        names = ", ".join(adapter.name for adapter in adapters())
        advice = advice_for(retriever)
        raise TypeError(
            f"prefilter supports these stores: {names}; {type(retriever).__name__} reads none of them "
            + (
                f"({advice})"
                if advice
                else "(pass your own filters to the wrapped retriever, the ACL still checks every node)"
            )
        )
    return adapter(retriever, batch_acl(acl), seen)


async def aretrieve(
    retriever: BaseRetriever, query_bundle: QueryBundle, warned: threading.Event
) -> list[NodeWithScore]:
    """``retriever.aretrieve``, or its sync retrieval in a thread where an adapter says the store needs it."""
    for adapter in adapters():
        threaded, warning = adapter.in_thread(retriever)
        if threaded:
            return await retrieve_in_thread(retriever, query_bundle, warned, warning)
    return await retriever.aretrieve(query_bundle)
