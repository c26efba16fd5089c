"""What every store adapter is: the ACL of one retriever, pushed down into that retriever's store."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.rules import AclTerms, MetadataAcl
from llama_jev.core.identity import RuntimeContext

__all__ = [
    "acl_metadata_filters",
    "KeyCensus",
    "Pushdown",
    "Seen",
    "match_nothing",
    "restrict_filters",
    "retrieve_in_thread",
    "vector_store_of",
]

# A value no tenant, user or role field holds: with IS_EMPTY on the same key, a filter no node
# satisfies on every store (an empty field cannot equal a non-empty string).
_NOTHING_SENTINEL = "llama_jev:match-nothing"

Seen = set[tuple[str, ...]]
"""The causes already warned about, per retriever: a warning is said once per retriever and cause."""


@dataclass(frozen=True)
class KeyCensus:
    """What a whole store says about an ACL's keys; key names and counts only, never a value.

    Attributes:
        absent: the configured keys not one of the store's nodes holds, in the order asked.
        nodes: how many nodes were looked at (0: the store is empty, nothing can be concluded).
        where: the store in words, for a message ("the 7 nodes of the in-memory store").
        present: metadata key names the store's nodes do hold (all, or a sample), so a
            misspelling can be shown next to its right spelling.
    """

    absent: tuple[str, ...]
    nodes: int
    where: str
    present: tuple[str, ...] = ()


def vector_store_of(retriever: BaseRetriever) -> Any:
    """The vector store a ``VectorIndexRetriever`` (or a retriever shaped like it) reads, else ``None``."""
    return getattr(retriever, "_vector_store", None)


def match_nothing(key: str) -> MetadataFilters:
    """``MetadataFilters`` no node satisfies: ``key`` is empty AND equals a non-empty string.

    Never an empty filter group instead: Qdrant skips an empty nested filter, which would turn
    "no node" into "every node".
    """
    return MetadataFilters(
        filters=[
            MetadataFilter(key=key, operator=FilterOperator.IS_EMPTY, value=None),
            MetadataFilter(key=key, operator=FilterOperator.EQ, value=_NOTHING_SENTINEL),
        ],
        condition=FilterCondition.AND,
    )


def acl_metadata_filters(
    acl: MetadataAcl, ctx: RuntimeContext, grants: Callable[[AclTerms], list[MetadataFilter]]
) -> MetadataFilters:
    """``acl`` for ``ctx`` as LlamaIndex ``MetadataFilters``: ``tenant EQ`` AND an OR of the grants.

    The shape every ``MetadataFilters`` dialect shares; ``grants`` writes the grant conditions in
    the store's own operators from the caller's :class:`AclTerms`. A single grant joins the tenant
    directly, grants without a tenant are one flat OR, and a caller who can match nothing gets
    :func:`match_nothing`.
    """
    terms = acl.terms(ctx)
    key = acl.tenant_key or acl.roles_key or acl.users_key or acl.public_key
    assert key is not None  # MetadataAcl refuses an ACL without keys
    if terms is None:
        return match_nothing(key)
    conditions: list[MetadataFilter | MetadataFilters] = []
    if acl.tenant_key is not None and terms.tenant is not None:
        conditions.append(MetadataFilter(key=acl.tenant_key, operator=FilterOperator.EQ, value=terms.tenant))
    written = grants(terms)
    if len(written) == 1:
        conditions.append(written[0])
    elif written and not conditions:
        return MetadataFilters(filters=list(written), condition=FilterCondition.OR)
    elif written:
        conditions.append(MetadataFilters(filters=list(written), condition=FilterCondition.OR))
    return MetadataFilters(filters=conditions, condition=FilterCondition.AND)


def restrict_filters(retriever: BaseRetriever, upstream: BaseRetriever, restriction: MetadataFilters) -> None:
    """Give ``upstream`` (this query's copy of ``retriever``) ``restriction`` AND the caller's own ``filters``."""
    existing: MetadataFilters | None = getattr(retriever, "_filters", None)
    # The caller's own filters still apply: both must hold.
    combined = (
        restriction
        if existing is None
        else MetadataFilters(filters=[existing, restriction], condition=FilterCondition.AND)
    )
    upstream._filters = combined  # type: ignore[attr-defined]


class Pushdown(ABC):
    """One retriever's :class:`MetadataAcl`, pushed down into its vector store.

    Built once per ``JevRetriever``; :meth:`restrict` runs per query on a private shallow copy of
    the wrapped retriever, so the caller's retriever is never mutated. Every value an adapter
    sends to its store is bound by the store's own client (a filter object, a bound SQL
    parameter), never pasted into a query string. The in-process ACL still checks every node
    that comes back: pushdown only keeps unreadable nodes out of the store's answer.

    A new store is one subclass: :attr:`name`, :meth:`recognises` and :meth:`restrict`, then
    ``llama_jev.stores.register(MyPushdown)`` (docs/stores-and-pushdown.md, "Write your own
    adapter"). The rest is optional: :meth:`advice`, :meth:`census` / :meth:`acensus`,
    :meth:`in_thread`.
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

    @classmethod
    def in_thread(cls, retriever: BaseRetriever) -> tuple[bool, str | None]:
        """Whether ``aretrieve`` over ``retriever`` runs its sync retrieval in a worker thread, and why.

        ``(False, None)`` by default: ``retriever.aretrieve`` is awaited. An adapter whose store
        answers async queries only by blocking the event loop returns ``(True, warning)``;
        ``warning`` (or ``None``: nothing the caller can change) is logged once per retriever.
        """
        return False, None

    @classmethod
    def census(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus | None:
        """Ask the whole store which of ``keys`` not one of its nodes holds; ``None``: it cannot be asked.

        Optional: an adapter that can ask its store cheaply (a scan of in-memory metadata, one
        ``limit=1`` query per key, one SQL statement) overrides this. With pushdown nothing may
        come back for a misspelled key, and without it the nodes that do come back are a sample,
        so only the store can say that no node holds ``is_public``. The retriever asks once
        (until a non-empty store has answered), whether or not it pushes the ACL down. It must
        name keys only, never read a value into a message.
        """
        return None

    @classmethod
    async def acensus(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus | None:
        """:meth:`census` for ``aretrieve``: by default the sync census in a worker thread."""
        return await asyncio.to_thread(cls.census, retriever, keys)


async def retrieve_in_thread(
    retriever: BaseRetriever, query_bundle: QueryBundle, warned: threading.Event, warning: str | None
) -> list[NodeWithScore]:
    """Run ``retriever``'s sync retrieval in a worker thread, with this task's context (identity, spans) copied.

    For a store whose async path would block the event loop; ``warning``, when given, is logged
    once per ``warned``.
    """
    if warning is not None and not warned.is_set():
        warned.set()
        logging.getLogger("llama_jev").warning(warning)  # the package logger DESIGN names for warnings
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, context.run, retriever.retrieve, query_bundle)
