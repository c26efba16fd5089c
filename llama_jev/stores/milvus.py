"""Pushdown into Milvus (LlamaIndex's ``MilvusVectorStore``): the ACL AND the caller's filters as one expression.

LlamaIndex's own filter translation drops a ``NOT`` (``NOT [tenant == acme]`` became
``tenant == 'acme'``) and pastes values unescaped, and none of these engines take bound filter
parameters. So this adapter writes the whole boolean expression itself, per query, on a private
copy of the retriever, and passes it as the store's ``string_expr`` (``vector_store_kwargs``):
the ACL's restriction (:func:`milvus_expression`) AND the caller's own ``filters``, ``node_ids``
and ``doc_ids`` (:func:`filters_expression`), each value a JSON string literal (quotes,
backslashes and control characters escaped; tested with ``acme' OR 1=1 --``, ``"``, ``\\``).

Metadata LlamaIndex writes sits in the dynamic field, read as ``$meta["key"]`` (any key, dots
and quotes included); a key declared as a ``VARCHAR`` schema field (a partition key on the
tenant, say) is read as that field. Comparisons are type-exact as :func:`~llama_jev.acl.evaluate`
is (``1`` matches ``1.0``, never ``true`` or ``"1"``), and a missing key compares false.

Operator by operator, measured on Milvus Lite 2.5.1 and the ``milvus`` 2.3.5 standalone server
(tests/test_store_milvus.py and the equivalence test in tests/test_store_adapters.py):

================  ==========================================  ===================  ==========
operator          expression                                  server 2.3.5 / 2.4+  Lite 2.5
================  ==========================================  ===================  ==========
equals            ``$meta[k] == v``                           exact                exact
in                ``==`` OR-ed (one type per ``in`` list)     exact                exact
list-contains     ``== v or json_contains($meta[k], v)``      exact                exact
intersects        ``in [..] or json_contains_any(.., [..])``  exact                exact
id-in (node ids)  ``id in [..]``                              exact                exact
id-in (a key)     ``$meta[k] in [..]``                        exact                exact
and / or          ``(..) and (..)`` / ``(..) or (..)``        exact                exact
not               pushed inward: ``!=``; ``not (..)`` else    exact                refused*
================  ==========================================  ===================  ==========

\\* Lite 2.5 answers ``not (...)`` with "unsupported expr proto node": a negated ``equals`` or
``in`` is stated as ``!=`` (which admits a missing key, as ``evaluate`` does), any other negated
operator refuses pushdown there (one warning; the final check decides).

A filtered HNSW search may return fewer than its limit while more rows match (the engine's
"fewer than topk" class), so over an approximate index the store is first asked the filter's
``count(*)``: at most 2,048 matching rows are read and ranked exactly
(:mod:`llama_jev.stores.milvus_answer`; the 2.3.5 server's filtered HNSW returned 0 of 5 for a
caller reading 5 of 10,000 rows, at every window); more, a short answer is complete only when it
holds every match (:func:`~llama_jev.stores.completeness.report_complete`), else widening asks
again. A FLAT index (Milvus Lite's) is exact: its answer is complete as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
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
    ListContains,
    Not,
    Or,
    Restriction,
    Scalar,
    Unknown,
)
from llama_jev.core.errors import UntranslatableFilterError
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import (
    CannotState,
    Pushdown,
    Seen,
    checked_condition,
    checked_scalar,
    condition_of,
    vector_store_of,
)
from llama_jev.stores.milvus_answer import CountedStore

__all__ = ["MilvusPushdown", "filters_expression", "is_milvus", "milvus_expression"]

# Milvus's int64 range: a larger int is not a value its expressions hold.
_INT64 = 2**63

# An expression no row satisfies, on both engines (Lite fails on `id in []` and on `!=` over the primary key).
_NOTHING = '($meta["llama_jev_match_nothing"] == 1 and $meta["llama_jev_match_nothing"] != 1)'

_OPERATORS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "==",
    FilterOperator.NE: "!=",
    FilterOperator.GT: ">",
    FilterOperator.LT: "<",
    FilterOperator.GTE: ">=",
    FilterOperator.LTE: "<=",
}


def _store_of(retriever: BaseRetriever) -> Any:
    store = vector_store_of(retriever)
    return store._store if isinstance(store, CountedStore) else store  # a query's copy reads it through CountedStore


def is_milvus(retriever: BaseRetriever) -> bool:
    """Whether ``retriever`` reads LlamaIndex's ``MilvusVectorStore`` (or a subclass)."""
    store = _store_of(retriever)
    return store is not None and any(
        cls.__name__ == "MilvusVectorStore" and cls.__module__.startswith("llama_index.vector_stores.milvus")
        for cls in type(store).__mro__
    )


