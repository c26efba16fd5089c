"""Re-tag in Milvus: the grant keys of stored rows set by ``upsert`` of the same row, its vector unchanged.

Milvus before 2.6 has no partial update: a row is replaced whole. So each selected row is read
with every field it holds (its vector included), the grant keys and the copy of the metadata in
``_node_content`` are changed, and the row is written back with ``upsert`` under the same primary
key. Text and vector are written back as they were read, never re-embedded; other keys are
untouched. One page is one ``upsert``: a failure part-way leaves the pages before it written (the
re-tag's :class:`~llama_jev.stores.RetagIncompleteError` names them). A collection with a sparse
vector field (LlamaIndex's ``enable_sparse``) is refused: a BM25 function's output cannot be written.

Rows are selected by primary key (``client.get``) or by the document key (the schema's ``VARCHAR``
field of that name, else the dynamic field in ``$meta``), values as escaped literals; the drift
check reads the collection with a query iterator, ``size`` rows at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from llama_jev.stores.grants import Retagger, Selection, Stored
from llama_jev.stores.milvus import _schema
from llama_jev.stores.milvus_expression import Dialect, literal

__all__ = ["MilvusRetagger"]


class MilvusRetagger(Retagger):
    """Reads with ``get`` / ``query`` and writes with ``upsert``, on the store's ``MilvusClient`` and collection."""

    name: ClassVar[str] = "milvus"

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        if getattr(store, "enable_sparse", False):
            raise TypeError(
                "retag over a Milvus collection with a sparse vector field (enable_sparse=True) is not supported: "
                "Milvus before 2.6 rewrites a row whole, and a function's sparse output cannot be written back"
            )
        self._client = store.client
        self._collection = store.collection_name
        self._vector = store.embedding_field
        # What a row holds that is not node metadata: the primary key, the text and the vector.
        self._fields = {"id", store.text_key, store.embedding_field}

    @classmethod
    def recognises(cls, store: Any) -> bool:
        return any(
            klass.__name__ == "MilvusVectorStore" and klass.__module__.startswith("llama_index.vector_stores.milvus")
            for klass in type(store).__mro__
        )

    def pages(self, selection: Selection, size: int) -> Iterator[list[Stored]]:
        output = ["*", self._vector]
        if selection.node_ids is not None:
            ids = list(selection.node_ids)
            for start in range(0, len(ids), size):
                found = self._client.get(self._collection, ids=ids[start : start + size], output_fields=output)
                yield [self._stored(row) for row in found]
            return
        lite, fields = _schema(self.store)
        field = Dialect(lite=lite, fields=fields).field(selection.document_id_key)
        documents = list(selection.document_ids or ())
        # Collected before writing: an offset walk over rows being replaced could skip some.
        matched: list[Stored] = []
        for start in range(0, len(documents), size):
            values = ", ".join(literal(value) for value in documents[start : start + size])
            found = self._client.query(self._collection, filter=f"{field} in [{values}]", output_fields=output)
            matched.extend(self._stored(row) for row in found)
        for start in range(0, len(matched), size):
            yield matched[start : start + size]

    def write(self, updates: Sequence[Stored], keys: Sequence[str]) -> None:
        rows = []
        for update in updates:
            row = dict(update.row)
            for key in (*keys, "_node_content"):
                if key in update.metadata:
                    row[key] = update.metadata[key]
            rows.append(row)
        self._client.upsert(self._collection, rows)

    def scan(self, size: int) -> Iterator[list[Stored]]:
        iterator = self._client.query_iterator(self._collection, batch_size=size, filter="", output_fields=["*"])
        try:
            while page := iterator.next():
                yield [self._stored(row) for row in page]
        finally:
            iterator.close()

    def count(self) -> int:
        found = self._client.query(self._collection, filter="", output_fields=["count(*)"])
        return int(found[0]["count(*)"])

    def _stored(self, row: Mapping[str, Any]) -> Stored:
        metadata = {key: value for key, value in row.items() if key not in self._fields}
        return Stored(str(row["id"]), metadata, row=dict(row))
