"""Pushdown into Qdrant (``QdrantVectorStore``): a restriction as metadata filters, ANDed with the caller's.

:func:`qdrant_condition` states a condition as LlamaIndex ``MetadataFilters``, and
:func:`qdrant_filters` (also ``MetadataAcl.filters(ctx, store="qdrant")``) states a
``MetadataAcl``'s; the Qdrant integration turns them into Qdrant's native ``Filter`` with every
value a typed field of the request, never part of a query string. The operators, one by one:

- ``equals``: a string or a boolean as ``MatchValue`` (Qdrant tells ``True`` from ``1``); a number
  as the range ``[v, v]``, which matches an int and a float of that value, as ``evaluate`` does
  (``MatchValue(1)`` would miss a stored ``1.0``). A superset only in that Qdrant also matches a
  list field holding the value (a list is never equal to a scalar).
- ``in``: an OR of ``equals``; ``list-contains`` and ``intersects``: ``MatchAny`` (exact on a
  string or a list of strings; a list that also holds a non-string still matches: a superset).
- ``id-in`` with a key: ``MatchAny`` on that key (a superset where the key holds a list). Without
  a key (node ids, which are Qdrant point ids, not payload), only as a term the whole condition
  ANDs: the retriever's ``node_ids`` (``HasId``); inside an ``or`` / ``not`` it is refused.
- ``and`` / ``or``: nested filter groups (an empty ``and`` is true, an empty ``or`` false).
- a key Qdrant would read as a path (``a.b``, ``a[]``) is quoted, so it names the flat key the
  metadata holds; a key holding a double quote is refused.
- ``not``: refused. Qdrant matches a list field when any element matches, so the negation of a
  match can drop a node the ACL admits (``not equals "draft"`` over ``["draft", "final"]``).

A refused operator means no pushdown for that query and one WARNING naming it. The store's class
is recognised by name, so ``llama_jev`` imports without the ``qdrant`` extra.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar, TypeAlias

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.batch import BatchAcl
from llama_jev.acl.conditions import (
    And,
    Condition,
    Equals,
    Everything,
    IdIn,
    In,
    Intersects,
    ListContains,
    Not,
    Or,
    Restriction,
    Scalar,
    Unknown,
)
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import (
    CannotState,
    KeyCensus,
    Pushdown,
    Seen,
    checked_condition,
    condition_of,
    match_nothing,
    node_id_terms,
    restrict_filters,
    vector_store_of,
)

__all__ = ["QdrantPushdown", "is_qdrant", "payload_key", "qdrant_condition", "qdrant_filters", "sync_only"]

# The key of the filter no node satisfies, when a condition names none of its own.
_NOTHING_KEY = "llama_jev_match_nothing"

_Stated: TypeAlias = MetadataFilter | MetadataFilters | bool
"""A condition in Qdrant's terms: a filter, or ``True`` / ``False`` (every node / none)."""

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
    ``public EQ "true"``, ``public EQ 1``, ``public EQ True`` (:meth:`MetadataAcl.condition`, stated
    by :func:`qdrant_condition`). Qdrant matches a condition on a list field when any element
    matches, so string and list values are both exact, and it tells ``True`` from ``1`` (the
    boolean filter is built without LlamaIndex's validation, which refuses boolean values;
    Qdrant's filter builder passes it through). A public flag stored as the float ``1.0`` is
    admitted by the store and denied by the ACL's final check. A caller who can match nothing
    gets a filter no node satisfies.

    Example::

        retriever = index.as_retriever(similarity_top_k=20, filters=qdrant_filters(acl, ctx))
    """
    condition = acl.condition(ctx)
    if condition is None:
        return match_nothing(acl.keys[0])
    return qdrant_condition(condition)


def qdrant_condition(condition: Condition) -> MetadataFilters:
    """``condition`` as ``MetadataFilters`` for a ``QdrantVectorStore``: exact, or a superset on list fields.

    See the module docstring for each operator. ``IdIn`` without a key (node ids) cannot be a
    metadata filter: :class:`QdrantPushdown` states it as the query's ``node_ids``.

    Raises:
        CannotState (an ``UntranslatableFilterError``): ``not``, ``id-in`` without a key, a value
            Qdrant cannot compare.

    Example::

        >>> qdrant_condition(Equals("tenant", "acme")).filters[0].value
        'acme'
    """
    stated = _stated(checked_condition(condition))
    if stated is True:
        return MetadataFilters(filters=[], condition=FilterCondition.AND)
    if stated is False:
        return match_nothing(_first_key(condition) or _NOTHING_KEY)
    return stated if isinstance(stated, MetadataFilters) else MetadataFilters(filters=[stated])


def _stated(condition: Condition) -> _Stated:
    if isinstance(condition, And):
        return _group([_stated(term) for term in condition.terms], FilterCondition.AND)
    if isinstance(condition, Or):
        return _group([_stated(term) for term in condition.terms], FilterCondition.OR)
    if isinstance(condition, Not):
        raise CannotState(
            "not",
            "Qdrant matches a list field when any element matches, so a negated match could drop a node the ACL admits",
        )
    if isinstance(condition, IdIn) and condition.key is None:
        raise CannotState("id-in", "node ids are Qdrant point ids, not payload: only as a term the condition ANDs")
    assert condition.key is not None  # IdIn without a key is refused above
    key = payload_key(condition.operator, condition.key)
    if isinstance(condition, Equals):
        return _equals(key, condition.value)
    if isinstance(condition, In):
        return _group([_equals(key, value) for value in condition.values], FilterCondition.OR)
    if isinstance(condition, ListContains):
        return MetadataFilter(key=key, operator=FilterOperator.IN, value=[condition.value])
    if isinstance(condition, Intersects):
        return _any(key, list(condition.values))
    return _any(key, sorted(condition.ids))


def payload_key(operator: str, key: str) -> str:
    """``key`` as Qdrant addresses that flat payload key: quoted when Qdrant would read it as a path.

    Qdrant reads ``a.b`` as the field ``b`` inside ``a`` and ``a[]`` as an array's elements; the
    metadata LlamaIndex writes (and the ACL reads) is flat, so such a key is quoted (``"a.b"``).

    Raises:
        CannotState: a key holding a double quote, which a quoted key cannot hold.
    """
    path = _path(key)
    if path is None:
        raise CannotState(operator, "a metadata key holding a double quote, which Qdrant cannot address as one key")
    return path


def _path(key: str) -> str | None:
    if '"' in key:
        return None
    return f'"{key}"' if any(character in key for character in ".[]") else key


def _any(key: str, values: list[str]) -> _Stated:
    # Qdrant's IN becomes MatchAny, which on a list payload matches any element.
    return MetadataFilter(key=key, operator=FilterOperator.IN, value=values) if values else False


def _group(parts: list[_Stated], condition: FilterCondition) -> _Stated:
    """AND / OR of ``parts``, with true and false folded away (Qdrant skips an empty nested group)."""
    absorbing = condition == FilterCondition.OR  # True absorbs an OR, False an AND
    if absorbing in parts:
        return absorbing
    filters: list[MetadataFilter | MetadataFilters] = []
    for part in parts:
        if isinstance(part, bool):
            continue  # the neutral element
        if isinstance(part, MetadataFilters) and part.condition == condition:
            filters.extend(part.filters)  # the same join one level down: one flat group
        else:
            filters.append(part)
    if not filters:
        return not absorbing
    return filters[0] if len(filters) == 1 else MetadataFilters(filters=filters, condition=condition)


def _equals(key: str, value: Scalar) -> MetadataFilter:
    if isinstance(value, bool):
        # LlamaIndex's MetadataFilter refuses a boolean (its value types are strict int / float /
        # str); Qdrant matches it natively (MatchValue(value=True)), and tells it from 1.
        return MetadataFilter.model_construct(key=key, operator=FilterOperator.EQ, value=value)
    if isinstance(value, int):
        # The Qdrant store states a float EQ as the range [v, v], which matches 1 and 1.0 alike
        # (evaluate's meaning); MatchValue(1) would miss a stored 1.0. A boolean is not in a range.
        return MetadataFilter(key=key, operator=FilterOperator.EQ, value=float(value))
    return MetadataFilter(key=key, operator=FilterOperator.EQ, value=value)


def _first_key(condition: Condition) -> str | None:
    if isinstance(condition, (And, Or)):
        return next((key for term in condition.terms if (key := _first_key(term)) is not None), None)
    if isinstance(condition, Not):
        return _first_key(condition.term)
    return condition.key


def _point_ids(ids: frozenset[str]) -> set[str]:
    """The ids a Qdrant point can have (UUIDs: the Qdrant store refuses any other string id)."""
    found = set()
    for node_id in ids:
        try:
            uuid.UUID(node_id)
        except ValueError:
            continue  # no point has it
        found.add(node_id)
    return found


class QdrantPushdown(Pushdown):
    """A restriction as Qdrant metadata filters (and node ids), ANDed with the retriever's own."""

    name: ClassVar[str] = "qdrant"

    def __init__(self, retriever: BaseRetriever, acl: BatchAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        if isinstance(acl, MetadataAcl):
            # Fail now, not on the first query, when this store cannot express the ACL.
            qdrant_filters(acl, RuntimeContext(user_id="probe", tenant_id="probe", roles=frozenset({"probe"})))

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return is_qdrant(retriever) and hasattr(retriever, "_filters")

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """``restriction`` as metadata filters AND the caller's, node ids as the query's ``node_ids``."""
        if isinstance(restriction, (Unknown, Everything)):
            return isinstance(restriction, Everything)
        try:
            condition = condition_of(restriction)
            if condition is None:
                restrict_filters(self.retriever, upstream, match_nothing(_NOTHING_KEY))
                return True
            ids, rest = node_id_terms(condition)
            filters = qdrant_condition(rest)
        except CannotState as refused:
            return self.refuse(refused.operator, refused.why)
        if ids is not None:
            # The Qdrant store reads an empty node_ids as no restriction (as_retriever passes []).
            own: list[str] | None = getattr(self.retriever, "_node_ids", None) or None
            admitted = sorted(_point_ids(ids) if own is None else _point_ids(ids) & set(own))
            if not admitted:  # never node_ids=[]: the Qdrant store reads an empty list as no restriction
                filters = match_nothing(_NOTHING_KEY)
            upstream._node_ids = admitted or own  # type: ignore[attr-defined]
        restrict_filters(self.retriever, upstream, filters)
        return True

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

    return models.Filter(must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=_path(key) or key))])


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
