"""Milvus boolean expressions: a condition of the ACL, or the caller's own filters, stated exactly and escaped.

Split from :mod:`llama_jev.stores.milvus` (the pushdown) by job: this is the dialect. Every value
is a JSON string literal (quotes, backslashes and control characters escaped), every key read as
the collection holds it (:class:`Fields`: its schema fields by name and type, the rest in the
dynamic field ``$meta``); what cannot be stated exactly raises :class:`~llama_jev.stores.base.CannotState`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.conditions import And, Condition, Equals, IdIn, In, ListContains, Not, Or, Scalar
from llama_jev.core.errors import UntranslatableFilterError
from llama_jev.stores.base import CannotState, checked_condition, checked_scalar

__all__ = ["Dialect", "Fields", "filters_expression", "group", "literal", "milvus_expression"]

# Milvus's int64 range: a larger int is not a value its expressions hold.
_INT64 = 2**63

_OPERATORS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "==",
    FilterOperator.NE: "!=",
    FilterOperator.GT: ">",
    FilterOperator.LT: "<",
    FilterOperator.GTE: ">=",
    FilterOperator.LTE: "<=",
}


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


@dataclass(frozen=True)
class Fields:
    """A collection's schema fields that the ACL may read (the primary key and the vectors excluded).

    ``varchar``: ``VARCHAR`` fields (a string each); ``bools``: ``BOOL`` fields; ``arrays``:
    ``ARRAY`` fields of ``VARCHAR`` elements (a grant list); ``nullable``: those of them that may
    hold null (a negation over one is refused: Milvus's ``!=`` is false on null, where
    :func:`~llama_jev.acl.evaluate` reads a missing key as not equal); ``other``: any other field
    (refused, never read as a missing key). Every other key is read in the dynamic field.
    """

    varchar: frozenset[str] = frozenset()
    bools: frozenset[str] = frozenset()
    arrays: frozenset[str] = frozenset()
    nullable: frozenset[str] = frozenset()
    other: frozenset[str] = frozenset()


class Dialect:
    """How one collection's keys are read: its schema fields by name and type, the rest in ``$meta``."""

    def __init__(self, *, lite: bool, fields: Fields = Fields(), id_field: str = "id") -> None:
        self.lite = lite
        self.fields = fields
        self.id_field = id_field

    def field(self, key: str) -> str:
        """``key`` as a scalar expression: a ``VARCHAR`` field by name, else the dynamic field's ``$meta[key]``."""
        fields = self.fields
        if key in fields.other or key in fields.bools or key in fields.arrays:
            # Not in $meta (it would compare false for every row) and not a string field: never guessed.
            raise CannotState("field", "a key that is a schema field of the collection other than VARCHAR")
        return key if key in fields.varchar else f"$meta[{literal(key)}]"

    def stated(self, condition: Condition, *, negated: bool = False) -> str | bool:
        """``condition`` (or its negation, pushed inward) as an expression; ``True`` / ``False``: all / none."""
        if isinstance(condition, Not):
            return self.stated(condition.term, negated=not negated)
        if isinstance(condition, (And, Or)):
            conjunction = isinstance(condition, And) != negated  # De Morgan
            return group([self.stated(term, negated=negated) for term in condition.terms], conjunction)
        if isinstance(condition, Equals):
            return self._equals(condition.key, condition.value, negated)
        if isinstance(condition, In):
            return group([self._equals(condition.key, value, negated) for value in condition.values], negated)
        if isinstance(condition, IdIn):
            if not condition.ids:
                return negated
            subject = self.id_field if condition.key is None else self.field(condition.key)
            listed = f"{subject} in [{', '.join(literal(value) for value in sorted(condition.ids))}]"
            return self._not(listed, condition.operator, condition.key) if negated else listed
        values = (condition.value,) if isinstance(condition, ListContains) else tuple(condition.values)
        key = condition.key
        if not values or key in self.fields.bools:
            return negated  # a BOOL field holds no string
        strings = ", ".join(literal(value) for value in sorted(set(values)))
        if key in self.fields.arrays:  # an ARRAY of VARCHAR: a list, never one string
            one = len(values) == 1
            contains = f"array_contains({key}, {strings})" if one else f"array_contains_any({key}, [{strings}])"
            return self._not(contains, condition.operator, key) if negated else contains
        field = self.field(key)
        scalar = f"{field} == {strings}" if len(values) == 1 else f"{field} in [{strings}]"
        if key in self.fields.varchar:  # a VARCHAR field holds one string, never a list
            return self._not(scalar, condition.operator, key) if negated else scalar
        listed = (
            f"json_contains({field}, {strings})" if len(values) == 1 else f"json_contains_any({field}, [{strings}])"
        )
        either = f"({scalar} or {listed})"
        return self._not(either, condition.operator, key) if negated else either

    def _equals(self, key: str, value: Scalar, negated: bool) -> str | bool:
        fields = self.fields
        if key in fields.arrays or (key in fields.varchar and not isinstance(value, str)):
            return negated  # a list never equals a scalar; a VARCHAR field holds strings only
        if key in fields.bools:
            if not isinstance(value, bool):
                return negated  # type-exact: a BOOL field's true is not 1 or "true"
            if negated:
                self._nullable(key, "equals")
            return f"{key} {'!=' if negated else '=='} {literal(value)}"
        if negated:
            self._nullable(key, "equals")
        return f"{self.field(key)} {'!=' if negated else '=='} {literal(value)}"

    def _nullable(self, key: str, operator: str) -> None:
        if key in self.fields.nullable:
            raise CannotState("not", f"a negated {operator} over a nullable schema field (null is neither == nor !=)")

    def _not(self, expression: str, operator: str, key: str | None) -> str:
        if key is not None:
            self._nullable(key, operator)
        if self.lite:
            raise CannotState("not", f"Milvus Lite 2.5 cannot run not (...), needed to negate {operator}")
        return f"not ({expression})"


