"""Pushdown into LlamaIndex's in-memory ``SimpleVectorStore``: a node-id restriction.

That store rejects nested filters, so a restriction cannot be one filter for most conditions.
Instead the restriction is decided over the metadata the store keeps (``evaluate``, the
condition language's reference meaning; a ``MetadataAcl``'s own rule for a ``MetadataAcl``),
and the retriever is asked for the admitted ids only: exact for every operator and every
restriction, and the caller's own flat ``filters`` and ``node_ids`` still apply.
:func:`simple_filters` (also ``MetadataAcl.filters(ctx, store="simple")``) is the ACL as the
flat filters this store reads, for querying it yourself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

from llama_jev.acl.batch import BatchAcl
from llama_jev.acl.conditions import Everything, IdIn, Restriction, Unknown, evaluate
from llama_jev.acl.diagnostics import warn_malformed
from llama_jev.acl.rules import AclTerms, MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import KeyCensus, Pushdown, Seen, acl_metadata_filters, condition_of, vector_store_of

__all__ = ["MemoryPushdown", "simple_filters"]


def simple_filters(acl: MetadataAcl, ctx: RuntimeContext) -> MetadataFilters:
    """``acl`` for ``ctx`` as the one-level ``MetadataFilters`` the in-memory ``SimpleVectorStore`` reads.

    That store rejects nested filters, so only one level is possible: the tenant alone, the
    grants alone (a flat OR), or the tenant with a single users or roles key; other
    configurations raise ``ValueError`` (decided from the configuration, never the caller).
    Users and roles are matched with ``CONTAINS`` / ``ANY``, which the store evaluates as Python
    ``in``: exact for lists, but a plain *string* value is tested as a substring (``"u10"``
    contains ``"u1"``), so with this store keep users and roles as lists. The looser match only
    costs recall slots, since the ACL still removes such nodes; a number under a users / roles
    key (malformed) makes this store raise ``TypeError``. It compares with Python ``==``, so
    ``public EQ 1`` also matches ``True`` (public) and ``1.0`` (not public: the ACL removes it).
    ``JevRetriever`` does not need this: it pushes the ACL down as a node-id restriction, exact
    for every configuration.

    Raises:
        ValueError: a configuration this store cannot express.

    Example::

        retriever = index.as_retriever(similarity_top_k=20, filters=simple_filters(acl, ctx))
    """
    _check_flat_expressible(acl)  # the tenant beside several grants would need a nested OR
    return acl_metadata_filters(acl, ctx, lambda terms: _simple_grants(acl, terms))


def _simple_grants(acl: MetadataAcl, terms: AclTerms) -> list[MetadataFilter]:
    grants: list[MetadataFilter] = []
    # This store's IN is `field in value` (never true for a list field); CONTAINS and ANY are
    # `value in field`, the list-membership test it needs.
    if acl.users_key is not None and terms.user is not None:
        grants.append(MetadataFilter(key=acl.users_key, operator=FilterOperator.CONTAINS, value=terms.user))
    if acl.roles_key is not None and terms.roles:
        grants.append(MetadataFilter(key=acl.roles_key, operator=FilterOperator.ANY, value=list(terms.roles)))
    if acl.public_key is not None:
        # Python `==` already matches True with 1, and LlamaIndex validation refuses a boolean value.
        grants.extend(
            MetadataFilter(key=acl.public_key, operator=FilterOperator.EQ, value=value)
            for value in terms.public
            if not isinstance(value, bool)
        )
    return grants


def _check_flat_expressible(acl: MetadataAcl) -> None:
    """Refuse the configurations needing AND-of-OR; the public flag is two conditions ("true", 1)."""
    if acl.tenant_key is None:
        return
    grant_keys = [key for key in (acl.users_key, acl.roles_key) if key is not None]
    if acl.public_key is None and len(grant_keys) <= 1:
        return
    raise ValueError(
        f"{acl!r} cannot be expressed as a filter for the in-memory SimpleVectorStore, which "
        "rejects nested filters: a tenant together with a public flag or with both users and roles "
        "needs AND(tenant, OR(...)). Retrieve without filters= (the ACL still checks every candidate) "
        'or use a store that accepts nested filters, such as Qdrant (store="qdrant").'
    )


class MemoryPushdown(Pushdown):
    """The restriction as the list of node ids it admits, for a retriever over ``SimpleVectorStore``.

    Exact for every operator: each node's stored metadata is read with ``evaluate``. A node the
    store keeps no metadata for is kept (the final check decides).
    """

    name: ClassVar[str] = "memory"

    def __init__(self, retriever: BaseRetriever, acl: BatchAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        self._values_checked = False

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return isinstance(vector_store_of(retriever), SimpleVectorStore) and hasattr(retriever, "_node_ids")

    @classmethod
    def census(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus:
        """One pass over the metadata the store keeps for the retriever's nodes (all of them)."""
        store: SimpleVectorStore = vector_store_of(retriever)
        metadata = store.data.metadata_dict
        stored = [metadata[node_id] for node_id in _own_ids(retriever) if node_id in metadata]
        missing = set(keys)
        present: set[str] = set()
        for entry in stored:
            present.update(entry)
            missing -= {key for key in missing if entry.get(key) is not None}
        return KeyCensus(
            absent=tuple(key for key in keys if key in missing),
            nodes=len(stored),
            where=f"the {len(stored)} nodes of the in-memory store",
            present=tuple(sorted(present)),
        )

    @classmethod
    async def acensus(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus:
        # In memory: no I/O to wait for, and a thread would only add a hop.
        return cls.census(retriever, keys)

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """``upstream`` searches only the ids, among its own, that ``restriction`` admits (exact)."""
        if isinstance(restriction, (Unknown, Everything)):
            return isinstance(restriction, Everything)
        if isinstance(self.acl, MetadataAcl) and restriction == self.acl.restriction(ctx):
            upstream._node_ids = self.readable_ids(ctx)  # type: ignore[attr-defined]
            return True
        # evaluate() is the reference meaning itself: any condition, any value, nothing to refuse.
        condition = condition_of(restriction, checked=False)
        store: SimpleVectorStore = vector_store_of(self.retriever)
        metadata = store.data.metadata_dict
        ids = _own_ids(self.retriever)
        if condition is None:
            admitted: list[str] = []
        elif isinstance(condition, IdIn) and condition.key is None:
            admitted = [node_id for node_id in ids if node_id in condition.ids]  # no metadata needed
        else:
            admitted = [
                node_id for node_id in ids if node_id not in metadata or evaluate(condition, node_id, metadata[node_id])
            ]
        upstream._node_ids = admitted  # type: ignore[attr-defined]
        return True

    def readable_ids(self, ctx: RuntimeContext) -> list[str]:
        """The ids, among the retriever's own, that ``ctx`` may read under this adapter's ``MetadataAcl``.

        An id the store holds no metadata for is kept: the post-filter decides.
        """
        if not isinstance(self.acl, MetadataAcl):
            raise TypeError(f"readable_ids needs a MetadataAcl, not the {self.acl.engine} ACL: use apply()")
        store: SimpleVectorStore = vector_store_of(self.retriever)
        metadata = store.data.metadata_dict
        ids = _own_ids(self.retriever)
        readable = [node_id for node_id in ids if node_id not in metadata or self.acl.allows(ctx, metadata[node_id])]
        if len(readable) < len(ids) and not self._values_checked:
            # Denied in the store, so the post-filter never sees them: say if unreadable ACL data
            # is in it. One scan per retriever, not per query (the store may hold many tenants).
            self._values_checked = True
            warn_malformed(self.acl, (metadata[node_id] for node_id in ids if node_id in metadata), seen=self.seen)
        return readable


def _own_ids(retriever: BaseRetriever) -> list[str]:
    """The node ids the retriever searches: its own ``node_ids``, else every node of the store."""
    own: list[str] | None = getattr(retriever, "_node_ids", None)
    store: SimpleVectorStore = vector_store_of(retriever)
    return list(store.data.embedding_dict) if own is None else own
