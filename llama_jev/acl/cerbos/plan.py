"""A Cerbos query plan (PlanResources) read as a :mod:`~llama_jev.acl.conditions` restriction.

The PDP answers PlanResources with a filter: ``KIND_ALWAYS_ALLOWED``, ``KIND_ALWAYS_DENIED`` or
``KIND_CONDITIONAL`` with a tree of operators over the resource (``request.resource.attr.<name>``,
``request.resource.id``) in which the principal's values are already substituted. Each operator is
mapped one by one, and only where our condition admits every resource CheckResources allows:

==================================  ==========================================================
plan                                condition
==================================  ==========================================================
``and`` / ``or`` / ``not``          ``And`` / ``Or`` / ``Not``
``eq(R.attr.k, v)``                 ``Equals(k, v)`` (``v`` a string, number or bool)
``ne(R.attr.k, v)``                 ``Not(Equals(k, v))``
``eq(R.id, v)``, ``in(R.id, [..])`` ``IdIn(...)``
``in(v, R.attr.k)``                 ``ListContains(k, v)`` (``v`` a string)
``in(R.attr.k, [..])``              ``In(k, (...))``
``hasIntersection(R.attr.k, [..])`` ``Intersects(k, (...))`` (strings)
``R.attr.k`` alone                  ``Equals(k, True)``
``true`` / ``false``                ``And(())`` / ``Or(())``
==================================  ==========================================================

Why this is a superset: where CEL gives a definite answer for a resource, the condition gives the
same; where CEL errs (a missing attribute, a string where a list was meant), the rule does not
grant, and any answer of ours is at worst an extra node for the final check to remove. Anything
else (``le``, ``startsWith``, ``size``, a comparison of two attributes, a ``null``) is refused,
never guessed: the restriction is :class:`~llama_jev.acl.conditions.Unknown` naming the operator,
and the final check alone decides. A list mixing strings with other values (``["u1", 5]``) holds
its strings, as in CEL. Known gap: CEL's ``"u1" in R.attr.owners`` is also true for a *map*
``{"u1": "editor"}`` (key membership), which ``ListContains`` does not read, so a store leaves such
a node out although the PDP allows it: keep grant attributes as strings or lists of strings.

Example::

    >>> plan = {"filter": {"kind": "KIND_CONDITIONAL", "condition": {"expression": {"operator": "eq",
    ...     "operands": [{"variable": "request.resource.attr.tenant"}, {"value": "acme"}]}}}}
    >>> restriction_from_plan(plan)
    Conditional(condition=Equals(key='tenant', value='acme'))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from llama_jev.acl.conditions import (
    And,
    Condition,
    Conditional,
    Equals,
    Everything,
    IdIn,
    In,
    Intersects,
    ListContains,
    Not,
    Nothing,
    Or,
    Restriction,
    Unknown,
)

__all__ = ["InvalidPlanError", "restriction_from_plan", "translate"]

_ATTRIBUTE = re.compile(r"^(?:request\.resource|R)\.attr\.([A-Za-z_][A-Za-z0-9_]*)$")
_RESOURCE_ID = frozenset({"request.resource.id", "R.id"})


class InvalidPlanError(ValueError):
    """The PDP's plan cannot be read (an unknown kind, a conditional plan without a condition, validation errors).

    The message names what was wrong, never a value from the plan.
    """


class _Untranslatable(Exception):
    def __init__(self, operator: str) -> None:
        super().__init__(operator)
        self.operator = operator


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


class _Reader:
    """One plan's operands to conditions; ``metadata_key`` maps a Cerbos attribute name to the node's metadata key."""

    def __init__(self, metadata_key: Callable[[str], str], id_key: str | None) -> None:
        self.metadata_key = metadata_key
        self.id_key = id_key

    def variable(self, operand: Mapping[str, Any]) -> tuple[str, str | None] | None:
        """``("attr", key)`` or ``("id", None)`` for a resource reference; ``None`` for anything else."""
        name = operand.get("variable") if isinstance(operand, Mapping) else None
        if not isinstance(name, str):
            return None
        if name in _RESOURCE_ID:
            return ("id", None)
        match = _ATTRIBUTE.match(name)
        return ("attr", self.metadata_key(match.group(1))) if match else None

    def split(self, operator: str, operands: list[Any]) -> tuple[tuple[str, str | None], Any, bool]:
        """A binary operator's resource reference, its constant, and whether the constant came first."""
        if len(operands) != 2:
            raise _Untranslatable(operator)
        first, second = operands
        for reference, constant, constant_first in ((first, second, False), (second, first, True)):
            target = self.variable(reference)
            if target is not None and isinstance(constant, Mapping) and "value" in constant:
                return target, constant["value"], constant_first
        raise _Untranslatable(operator)

    def equals(self, operator: str, operands: list[Any]) -> Condition:
        (what, key), value, _ = self.split(operator, operands)
        if what == "id":
            # A resource id is a string: CEL's "id" == 5 is false, not an error.
            return IdIn(frozenset({value}), self.id_key) if isinstance(value, str) else Or(())
        if key is None or not _scalar(value):
            raise _Untranslatable(operator)  # null, a list or a map: no exact store filter
        return Equals(key, value)

    def member(self, operator: str, operands: list[Any]) -> Condition:
        (what, key), value, constant_first = self.split(operator, operands)
        if constant_first:
            # value in R.attr.k: the attribute is the list.
            if what != "attr" or key is None or not isinstance(value, str):
                raise _Untranslatable(operator)
            return ListContains(key, value)
        # R.attr.k in [...] / R.id in [...]: the constant is the list.
        if not isinstance(value, list) or not all(_scalar(item) for item in value):
            raise _Untranslatable(operator)
        if what == "id":
            return IdIn(frozenset(item for item in value if isinstance(item, str)), self.id_key)
        assert key is not None
        return In(key, tuple(value))

    def intersects(self, operator: str, operands: list[Any]) -> Condition:
        (what, key), value, _ = self.split(operator, operands)
        if what != "attr" or key is None or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Untranslatable(operator)
        return Intersects(key, tuple(value))

    def operand(self, operand: Any) -> Condition:
        if not isinstance(operand, Mapping):
            raise _Untranslatable("a malformed operand")
        if "value" in operand:
            value = operand["value"]
            if isinstance(value, bool):
                return And(()) if value else Or(())
            raise _Untranslatable("a constant")
        if "variable" in operand:
            target = self.variable(operand)
            if target is None or target[1] is None:
                raise _Untranslatable("a variable")
            return Equals(target[1], True)  # a boolean attribute standing alone
        expression = operand.get("expression")
        if not isinstance(expression, Mapping):
            raise _Untranslatable("a malformed operand")
        operator = expression.get("operator")
        operands = expression.get("operands") or []
        if not isinstance(operator, str) or not isinstance(operands, list):
            raise _Untranslatable("a malformed expression")
        if operator in ("and", "or"):
            terms = tuple(self.operand(item) for item in operands)
            return And(terms) if operator == "and" else Or(terms)
        if operator == "not" and len(operands) == 1:
            return Not(self.operand(operands[0]))
        if operator == "eq":
            return self.equals(operator, operands)
        if operator == "ne":
            return Not(self.equals(operator, operands))
        if operator == "in":
            return self.member(operator, operands)
        if operator == "hasIntersection":
            return self.intersects(operator, operands)
        raise _Untranslatable(operator)