def literal(value: Scalar) -> str:
    """``value`` as a Milvus literal: a string JSON-quoted (``"``, ``\\`` and control characters escaped).

    Raises:
        CannotState: a non-finite float or an int outside int64, which no expression holds.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if any(ord(character) < 0x20 or character == "\x7f" for character in value):
            # Milvus Lite 2.5 reads an escaped newline as a backslash and an n: not stated exactly.
            raise CannotState("equals", "a string with a control character")
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise CannotState("equals", "an int outside int64")
        return str(value)
    if not math.isfinite(value):
        raise CannotState("equals", "a non-finite float value")
    return repr(float(value))


class _Dialect:
    """How one collection's keys are read: its ``VARCHAR`` schema fields by name, the rest in ``$meta``."""

    def __init__(
        self, *, lite: bool, varchar: frozenset[str], other: frozenset[str] = frozenset(), id_field: str = "id"
    ) -> None:
        self.lite = lite
        self.varchar = varchar
        self.other = other
        self.id_field = id_field

    def field(self, key: str) -> str:
        if key in self.other:
            # Not in $meta (it would compare false for every row) and not a string field: never guessed.
            raise CannotState("field", "a key that is a schema field of the collection other than VARCHAR")
        return key if key in self.varchar else f"$meta[{literal(key)}]"

    def stated(self, condition: Condition, *, negated: bool = False) -> str | bool:
        """``condition`` (or its negation, pushed inward) as an expression; ``True`` / ``False``: all / none."""
        if isinstance(condition, Not):
            return self.stated(condition.term, negated=not negated)
        if isinstance(condition, (And, Or)):
            conjunction = isinstance(condition, And) != negated  # De Morgan
            return _group([self.stated(term, negated=negated) for term in condition.terms], conjunction)
        if isinstance(condition, Equals):
            return self._equals(condition.key, condition.value, negated)
        if isinstance(condition, In):
            return _group([self._equals(condition.key, value, negated) for value in condition.values], negated)
        if isinstance(condition, IdIn):
            if not condition.ids:
                return negated
            subject = self.id_field if condition.key is None else self.field(condition.key)
            listed = f"{subject} in [{', '.join(literal(value) for value in sorted(condition.ids))}]"
            return self._not(listed, condition.operator) if negated else listed
        values = (condition.value,) if isinstance(condition, ListContains) else tuple(condition.values)
        if not values:
            return negated
        field = self.field(condition.key)
        strings = ", ".join(literal(value) for value in sorted(set(values)))
        scalar = f"{field} == {strings}" if len(values) == 1 else f"{field} in [{strings}]"
        if condition.key in self.varchar:  # a VARCHAR field holds one string, never a list
            return self._not(scalar, condition.operator) if negated else scalar
        listed = (
            f"json_contains({field}, {strings})" if len(values) == 1 else f"json_contains_any({field}, [{strings}])"
        )
        either = f"({scalar} or {listed})"
        return self._not(either, condition.operator) if negated else either

    def _equals(self, key: str, value: Scalar, negated: bool) -> str | bool:
        if key in self.varchar and not isinstance(value, str):
            return negated  # a VARCHAR field holds strings only: never equal to another type
        return f"{self.field(key)} {'!=' if negated else '=='} {literal(value)}"

    def _not(self, expression: str, operator: str) -> str:
        if self.lite:
            raise CannotState("not", f"Milvus Lite 2.5 cannot run not (...), needed to negate {operator}")
        return f"not ({expression})"


def _group(parts: Sequence[str | bool], conjunction: bool) -> str | bool:
    """``and`` (``conjunction``) or ``or`` of ``parts``, with true and false folded away."""
    if (not conjunction) in parts:
        return not conjunction  # False absorbs an AND, True an OR
    terms = [part for part in parts if not isinstance(part, bool)]
    if not terms:
        return conjunction
    return terms[0] if len(terms) == 1 else "(" + (" and " if conjunction else " or ").join(terms) + ")"


