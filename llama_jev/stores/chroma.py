"""Pushdown into Chroma (LlamaIndex's ``ChromaVectorStore``): the ACL AND the caller's filters as one ``where``.

The stock store cannot carry the ACL as ``MetadataFilters``: it has no operator for "a list
holds this value", and it refuses a native ``where`` beside ``filters``. So this adapter writes
the whole ``where`` itself, per query, on a private copy of the retriever: the ACL
(:func:`chroma_where`) AND the caller's own ``filters`` (:func:`filters_where`, the stock store's
own translation, operator for operator) AND any ``where`` the caller passed in
``vector_store_kwargs``. Every value is a value of Chroma's filter document, never parsed as an
operator: an identity ``"$ne"`` is compared as the string ``"$ne"``.

Exact, measured against Chroma 1.5 (server and embedded; tests/test_store_chroma.py): the tenant
(``$eq`` on a string matches only that string, never a list or a number); a user or role grant as
a string (``$eq`` / ``$in``) or a member of a list of strings (``$contains``, which never
matches a substring of a scalar); the public flag ``"true"``, ``1`` or ``True`` (Chroma compares by
type, so ``True`` does not match ``1``). Not exact, so the in-process ACL removes them: a public
flag of the float ``1.0`` (Chroma compares numbers by value) and malformed grant values (numbers
under a users or roles key), which the ACL denies and Chroma's ``where`` cannot tell apart.

Any restriction (:func:`chroma_condition`), operator by operator, measured against Chroma 1.5:

- ``equals``: ``$eq``, exact for a string, a boolean, an int and a float with an integral value
  (Chroma compares numbers by value and never matches a list with ``$eq``); a float with a
  fraction is a superset (Chroma also matches an int field with its integral part: ``1.5``
  matches ``1``). ``in``: an OR of ``$eq`` (Chroma's ``$in`` wants values of one type).
- ``list-contains``: ``$eq`` OR ``$contains``; ``intersects``: ``$in`` OR one ``$contains`` per
  value; ``id-in`` with a key: ``$in`` on it. Exact (Chroma's arrays hold one type).
- ``id-in`` without a key: the query's ``ids`` (Chroma's own ids are the node ids), as a term the
  whole condition ANDs; inside an ``or`` / ``not`` it is refused (a ``where`` cannot read ids).
- ``and`` / ``or``: ``$and`` / ``$or``; ``not``: pushed inward (De Morgan) down to ``$ne``,
  ``$nin`` and ``$not_contains``, which Chroma reads as the exact negation (a missing key, a list
  or another type is "not equal"), so a missing field under ``not`` is admitted, as ``evaluate``
  admits it. Refused under ``not``: a float with a fraction (its ``$eq`` is a superset, so its
  ``$ne`` would be a subset) and ``id-in`` without a key.
- a key starting with ``$``: refused (Chroma would read it as an operator).

A caller's filter this adapter cannot state exactly (``CONTAINS``, ``TEXT_MATCH``, ``NOT``, a key
starting with ``$``, ...): no pushdown for that retriever, and one WARNING naming the filter's key
and operator (never its value). A restriction it cannot state: no pushdown for that query, and
one WARNING naming the operator. The store's class is recognised by name, so ``llama_jev``
imports without the ``chroma`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

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
    Unknown,
)
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.errors import UntranslatableFilterError
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import (
    CannotState,
    KeyCensus,
    Pushdown,
    Seen,
    checked_condition,
    condition_of,
    node_id_terms,
    vector_store_of,
)

__all__ = [
    "ChromaPushdown",
    "UntranslatableFilterError",
    "chroma_condition",
    "chroma_where",
    "filters_where",
    "is_chroma",
]

Where = dict[str, Any]
"""A Chroma ``where`` document."""

# The stock store's operator table (llama_index.vector_stores.chroma.base), and so exactly what
# it would send for the same filter: translated here the same way, nothing else.
_OPERATORS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.LT: "$lt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
}
_CONDITIONS: dict[FilterCondition, str] = {FilterCondition.AND: "$and", FilterCondition.OR: "$or"}

# A value no metadata field holds: `key == it AND key != it` holds for no node.
_NOTHING_SENTINEL = "llama_jev:match-nothing"

# Metadata read per page by the census, and the most nodes it reads before it gives up.
_CENSUS_PAGE = 1000
_CENSUS_LIMIT = 20_000


def is_chroma(retriever: BaseRetriever) -> bool:
    """Whether ``retriever`` reads LlamaIndex's ``ChromaVectorStore`` (or a subclass)."""
    store = vector_store_of(retriever)
    return store is not None and any(
        cls.__name__ == "ChromaVectorStore" and cls.__module__.startswith("llama_index.vector_stores.chroma")
        for cls in type(store).__mro__
    )