def translate(
    condition: Mapping[str, Any], metadata_key: Callable[[str], str] = str, id_key: str | None = None
) -> Condition | Unknown:
    """A plan's condition operand as a :data:`Condition`, or :class:`Unknown` naming the first operator it cannot state.

    ``metadata_key`` maps a Cerbos attribute name to the node metadata key it was read from (the
    inverse of ``CerbosAcl``'s ``attribute_keys``); ``id_key`` is the metadata key holding the
    resource id when it is not the node id (``CerbosAcl``'s ``document_id_key``).
    """
    try:
        return _Reader(metadata_key, id_key).operand(condition)
    except _Untranslatable as refused:
        return Unknown(f"the Cerbos plan uses {refused.operator!r}, which no store filter states exactly")


def restriction_from_plan(
    response: Mapping[str, Any], metadata_key: Callable[[str], str] = str, id_key: str | None = None
) -> Restriction:
    """A PlanResources response (the PDP's JSON shape) as a restriction.

    Raises:
        InvalidPlanError: the response holds validation errors, no filter, an unknown kind, or a
            conditional filter without a condition.
    """
    if response.get("validationErrors"):
        raise InvalidPlanError("the plan carries validation errors (the principal or resource fails a schema)")
    plan = response.get("filter")
    if not isinstance(plan, Mapping):
        raise InvalidPlanError("the plan has no filter")
    kind = plan.get("kind")
    if kind == "KIND_ALWAYS_ALLOWED":
        return Everything()
    if kind == "KIND_ALWAYS_DENIED":
        return Nothing()
    if kind != "KIND_CONDITIONAL":
        raise InvalidPlanError("the plan's filter kind is not one of KIND_ALWAYS_ALLOWED, _DENIED, _CONDITIONAL")
    condition = plan.get("condition")
    if not isinstance(condition, Mapping):
        raise InvalidPlanError("a conditional plan came without its condition")
    translated = translate(condition, metadata_key, id_key)
    return translated if isinstance(translated, Unknown) else Conditional(translated)