def group(parts: Sequence[str | bool], conjunction: bool) -> str | bool:
    """``and`` (``conjunction``) or ``or`` of ``parts``, with true and false folded away."""
    if (not conjunction) in parts:
        return not conjunction  # False absorbs an AND, True an OR
    terms = [part for part in parts if not isinstance(part, bool)]
    if not terms:
        return conjunction
    return terms[0] if len(terms) == 1 else "(" + (" and " if conjunction else " or ").join(terms) + ")"


def milvus_expression(
    condition: Condition, *, lite: bool = False, varchar: Iterable[str] = (), fields: Fields | None = None
) -> str | bool:
    """``condition`` as one Milvus boolean expression; ``True``: every row, ``False``: none.

    ``lite``: for Milvus Lite 2.5, which refuses ``not (...)``. ``varchar``: metadata keys that are
    ``VARCHAR`` schema fields of the collection (read by name, not in ``$meta``); ``fields``: the
    collection's schema fields of every type (:class:`Fields`; ``varchar`` is then ignored).

    Raises:
        CannotState (an ``UntranslatableFilterError``): what the engine cannot state (module docstring).

    Example::

        >>> milvus_expression(And((Equals("tenant", "acme' OR 1=1 --"), ListContains("users", "u1"))))
        '($meta["tenant"] == "acme\\' OR 1=1 --" and ($meta["users"] == "u1" or json_contains($meta["users"], "u1")))'
    """
    known = fields if fields is not None else Fields(varchar=frozenset(varchar))
    return Dialect(lite=lite, fields=known).stated(checked_condition(condition))


def filters_expression(
    filters: MetadataFilters | None,
    *,
    varchar: Iterable[str] = (),
    other: Iterable[str] = (),
    node_ids: Sequence[str] | None = None,
    doc_ids: Sequence[str] | None = None,
    doc_id_field: str = "doc_id",
    fields: Fields | None = None,
) -> str | None:
    """The caller's own ``filters``, ``node_ids`` and ``doc_ids`` as one escaped expression; ``None``: none.

    ``varchar`` / ``other``: the collection's ``VARCHAR`` schema fields and its other ones; or
    ``fields``, all of them by type (:class:`Fields`; ``varchar`` and ``other`` are then ignored).
    A filter reads a ``VARCHAR`` field or the dynamic field; any other field is refused.

    Raises:
        UntranslatableFilterError: a filter with an operator or value this adapter cannot state
            exactly (anything but ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``nin`` over
            scalars, joined by AND / OR).
    """
    known = fields if fields is not None else Fields(varchar=frozenset(varchar), other=frozenset(other))
    dialect = Dialect(lite=False, fields=known)
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


def _filters(dialect: Dialect, filters: MetadataFilters) -> str | None:
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


def _filter(dialect: Dialect, item: MetadataFilter) -> str:
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
