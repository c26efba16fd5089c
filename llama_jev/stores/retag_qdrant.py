"""Re-tag in Qdrant: ``set_payload`` of the changed keys on existing points, never a re-upsert.

Each point's grants and its ``_node_content`` (the serialized node the LlamaIndex store rebuilds
a retrieved node from) are set together in one operation; a page of points is one
``batch_update_points`` request. Qdrant has no transaction across requests, so a failure part-way
leaves the pages before it written (:class:`~llama_jev.stores.grants.RetagIncompleteError` names them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from llama_jev.stores.base import CannotState
from llama_jev.stores.grants import GrantsError, Retagger, Selection, Stored
from llama_jev.stores.qdrant import _point_ids, payload_key

__all__ = ["QdrantRetagger"]


class QdrantRetagger(Retagger):
    """Reads payloads with ``retrieve`` / ``scroll`` and writes with ``set_payload``, over the store's sync client."""

    name: ClassVar[str] = "qdrant"

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        client = getattr(store, "_client", None)
        if client is None:
            raise TypeError(
                "re-tag in Qdrant uses the store's sync client: "
                "build the QdrantVectorStore with client=QdrantClient(...)"
            )
        self._client = client
        self._collection: str = store.collection_name

    @classmethod
    def recognises(cls, store: Any) -> bool:
        # By name, so llama_jev imports without the qdrant extra.
        return any(klass.__name__ == "QdrantVectorStore" for klass in type(store).__mro__)

    def pages(self, selection: Selection, size: int) -> Iterator[list[Stored]]:
        if not self._client.collection_exists(self._collection):
            return
        if selection.node_ids is not None:
            possible = _point_ids(frozenset(selection.node_ids))  # a non-UUID id is no point: missing
            ids = [node_id for node_id in selection.node_ids if node_id in possible]
            for start in range(0, len(ids), size):
                points = self._client.retrieve(
                    self._collection, ids=ids[start : start + size], with_payload=True, with_vectors=False
                )
                yield [_stored(point) for point in points]
            return
        from qdrant_client import models  # only reached with a Qdrant store, so the extra is installed

        where = models.Filter(
            must=[
                models.FieldCondition(
                    key=_key(selection.document_id_key), match=models.MatchAny(any=list(selection.document_ids or ()))
                )
            ]
        )
        yield from self._scroll(size, where)

    def write(self, updates: Sequence[Stored], keys: Sequence[str]) -> None:
        from qdrant_client import models

        operations = []
        for update in updates:
            payload = {key: update.metadata[key] for key in (*keys, "_node_content") if key in update.metadata}
            operations.append(
                models.SetPayloadOperation(set_payload=models.SetPayload(payload=payload, points=[update.node_id]))
            )
        self._client.batch_update_points(self._collection, operations, wait=True)

    def scan(self, size: int) -> Iterator[list[Stored]]:
        if self._client.collection_exists(self._collection):
            yield from self._scroll(size, None)

    def _scroll(self, size: int, where: Any) -> Iterator[list[Stored]]:
        offset = None
        while True:
            points, offset = self._client.scroll(
                self._collection, scroll_filter=where, limit=size, offset=offset, with_payload=True, with_vectors=False
            )
            if points:
                yield [_stored(point) for point in points]
            if offset is None:
                return

    def count(self) -> int | None:
        if not self._client.collection_exists(self._collection):
            return 0
        counted: int = self._client.count(self._collection, exact=True).count
        return counted


def _key(key: str) -> str:
    """The flat payload key as Qdrant addresses it (``a.b`` quoted, so it is not read as a path)."""
    try:
        return payload_key("document_id_key", key)
    except CannotState as refused:
        raise GrantsError(key, refused.why) from refused


def _stored(point: Any) -> Stored:
    return Stored(str(point.id), dict(point.payload or {}))
