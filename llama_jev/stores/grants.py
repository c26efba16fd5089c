"""What re-tagging writes, decided once for every store: checked grants, the new metadata, the result.

A store's writer (:class:`Retagger`, one per store, in ``retag_<store>.py``) only reads and
writes; the rules live here as pure functions, so every store and both the sync and async
paths write the same thing:

- :func:`checked_grants`: the grants, checked with the ACL's own reading rules before anything
  is written (a grant list of strings, a string tenant, a public flag ``MetadataAcl`` reads).
- :func:`retagged`: a node's stored metadata with the grants set; LlamaIndex's ``_node_content``
  (the serialized node some stores keep beside the flat keys, from which they rebuild the node a
  retriever returns) is updated the same way, so the flat keys a pushdown filters on and the node
  the final check reads never disagree. ``None`` when nothing would change.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llama_jev.acl.rules import PUBLIC_VALUES, MetadataAcl
from llama_jev.core.errors import JevError

__all__ = [
    "GrantsError",
    "NODE_CONTENT",
    "RESERVED_KEYS",
    "RetagIncompleteError",
    "RetagResult",
    "Retagger",
    "Selection",
    "Stored",
    "checked_grants",
    "retagged",
]

NODE_CONTENT = "_node_content"
"""The key under which LlamaIndex keeps the serialized node in a store's payload / metadata."""

# Keys LlamaIndex itself writes: re-tagging them would detach chunks from their document.
RESERVED_KEYS = frozenset({NODE_CONTENT, "_node_type", "doc_id", "document_id", "ref_doc_id"})


class GrantsError(JevError, ValueError):
    """Grants that would be written wrong: names the key and the rule, never the value; nothing was written.

    Attributes:
        key: the metadata key whose value (or name) breaks the rule, or ``None`` for the whole mapping.
        rule: the rule, in words.
    """

    def __init__(self, key: str | None, rule: str) -> None:
        where = "grants" if key is None else f"grant {key!r}"
        super().__init__(f"{where}: {rule}; nothing was written")
        self.key = key
        self.rule = rule


class RetagIncompleteError(JevError):
    """A re-tag failed part-way in a store that cannot write atomically: exactly what was written is here.

    Attributes:
        written: ids of the nodes whose new grants are stored (a re-run writes the rest and
            counts these as unchanged).
        uncertain: ids of the batch in flight when the store failed: written or not, the store
            did not say (re-run the re-tag).
        store: the store's name.
    """

    def __init__(
        self, store: str, *, written: tuple[str, ...], uncertain: tuple[str, ...], cause: BaseException
    ) -> None:
        super().__init__(
            f"re-tag in {store} failed after {len(written)} nodes were written ({len(uncertain)} more uncertain): "
            f"{type(cause).__name__}; run the same re-tag again to finish it"
        )
        self.store = store
        self.written = written
        self.uncertain = uncertain


@dataclass(frozen=True)
class RetagResult:
    """What a re-tag did.

    Attributes:
        matched: nodes selected (found in the store).
        changed: nodes whose stored grants changed (the rest already held them).
        written: ids of the nodes written (the ``changed`` ones), in the order written.
        missing: the node ids or document ids asked for that matched no node.
        atomic: the store wrote everything in one transaction (PostgreSQL).
    """

    matched: int
    changed: int
    written: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    atomic: bool = False


@dataclass(frozen=True)
class Selection:
    """The nodes to re-tag: by node id, or every chunk of the documents (``document_id_key`` of their metadata)."""

    node_ids: tuple[str, ...] | None
    document_ids: tuple[str, ...] | None
    document_id_key: str

    @property
    def asked(self) -> tuple[str, ...]:
        return self.node_ids if self.node_ids is not None else (self.document_ids or ())


@dataclass(frozen=True)
class Stored:
    """One node as its store keeps it: the id and the flat metadata (``_node_content`` included where kept).

    ``row`` is the store's own key for it where that is not the node id (a PostgreSQL row's
    primary key: two rows may hold one node id), for the writer only.
    """

    node_id: str
    metadata: Mapping[str, Any]
    row: Any = field(default=None, compare=False, repr=False)


class Retagger(ABC):
    """How one store reads and partially writes its nodes' metadata; the rules are :mod:`grants`'s.

    A store added later is one subclass in its own module, listed in ``llama_jev.stores.retagging``
    (or passed to :func:`llama_jev.stores.retagging.register_retagger`). It never rewrites text or
    embeddings: :meth:`write` sets the changed keys of existing nodes only.
    """

    name: ClassVar[str]
    atomic: ClassVar[bool] = False
    """``True`` when :meth:`transaction` makes the whole re-tag one transaction."""

    def __init__(self, store: Any) -> None:
        self.store = store

    @classmethod
    @abstractmethod
    def recognises(cls, store: Any) -> bool:
        """Whether this writer speaks ``store`` (a LlamaIndex vector store)."""

    @abstractmethod
    def pages(self, selection: Selection, size: int) -> Iterator[list[Stored]]:
        """The selected nodes as stored, at most ``size`` per page."""

    @abstractmethod
    def write(self, updates: Sequence[Stored], keys: Sequence[str]) -> None:
        """Store each update's metadata, setting only ``keys`` (the grants and ``_node_content``)."""

    @abstractmethod
    def scan(self, size: int) -> Iterator[list[Stored]]:
        """Every node of the store, ``size`` per page, never all in memory (the drift check).

        The metadata may leave ``_node_content`` out: the drift check reads the flat keys only.
        """

    def count(self) -> int | None:
        """How many nodes the store holds, for progress; ``None`` when it cannot say cheaply."""
        return None

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        """The scope of one re-tag: a database transaction where the store has them."""
        return contextlib.nullcontext()

    def checked(self, grants: Mapping[str, Any]) -> Mapping[str, Any]:
        """``grants`` as this store can hold them (raise :class:`GrantsError` for what it cannot)."""
        return grants