def milvus_expression(condition: Condition, *, lite: bool = False, varchar: Iterable[str] = ()) -> str | bool:
    """``condition`` as one Milvus boolean expression; ``True``: every row, ``False``: none.

    ``lite``: for Milvus Lite 2.5, which refuses ``not (...)``. ``varchar``: metadata keys that are
    ``VARCHAR`` schema fields of the collection (read by name, not in ``$meta``).

    Raises:
        CannotState (an ``UntranslatableFilterError``): what the engine cannot state (module docstring).

    Example::

        >>> milvus_expression(And((Equals("tenant", "acme' OR 1=1 --"), ListContains("users", "u1"))))
        '($meta["tenant"] == "acme\\' OR 1=1 --" and ($meta["users"] == "u1" or json_contains($meta["users"], "u1")))'
    """
    return _Dialect(lite=lite, varchar=frozenset(varchar)).stated(checked_condition(condition))


def filters_expression(
    filters: MetadataFilters | None,
    *,
    varchar: Iterable[str] = (),
    other: Iterable[str] = (),
    node_ids: Sequence[str] | None = None,
    doc_ids: Sequence[str] | None = None,
    doc_id_field: str = "doc_id",
) -> str | None:
    """The caller's own ``filters``, ``node_ids`` and ``doc_ids`` as one escaped expression; ``None``: none.

    Raises:
        UntranslatableFilterError: a filter with an operator or value this adapter cannot state
            exactly (anything but ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``nin`` over
            scalars, joined by AND / OR).
    """
    dialect = _Dialect(lite=False, varchar=frozenset(varchar), other=frozenset(other))
    parts: list[str] = []
    if filters is not None:
        stated = _filters(dialect, filters)
        if stated is not None:
            parts.append(stated)
    if node_ids:
        parts.append(f"{dialect.id_field} in [{', '.join(literal(value) for value in node_ids)}]")
    if doc_ids:
        parts.append(f"{doc_id_field} in [{', '.join(literal(value) for value in doc_ids)}]")
    return None if not parts else parts[0] if len(parts) == 1 else "(" + " and ".join(parts) + ")"


def _filters(dialect: _Dialect, filters: MetadataFilters) -> str | None:
    joins = {FilterCondition.AND: " and ", FilterCondition.OR: " or "}
    join = joins.get(filters.condition or FilterCondition.AND)
    if join is None:
        raise UntranslatableFilterError(f"a filter group with condition {_name(filters.condition)}")
    parts = []
    for item in filters.filters:
        stated = _filters(dialect, item) if isinstance(item, MetadataFilters) else _filter(dialect, item)
        if stated is not None:
            parts.append(stated)
    return None if not parts else parts[0] if len(parts) == 1 else "(" + join.join(parts) + ")"


def _filter(dialect: _Dialect, item: MetadataFilter) -> str:
    where = f"the filter on key {item.key!r} with operator {_name(item.operator)}"
    try:
        if item.operator in (FilterOperator.IN, FilterOperator.NIN) and isinstance(item.value, list):
            values = [literal(checked_scalar("filter", value)) for value in item.value]
            if not values:
                raise UntranslatableFilterError(f"{where} and an empty list")
            negated = item.operator is FilterOperator.NIN
            joined = (" and " if negated else " or ").join(
                f"{dialect.field(item.key)} {'!=' if negated else '=='} {value}" for value in values
            )
            return f"({joined})"
        operator = _OPERATORS.get(item.operator)
        if operator is None or isinstance(item.value, list):
            raise UntranslatableFilterError(where)
        return f"{dialect.field(item.key)} {operator} {literal(checked_scalar('filter', item.value))}"
    except CannotState as refused:
        raise UntranslatableFilterError(f"{where} ({refused.why})") from refused


def _name(value: Any) -> str:
    return repr(getattr(value, "value", value))


def _flat(store: Any) -> bool:
    """Whether the store's dense field has a FLAT index (exact search); ``False`` when it cannot be told."""
    try:
        described = store.client.describe_index(store.collection_name, index_name=store.embedding_field)
    except Exception:
        return False
    return str((described or {}).get("index_type", "")).upper() == "FLAT"


def _schema(store: Any) -> tuple[bool, frozenset[str], frozenset[str]]:
    """Whether ``store`` is Milvus Lite, its ``VARCHAR`` schema fields and its other ones (the primary key excluded)."""
    client = store.client
    uri = str(getattr(getattr(client, "_config", None), "uri", ""))
    # pymilvus starts Milvus Lite for a local path ending in .db and talks to it over a unix socket.
    lite = uri.endswith(".db") or (uri.startswith("unix:") and ".db" in uri)
    described = client.describe_collection(store.collection_name)
    fields = [field for field in described.get("fields", []) if not field.get("is_primary")]
    # pymilvus gives a DataType enum (str() of it is "21"): compared by name.
    varchar = frozenset(field["name"] for field in fields if getattr(field.get("type"), "name", None) == "VARCHAR")
    return lite, varchar, frozenset(field["name"] for field in fields) - varchar


