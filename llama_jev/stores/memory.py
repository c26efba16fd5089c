"""Pushdown into LlamaIndex's in-memory ``SimpleVectorStore``: a node-id restriction.

That store rejects nested filters, so the ACL cannot be one filter for most configurations.
Instead the ACL itself decides over the metadata the store keeps, and the retriever is asked
for the readable ids only: exact for every configuration, and the caller's own flat
``filters`` stay untouched.
"""

from __future__ import annotations

from typing import ClassVar

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.vector_stores.simple import SimpleVectorStore

from llama_jev.acl.diagnostics import missing_everywhere, warn_keys_absent, warn_malformed
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import Pushdown, Seen, vector_store_of

__all__ = ["MemoryPushdown"]


class MemoryPushdown(Pushdown):
    """The ACL as the list of node ids the caller may read, for a retriever over ``SimpleVectorStore``."""

    name: ClassVar[str] = "memory"

    def __init__(self, retriever: BaseRetriever, acl: MetadataAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        self._values_checked = False
        self._keys_checked = False

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return isinstance(vector_store_of(retriever), SimpleVectorStore) and hasattr(retriever, "_node_ids")

    def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
        upstream._node_ids = self.readable_ids(ctx)  # type: ignore[attr-defined]

    def readable_ids(self, ctx: RuntimeContext) -> list[str]:
        """The ids, among the retriever's own, that ``ctx`` may read.

        An id the store holds no metadata for is kept: the post-filter decides.
        """
        store: SimpleVectorStore = vector_store_of(self.retriever)
        metadata = store.data.metadata_dict
        own: list[str] | None = getattr(self.retriever, "_node_ids", None)
        ids = list(store.data.embedding_dict) if own is None else own
        readable = [node_id for node_id in ids if node_id not in metadata or self.acl.allows(ctx, metadata[node_id])]
        if len(readable) < len(ids) and not self._values_checked:
            # Denied in the store, so the post-filter never sees them: say if unreadable ACL data
            # is in it. One scan per retriever, not per query (the store may hold many tenants).
            self._values_checked = True
            warn_malformed(self.acl, (metadata[node_id] for node_id in ids if node_id in metadata), seen=self.seen)
        if ids and not readable and not self._keys_checked:
            # The store denied everything, so the post-filter's diagnosis never sees a node.
            self._keys_checked = True
            stored = [metadata[node_id] for node_id in ids if node_id in metadata]
            missing = missing_everywhere(self.acl, stored)
            if missing:
                present = (key for entry in stored for key in entry)
                warn_keys_absent(missing, f"the {len(ids)} nodes in the store", present, seen=self.seen)
        return readable