def chroma_where(acl: MetadataAcl, ctx: RuntimeContext) -> Where:
    """``acl`` for ``ctx`` as a Chroma ``where``: exact for string and list-of-string grants.

    :meth:`MetadataAcl.condition` stated by :func:`chroma_condition`.

    Example::

        >>> acl = MetadataAcl(tenant_key="tenant", users_key="users")
        >>> chroma_where(acl, RuntimeContext(user_id="u1", tenant_id="acme"))  # doctest: +NORMALIZE_WHITESPACE
        {'$and': [{'tenant': {'$eq': 'acme'}},
                  {'$or': [{'users': {'$eq': 'u1'}}, {'users': {'$contains': 'u1'}}]}]}
    """
    condition = acl.condition(ctx)
    if condition is None:
        return _nothing(acl.keys[0])
    return chroma_condition(condition)


def chroma_condition(condition: Condition) -> Where:
    """``condition`` as one Chroma ``where`` (see the module docstring for each operator).

    ``{}`` when it admits every node (no ``where`` at all). ``IdIn`` without a key (node ids) is
    not a ``where``: :class:`ChromaPushdown` states it as the query's ``ids``.

    Raises:
        CannotState (an ``UntranslatableFilterError``): what Chroma cannot state exactly or as a
            superset (see the module docstring).

    Example::

        >>> chroma_condition(Not(ListContains("users", "u1")))
        {'$and': [{'users': {'$ne': 'u1'}}, {'users': {'$not_contains': 'u1'}}]}
    """
    stated = _stated(checked_condition(condition), negated=False)
    if stated is True:
        return {}
    if stated is False:
        return _nothing(_NOTHING_KEY)
    return stated


# A where, or True / False: every node / none (folded away before Chroma sees them).
_Stated = Where | bool
_NOTHING_KEY = "llama_jev_match_nothing"


def _nothing(key: str) -> Where:
    return {"$and": [{key: {"$eq": _NOTHING_SENTINEL}}, {key: {"$ne": _NOTHING_SENTINEL}}]}


def _stated(condition: Condition, *, negated: bool) -> _Stated:
    """``condition`` (or its negation, pushed inward: Chroma's ``where`` has no ``$not``)."""
    if isinstance(condition, Not):
        return _stated(condition.term, negated=not negated)
    if isinstance(condition, (And, Or)):
        conjunction = isinstance(condition, And) != negated  # De Morgan
        return _group([_stated(term, negated=negated) for term in condition.terms], conjunction)
    if isinstance(condition, IdIn) and condition.key is None:
        raise CannotState("id-in", "Chroma's where cannot read node ids: only as a term the whole condition ANDs")
    assert condition.key is not None  # IdIn without a key is refused above
    key = _key(condition.operator, condition.key)
    if isinstance(condition, Equals):
        return _equals(key, condition.value, negated=negated)
    if isinstance(condition, In):
        return _group([_equals(key, value, negated=negated) for value in condition.values], negated)
    if isinstance(condition, ListContains):
        return _strings(key, [condition.value], negated=negated, one=True)
    if isinstance(condition, Intersects):
        return _strings(key, list(condition.values), negated=negated, one=False)
    if not condition.ids:
        return negated
    return {key: {"$nin" if negated else "$in": sorted(condition.ids)}}


def _key(operator: str, key: str) -> str:
    if key.startswith("$"):
        raise CannotState(operator, "a metadata key starting with $, which Chroma reads as an operator")
    return key


def _equals(key: str, value: str | int | float | bool, *, negated: bool) -> Where:
    if negated and isinstance(value, float) and not value.is_integer():
        # Chroma matches an int field with a float's integral part ($eq 1.5 matches 1): a superset,
        # so its negation would drop a node the condition admits.
        raise CannotState("not", "a negated equals with a float value that has a fraction")
    return {key: {"$ne" if negated else "$eq": value}}


