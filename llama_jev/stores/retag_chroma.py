"""Re-tag in Chroma: ``collection.update(ids=..., metadatas=...)``, metadatas only (documents and embeddings untouched).

Chroma merges an update's metadata into the record's, so only the grant keys and
``_node_content`` are sent. It cannot hold an empty list: an empty grant list is written as the
key removed (``None``), which the ACL reads the same way (a grant key a node lacks grants
nothing). One page is one ``update`` call; a failure part-way leaves the pages before it written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from llama_jev.stores.grants import GrantsError, Retagger, Selection, Stored

__all__ = ["ChromaRetagger"]


class ChromaRetagger(Retagger):
    """Reads with ``collection.get`` and writes with ``collection.update``, of the store's collection."""

    name: ClassVar[str] = "chroma"

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self._collection = store._collection

    @classmethod
    def recognises(cls, store: Any) -> bool:
        return any(klass.__name__ == "ChromaVectorStore" for klass in type(store).__mro__)

    def checked(self, grants: Mapping[str, Any]) -> Mapping[str, Any]:
        """Refuses a key Chroma would read as an operator (``$...``): its ``where`` could not address it."""
        for key in grants:
            if key.startswith("$"):
                raise GrantsError(key, "Chroma reads a key starting with $ as an operator; name the key otherwise")
        return grants

    def pages(self, selection: Selection, size: int) -> Iterator[list[Stored]]:
        if selection.node_ids is not None:
            ids = list(selection.node_ids)
            for start in range(0, len(ids), size):
                found = self._collection.get(ids=ids[start : start + size], include=["metadatas"])
                yield _stored(found)
            return
        where = {selection.document_id_key: {"$in": list(selection.document_ids or ())}}
        # Collected before writing: an offset walk over records being updated could skip some.
        matched = [stored for page in self._pages(size, where) for stored in page]
        for start in range(0, len(matched), size):
            yield matched[start : start + size]

    def write(self, updates: Sequence[Stored], keys: Sequence[str]) -> None:
        sent = [
            {
                key: (None if update.metadata[key] == [] else update.metadata[key])
                for key in (*keys, "_node_content")
                if key in update.metadata
            }
            for update in updates
        ]
        self._collection.update(ids=[update.node_id for update in updates], metadatas=sent)

    def scan(self, size: int) -> Iterator[list[Stored]]:
        yield from self._pages(size, None)

    def _pages(self, size: int, where: Mapping[str, Any] | None) -> Iterator[list[Stored]]:
        offset = 0
        while True:
            found = self._collection.get(where=where, limit=size, offset=offset, include=["metadatas"])
            page = _stored(found)
            if page:
                yield page
            if len(page) < size:
                return
            offset += len(page)

    def count(self) -> int:
        counted: int = self._collection.count()
        return counted


def _stored(found: Mapping[str, Any]) -> list[Stored]:
    metadatas = found.get("metadatas") or [None] * len(found["ids"])
    return [Stored(node_id, dict(metadata or {})) for node_id, metadata in zip(found["ids"], metadatas, strict=True)]
