"""What every store adapter is: the ACL of one retriever, pushed down into that retriever's store."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.batch import BatchAcl
from llama_jev.acl.conditions import (
    And,
    Condition,
    Conditional,
    Equals,
    Everything,
    IdIn,
    Ids,
    In,
    Intersects,
    ListContains,
    Not,
    Nothing,
    Or,
    Restriction,
    Scalar,
    Unknown,
)
from llama_jev.acl.rules import AclTerms, MetadataAcl
from llama_jev.core.errors import UntranslatableFilterError
from llama_jev.core.identity import RuntimeContext

__all__ = [
    "CannotState",
    "acl_metadata_filters",
    "checked_condition",
    "checked_scalar",
    "condition_of",
    "KeyCensus",
    "Pushdown",
    "Seen",
    "match_nothing",
    "node_id_terms",
    "restrict_filters",
    "retrieve_in_thread",
    "vector_store_of",
]

logger = logging.getLogger("llama_jev")  # the package logger DESIGN names for warnings

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


class CannotState(UntranslatableFilterError):
    """A store's translation cannot state ``operator`` exactly or as a superset: no pushdown for this query.

    Raised inside an adapter's translation and turned by :meth:`Pushdown.refuse` into one WARNING
    per retriever. ``why`` names the operator's shape or a value's *type*, never a value. An
    :class:`~llama_jev.errors.UntranslatableFilterError` (a ``JevError`` and a ``ValueError``), as
    a caller's filter a store cannot state is.
    """

    def __init__(self, operator: str, why: str) -> None:
        super().__init__(f"{operator}: {why}")
        self.operator = operator
        self.why = why


def checked_scalar(operator: str, value: object) -> Scalar:
    """``value`` if it is a condition value every store can compare (str, int, bool, a finite float).

    Raises:
        CannotState: any other type (named by its type, never its value), or a NaN / infinity,
            which no store compares the way Python does.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise CannotState(operator, "a non-finite float value")
    if not isinstance(value, (str, int, float, bool)):
        raise CannotState(operator, f"a value of type {type(value).__name__}")
    return value


def checked_condition(condition: Condition) -> Condition:
    """``condition``, once every value in it is one :func:`checked_scalar` accepts (and every node a condition).

    Raises:
        CannotState: a value of another type, or something that is not a condition.
    """
    if isinstance(condition, (And, Or)):
        for term in condition.terms:
            checked_condition(term)
    elif isinstance(condition, Not):
        checked_condition(condition.term)
    elif isinstance(condition, Equals):
        _checked_key(condition.operator, condition.key)
        checked_scalar(condition.operator, condition.value)
    elif isinstance(condition, In):
        _checked_key(condition.operator, condition.key)
        for value in condition.values:
            checked_scalar(condition.operator, value)
    elif isinstance(condition, ListContains):
        _checked_key(condition.operator, condition.key)
        _checked_string(condition.operator, condition.value)
    elif isinstance(condition, Intersects):
        _checked_key(condition.operator, condition.key)
        for value in condition.values:
            _checked_string(condition.operator, value)
    elif isinstance(condition, IdIn):
        if condition.key is not None:
            _checked_key(condition.operator, condition.key)
        for value in condition.ids:
            _checked_string(condition.operator, value)
    else:
        raise CannotState(type(condition).__name__, "not one of llama_jev.acl's conditions")
    return condition


def _checked_key(operator: str, key: object) -> None:
    if not isinstance(key, str) or not key:
        raise CannotState(operator, f"a metadata key of type {type(key).__name__} (a non-empty str is needed)")


def _checked_string(operator: str, value: object) -> None:
    if not isinstance(value, str):
        raise CannotState(operator, f"a value of type {type(value).__name__} where a string is compared")


def condition_of(restriction: Nothing | Ids | Conditional, *, checked: bool = True) -> Condition | None:
    """The condition a store must state for ``restriction``; ``None``: match nothing.

    ``checked=False`` skips the values' check, for a store that reads any value as ``evaluate`` does.

    Raises:
        CannotState: a value in it no store can compare (see :func:`checked_condition`).
        TypeError: ``restriction`` is none of the restriction kinds (an engine's bug: never guessed at).
    """
    if isinstance(restriction, Nothing):
        return None
    if not isinstance(restriction, (Ids, Conditional)):
        raise TypeError(
            f"a restriction must be Everything, Nothing, Ids, Conditional or Unknown (llama_jev.acl), "
            f"not {type(restriction).__name__}"
        )
    return checked_condition(restriction.condition) if checked else restriction.condition


