"""Pushdown into LlamaIndex's in-memory ``SimpleVectorStore``: a node-id restriction.

That store rejects nested filters, so the ACL cannot be one filter for most configurations.
Instead the ACL itself decides over the metadata the store keeps, and the retriever is asked
for the readable ids only: exact for every configuration, and the caller's own flat
``filters`` stay untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.simple import SimpleVectorStore

from llama_jev.acl.diagnostics import warn_malformed
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import KeyCensus, Pushdown, Seen, vector_store_of

__all__ = ["MemoryPushdown"]


class MemoryPushdown(Pushdown):
    """The ACL as the list of node ids the caller may read, for a retriever over ``SimpleVectorStore``."""

    name: ClassVar[str] = "memory"

    def __init__(self, retriever: BaseRetriever, acl: MetadataAcl, seen: Seen) -> None:
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

    def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
        upstream._node_ids = self.readable_ids(ctx)  # type: ignore[attr-defined]

    def readable_ids(self, ctx: RuntimeContext) -> list[str]:
        """The ids, among the retriever's own, that ``ctx`` may read.

        An id the store holds no metadata for is kept: the post-filter decides.
        """
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
