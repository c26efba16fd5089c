"""What a store may pre-select for one caller: the restriction kinds and a small condition language.

An ACL that can say, before retrieval, which nodes a caller might read lets the vector store
search only those (pushdown); the ACL's final check (``allowed``) still decides every node that
comes back. The restriction is one of:

- :class:`Everything`: the caller may read any node (no store filter needed);
- :class:`Nothing`: the caller may read no node (nothing is retrieved at all);
- :class:`Ids`: an allow-list of ids (node ids, or the values of a metadata key such as a
  document id), with the engine's consistency token when it has one;
- :class:`Conditional`: a :data:`Condition` over node metadata;
- :class:`Unknown`: nothing can be said in advance (no pushdown; the final check does it all).

A :data:`Condition` is a small tree of our own (``And``, ``Or``, ``Not``, ``Equals``, ``In``,
``ListContains``, ``Intersects``, ``IdIn``) that each store adapter translates once, in its own
module under ``llama_jev/stores/``. A store may read a condition as a superset (let extra nodes
through, which the final check removes), never as a subset: a permitted node must never be left
out. :func:`evaluate` is the reference meaning every translation is tested against.

Example::

    >>> condition = And((Equals("tenant", "acme"), Or((ListContains("users", "u1"), In("public", ("true", 1))))))
    >>> evaluate(condition, "n1", {"tenant": "acme", "users": ["u1", "u2"]})
    True
    >>> evaluate(condition, "n2", {"tenant": "acme", "users": "u2", "public": "yes"})
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

__all__ = [
    "And",
    "Condition",
    "Conditional",
    "Equals",
    "Everything",
    "IdIn",
    "Ids",
    "In",
    "Intersects",
    "ListContains",
    "Not",
    "Nothing",
    "Or",
    "Restriction",
    "RestrictionKind",
    "Scalar",
    "Unknown",
    "evaluate",
    "operators",
]

Scalar: TypeAlias = str | int | float | bool
"""A value a condition compares with. Comparisons are type-exact: ``True`` is not ``1``, ``1`` is not ``"1"``."""


def _same(stored: Any, value: Scalar) -> bool:
    # Type-exact equality: a permission is never granted by Python's True == 1 or 1 == 1.0.
    if isinstance(value, bool) or isinstance(stored, bool):
        return type(stored) is type(value) and stored == value
    if isinstance(value, str) or isinstance(stored, str):
        return isinstance(stored, str) and isinstance(value, str) and stored == value
    return isinstance(stored, (int, float)) and stored == value


def _strings(stored: Any) -> frozenset[str] | None:
    """A string, or a list's string elements, as a set; anything else (a number, a dict) is ``None``.

    A list's other elements are passed over rather than spoiling the list: an engine's own check
    (Cerbos's ``"u1" in R.attr.users``) finds ``"u1"`` in ``["u1", 5]``, and a store filter may
    never drop a node the engine allows. ``MetadataAcl`` denies such a list in its own final check.
    """
    if isinstance(stored, str):
        return frozenset((stored,))
    if isinstance(stored, (list, tuple)):
        return frozenset(item for item in stored if isinstance(item, str))
    return None


@dataclass(frozen=True)
class Equals:
    """``metadata[key]`` equals ``value`` (type-exact). A missing key or ``None`` is false."""

    key: str
    value: Scalar
    operator: ClassVar[str] = "equals"


@dataclass(frozen=True)
class In:
    """``metadata[key]`` equals one of ``values`` (a scalar field). An empty ``values`` is false."""

    key: str
    values: tuple[Scalar, ...]
    operator: ClassVar[str] = "in"


@dataclass(frozen=True)
class ListContains:
    """``metadata[key]`` holds ``value``: a list with it as an element, or the string itself.

    A string field is one entry (``"u1"`` holds ``"u1"``, never ``"u10"``); a list's non-string
    elements are passed over (``["u1", 5]`` holds ``"u1"``); any other type holds nothing.
    """

    key: str
    value: str
    operator: ClassVar[str] = "list-contains"


@dataclass(frozen=True)
class Intersects:
    """``metadata[key]`` (a string, or a list's string elements) shares an element with ``values``."""

    key: str
    values: tuple[str, ...]
    operator: ClassVar[str] = "intersects"


@dataclass(frozen=True)
class IdIn:
    """The node's id (``key=None``) or the string ``metadata[key]`` (a document id, say) is one of ``ids``.

    With a key, every chunk whose metadata names a listed document matches: chunks of one
    document share its id and are never collapsed into one.
    """

    ids: frozenset[str]
    key: str | None = None
    operator: ClassVar[str] = "id-in"


@dataclass(frozen=True)
class And:
    """Every term holds (an empty ``And`` is true)."""

    terms: tuple[Condition, ...]
    operator: ClassVar[str] = "and"


@dataclass(frozen=True)
class Or:
    """At least one term holds (an empty ``Or`` is false)."""

    terms: tuple[Condition, ...]
    operator: ClassVar[str] = "or"


@dataclass(frozen=True)
class Not:
    """``term`` does not hold.

    A store that reads a missing field under ``Not`` as true (Qdrant's ``must_not``) or as
    unknown (SQL's ``NULL``) differs only on nodes the final check decides anyway; a translation
    must stay a superset of what the engine allows.
    """

    term: Condition
    operator: ClassVar[str] = "not"


Condition: TypeAlias = Equals | In | ListContains | Intersects | IdIn | And | Or | Not
"""A condition over one node's id and metadata; see the module docstring."""


def evaluate(condition: Condition, node_id: str, metadata: Mapping[str, Any]) -> bool:
    """The reference meaning of ``condition`` for one node: what every store translation must admit.

    Raises:
        TypeError: ``condition`` is not one of this module's condition types.

    Example::

        >>> evaluate(Intersects("roles", ("support", "admin")), "n1", {"roles": "support"})
        True
    """
    if isinstance(condition, And):
        return all(evaluate(term, node_id, metadata) for term in condition.terms)
    if isinstance(condition, Or):
        return any(evaluate(term, node_id, metadata) for term in condition.terms)
    if isinstance(condition, Not):
        return not evaluate(condition.term, node_id, metadata)
    if isinstance(condition, IdIn):
        subject = node_id if condition.key is None else metadata.get(condition.key)
        return isinstance(subject, str) and subject in condition.ids
    if isinstance(condition, Equals):
        return _same(metadata.get(condition.key), condition.value)
    if isinstance(condition, In):
        stored = metadata.get(condition.key)
        return any(_same(stored, value) for value in condition.values)
    if isinstance(condition, ListContains):
        held = _strings(metadata.get(condition.key))
        return held is not None and condition.value in held
    if isinstance(condition, Intersects):
        held = _strings(metadata.get(condition.key))
        return held is not None and not held.isdisjoint(condition.values)
    raise TypeError(f"not a condition: {type(condition).__name__}")


def operators(condition: Condition) -> frozenset[str]:
    """Every operator name ``condition`` uses (``"and"``, ``"in"``, ...): what an adapter must translate.

    Example::

        >>> sorted(operators(Not(Equals("draft", True))))
        ['equals', 'not']
    """
    if isinstance(condition, (And, Or)):
        return frozenset({condition.operator}).union(*(operators(term) for term in condition.terms))
    if isinstance(condition, Not):
        return frozenset({condition.operator}) | operators(condition.term)
    return frozenset({condition.operator})


RestrictionKind: TypeAlias = Literal["everything", "nothing", "ids", "condition", "none"]
"""How a retrieval was pre-selected, as records and spans name it (``none``: no pushdown)."""


@dataclass(frozen=True)
class Everything:
    """The caller may read every node: the store needs no restriction."""

    kind: ClassVar[RestrictionKind] = "everything"


@dataclass(frozen=True)
class Nothing:
    """The caller may read no node: nothing is retrieved, no store is asked."""

    kind: ClassVar[RestrictionKind] = "nothing"


@dataclass(frozen=True)
class Ids:
    """The caller may read at most these ids (node ids, or values of ``metadata[key]``).

    ``token`` is the engine's consistency token the list was read at (a SpiceDB ZedToken), so the
    final check can read at least as fresh; ``None`` when the engine has none.
    """

    ids: frozenset[str]
    key: str | None = None
    token: str | None = None
    kind: ClassVar[RestrictionKind] = "ids"

    @property
    def condition(self) -> IdIn:
        """The allow-list as a condition, for a store that takes only conditions."""
        return IdIn(self.ids, self.key)


@dataclass(frozen=True)
class Conditional:
    """The caller may read at most the nodes ``condition`` admits."""

    condition: Condition
    kind: ClassVar[RestrictionKind] = "condition"


@dataclass(frozen=True)
class Unknown:
    """Nothing can be said before retrieval (a plain callable ACL, a lookup too large or cut short).

    ``reason`` says why, for a log line: no id, value or text.
    """

    reason: str = "the ACL cannot say in advance which nodes the caller may read"
    kind: ClassVar[RestrictionKind] = "none"


Restriction: TypeAlias = Everything | Nothing | Ids | Conditional | Unknown
"""What :meth:`BatchAcl.restriction` answers: what a store may pre-select for one caller."""
