"""SQL for PostgreSQL + pgvector: ``MetadataAcl.allows``, any condition and LlamaIndex filters as bound
expressions, and :class:`AclFilters`, which carry one caller's ACL (or restriction) inside a query to
``AclPGVectorStore``.

A condition (:func:`condition_clause`) is stated exactly, operator by operator, as ``evaluate``
reads it: ``equals`` a string as a JSON string equal to it, a number or a boolean as JSONB
equality (JSON types kept apart, ``1`` equal to ``1.0``); ``in`` an OR of those;
``list-contains`` / ``intersects`` a string or an array of strings only, holding a value
(``?|``); ``id-in`` without a key the table's ``node_id`` column, with a key a JSON string in the
list; ``and`` / ``or`` as SQL's; ``not`` as ``IS NOT TRUE``, so a missing field (SQL ``NULL``)
reads as false under it too and its negation admits the node, as ``evaluate`` does.

Every key and value is a bound parameter of a SQLAlchemy expression; nothing a caller, a filter
or the stored data holds is ever pasted into the SQL text. The expressions read the
``metadata_`` column of LlamaIndex's ``PGVectorStore`` table, ``JSON`` (the store's default) or
``JSONB`` (``use_jsonb=True``); SQLAlchemy ships with ``llama-index-core``, so this module needs
no PostgreSQL driver.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
from sqlalchemy import Float, and_, any_, cast, exists, false, func, literal, or_, select, true
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, JSONPATH, TEXT
from sqlalchemy.sql.elements import ColumnElement

from llama_jev.acl.conditions import (
    And,
    Condition,
    Conditional,
    Equals,
    IdIn,
    In,
    ListContains,
    Not,
    Or,
    Scalar,
)
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import checked_condition

__all__ = [
    "AclFilters",
    "acl_clause",
    "acl_filters",
    "condition_clause",
    "condition_filters",
    "filter_clause",
    "key_present",
]

# A value no metadata field holds: with IS_EMPTY on the same key, a condition no row satisfies.
_NOTHING_SENTINEL = "llama_jev:match-nothing"

# Present but holding anything other than strings: malformed ACL data (MetadataAcl denies the node).
_NON_STRING_ELEMENT = 'strict $[*] ? (@.type() != "string")'
_PUBLIC_JSON = ('"true"', "1", "true")  # the public flag's values as JSONB (see _acl_conditions)

# The stock store's SQL operators for the comparisons it writes as `<field> <op> <value>`.
_COMPARISONS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "=",
    FilterOperator.NE: "!=",
    FilterOperator.GT: ">",
    FilterOperator.LT: "<",
    FilterOperator.GTE: ">=",
    FilterOperator.LTE: "<=",
}


class AclFilters(MetadataFilters):
    """``MetadataFilters`` carrying one caller's :class:`MetadataAcl` (or any condition) to an ``AclPGVectorStore``.

    Put them in a query's ``filters`` (alone or AND-ed with your own) and ``AclPGVectorStore``
    writes the ACL into that query's SQL as bound parameters (``acl_clause(column, filters.acl,
    filters.ctx, ...)``). The visible ``filters`` match no node on any store, so handed to a store
    that does not know them they return nothing, never everything. Build them with
    :func:`acl_filters` (a ``MetadataAcl``) or :func:`condition_filters` (an engine's condition).
    """

    _acl: MetadataAcl | Conditional = PrivateAttr()
    _ctx: RuntimeContext = PrivateAttr()

    @property
    def acl(self) -> MetadataAcl | Conditional:
        """The ACL to apply: a ``MetadataAcl``, or an engine's restriction as a ``Conditional``."""
        return self._acl

    @property
    def ctx(self) -> RuntimeContext:
        """The caller it is applied for."""
        return self._ctx

    @property
    def restriction_condition(self) -> Condition | None:
        """What the SQL states, as a condition (``None``: no row), e.g. for a planner estimating its size.

        For a ``MetadataAcl`` a superset: its SQL also denies malformed users / roles values.
        """
        return self._acl.condition if isinstance(self._acl, Conditional) else self._acl.condition(self._ctx)


def acl_filters(acl: MetadataAcl, ctx: RuntimeContext) -> AclFilters:
    """The ACL of ``ctx`` as filters for an ``AclPGVectorStore`` query.

    ``JevRetriever`` does this for you; use it where you query the store yourself.

    Example::

        retriever = index.as_retriever(similarity_top_k=5, filters=acl_filters(acl, ctx))
    """
    if not isinstance(acl, MetadataAcl):
        raise TypeError(f"acl must be a MetadataAcl, not {type(acl).__name__}")
    if not isinstance(ctx, RuntimeContext):
        raise TypeError(f"ctx must be a RuntimeContext, not {type(ctx).__name__}")
    return _carrying(acl, ctx, acl.keys[0])


def condition_filters(condition: Condition | None, ctx: RuntimeContext) -> AclFilters:
    """``condition`` (an engine's restriction; ``None``: no node) as filters for an ``AclPGVectorStore`` query.

    ``JevRetriever`` does this for an ACL that is not a ``MetadataAcl``; the store states it with
    :func:`condition_clause`, every value bound.

    Raises:
        CannotState: a value no store can compare (a list, ``None``, NaN), before any query runs.

    Example::

        retriever = index.as_retriever(similarity_top_k=5, filters=condition_filters(Equals("team", "red"), ctx))
    """
    if not isinstance(ctx, RuntimeContext):
        raise TypeError(f"ctx must be a RuntimeContext, not {type(ctx).__name__}")
    stated = Conditional(Or(()) if condition is None else checked_condition(condition))
    return _carrying(stated, ctx, "llama_jev_match_nothing")


def _carrying(acl: MetadataAcl | Conditional, ctx: RuntimeContext, key: str) -> AclFilters:
    restriction = AclFilters(
        filters=[
            MetadataFilter(key=key, operator=FilterOperator.IS_EMPTY, value=None),
            MetadataFilter(key=key, operator=FilterOperator.EQ, value=_NOTHING_SENTINEL),
        ],
        condition=FilterCondition.AND,
    )
    restriction._acl = acl
    restriction._ctx = ctx
    return restriction


class _Field:
    """One metadata key of the ``metadata_`` column, with the key bound."""

    def __init__(self, column: Any, key: str, jsonb: bool) -> None:
        self._column = column
        self._key = literal(key, TEXT)
        self._jsonb = jsonb

    @property
    def raw(self) -> Any:
        """``metadata_ -> key``: the value as JSON (SQL ``NULL`` when the key is absent)."""
        return self._column.op("->")(self._key)

    @property
    def text(self) -> Any:
        """``metadata_ ->> key``: a string value unquoted and unescaped."""
        return self._column.op("->>")(self._key)

    @property
    def kind(self) -> Any:
        """The JSON type: ``'string'``, ``'number'``, ``'boolean'``, ``'array'``, ``'object'``, ``'null'``."""
        return (func.jsonb_typeof if self._jsonb else func.json_typeof)(self.raw)


def _condition(expression: object) -> ColumnElement[bool]:
    # The column is typed loosely by LlamaIndex (a dynamic model), so SQLAlchemy cannot infer this.
    return typing.cast("ColumnElement[bool]", expression)


def _text_array(values: list[str]) -> Any:
    return cast(literal(values, ARRAY(TEXT)), ARRAY(TEXT))


def acl_clause(column: Any, acl: MetadataAcl | Conditional, ctx: RuntimeContext, *, jsonb: bool) -> ColumnElement[bool]:
    """``acl.allows(ctx, metadata)`` as one SQL condition over the ``metadata_`` ``column``.

    (A ``Conditional``, what :func:`condition_filters` carries, is :func:`condition_clause` of its
    condition.)

    True exactly for the rows ``MetadataAcl.allows`` admits, for every stored value, well-formed
    or not (the metadata is read as LlamaIndex reads it back: JSON's own types):

    - tenant: a JSON *string* equal to ``ctx.tenant_id`` (a number, list or missing value denies;
      a caller without a tenant matches nothing);
    - users / roles, each when configured: a present value that is neither a string nor a list
      of strings (``3``, ``{"u": 1}``, ``["u1", 3]``) denies the row whatever else grants it;
      JSON ``null`` counts as absent;
    - grants OR-ed: ``ctx.user_id`` is the users string or in the users list; a role of
      ``ctx.roles`` is the roles string or in the roles list; the public flag is the string
      ``"true"``, the JSON number written ``1`` or ``true`` (``1.0``, ``"True"``, ``"yes"`` are
      not public); no grant configured or matching matches nothing.

    A SQL ``NULL`` anywhere counts as false, so the clause fails closed.

    The tenant is compared as ``metadata_ ->> 'tenant'``, the expression an index on the tenant
    key is built on, so the planner can start from that index. A ``JSON`` column is text that
    every operator parses again, so the rest of the checks read it once, converted to ``JSONB``
    in a subquery the planner may not inline (``OFFSET 0``).
    """
    if isinstance(acl, Conditional):
        return condition_clause(column, acl.condition, jsonb=jsonb)
    if acl.tenant_key is not None and ctx.tenant_id is None:
        return false()
    tenant = (
        [_Field(column, acl.tenant_key, jsonb).text == literal(ctx.tenant_id, TEXT)]
        if acl.tenant_key is not None
        else []
    )
    if jsonb:
        return and_(*tenant, _acl_conditions(column, column, acl, ctx, indexed=True))
    # Correlated to the query's own table: the subquery reads the outer row, never scans the table.
    parsed = select(cast(column, JSONB).label("metadata")).correlate(column.table).offset(0).subquery("acl_row")
    checks = select(literal(1)).select_from(parsed).where(_acl_conditions(parsed.c.metadata, column, acl, ctx))
    return and_(*tenant, exists(checks))


def _acl_conditions(
    document: Any, raw: Any, acl: MetadataAcl, ctx: RuntimeContext, *, indexed: bool = False
) -> ColumnElement[bool]:
    """The ACL over ``document``, the row's metadata as ``JSONB``; ``raw`` is the column as stored.

    ``indexed``: ``document`` is the ``JSONB`` column itself, which the ACL's indexes are built on.
    """
    conditions: list[ColumnElement[bool]] = []
    if acl.tenant_key is not None:
        tenant = _Field(document, acl.tenant_key, jsonb=True)
        conditions.append(and_(tenant.kind == "string", tenant.text == literal(ctx.tenant_id, TEXT)))
    if acl.users_key is None and acl.roles_key is None and acl.public_key is None:
        return and_(true(), *conditions)

    grants: list[ColumnElement[bool]] = []
    for key, held in ((acl.users_key, [ctx.user_id]), (acl.roles_key, sorted(ctx.roles))):
        if key is None:
            continue
        field = _Field(document, key, jsonb=True)
        well_formed = or_(
            field.kind.is_(None),
            field.kind.in_(("null", "string")),
            and_(
                field.kind == "array",
                ~func.jsonb_path_exists(field.raw, cast(literal(_NON_STRING_ELEMENT, TEXT), JSONPATH)),
            ),
        )
        conditions.append(well_formed)
        if held:
            # `?|` asks whether any of `held` is the string itself or a string element of the array.
            grants.append(and_(field.kind.in_(("string", "array")), field.raw.op("?|")(_text_array(held))))
    if acl.public_key is not None:
        flag = _Field(document, acl.public_key, jsonb=True)
        # A number is public when its JSON text is `1`, as Python reads it back (1.0 and 1e0 are
        # floats). JSONB writes 1e0 as 1, so the text as stored is checked too (last: the
        # conjunction stops before it unless the value is a number equal to 1).
        stored_text = cast(raw.op("->")(literal(acl.public_key, TEXT)), TEXT)
        # Over a JSONB column, a superset of the three the B-tree on the flag serves (JSONB's `1` also
        # equals 1.0, which the exact checks then deny): without an index on every arm of the grants'
        # OR, the planner reads the whole table for a caller granted a few rows.
        indexable = [flag.raw == any_(cast(literal(list(_PUBLIC_JSON), ARRAY(TEXT)), ARRAY(JSONB)))] if indexed else []
        grants.append(
            and_(
                *indexable,
                or_(
                    and_(flag.kind == "string", flag.text == literal("true", TEXT)),
                    and_(
                        flag.kind == "number",
                        cast(flag.raw, TEXT) == literal("1", TEXT),
                        stored_text == literal("1", TEXT),
                    ),
                    and_(flag.kind == "boolean", cast(flag.raw, TEXT) == literal("true", TEXT)),
                ),
            )
        )
    conditions.append(or_(*grants) if grants else false())
    return and_(*conditions)


def condition_clause(column: Any, condition: Condition | None, *, jsonb: bool) -> ColumnElement[bool]:
    """``condition`` (``None``: no row) as one SQL condition over the ``metadata_`` ``column`` (and ``node_id``).

    Exact for every operator and every stored value: a row satisfies it exactly when
    ``evaluate(condition, node_id, metadata)`` holds for the metadata as LlamaIndex reads it back
    (see the module docstring). Keys and values are bound parameters. As in :func:`acl_clause`,
    each string ``equals`` the whole condition ANDs is also compared as ``metadata_ ->> key``
    outside the rest (the expression an index on that key is built on), and a ``JSON`` column is
    read once, converted to ``JSONB`` in a subquery the planner may not inline.

    Raises:
        CannotState: a value no store can compare (a list, ``None``, NaN).

    Example::

        store_query_filter = condition_clause(table.c.metadata_, Equals("tenant", "acme"), jsonb=True)
    """
    if condition is None:
        return false()
    checked_condition(condition)
    terms = condition.terms if isinstance(condition, And) else (condition,)
    hoisted = [
        _Field(column, term.key, jsonb).text == literal(term.value, TEXT)
        for term in terms
        if isinstance(term, Equals) and isinstance(term.value, str)
    ]
    table = column.table
    if jsonb:
        return and_(*hoisted, _stated(column, condition, table))
    # Correlated to the query's own table: the subquery reads the outer row, never scans the table.
    parsed = select(cast(column, JSONB).label("metadata")).correlate(table).offset(0).subquery("condition_row")
    checks = select(literal(1)).select_from(parsed).where(_stated(parsed.c.metadata, condition, table))
    return and_(*hoisted, exists(checks))


def _stated(document: Any, condition: Condition, table: Any) -> ColumnElement[bool]:
    """``condition`` over ``document``, the row's metadata as ``JSONB`` (never SQL ``NULL`` where it matters)."""
    if isinstance(condition, And):
        return and_(true(), *(_stated(document, term, table) for term in condition.terms))
    if isinstance(condition, Or):
        return or_(false(), *(_stated(document, term, table) for term in condition.terms))
    if isinstance(condition, Not):
        # A missing field makes the term NULL, which WHERE reads as false; NOT NULL would be NULL
        # too, so the negation is IS NOT TRUE: the node evaluate admits is admitted.
        return _condition(_stated(document, condition.term, table).is_not(true()))
    if isinstance(condition, IdIn) and condition.key is None:
        return _condition(table.c.node_id.in_(sorted(condition.ids))) if condition.ids else false()
    assert condition.key is not None
    field = _Field(document, condition.key, jsonb=True)
    if isinstance(condition, Equals):
        return _equals(field, condition.value)
    if isinstance(condition, In):
        return or_(false(), *(_equals(field, value) for value in condition.values))
    if isinstance(condition, IdIn):
        if not condition.ids:
            return false()
        return and_(field.kind == "string", field.text.in_(sorted(condition.ids)))
    values = [condition.value] if isinstance(condition, ListContains) else list(condition.values)
    if not values:
        return false()
    # The shape acl_clause's grants have: `?|` asks whether any value is the string itself or a
    # string element of the array (other elements are passed over, as evaluate() and the engines do).
    return and_(field.kind.in_(("string", "array")), field.raw.op("?|")(_text_array(values)))


def _equals(field: _Field, value: Scalar) -> ColumnElement[bool]:
    if isinstance(value, str):
        return and_(field.kind == "string", field.text == literal(value, TEXT))
    # JSONB equality keeps JSON's types apart (true is not 1, "1" is not 1) and compares numbers
    # by value (1 equals 1.0), as evaluate does.
    return _condition(field.raw == cast(literal(json.dumps(value), TEXT), JSONB))


def filter_clause(column: Any, filter_: MetadataFilter) -> ColumnElement[bool]:
    """One LlamaIndex ``MetadataFilter`` as the stock ``PGVectorStore`` reads it, with key and value bound.

    Same semantics as ``llama-index-vector-stores-postgres`` 0.9 for every operator (a number
    compares the field cast to float, ``IN`` compares text, ``ANY`` / ``ALL`` / ``CONTAINS``
    read a list field, ``TEXT_MATCH`` is ``LIKE '%value%'``), except that a value is only ever
    a value: ``x' OR 1=1 --``, ``o'brien`` or ``:x`` match rows holding exactly that text.
    """
    field = _Field(column, filter_.key, jsonb=False)
    whole_jsonb = cast(column, JSONB).op("->")(literal(filter_.key, TEXT))
    operator = filter_.operator
    value: Any = filter_.value
    if operator in (FilterOperator.IN, FilterOperator.NIN):
        texts = [str(item) for item in value]
        return _condition(field.text.in_(texts) if operator == FilterOperator.IN else field.text.not_in(texts))
    if operator in (FilterOperator.ANY, FilterOperator.ALL):
        texts = [str(item) for item in value]
        return _condition(whole_jsonb.op("?|" if operator == FilterOperator.ANY else "?&")(_text_array(texts)))
    if operator == FilterOperator.CONTAINS:
        return _condition(whole_jsonb.op("@>")(cast(literal(json.dumps([str(value)]), TEXT), JSONB)))
    if operator in (FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE):
        pattern = literal(f"%{value}%", TEXT)
        return _condition(
            field.text.like(pattern) if operator == FilterOperator.TEXT_MATCH else field.text.ilike(pattern)
        )
    if operator == FilterOperator.IS_EMPTY:
        return _condition(field.text.is_(None))
    # The stock store falls back to "=" for an operator it does not know; so does this.
    symbol = _COMPARISONS.get(operator, "=")
    try:
        number = float(value)
    except ValueError:
        return _condition(field.text.op(symbol, is_comparison=True)(literal(value, TEXT)))
    return _condition(cast(field.text, Float).op(symbol, is_comparison=True)(literal(number, Float)))


def key_present(column: Any, key: str, *, jsonb: bool) -> ColumnElement[bool]:
    """The row's metadata holds ``key``, with a value other than JSON ``null`` (``MetadataAcl``'s "present")."""
    return _condition(_Field(column, key, jsonb).kind != "null")