def node_id_terms(condition: Condition) -> tuple[frozenset[str] | None, Condition]:
    """The node ids ``condition`` ANDs at its top (``IdIn`` without a key), and the rest of it.

    For a store that reads node ids apart from metadata (a query's ``node_ids`` / ``ids``):
    ``(None, condition)`` when there are none; several such terms intersect.
    """
    terms = condition.terms if isinstance(condition, And) else (condition,)
    ids: frozenset[str] | None = None
    rest: list[Condition] = []
    for term in terms:
        if isinstance(term, IdIn) and term.key is None:
            ids = term.ids if ids is None else ids & term.ids
        else:
            rest.append(term)
    return ids, (rest[0] if len(rest) == 1 else And(tuple(rest)))


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
    """One retriever's ACL, pushed down into its vector store.

    Built once per ``JevRetriever``; :meth:`apply` runs per query on a private shallow copy of
    the wrapped retriever, so the caller's retriever is never mutated. It states the ACL's
    :class:`~llama_jev.acl.conditions.Restriction` for this caller (everything, nothing, an id
    allow-list, a condition) in the store's own terms, exactly or as a superset, never dropping a
    node the restriction admits. Every value an adapter sends to its store is bound by the store's
    own client (a filter object, a bound SQL parameter), never pasted into a query string. The
    ACL's final check still decides every node that comes back: pushdown only keeps unreadable
    nodes out of the store's answer.

    A new store is one subclass: :attr:`name`, :meth:`recognises` and :meth:`apply`, then
    ``llama_jev.stores.register(MyPushdown)`` (docs/stores-and-pushdown.md, "Write your own
    adapter"). An adapter written for 0.2 implements :meth:`restrict` instead; it keeps working
    for a :class:`~llama_jev.acl.rules.MetadataAcl` (and declines any other ACL's restriction).
    The rest is optional: :meth:`advice`, :meth:`census` / :meth:`acensus`, :meth:`in_thread`.
    """

    name: ClassVar[str]
    """The store's name in messages and docs ("qdrant", "memory", ...)."""

    short_is_complete: ClassVar[bool] = True
    """How widening reads an answer shorter than asked when the store said nothing of it
    (:func:`llama_jev.stores.completeness.report_complete`): ``True``, the store holds no more (it
    ranks every admitted row: the in-memory store, Qdrant local); ``False``, it may hold more (an
    HNSW search under a filter can stop short), so widening asks again with a wider window."""

    def __init__(self, retriever: BaseRetriever, acl: BatchAcl, seen: Seen) -> None:
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

    @classmethod
    def implements(cls) -> bool:
        """Whether the class overrides :meth:`apply` or 0.2's :meth:`restrict` (``register`` needs one)."""
        return cls.apply is not Pushdown.apply or cls.restrict is not Pushdown.restrict

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """Restrict ``upstream`` to a superset of what ``restriction`` admits, AND the caller's own filters.

        ``upstream`` is this query's private shallow copy of the wrapped retriever. Returns ``True``
        when the store now pre-selects; ``False`` when it cannot state this restriction (then it
        has logged one WARNING per retriever naming the operator, see :meth:`refuse`) or the
        restriction is :class:`~llama_jev.acl.conditions.Unknown`: the retrieval runs without
        pushdown, and the final check keeps the answer the same.
        :class:`~llama_jev.acl.conditions.Everything` leaves the caller's filters as they are;
        :class:`~llama_jev.acl.conditions.Nothing` is a filter no node satisfies.

        This default serves an adapter written for 0.2, which implements :meth:`restrict`: it is
        called for a ``MetadataAcl``'s own restriction, and any other restriction is declined.
        """
        if isinstance(restriction, Unknown):
            return False
        if isinstance(restriction, Everything):
            return True
        if type(self).restrict is Pushdown.restrict:
            raise NotImplementedError(f"{type(self).__qualname__} implements neither apply() nor restrict()")
        if isinstance(self.acl, MetadataAcl) and restriction == self.acl.restriction(ctx):
            self.restrict(upstream, ctx)
            return True
        return self.refuse(
            restriction.kind,
            f"{type(self).__qualname__} implements 0.2's restrict(), which states a MetadataAcl only "
            "(implement apply())",
        )

    def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
        """0.2's entry point: restrict ``upstream`` to the nodes ``ctx`` may read (the ACL's restriction).

        Kept for adapters and callers written against 0.2; it is :meth:`apply` with
        ``self.acl.restriction(ctx)``. A restriction the store cannot state leaves ``upstream``
        unrestricted (the final check still decides every node).
        """
        if type(self).apply is Pushdown.apply:
            raise NotImplementedError(f"{type(self).__qualname__} implements neither apply() nor restrict()")
        self.apply(upstream, self.acl.restriction(ctx), ctx)

    def refuse(self, operator: str, why: str) -> bool:
        """Decline this query's pushdown: one WARNING per retriever and ``operator``; returns ``False``.

        For :meth:`apply`, when the store cannot state ``operator`` exactly or as a superset (a
        guess could drop a node the ACL allows). ``why`` says which shape or value type, never a
        value, an id or text.
        """
        cause = ("pushdown-refused", self.name, operator)
        if cause not in self.seen:
            self.seen.add(cause)
            logger.warning(
                "no pushdown into %s: it cannot state the %r operator of the %s ACL's restriction exactly or as a "
                "superset (%s). The retrieval runs without pushdown and the ACL's final check decides every node "
                "(denied nodes take top-k slots).",
                self.name,
                operator,
                cast(str, getattr(self.acl, "engine", type(self.acl).__name__)),
                why,
            )
        return False

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
        logger.warning(warning)
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, context.run, retriever.retrieve, query_bundle)
