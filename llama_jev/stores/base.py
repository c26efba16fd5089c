"""What every store adapter is: the ACL of one retriever, pushed down into that retriever's store."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from llama_index.core.base.base_retriever import BaseRetriever

from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext

__all__ = ["Pushdown", "Seen", "vector_store_of"]

Seen = set[tuple[str, ...]]
"""The causes already warned about, per retriever: a warning is said once per retriever and cause."""


def vector_store_of(retriever: BaseRetriever) -> Any:
    """The vector store a ``VectorIndexRetriever`` (or a retriever shaped like it) reads, else ``None``."""
    return getattr(retriever, "_vector_store", None)


class Pushdown(ABC):
    """One retriever's :class:`MetadataAcl`, pushed down into its vector store.

    Built once per ``JevRetriever``; :meth:`restrict` runs per query on a private shallow copy of
    the wrapped retriever, so the caller's retriever is never mutated. Every value an adapter
    sends to its store is bound by the store's own client (a filter object, a bound SQL
    parameter), never pasted into a query string. The in-process ACL still checks every node
    that comes back: pushdown only keeps unreadable nodes out of the store's answer.

    A new store: subclass this in ``llama_jev/stores/<store>.py`` and add it to
    ``llama_jev.stores.ADAPTERS``.
    """

    name: ClassVar[str]
    """The store's name in messages and docs ("qdrant", "memory", ...)."""

    def __init__(self, retriever: BaseRetriever, acl: MetadataAcl, seen: Seen) -> None:
        self.retriever = retriever
        self.acl = acl
        self.seen = seen

    @classmethod
    @abstractmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        """Whether ``retriever`` reads a store this adapter speaks, in a way it can restrict."""

    @classmethod
    def advice(cls, retriever: BaseRetriever) -> str | None:
        """Why pushdown is off for ``retriever``'s store although this adapter's store could have it.

        ``None`` (the default) when there is nothing to say; else one sentence naming what to use
        instead, which ``JevRetriever`` logs once at WARNING when it runs without pushdown.
        """
        return None

    @abstractmethod
    def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
        """Restrict ``upstream`` (this query's copy of the retriever) to the nodes ``ctx`` may read."""

    def diagnose_empty(self) -> None:  # noqa: B027 - optional hook: most stores have nothing to add
        """The store returned nothing under the ACL: say if a configured key is absent from the whole store.

        Called at most until it has run once per retriever. With pushdown, nothing may come
        back, so the in-process diagnosis never sees a node; an adapter that can ask its store
        which keys exist does it here. Names keys only, never values.
        """