class MilvusPushdown(Pushdown):
    """The ACL AND the caller's own filters as one escaped expression, for a retriever over ``MilvusVectorStore``."""

    name: ClassVar[str] = "milvus"
    short_is_complete: ClassVar[bool] = False  # a filtered HNSW search may stop short (see the module docstring)

    def __init__(self, retriever: BaseRetriever, acl: BatchAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        store = vector_store_of(retriever)
        self._lite, self._varchar, self._other = _schema(store)
        self._exact_index = _flat(store)
        self._own = _own_expression(retriever, self._varchar, self._other)  # fails now, not on the first query

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return is_milvus(retriever) and hasattr(retriever, "_filters") and cls._untranslatable(retriever) is None

    @classmethod
    def advice(cls, retriever: BaseRetriever) -> str | None:
        if not is_milvus(retriever):
            return None
        problem = cls._untranslatable(retriever)
        if problem is None:
            return None
        return (
            f"no pushdown into Milvus: {problem} of the wrapped retriever cannot be stated exactly as a Milvus "
            "expression, so the ACL is applied after retrieval only (denied nodes take top-k slots). Use ==, !=, <, "
            "<=, >, >=, in or nin filters over scalars to have the ACL pushed down with them."
        )

    @classmethod
    def _untranslatable(cls, retriever: BaseRetriever) -> str | None:
        try:
            _own_expression(retriever, ())
        except UntranslatableFilterError as error:
            return str(error)
        return None

    @classmethod
    def in_thread(cls, retriever: BaseRetriever) -> tuple[bool, str | None]:
        """For a store built with ``use_async_client=False`` (Milvus Lite, say): its ``aquery`` has no client."""
        if is_milvus(retriever) and getattr(_store_of(retriever), "aclient", True) is None:
            return True, None
        return False, None

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """``restriction`` AND the caller's own filters as the query's ``string_expr``."""
        if isinstance(restriction, Unknown):
            return False
        try:
            condition = None if isinstance(restriction, Everything) else condition_of(restriction)
            stated: str | bool = (
                True
                if condition is None and isinstance(restriction, Everything)
                else False
                if condition is None
                else _Dialect(lite=self._lite, varchar=self._varchar, other=self._other).stated(condition)
            )
        except CannotState as refused:
            return self.refuse(refused.operator, refused.why)
        expression = _group([stated, *([self._own] if self._own else [])], True)
        # True: no filter (an empty expression); False: one no row satisfies (Lite fails on an empty in-list).
        text = "" if expression is True else _NOTHING if expression is False else str(expression)
        kwargs = dict(getattr(self.retriever, "_kwargs", None) or {})
        kwargs["string_expr"] = text
        # Everything is in string_expr now: the store ignores it beside filters, node ids or doc ids.
        upstream._filters = None  # type: ignore[attr-defined]
        upstream._node_ids = None  # type: ignore[attr-defined]
        upstream._doc_ids = None  # type: ignore[attr-defined]
        upstream._kwargs = kwargs  # type: ignore[attr-defined]
        upstream._vector_store = CountedStore(_store_of(self.retriever), text, exact_index=self._exact_index)  # type: ignore[attr-defined]
        return True


def _own_expression(retriever: BaseRetriever, varchar: Iterable[str], other: Iterable[str] = ()) -> str | None:
    """The caller's own restriction: its ``filters``, ``node_ids``, ``doc_ids`` and ``string_expr``."""
    store = vector_store_of(retriever)
    own = filters_expression(
        getattr(retriever, "_filters", None),
        varchar=varchar,
        other=other,
        node_ids=getattr(retriever, "_node_ids", None),
        doc_ids=getattr(retriever, "_doc_ids", None),
        doc_id_field=str(getattr(store, "doc_id_field", "doc_id")),
    )
    kwargs: Mapping[str, Any] = getattr(retriever, "_kwargs", None) or {}
    custom = kwargs.get("string_expr")
    parts = [part for part in (own, f"({custom})" if custom else None) if part]
    return None if not parts else " and ".join(parts)
