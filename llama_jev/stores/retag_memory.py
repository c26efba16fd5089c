"""Re-tag in LlamaIndex's in-memory store: the ``SimpleVectorStore``'s metadata and the index's docstore.

A ``VectorStoreIndex`` over a ``SimpleVectorStore`` keeps each node's metadata twice: flat in
the store's ``metadata_dict`` (what pushdown reads) and in the node the docstore returns (what a
retriever hands on, and the final check reads). Both are written, so the two never disagree;
hence this writer needs the index, not the store alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from llama_index.core.vector_stores.simple import SimpleVectorStore

from llama_jev.stores.grants import Retagger, Selection, Stored

__all__ = ["MemoryRetagger"]


class MemoryRetagger(Retagger):
    """Writes ``metadata_dict`` and the docstore's node of each selected id; given the index."""

    name: ClassVar[str] = "memory"
    needs_index: ClassVar[bool] = True

    def __init__(self, store: Any) -> None:
        if isinstance(store, SimpleVectorStore) or getattr(store, "docstore", None) is None:
            raise TypeError(
                "re-tag in the in-memory SimpleVectorStore needs the VectorStoreIndex over it (retag(index, ...)): "
                "its nodes, which retrieval returns, live in the index's docstore"
            )
        super().__init__(store)
        self._metadata: dict[str, dict[str, Any]] = store.vector_store.data.metadata_dict
        self._docstore = store.docstore

    @classmethod
    def recognises(cls, store: Any) -> bool:
        return isinstance(store, SimpleVectorStore)

    def pages(self, selection: Selection, size: int) -> Iterator[list[Stored]]:
        if selection.node_ids is not None:
            ids = [node_id for node_id in selection.node_ids if node_id in self._metadata]
        else:
            wanted = set(selection.document_ids or ())
            key = selection.document_id_key
            ids = [node_id for node_id, entry in self._metadata.items() if entry.get(key) in wanted]
        for start in range(0, len(ids), size):
            yield [Stored(node_id, self._metadata[node_id]) for node_id in ids[start : start + size]]

    def write(self, updates: Sequence[Stored], keys: Sequence[str]) -> None:
        nodes = []
        for update in updates:
            self._metadata[update.node_id] = dict(update.metadata)
            if self._docstore.document_exists(update.node_id):
                node = self._docstore.get_node(update.node_id)  # a copy: written back below
                node.metadata.update({key: update.metadata[key] for key in keys})
                nodes.append(node)
        if nodes:
            self._docstore.add_documents(nodes, allow_update=True)

    def scan(self, size: int) -> Iterator[list[Stored]]:
        ids = list(self._metadata)
        for start in range(0, len(ids), size):
            yield [Stored(node_id, self._metadata[node_id]) for node_id in ids[start : start + size]]

    def count(self) -> int:
        return len(self._metadata)