def _strings(key: str, values: list[str], *, negated: bool, one: bool) -> _Stated:
    """``key`` is one of ``values`` or a list holding one (exact in both shapes), or its negation.

    ``one``: a single value, compared with ``$eq`` / ``$ne``; else ``$in`` / ``$nin``.
    """
    if not values:
        return negated
    # A scalar is matched by $eq / $in, a list of strings by $contains (never by $eq, and
    # $contains never matches inside a scalar string): both shapes, one condition each.
    scalar: Where = {
        key: {("$ne" if negated else "$eq") if one else ("$nin" if negated else "$in"): values[0] if one else values}
    }
    listed = [{key: {"$not_contains" if negated else "$contains": value}} for value in values]
    return _group([scalar, *listed], negated)


def _group(parts: Sequence[_Stated], conjunction: bool) -> _Stated:
    """``$and`` (``conjunction``) or ``$or`` of ``parts``, true and false folded, same-operator groups flattened."""
    operator = "$and" if conjunction else "$or"
    if (not conjunction) in parts:
        return not conjunction  # False absorbs an AND, True an OR
    flat: list[Where] = []
    for part in parts:
        if isinstance(part, bool):
            continue  # the neutral element
        flat.extend(part[operator] if set(part) == {operator} else [part])
    if not flat:
        return conjunction
    return _join(operator, flat)


def filters_where(filters: MetadataFilters | None) -> Where | None:
    """The caller's ``MetadataFilters`` as a Chroma ``where``, as the stock store translates them; ``None``: none.

    Raises:
        UntranslatableFilterError: a filter the stock store does not translate either (its
            operators are ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``nin``, joined
            by AND / OR), or a key starting with ``$``, which Chroma would read as an operator.
    """
    if filters is None:
        return None
    condition = _CONDITIONS.get(filters.condition or FilterCondition.AND)
    if condition is None:
        raise UntranslatableFilterError(f"a filter group with condition {_name(filters.condition)}")
    parts: list[Where] = []
    for item in filters.filters:
        if isinstance(item, MetadataFilters):
            nested = filters_where(item)
            if nested is not None:
                parts.append(nested)
            continue
        parts.append(_filter_where(item))
    return _join(condition, parts) if parts else None


def _filter_where(item: MetadataFilter) -> Where:
    operator = _OPERATORS.get(item.operator)
    if operator is None:
        raise UntranslatableFilterError(f"the filter on key {item.key!r} with operator {_name(item.operator)}")
    if item.key.startswith("$"):
        raise UntranslatableFilterError(
            f"the filter on key {item.key!r} (Chroma reads a key starting with $ as an operator)"
        )
    return {item.key: {operator: item.value}}


def _name(value: Any) -> str:
    return repr(getattr(value, "value", value))


def _join(operator: str, parts: Sequence[Where]) -> Where:
    # Chroma refuses $and / $or with fewer than two members.
    if not parts:
        return {}
    return dict(parts[0]) if len(parts) == 1 else {operator: list(parts)}


def _own_where(retriever: BaseRetriever) -> Where | None:
    """The caller's own restriction: its ``filters`` AND its ``vector_store_kwargs`` ``where``."""
    parts = [
        where
        for where in (filters_where(getattr(retriever, "_filters", None)), _kwargs_of(retriever).get("where"))
        if where
    ]
    return _join("$and", parts) if parts else None


def _present(retriever: BaseRetriever, ids: frozenset[str] | set[str]) -> list[str]:
    """The ``ids`` the collection holds: Chroma 1.5's query fails outright on an id it does not hold.

    (``get`` does not, so it asks first: one round trip, ids only.)
    """
    if not ids:
        return []
    collection = vector_store_of(retriever)._collection
    found: list[str] = collection.get(ids=sorted(ids), include=[])["ids"]
    return sorted(found)


def _kwargs_of(retriever: BaseRetriever) -> Mapping[str, Any]:
    kwargs: Mapping[str, Any] = getattr(retriever, "_kwargs", None) or {}
    return kwargs


