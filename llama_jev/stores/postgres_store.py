"""``AclPGVectorStore``: LlamaIndex's ``PGVectorStore`` with the caller's ACL and filters as bound SQL.

Needs the ``postgres`` extra (``pip install "llama-jev[postgres]"``). Import it from
``llama_jev.stores``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

try:
    from llama_index.vector_stores.postgres import PGVectorStore
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'AclPGVectorStore needs llama-index-vector-stores-postgres and its drivers: pip install "llama-jev[postgres]"'
    ) from error
import sqlalchemy
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.vector_stores.types import MetadataFilter
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement

from llama_jev.stores.base import KeyCensus
from llama_jev.stores.postgres_sql import AclFilters, acl_clause, filter_clause, key_present

__all__ = ["AclPGVectorStore"]

logger = logging.getLogger("llama_jev")

# pgvector 0.8 added iterative index scans: without them an HNSW scan stops after ef_search
# candidates, and a selective WHERE clause (one tenant of many) leaves fewer than k rows, often 0.
_ITERATIVE_SCAN_SINCE = (0, 8)
# Rows whose metadata key names (never values) are shown beside a key no row holds.
_KEY_SAMPLE = 32


def _iterative_scan(connection: sqlalchemy.Connection) -> None:
    # LOCAL: for this transaction only, so an engine shared with other code keeps its settings.
    # strict_order: results stay ordered by distance, as LlamaIndex expects.
    connection.exec_driver_sql("SET LOCAL hnsw.iterative_scan = strict_order")


class AclPGVectorStore(PGVectorStore):
    """A drop-in ``PGVectorStore`` whose SQL applies the caller's ACL, every value bound.

    Same constructor, same ``from_params``, same table: point it at the table an existing
    ``PGVectorStore`` wrote and nothing is re-ingested. What changes:

    - ``JevRetriever.from_index`` pushes a :class:`~llama_jev.acl.rules.MetadataAcl` down into
      it by default: each query's SQL gets one ACL clause (tenant, users, roles, public flag,
      exactly ``MetadataAcl.allows``) AND-ed with the caller's own filters, on every path (dense,
      sparse / text search, hybrid, MMR, sync and async), so nodes the caller may not read never
      leave the database and never crowd readable ones out of the top k.
    - The caller's own ``MetadataFilters`` are bound parameters too. The stock store pastes
      filter values into the SQL text: a tenant value ``x' OR 1=1 --`` returned every row, and
      ``--`` comments out whatever follows it.
    - With pgvector 0.8 or later each transaction sets ``hnsw.iterative_scan = strict_order``,
      so an HNSW index under a selective ACL still returns k rows (up to pgvector's
      ``hnsw.max_scan_tuples``, 20,000 by default).

    Example::

        store = AclPGVectorStore.from_params(
            host="localhost", port="5432", database="rag", user="app", password="...",
            table_name="docs", embed_dim=384,
        )
        index = VectorStoreIndex.from_vector_store(store, embed_model=embed_model)
        retriever = JevRetriever.from_index(index, selector, acl, top_k=5)  # pushes the ACL down
    """

    _scan_checked: bool = PrivateAttr(default=False)

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "AclPGVectorStore"

    def _initialize(self) -> None:
        super()._initialize()
        if not self._scan_checked:
            self._scan_checked = True
            self._enable_iterative_scan()

    def _enable_iterative_scan(self) -> None:
        """Set ``hnsw.iterative_scan`` in every transaction, where the server's pgvector has it."""
        # Both set by _connect.
        assert self._engine is not None
        assert self._async_engine is not None
        with self._engine.connect() as connection:
            version = connection.exec_driver_sql(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).scalar()
        if version is None:
            return  # no pgvector yet: the stock store reports that on its first query
        if _version(str(version)) < _ITERATIVE_SCAN_SINCE:
            logger.warning(
                "pgvector %s on this server has no iterative index scans: with an HNSW or IVFFlat index, a "
                "selective ACL can return fewer than k nodes (often none). Upgrade the extension to 0.8 or later "
                "(ALTER EXTENSION vector UPDATE).",
                version,
            )
            return
        for engine in (self._engine, self._async_engine.sync_engine):
            if not sqlalchemy.event.contains(engine, "begin", _iterative_scan):
                sqlalchemy.event.listen(engine, "begin", _iterative_scan)

    def _recursively_apply_filters(self, filters: Any) -> Any:
        # (Annotated `List[MetadataFilters]` upstream, but it is called with one MetadataFilters.)
        # Every SQL path (dense, sparse, hybrid, MMR, get_nodes, sync and async) builds its
        # WHERE clause here, nested groups included: the one place to recognise the ACL.
        if isinstance(filters, AclFilters):
            return acl_clause(self._table_class.metadata_, filters.acl, filters.ctx, jsonb=self.use_jsonb)
        return super()._recursively_apply_filters(filters)

    def _build_filter_clause(self, filter_: MetadataFilter) -> ColumnElement[bool]:
        # The caller's own filters, with key and value bound instead of pasted into SQL text.
        return filter_clause(self._table_class.metadata_, filter_)

    def key_census(self, keys: Sequence[str]) -> KeyCensus:
        """Which of ``keys`` no row's metadata holds, and the key names a sample of rows does hold.

        One ``LIMIT 1`` query per key, plus the key names (never the values) of ``_KEY_SAMPLE``
        rows, for diagnosing an ACL that denies everything because the data names its keys otherwise.
        """
        self._initialize()
        table = self._table_class.__table__
        where = f"the rows of PostgreSQL table {table.name!r}"
        assert self._engine is not None  # set by _initialize
        with self._engine.connect() as connection:
            sample = sqlalchemy.select(table.c.metadata_).limit(_KEY_SAMPLE).subquery()
            names = sqlalchemy.select(
                sqlalchemy.func.jsonb_object_keys(sqlalchemy.cast(sample.c.metadata_, postgresql.JSONB))
            ).distinct()
            present = tuple(sorted(connection.scalars(names)))
            rows = connection.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(sample)).scalar_one()
            if not rows:
                return KeyCensus(absent=(), nodes=0, where=where)
            absent = [
                key
                for key in keys
                if connection.execute(sqlalchemy.select(table.c.id).where(self._holds(key)).limit(1)).first() is None
            ]
        return KeyCensus(absent=tuple(absent), nodes=rows, where=where, present=present)

    def _holds(self, key: str) -> ColumnElement[bool]:
        return key_present(self._table_class.__table__.c.metadata_, key, jsonb=self.use_jsonb)


def _version(text: str) -> tuple[int, ...]:
    """``"0.8.1"`` -> ``(0, 8, 1)``; a part that is not a number ends the version."""
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)
