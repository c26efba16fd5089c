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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.core.context import RuntimeContext

__all__ = ["Acl", "FilterStore", "MetadataAcl", "check_acl"]

Acl: TypeAlias = Callable[[RuntimeContext, BaseNode], bool]
"""``acl(ctx, node) -> bool``: ``True`` when the caller ``ctx`` may read ``node``."""

FilterStore: TypeAlias = Literal["qdrant", "simple"]
"""The vector stores ``MetadataAcl.filters`` knows how to address (they read filters differently)."""

# A value no tenant, user or role field holds: together with IS_EMPTY it makes a filter that no
# node satisfies, on every store (an empty field cannot equal a non-empty string).
_NOTHING_SENTINEL = "llama_jev:match-nothing"

# The public flag values the ACL accepts, and so the ones every store filter must match: the
# string "true" and the int 1 (plus the boolean True, matched separately: LlamaIndex validation
# refuses a boolean filter value).
_PUBLIC_FILTER_VALUES: tuple[str | int, ...] = ("true", 1)

_STORES: tuple[str, ...] = ("qdrant", "simple")


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
    # a public flag is a security decision, so only unmistakable values count. Each of the three
    # is matched by every store filter MetadataAcl.filters writes, so the check and the
    # pushed-down filter agree.
    return value is True or (isinstance(value, str) and value == "true") or (type(value) is int and value == 1)


def _boolean_true_filter(key: str) -> MetadataFilter:
    """``key EQ True``, which Qdrant matches natively (``MatchValue(value=True)``).

    LlamaIndex's ``MetadataFilter`` refuses a boolean value at validation (its value types are
    strict int / float / str), so the filter is built without validation; Qdrant's filter
    builder passes the value through unchanged.
    """
    return MetadataFilter.model_construct(key=key, operator=FilterOperator.EQ, value=True)