class ChromaPushdown(Pushdown):
    """The ACL AND the caller's own filters as one native ``where``, for a retriever over ``ChromaVectorStore``."""

    name: ClassVar[str] = "chroma"

    def __init__(self, retriever: BaseRetriever, acl: BatchAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        if isinstance(acl, MetadataAcl) and (operators := [key for key in acl.keys if key.startswith("$")]):
            raise ValueError(
                f"MetadataAcl key {operators[0]!r} cannot be pushed into Chroma, which reads a key starting with $ "
                "as an operator: name the metadata key otherwise, or pass prefilter=False"
            )
        _own_where(retriever)  # fail now, not on the first query, if the caller's filters cannot be stated

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return (
            is_chroma(retriever)
            and hasattr(retriever, "_filters")
            and hasattr(retriever, "_kwargs")
            and cls._untranslatable(retriever) is None
        )

    @classmethod
    def advice(cls, retriever: BaseRetriever) -> str | None:
        if not is_chroma(retriever):
            return None
        problem = cls._untranslatable(retriever)
        if problem is None:
            return None
        return (
            f"no pushdown into Chroma: {problem} of the wrapped retriever cannot be stated exactly as a Chroma where, "
            "so the ACL is applied after retrieval only (denied nodes take top-k slots, and the wrapped retriever's "
            "events carry them). Use ==, !=, <, <=, >, >=, in or nin filters to have the ACL pushed down with them."
        )

    @classmethod
    def _untranslatable(cls, retriever: BaseRetriever) -> str | None:
        try:
            _own_where(retriever)
        except UntranslatableFilterError as error:
            return str(error)
        return None

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """``restriction`` AND the caller's own filters as one ``where``; node ids as the query's ``ids``."""
        if isinstance(restriction, (Unknown, Everything)):
            return isinstance(restriction, Everything)
        kwargs = dict(_kwargs_of(self.retriever))
        try:
            condition = condition_of(restriction)
            ids, rest = (None, Or(())) if condition is None else node_id_terms(condition)
            where = chroma_condition(rest)
        except CannotState as refused:
            return self.refuse(refused.operator, refused.why)
        if ids is not None:
            own = kwargs.get("ids")
            admitted = _present(
                self.retriever, ids if own is None else ids & set([own] if isinstance(own, str) else own)
            )
            if admitted:
                kwargs["ids"] = admitted
            else:
                where = _nothing(_NOTHING_KEY)  # never ids=[]: not every Chroma version reads it as "none"
        own_where = _own_where(self.retriever)
        parts = [part for part in (where, own_where) if part]
        # The stock store refuses `where` beside `filters`: both are in `where` now. A new dict,
        # since the shallow copy shares the caller's.
        upstream._filters = None  # type: ignore[attr-defined]
        kwargs.pop("where", None)
        if parts:
            kwargs["where"] = parts[0] if len(parts) == 1 else {"$and": parts}
        upstream._kwargs = kwargs  # type: ignore[attr-defined]
        return True

    @classmethod
    def in_thread(cls, retriever: BaseRetriever) -> tuple[bool, str | None]:
        """Always for Chroma: ``ChromaVectorStore`` has no async path (its ``aquery`` blocks the event loop).

        Nothing to warn about: no client the caller could pass would change it.
        """
        return (True, None) if is_chroma(retriever) else (False, None)

    @classmethod
    def census(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus | None:
        """Reads metadata page by page until every key is found; ``None`` past :data:`_CENSUS_LIMIT` nodes.

        Chroma's ``where`` has no "key exists" (``$ne`` also matches a node without the key), so
        the metadata is read; only key names are kept, and they go nowhere but the census.
        """
        collection = getattr(vector_store_of(retriever), "_collection", None)
        if collection is None:
            return None
        where = f"the records of Chroma collection {collection.name!r}"
        missing = set(keys)
        present: set[str] = set()
        read = 0
        while missing and read < _CENSUS_LIMIT:
            page = collection.get(limit=_CENSUS_PAGE, offset=read, include=["metadatas"])["metadatas"] or []
            for metadata in page:
                present.update(metadata or {})
                missing -= {key for key in missing if (metadata or {}).get(key) is not None}
            read += len(page)
            if len(page) < _CENSUS_PAGE:
                break
        else:
            if missing:
                return None  # too many nodes to read: cannot say
        total = collection.count()
        if total == 0:
            return KeyCensus(absent=(), nodes=0, where=where)
        return KeyCensus(
            absent=tuple(key for key in keys if key in missing),
            nodes=total,
            where=where,
            present=tuple(sorted(present)),
        )