def checked_grants(grants: Any, *, acl: Any = None, document_id_key: str = "ref_doc_id") -> dict[str, Any]:
    """``grants`` as a plain dict (lists as lists), once every key and value passes the ACL's reading rules.

    Rules: a non-empty mapping of non-blank string keys, none of them a key LlamaIndex writes
    (``ref_doc_id``, ``_node_content``, ...) or the document key. With a ``MetadataAcl`` as ``acl``,
    every key is one it reads and each value is what it reads under that key: the tenant a
    non-blank string; users and roles a list of strings (not a bare string: ``"u1,u2"`` would be
    read as one id); the public flag ``True``, ``False``, ``"true"`` or ``1``. Without it (or with an
    engine's ACL, which reads any metadata key), each value is a string, an int, a bool, or a list of
    strings: a float, ``None``, a mapping or a mixed list is refused (to revoke, write an empty
    list or ``False``).

    Raises:
        GrantsError: naming the key and the broken rule (never the value).

    Example::

        >>> acl = MetadataAcl(tenant_key="tenant", users_key="users")
        >>> checked_grants({"tenant": "acme", "users": ("u1",)}, acl=acl)
        {'tenant': 'acme', 'users': ['u1']}
    """
    if not isinstance(grants, Mapping) or not grants:
        raise GrantsError(None, "must be a non-empty mapping of metadata key to value")
    roles = _roles(acl)
    checked: dict[str, Any] = {}
    for key, value in grants.items():
        if not isinstance(key, str) or not key.strip():
            raise GrantsError(None, f"a key must be a non-blank string, not {type(key).__name__}")
        if key in RESERVED_KEYS or key == document_id_key:
            raise GrantsError(key, "is a key LlamaIndex writes to tie a chunk to its node and document; it is no grant")
        if roles is not None and key not in roles:
            raise GrantsError(key, f"is not a key the ACL reads (it reads {', '.join(sorted(roles))})")
        checked[key] = _checked_value(key, value, (roles or {}).get(key))
    return checked


def _roles(acl: Any) -> dict[str, str] | None:
    """Key -> what ``acl`` reads under it, for a ``MetadataAcl``; ``None``: any key, the generic rule."""
    if acl is None or not isinstance(acl, MetadataAcl):
        return None  # an engine's ACL reads node metadata as attributes: every key may matter
    named = {"tenant": acl.tenant_key, "list": acl.users_key, "public": acl.public_key}
    roles = {key: role for role, key in named.items() if key is not None}
    if acl.roles_key is not None:
        roles[acl.roles_key] = "list"
    return roles


def _checked_value(key: str, value: Any, role: str | None) -> Any:
    kind = type(value).__name__
    if role == "tenant":
        if not isinstance(value, str) or not value.strip():
            raise GrantsError(key, f"the tenant must be a non-blank string (the ACL denies any other), not {kind}")
        return value
    if role == "list":
        if isinstance(value, str):
            raise GrantsError(key, "a grant list must be a list of strings, not one string (write ['...'])")
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise GrantsError(key, f"a grant list must be a list of strings (the ACL denies any other), not {kind}")
        return list(value)
    if role == "public":
        if value is False or any(
            value is flag or (type(value) is type(flag) and value == flag) for flag in PUBLIC_VALUES
        ):
            return value
        raise GrantsError(key, "the public flag must be True, False, 'true' or 1 (the ACL reads no other as public)")
    if isinstance(value, (list, tuple)):
        if not all(isinstance(item, str) for item in value):
            raise GrantsError(key, "a list must hold strings only")
        return list(value)
    if isinstance(value, (str, int)):  # bool is an int
        return value
    raise GrantsError(key, f"a value must be a string, an int, a bool or a list of strings, not {kind}")


def retagged(stored: Stored, grants: Mapping[str, Any]) -> Stored | None:
    """``stored`` with ``grants`` set (flat keys and ``_node_content``'s metadata alike); ``None``: unchanged.

    Every other key, and the node's text and relationships inside ``_node_content``, stay as they were.

    Example::

        >>> retagged(Stored("n1", {"users": ["u1"], "topic": "x"}), {"users": []}).metadata
        {'users': [], 'topic': 'x'}
    """
    metadata = dict(stored.metadata)
    changed = any(not _same(metadata.get(key, _ABSENT), value) for key, value in grants.items())
    # A list of its own per node: an in-memory store must not share one list between nodes.
    metadata.update({key: list(value) if isinstance(value, list) else value for key, value in grants.items()})
    content = metadata.get(NODE_CONTENT)
    if isinstance(content, str):
        node = json.loads(content)
        inner = node.get("metadata")
        if isinstance(inner, dict) and any(not _same(inner.get(key, _ABSENT), value) for key, value in grants.items()):
            inner.update(grants)
            metadata[NODE_CONTENT] = json.dumps(node)
            changed = True
    return Stored(stored.node_id, metadata, stored.row) if changed else None


_ABSENT = object()


def _same(old: Any, new: Any) -> bool:
    # Typed: True and 1 are one public flag to the ACL but not to every store's filter.
    return type(old) is type(new) and old == new
