"""Who may read a node: the ``Acl`` type, the declarative ``MetadataAcl``, and ``check_acl``.

An ACL is any ``acl(ctx, node) -> bool``. It is deterministic, runs in the process on every
candidate before anything reaches the judge, and fails closed: a non-bool answer is an error and
an ACL that raises fails the retrieval; neither ever lets a node through.

``MetadataAcl`` reads the decision from node metadata, and can also state it as LlamaIndex
``MetadataFilters`` so a vector store narrows its search to the caller's nodes. That pre-filter
only saves recall slots; the in-process check stays in place behind it.

Example::

    acl = MetadataAcl(tenant_key="tenant", users_key="allowed_users", roles_key="allowed_roles",
                      public_key="public")
    retriever = index.as_retriever(similarity_top_k=20, filters=acl.filters(ctx, store="qdrant"))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias

from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import MetadataFilters

from llama_jev.acl.conditions import (
    And,
    Condition,
    Conditional,
    Equals,
    In,
    Intersects,
    ListContains,
    Nothing,
    Or,
    Restriction,
)
from llama_jev.core.context import RuntimeContext

__all__ = ["PUBLIC_VALUES", "Acl", "AclTerms", "FilterStore", "MetadataAcl", "check_acl"]

Acl: TypeAlias = Callable[[RuntimeContext, BaseNode], bool]
"""``acl(ctx, node) -> bool``: ``True`` when the caller ``ctx`` may read ``node``."""

FilterStore: TypeAlias = Literal["qdrant", "simple"]
"""The vector stores ``MetadataAcl.filters`` knows how to address (they read filters differently)."""

# The public flag values the ACL accepts, and so the ones every store dialect must match: the
# string "true", the int 1 and the boolean True (stores that tell them apart match each).
PUBLIC_VALUES: tuple[str | int | bool, ...] = ("true", 1, True)

# store -> (module, function) of its MetadataFilters dialect, beside the store's adapter.
_DIALECTS: dict[str, tuple[str, str]] = {
    "qdrant": ("llama_jev.stores.qdrant", "qdrant_filters"),
    "simple": ("llama_jev.stores.memory", "simple_filters"),
}


@dataclass(frozen=True)
class AclTerms:
    """What a node must hold for one caller to read it, for a store dialect to translate.

    Built by :meth:`MetadataAcl.terms`. Only the keys the ACL configures carry terms: a node is
    readable when its tenant value is the string ``tenant`` (when ``tenant`` is set) and, where
    the ACL has grant keys, one grant holds: ``user`` listed under the users key, one of
    ``roles`` listed under the roles key, or the public flag one of ``public``.

    Attributes:
        tenant: the caller's tenant, or ``None`` when the ACL has no tenant key.
        user: the caller's user id, or ``None`` when the ACL has no users key.
        roles: the caller's roles, sorted (empty when the ACL has no roles key, or none held).
        public: the public flag values that grant (:data:`PUBLIC_VALUES`), or empty.
    """

    tenant: str | None
    user: str | None
    roles: tuple[str, ...]
    public: tuple[str | int | bool, ...]


def _string_set(value: Any) -> frozenset[str] | None:
    """The strings a users / roles field lists, or ``None`` when the value is malformed.

    A string is one entry, a list (or tuple) of strings is several; anything else (a dict, a
    number, a list holding a non-string) is malformed and never coerced: ``3`` is not ``"3"``.
    """
    if isinstance(value, str):
        return frozenset((value,))
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return frozenset(value)
    return None


def _is_public(value: Any) -> bool:
    # Exactly the string "true", the int 1 or the boolean True; not "True", "yes", 1.0 or a list:
    # a public flag is a security decision, so only unmistakable values count. PUBLIC_VALUES names
    # the same three for every store dialect, so the check and the pushed-down filter agree.
    return value is True or (isinstance(value, str) and value == "true") or (type(value) is int and value == 1)


@dataclass(frozen=True)
class MetadataAcl:
    """A declarative ACL over node metadata, usable wherever an ``Acl`` is.

    Only the configured keys are checked. For a caller ``ctx`` a node is readable when both hold:

    1. **Tenant** (if ``tenant_key`` is set): ``metadata[tenant_key]`` is a string equal to
       ``ctx.tenant_id``. A missing value, a non-string value (a list of tenants too), or a caller
       with ``tenant_id=None`` is denied.
    2. **Grant** (if any of ``users_key``, ``roles_key``, ``public_key`` is set): at least one of
       ``ctx.user_id`` is listed under ``users_key``; ``ctx.roles`` shares a role with
       ``roles_key``; the ``public_key`` flag is public. Each grant key the node lacks simply
       grants nothing, so a node lacking *all* configured grant keys is denied, and a node with
       ``users_key`` but no ``roles_key`` is judged on its users alone.

    Values:

    - users / roles: a string (one entry) or a list of strings. Anything else (a dict, an int, a
      list holding a non-string) is malformed and **denies the node**, whatever the other keys
      say: broken ACL data is not guessed around.
    - public flag: the string ``"true"``, the int ``1`` or the boolean ``True`` (what plain
      LlamaIndex code writes). Any other value (``"True"``, ``"yes"``, ``1.0``, ``False``, ...)
      means not public; it never denies by itself. :meth:`filters` matches the same three
      values on every store it supports, so the pre-filter and the check agree.
    - a value of ``None`` counts as missing.

    At least one key must be set: an ACL that checks nothing would let everything through
    silently (pass ``lambda ctx, node: True`` to say that on purpose). Keys must be non-blank and
    distinct.

    Example::

        >>> from llama_index.core.schema import TextNode
        >>> acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles")
        >>> node = TextNode(text="...", metadata={"tenant": "acme", "roles": ["support"]})
        >>> acl(RuntimeContext(user_id="u1", tenant_id="acme", roles={"support"}), node)
        True
        >>> acl(RuntimeContext(user_id="u1", tenant_id="other", roles={"support"}), node)
        False
    """

    tenant_key: str | None = None
    users_key: str | None = None
    roles_key: str | None = None
    public_key: str | None = None
    engine: ClassVar[str] = "metadata"
    # Whether any grant key is configured, read once (allows asks it for every node).
    _grants: bool = field(default=False, init=False, repr=False, compare=False)
    """The ACL's name in records and spans: the decision is read from node metadata."""

    def __post_init__(self) -> None:
        configured: list[str] = []
        for name in ("tenant_key", "users_key", "roles_key", "public_key"):
            key = getattr(self, name)
            if key is None:
                continue
            if not isinstance(key, str):
                raise TypeError(f"MetadataAcl {name} must be a str or None, not {type(key).__name__}")
            if not key.strip():
                raise ValueError(f"MetadataAcl {name} must not be blank")
            configured.append(key)
        if not configured:
            raise ValueError(
                "MetadataAcl needs at least one of tenant_key, users_key, roles_key, public_key: "
                "an ACL that checks nothing would admit every node. To admit everything on purpose, "
                "pass `lambda ctx, node: True` as the ACL."
            )
        if len(set(configured)) != len(configured):
            raise ValueError("MetadataAcl keys must be different metadata keys")
        grants = self.users_key is not None or self.roles_key is not None or self.public_key is not None
        object.__setattr__(self, "_grants", grants)  # frozen: set once, here

    @property
    def keys(self) -> tuple[str, ...]:
        """The configured metadata keys, in the order tenant, users, roles, public."""
        return tuple(key for key in (self.tenant_key, self.users_key, self.roles_key, self.public_key) if key)

    def missing_keys(self, node: BaseNode) -> tuple[str, ...]:
        """The configured keys ``node``'s metadata lacks (absent or ``None``): for diagnosing denials.

        A node lacking every configured key is denied for every caller, usually because the ACL
        names a key the data spells differently (``users`` for ``allowed_users``).

        Example::

            >>> from llama_index.core.schema import TextNode
            >>> MetadataAcl(tenant_key="tenant", users_key="users").missing_keys(
            ...     TextNode(text="...", metadata={"tenant": "acme", "allowed_users": ["u1"]}))
            ('users',)
        """
        return tuple(key for key in self.keys if node.metadata.get(key) is None)

    @property
    def _grant_keys_configured(self) -> bool:
        return self._grants

    def __call__(self, ctx: RuntimeContext, node: BaseNode) -> bool:
        """Return ``True`` when ``ctx`` may read ``node`` (see the class docstring for the rules)."""
        return self.allows(ctx, node.metadata)

    def allows(self, ctx: RuntimeContext, metadata: Mapping[str, Any]) -> bool:
        """The ACL decision from a metadata mapping alone (a vector store's stored metadata, say).

        ``acl(ctx, node)`` is ``acl.allows(ctx, node.metadata)``: one rule, whichever holds the data.
        """
        if self.tenant_key is not None:
            tenant = metadata.get(self.tenant_key)
            if ctx.tenant_id is None or not isinstance(tenant, str) or tenant != ctx.tenant_id:
                return False
        if not self._grants:  # _grant_keys_configured, without a property call per node
            return True

        # Every present users / roles value is checked for shape before any grant counts, so a
        # malformed one denies even when the public flag or another key would have granted.
        granted = False
        if self.users_key is not None and metadata.get(self.users_key) is not None:
            users = _string_set(metadata[self.users_key])
            if users is None:
                return False
            granted = ctx.user_id in users
        if self.roles_key is not None and metadata.get(self.roles_key) is not None:
            roles = _string_set(metadata[self.roles_key])
            if roles is None:
                return False
            granted = granted or not roles.isdisjoint(ctx.roles)
        if self.public_key is not None:
            granted = granted or _is_public(metadata.get(self.public_key))
        return granted

    def terms(self, ctx: RuntimeContext) -> AclTerms | None:
        """What a node must hold for ``ctx`` to read it, store-neutral; ``None``: no node can match.

        Every store dialect (``llama_jev.stores.<store>``) translates these terms, so the
        fail-closed decisions are made here once: a tenant key with ``ctx.tenant_id=None``, or
        grant keys none of which ``ctx`` can match (roles the only grant and no roles), match
        nothing. Roles are sorted, so the same caller always gets the same restriction.

        Raises:
            TypeError: ``ctx`` is not a ``RuntimeContext``.

        Example::

            >>> MetadataAcl(tenant_key="tenant", roles_key="roles").terms(
            ...     RuntimeContext(user_id="u1", tenant_id="acme", roles={"b", "a"})).roles
            ('a', 'b')
        """
        if not isinstance(ctx, RuntimeContext):
            raise TypeError(f"ctx must be a RuntimeContext, not {type(ctx).__name__}")
        if self.tenant_key is not None and ctx.tenant_id is None:
            return None  # fail closed in the store too: no tenant, no node (mirrors allows)
        terms = AclTerms(
            tenant=ctx.tenant_id if self.tenant_key is not None else None,
            user=ctx.user_id if self.users_key is not None else None,
            roles=tuple(sorted(ctx.roles)) if self.roles_key is not None else (),
            public=PUBLIC_VALUES if self.public_key is not None else (),
        )
        if self._grant_keys_configured and terms.user is None and not terms.roles and not terms.public:
            return None  # grants are required and ctx can match none of them
        return terms

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The ids of the ``nodes`` ``ctx`` may read: the batched form of ``acl(ctx, node)`` (``BatchAcl``).

        Each node is asked through ``acl(ctx, node)`` itself, so a subclass's stricter
        ``__call__`` stays the decision, as it was before the batched check.
        """
        cls = type(self)
        if cls.__call__ is MetadataAcl.__call__ and cls.allows is MetadataAcl.allows:
            # Neither is overridden, so acl(ctx, node) is allows(ctx, node.metadata), whose every
            # return is a bool: check_acl's answer check cannot fail. Asking allows directly is the
            # same rule without two calls per node (most of what OFF adds to a retrieval).
            allows = self.allows
            return {node.node_id for node in nodes if allows(ctx, node.metadata)}
        return {node.node_id for node in nodes if check_acl(self, ctx, node)}

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """:meth:`allowed` (in-process, nothing to wait for)."""
        return self.allowed(ctx, nodes)

    def condition(self, ctx: RuntimeContext) -> Condition | None:
        """The ACL for ``ctx`` as a store-neutral condition; ``None``: no node can match.

        ``tenant equals`` AND an OR of ``users list-contains user``, ``roles intersects roles``,
        ``public in ("true", 1, True)``. On well-formed metadata it admits exactly what
        :meth:`allows` admits; where a users / roles value is malformed (which :meth:`allows`
        denies) a store may admit the node, and the final check removes it.

        Example::

            >>> MetadataAcl(tenant_key="tenant", users_key="users").condition(
            ...     RuntimeContext(user_id="u1", tenant_id="acme"))
            And(terms=(Equals(key='tenant', value='acme'), ListContains(key='users', value='u1')))
        """
        terms = self.terms(ctx)
        if terms is None:
            return None
        grants: list[Condition] = []
        if self.users_key is not None and terms.user is not None:
            grants.append(ListContains(self.users_key, terms.user))
        if self.roles_key is not None and terms.roles:
            grants.append(Intersects(self.roles_key, terms.roles))
        if self.public_key is not None and terms.public:
            grants.append(In(self.public_key, terms.public))
        parts: list[Condition] = []
        if self.tenant_key is not None and terms.tenant is not None:
            parts.append(Equals(self.tenant_key, terms.tenant))
        if len(grants) == 1:
            parts.append(grants[0])
        elif grants:
            parts.append(Or(tuple(grants)))
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        """What a store may pre-select for ``ctx``: :meth:`condition`, or ``Nothing`` (``BatchAcl``)."""
        condition = self.condition(ctx)
        return Nothing() if condition is None else Conditional(condition)

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        """:meth:`restriction` (in-process, nothing to wait for)."""
        return self.restriction(ctx)

    def filters(self, ctx: RuntimeContext, *, store: FilterStore = "qdrant") -> MetadataFilters:
        """The same decision for ``ctx`` as LlamaIndex ``MetadataFilters``, for a vector store to pre-filter.

        On well-formed metadata (string tenant; users / roles as strings or lists of strings;
        public flag ``"true"``, ``1`` or ``True``) the filter admits the nodes ``self(ctx, node)``
        admits. ``store`` picks the dialect, since stores read filters differently; each lives
        beside its store's adapter and is documented there:

        - ``"qdrant"``: :func:`llama_jev.stores.qdrant_filters` (exact on well-formed metadata).
        - ``"simple"``: :func:`llama_jev.stores.simple_filters` (the in-memory
          ``SimpleVectorStore``: one level of filters, so some configurations raise ``ValueError``).

        ``JevRetriever.from_index`` pushes the ACL down by itself (also into Chroma and
        PostgreSQL, which take no ``MetadataFilters`` for it); this is for querying a store yourself.

        Raises:
            ValueError: unknown ``store``, or a configuration ``store`` cannot express.
            TypeError: ``ctx`` is not a ``RuntimeContext``.

        Example::

            >>> acl = MetadataAcl(tenant_key="tenant", users_key="users")
            >>> ctx = RuntimeContext(user_id="u1", tenant_id="acme")
            >>> [(f.key, f.operator.value, f.value) for f in acl.filters(ctx, store="simple").filters]
            [('tenant', '==', 'acme'), ('users', 'contains', 'u1')]
        """
        if not isinstance(ctx, RuntimeContext):
            raise TypeError(f"ctx must be a RuntimeContext, not {type(ctx).__name__}")
        if store not in _DIALECTS:
            raise ValueError(f"unknown store {store!r}; MetadataAcl.filters supports {', '.join(_DIALECTS)}")
        # The dialect lives with its store's adapter, one layer up (llama_jev.stores); it is
        # loaded by name so this layer never imports a store module (tests/test_layers.py).
        module_name, function_name = _DIALECTS[store]
        dialect: Callable[[MetadataAcl, RuntimeContext], MetadataFilters] = getattr(
            importlib.import_module(module_name), function_name
        )
        return dialect(self, ctx)


def check_acl(acl: Acl, ctx: RuntimeContext, node: BaseNode) -> bool:
    """Ask ``acl`` whether ``ctx`` may read ``node``, accepting only a real ``bool`` answer.

    Truthiness is never trusted: an ACL returning ``1``, ``"yes"`` or a list is a bug, so it is a
    ``TypeError`` rather than a guess. Whatever the ACL raises propagates unchanged, failing the
    retrieval: an ACL that cannot decide never lets a node through.

    Raises:
        TypeError: the ACL returned something other than ``True`` or ``False``.

    Example::

        >>> from llama_index.core.schema import TextNode
        >>> check_acl(lambda ctx, node: node.metadata.get("owner") == ctx.user_id,
        ...           RuntimeContext(user_id="u1"), TextNode(text="...", metadata={"owner": "u1"}))
        True
    """
    allowed = acl(ctx, node)
    if type(allowed) is not bool:
        # Names the ACL and node id only: node text and metadata never go into messages.
        name = getattr(acl, "__qualname__", type(acl).__qualname__)
        raise TypeError(
            f"ACL {name} returned {type(allowed).__name__} for node {node.node_id!r}; an ACL must return "
            "True or False (a non-bool answer is not read as a decision)"
        )
    return allowed