def _match_nothing(key: str) -> list[MetadataFilter]:
    """Conditions, to be ANDed, that no node satisfies: ``key`` is empty and equals a non-empty string."""
    return [
        MetadataFilter(key=key, operator=FilterOperator.IS_EMPTY, value=None),
        MetadataFilter(key=key, operator=FilterOperator.EQ, value=_NOTHING_SENTINEL),
    ]


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
        return self.users_key is not None or self.roles_key is not None or self.public_key is not None

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
        if not self._grant_keys_configured:
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

    def filters(self, ctx: RuntimeContext, *, store: FilterStore = "qdrant") -> MetadataFilters:
        """The same decision for ``ctx`` as ``MetadataFilters``, for a vector store to pre-filter.

        On well-formed metadata (string tenant; users / roles as strings or lists of strings;
        public flag ``"true"``, ``1`` or ``True``) the filter admits exactly the nodes ``self(ctx, node)``
        admits. A caller who can match nothing (a tenant key but ``ctx.tenant_id is None``, or
        roles the only grant and ``ctx.roles`` empty) gets a filter that matches no node.

        ``store`` picks the dialect, since stores read filters differently:

        - ``"qdrant"`` (``QdrantVectorStore``): ``tenant EQ`` AND a nested OR of
          ``users IN [user_id]``, ``roles IN ctx.roles``, ``public EQ "true"``, ``public EQ 1``,
          ``public EQ True`` (Qdrant matches booleans natively; that one filter is built without
          LlamaIndex's validation, which refuses boolean values).
          Qdrant matches a condition on a list field when any element matches, so string and
          list values are both exact.
        - ``"simple"`` (the default in-memory ``SimpleVectorStore``): that store rejects nested
          filters, so only one level is possible: the tenant alone, the grants alone (a flat OR),
          or the tenant with a single users or roles key. Other configurations raise
          ``ValueError`` (retrieve without ``filters=``; the ACL still runs on every candidate).
          List values are matched with ``CONTAINS`` / ``ANY``, which the store evaluates as
          Python ``in``: exact for lists, but a plain *string* value is tested as a substring
          (``"u10"`` contains ``"u1"``), so with this store keep users and roles as lists. The
          looser match only costs recall slots, since the ACL still removes such nodes; a
          number under a users / roles key (malformed) makes this store raise ``TypeError``.
          This store compares with Python ``==``, so ``public EQ 1`` also matches ``True`` (public)
          and ``1.0`` (not public: the ACL then removes it). ``JevRetriever`` does not need this
          dialect for the in-memory store: it pushes the ACL down as a node-id restriction, which
          is exact for every configuration.

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
        if store not in _STORES:
            raise ValueError(f"unknown store {store!r}; MetadataAcl.filters supports {', '.join(_STORES)}")
        if store == "simple":
            self._check_flat_expressible()

        conditions: list[MetadataFilter | MetadataFilters] = []
        if self.tenant_key is not None:
            if ctx.tenant_id is None:
                # Fail closed in the store too: no tenant, no node (mirrors __call__).
                return MetadataFilters(filters=list(_match_nothing(self.tenant_key)), condition=FilterCondition.AND)
            conditions.append(MetadataFilter(key=self.tenant_key, operator=FilterOperator.EQ, value=ctx.tenant_id))

        if self._grant_keys_configured:
            grants = self._grant_conditions(ctx, store)
            if not grants:
                # Never emit an empty OR group: Qdrant skips empty nested filters, which would
                # turn "no grant possible" into "no grant needed".
                key = self.roles_key or self.users_key or self.public_key
                assert key is not None  # _grant_keys_configured
                conditions.extend(_match_nothing(key))
            elif len(grants) == 1:
                conditions.append(grants[0])
            elif not conditions:
                # Grants alone: one flat OR, which every store accepts.
                return MetadataFilters(filters=list(grants), condition=FilterCondition.OR)
            else:
                # Only reachable for Qdrant: _check_flat_expressible refused this for "simple".
                conditions.append(MetadataFilters(filters=list(grants), condition=FilterCondition.OR))
        return MetadataFilters(filters=conditions, condition=FilterCondition.AND)

    def _grant_conditions(self, ctx: RuntimeContext, store: FilterStore) -> list[MetadataFilter]:
        """The OR-ed conditions of which one must hold; empty when ``ctx`` can match none."""
        grants: list[MetadataFilter] = []
        roles = sorted(ctx.roles)  # sorted: the same caller always gets the same filter
        if store == "qdrant":
            # Qdrant's IN becomes MatchAny, which on a list payload matches any element.
            if self.users_key is not None:
                grants.append(MetadataFilter(key=self.users_key, operator=FilterOperator.IN, value=[ctx.user_id]))
            if self.roles_key is not None and roles:
                grants.append(MetadataFilter(key=self.roles_key, operator=FilterOperator.IN, value=roles))
        else:
            # SimpleVectorStore's IN is `field in value` (never true for a list field); CONTAINS
            # and ANY are `value in field`, the list-membership test this store needs.
            if self.users_key is not None:
                grants.append(MetadataFilter(key=self.users_key, operator=FilterOperator.CONTAINS, value=ctx.user_id))
            if self.roles_key is not None and roles:
                grants.append(MetadataFilter(key=self.roles_key, operator=FilterOperator.ANY, value=roles))
        if self.public_key is not None:
            grants.extend(
                MetadataFilter(key=self.public_key, operator=FilterOperator.EQ, value=value)
                for value in _PUBLIC_FILTER_VALUES
            )
            if store == "qdrant":
                # Qdrant tells True from 1; the in-memory store's `==` already matches it with 1.
                grants.append(_boolean_true_filter(self.public_key))
        return grants

    def _check_flat_expressible(self) -> None:
        """Refuse, for the one-level ``SimpleVectorStore``, configurations needing AND-of-OR.

        Decided from the configuration, not the caller, so the same ACL never works for one user
        and fails for another. The public flag is two conditions (``"true"``, ``1``), so with a
        tenant it needs nesting too.
        """
        if self.tenant_key is None:
            return
        grant_keys = [key for key in (self.users_key, self.roles_key) if key is not None]
        if self.public_key is None and len(grant_keys) <= 1:
            return
        raise ValueError(
            f"{self!r} cannot be expressed as a filter for the in-memory SimpleVectorStore, which "
            "rejects nested filters: a tenant together with a public flag or with both users and roles "
            "needs AND(tenant, OR(...)). Retrieve without filters= (the ACL still checks every candidate) "
            'or use a store that accepts nested filters, such as Qdrant (store="qdrant").'
        )


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
