"""Re-tag in PostgreSQL (``PGVectorStore`` / ``AclPGVectorStore``, JSON or JSONB): one transaction.

The selected rows are read ``FOR UPDATE`` page by page and each changed row's ``metadata_`` gets
``metadata_::jsonb || :changed`` (cast back to ``json`` for a JSON column): only the grant keys
and ``_node_content`` are replaced, every value a bound parameter; text and embedding are never
touched. All pages commit together or not at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import sqlalchemy
from sqlalchemy.dialects import postgresql

from llama_jev.stores.grants import Retagger, Selection, Stored

__all__ = ["PostgresRetagger"]


class PostgresRetagger(Retagger):
    """Reads and writes the store's table over its own SQLAlchemy engine, in one transaction per re-tag."""

    name: ClassVar[str] = "postgres"
    atomic: ClassVar[bool] = True

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        store._initialize()
        self._engine: sqlalchemy.Engine = store._engine
        self._table: sqlalchemy.Table = store._table_class.__table__
        self._jsonb = bool(store.use_jsonb)
        self._connection: sqlalchemy.Connection | None = None

    @classmethod
    def recognises(cls, store: Any) -> bool:
        # By name, so llama_jev imports without the postgres extra.
        return any(klass.__name__ == "PGVectorStore" for klass in type(store).__mro__)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlalchemy.Connection]:
        with self._engine.begin() as connection:
            self._connection = connection
            try:
                yield connection
            finally:
                self._connection = None

    def pages(self, selection: Selection, size: int) -> Iterator[list[Stored]]:
        table = self._table
        if selection.node_ids is not None:
            ids = list(selection.node_ids)
            for start in range(0, len(ids), size):
                yield from self._read(table.c.node_id.in_(ids[start : start + size]), size, lock=True)
            return
        document = table.c.metadata_[selection.document_id_key].astext
        yield from self._read(document.in_(list(selection.document_ids or ())), size, lock=True)

    def _read(self, where: Any, size: int, *, lock: bool) -> Iterator[list[Stored]]:
        """Rows matching ``where``, keyset-paged by the primary key (constant memory, no OFFSET rescans)."""
        table = self._table
        last: int | None = None
        while True:
            # A scan leaves the serialized node out (most of the bytes; no grant is read from it).
            metadata = (
                table.c.metadata_
                if lock
                else sqlalchemy.cast(table.c.metadata_, postgresql.JSONB).op("-")(
                    sqlalchemy.literal("_node_content", sqlalchemy.Text)
                )
            )
            query = (
                sqlalchemy.select(table.c.id, table.c.node_id, metadata.label("metadata_"))
                .order_by(table.c.id)
                .limit(size)
            )
            if where is not None:
                query = query.where(where)
            if last is not None:
                query = query.where(table.c.id > last)
            if lock:
                query = query.with_for_update()
            with contextlib.ExitStack() as stack:
                connection = self._connection or stack.enter_context(self._engine.connect())
                rows = connection.execute(query).all()
            if rows:
                yield [Stored(row.node_id, row.metadata_ or {}, row.id) for row in rows]
            if len(rows) < size:
                return
            last = rows[-1].id

    def write(self, updates: Sequence[Stored], keys: Sequence[str]) -> None:
        assert self._connection is not None, "write() runs inside transaction()"
        table = self._table
        merged = sqlalchemy.cast(table.c.metadata_, postgresql.JSONB).op("||")(
            sqlalchemy.cast(sqlalchemy.bindparam("changed", type_=postgresql.JSONB), postgresql.JSONB)
        )
        value = merged if self._jsonb else sqlalchemy.cast(merged, postgresql.JSON)
        statement = table.update().where(table.c.id == sqlalchemy.bindparam("target")).values(metadata_=value)
        self._connection.execute(
            statement,
            [
                {
                    "target": update.row,  # the primary key: node_id may have no index
                    "changed": {
                        key: update.metadata[key] for key in (*keys, "_node_content") if key in update.metadata
                    },
                }
                for update in updates
            ],
        )

    def scan(self, size: int) -> Iterator[list[Stored]]:
        yield from self._read(None, size, lock=False)

    def count(self) -> int:
        with self._engine.connect() as connection:
            counted: int = connection.execute(
                sqlalchemy.select(sqlalchemy.func.count()).select_from(self._table)
            ).scalar_one()
        return counted
