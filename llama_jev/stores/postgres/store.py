"""``AclPGVectorStore``: LlamaIndex's ``PGVectorStore`` with the caller's ACL and filters as bound SQL.

Needs the ``postgres`` extra (``pip install -e ".[postgres]"`` in a clone). Import it from
``llama_jev.stores``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

try:
    from llama_index.vector_stores.postgres import PGVectorStore
    from llama_index.vector_stores.postgres.base import DBEmbeddingRow
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "AclPGVectorStore needs llama-index-vector-stores-postgres and its drivers: "
        'pip install -e ".[postgres]" in a clone of llama_jev'
    ) from error
import sqlalchemy
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement

from llama_jev.acl.rules import MetadataAcl
from llama_jev.stores.base import KeyCensus
from llama_jev.stores.completeness import report_complete
from llama_jev.stores.postgres import cost
from llama_jev.stores.postgres.plan import (
    TABLE_KEY,
    Estimates,
    Plan,
    Steps,
    acl_indexes,
    estimate_key,
    plan_dense,
    run_async,
    run_sync,
    settings,
)
from llama_jev.stores.postgres.sql import AclFilters, acl_clause, filter_clause, key_present

__all__ = ["AclPGVectorStore"]

logger = logging.getLogger("llama_jev")

# pgvector 0.8 added iterative index scans: without them an HNSW scan stops after ef_search
# candidates, and a selective WHERE clause (one tenant of many) leaves fewer than k rows, often 0.
_ITERATIVE_SCAN_SINCE = (0, 8)
# From this many rows on, a table without an index on the tenant key is worth a warning: reading
# all of it for one tenant's rows costs about 3 us a row (its JSON parsed), 60 ms here.
_LARGE_TABLE = 20_000
# Rows whose metadata key names (never values) are shown beside a key no row holds.
_KEY_SAMPLE = 32


_PLANNED = "llama_jev_planned"  # an execution option: the connection's query sets its own settings


def _iterative_scan(connection: sqlalchemy.Connection) -> None:
    if connection.get_execution_options().get(_PLANNED):
        return  # a planned query sets iterative_scan with the rest of its settings, in one statement
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
    - A filtered dense query is planned by cost, as Qdrant's query planner does
      (``llama_jev.stores.postgres.plan`` and ``.cost``): the table's size sets the line (3,000
      admitted rows up to 100,000 rows, about 12,000 at 1,000,000, at most 20,000: the exact read
      costs about 5 us a row); the planner's row estimate decides whether to try the exact path
      (up to twice the line), which reads the admitted rows through the indexes, counts them and,
      at most the line, ranks them exactly (the exact filtered top k: the count, not a statistic,
      decides). A broader caller walks the HNSW index with pgvector 0.8's ``relaxed_order``
      iterative scan, ``ef_search`` and a window growing with the table (80 and 20 up to
      100,000 rows, 400 and 40 at 1,000,000) and an exact re-sort of the window. A walk that
      comes back short stopped on its budget: the admitted rows are then ranked exactly, and the
      store tells ``JevRetriever`` whether its answer is complete
      (``llama_jev.stores.completeness``), so a shortfall is never silent. Grant lists over the
      JSON column have no estimate (the planner says half the table): tried exactly on a table of
      up to 20,000 rows; beyond, use ``use_jsonb=True`` with ``acl_indexes`` (GIN: true counts).
      Other paths (text search, MMR) set ``hnsw.iterative_scan = strict_order`` per transaction.
    - ``acl_indexes=acl`` (a :class:`~llama_jev.acl.rules.MetadataAcl`): on setup, create the
      indexes that ACL's clause can use (:meth:`create_acl_indexes`): the tenant's B-tree
      makes a tenant's rows cheap to read and gives the planner its statistics. Without any
      index on a metadata key the store says so once (WARNING).

    Example::

        store = AclPGVectorStore.from_params(
            host="localhost", port="5432", database="rag", user="app", password="...",
            table_name="docs", embed_dim=384, acl_indexes=acl,
        )
        index = VectorStoreIndex.from_vector_store(store, embed_model=embed_model)
        retriever = JevRetriever.from_index(index, selector, acl, top_k=5)  # pushes the ACL down
    """

    _scan_checked: bool = PrivateAttr(default=False)
    _acl_indexes: MetadataAcl | None = PrivateAttr(default=None)
    _indexes_checked: bool = PrivateAttr(default=False)
    _iterative: bool = PrivateAttr(default=False)
    _estimates: Estimates = PrivateAttr(default_factory=Estimates)
    _blind_warned: bool = PrivateAttr(default=False)

    def __init__(self, *args: Any, acl_indexes: MetadataAcl | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acl_indexes = _checked_acl(acl_indexes)

    @classmethod
    def from_params(cls, *args: Any, acl_indexes: MetadataAcl | None = None, **kwargs: Any) -> AclPGVectorStore:
        """``PGVectorStore.from_params``, plus ``acl_indexes`` (see the class)."""
        store = super().from_params(*args, **kwargs)
        assert isinstance(store, AclPGVectorStore)
        store._acl_indexes = _checked_acl(acl_indexes)
        return store

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "AclPGVectorStore"

    def _initialize(self) -> None:
        super()._initialize()
        if not self._scan_checked:
            self._scan_checked = True
            self._enable_iterative_scan()
            if self._acl_indexes is not None and self.perform_setup:
                self.create_acl_indexes(self._acl_indexes)

    def create_acl_indexes(self, acl: MetadataAcl) -> list[str]:
        """Create the indexes the pushed-down ``acl`` uses, where missing; return the names of all of them.

        A B-tree on the tenant key's text (every table), a GIN index on the users and roles keys
        (a ``use_jsonb=True`` table only: a JSON column's grants are checked on a JSONB copy no
        index serves). Idempotent; the store calls it on setup when built with ``acl_indexes``.
        ``CREATE INDEX`` blocks writes to the table while it runs: on a large live table, run
        the statements of :meth:`acl_index_ddl` yourself with ``CONCURRENTLY``.

        Example::

            store.create_acl_indexes(MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles"))
        """
        acl = _required_acl(acl)
        self._initialize()
        assert self._engine is not None  # set by _initialize
        indexes = acl_indexes(self._table_class, acl, jsonb=self.use_jsonb)
        with self._engine.begin() as connection:
            for index in indexes:
                index.create(connection, checkfirst=True)
            # The planner's estimate of a tenant's rows comes from the new index's statistics.
            connection.exec_driver_sql(f"ANALYZE {self._qualified_table()}")
        self._indexes_checked = True
        return [str(index.name) for index in indexes]

    def acl_index_ddl(self, acl: MetadataAcl) -> list[str]:
        """The ``CREATE INDEX`` statements of :meth:`create_acl_indexes`, to run yourself (``CONCURRENTLY``).

        Example::

            for statement in store.acl_index_ddl(acl):
                print(statement.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))
        """
        acl = _required_acl(acl)
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        return [
            str(sqlalchemy.schema.CreateIndex(index).compile(dialect=dialect))
            for index in acl_indexes(self._table_class, acl, jsonb=self.use_jsonb)
        ]

    def _qualified_table(self) -> str:
        # schema_name is checked against [A-Za-z_][A-Za-z0-9_]* by the stock store; the table
        # name is LlamaIndex's data_<table_name>, quoted as an identifier.
        preparer = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
        return f"{preparer.quote(self.schema_name)}.{preparer.quote(self._table_class.__tablename__)}"

    def _check_acl_indexes(self, connection: sqlalchemy.Connection) -> None:
        """Warn once when a large table has no index on a metadata key: a selective ACL scans all of it."""
        if self._indexes_checked:
            return
        self._indexes_checked = True
        table = self._table_class.__table__
        rows = connection.execute(
            sqlalchemy.select(sqlalchemy.func.count()).select_from(
                sqlalchemy.select(table.c.id).limit(_LARGE_TABLE).subquery()
            )
        ).scalar_one()
        if rows < _LARGE_TABLE:
            return  # a scan of a small table costs less than asking for an index
        found = connection.execute(
            sqlalchemy.text(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = :schema AND tablename = :table "
                # (LlamaIndex's own index on ref_doc_id, for deletes, serves no ACL.)
                "AND indexdef LIKE '%metadata_ ->%' AND indexdef NOT LIKE '%''ref_doc_id''%'"
            ),
            {"schema": self.schema_name, "table": self._table_class.__tablename__},
        ).scalar_one()
        if not found:
            logger.warning(
                "AclPGVectorStore: table %s has no index on a metadata key, so a selective ACL (one tenant of "
                "many) reads the whole table. Build the store with acl_indexes=acl, or call "
                "store.create_acl_indexes(acl) once.",
                self._table_class.__tablename__,
            )

    def _plan_steps(self, embedding: Any, limit: int, filters: MetadataFilters, **kwargs: Any) -> Steps:
        where = self._recursively_apply_filters(filters)
        # The stock store's own ef_search (hnsw_kwargs, or the query's keyword) is a floor.
        floor = int(kwargs.get("hnsw_ef_search") or (self.hnsw_kwargs or {}).get("hnsw_ef_search") or 0)

        def hnsw_query(size: int) -> Any:
            # The stock statement without filters, then the clause built above: the ACL's clause
            # costs about a third of a broad query's Python time, so it is built once per query.
            # (The stock store applies its filters after customize_query_fn too, so the SQL is the same.)
            return self._build_query(embedding, max(size, floor), None, **kwargs).where(where)

        values = settings(limit, iterative=self._iterative, ef_search=floor)
        exact = self._customize_query_fn is None
        key = estimate_key(where)
        known, table_rows = self._estimates.get(key), self._estimates.get(TABLE_KEY)
        steps = plan_dense(
            self._table_class, embedding, limit, where, hnsw_query, values=values, exact=exact,
            known=known, table_rows=table_rows,
        )  # fmt: skip
        plan = yield from steps
        self._warn_blind(plan)
        # Kept from when they were taken (not refreshed by use), so a table or a tenant that grows is
        # measured again within ESTIMATE_SECONDS; a count taken this time replaces a remembered estimate.
        if known is None or plan.admitted is not None:
            self._estimates.put(key, plan.known)
        if table_rows is None:
            self._estimates.put(TABLE_KEY, plan.table_rows)
        # Whether a short answer holds every admitted row (an exact read) or a walk stopped on its budget.
        report_complete(plan.complete)
        return plan

    def _warn_blind(self, plan: Plan) -> None:
        """Warn once when a filter had no estimate on a table too large to read whole for it."""
        if self._blind_warned or not plan.blind or plan.path == "exact" or plan.table_rows <= cost.BLIND_TABLE_ROWS:
            return
        self._blind_warned = True
        logger.warning(
            "AclPGVectorStore: on table %s (about %d rows) no index serves an ACL filter, so PostgreSQL cannot "
            "estimate how many rows a caller may read (grant lists over the JSON metadata column: it guesses half "
            "the table) and a selective caller walks the HNSW index instead of being ranked exactly. Store the "
            "metadata as JSONB (use_jsonb=True) and build the store with acl_indexes=acl.",
            self._table_class.__tablename__,
            plan.table_rows,
        )

    def _planned(self, filters: Any, embedding: Any) -> bool:
        return isinstance(filters, MetadataFilters) and bool(filters.filters) and embedding is not None

    def _query_with_score(
        self, embedding: Any, limit: int = 10, metadata_filters: Any = None, **kwargs: Any
    ) -> list[DBEmbeddingRow]:
        # The dense path of query() and of hybrid queries: a filtered one is planned by its size.
        if not self._planned(metadata_filters, embedding):
            rows: list[DBEmbeddingRow] = super()._query_with_score(embedding, limit, metadata_filters, **kwargs)
            return rows
        steps = self._plan_steps(embedding, limit, metadata_filters, **kwargs)
        assert self._engine is not None  # set by query()'s _initialize
        with self._engine.execution_options(**{_PLANNED: True}).begin() as connection:
            if _holds_acl(metadata_filters):
                self._check_acl_indexes(connection)
            plan = run_sync(steps, connection)
        return _embedding_rows(plan)

    async def _aquery_with_score(
        self, embedding: Any, limit: int = 10, metadata_filters: Any = None, **kwargs: Any
    ) -> list[DBEmbeddingRow]:
        if not self._planned(metadata_filters, embedding):
            rows: list[DBEmbeddingRow] = await super()._aquery_with_score(embedding, limit, metadata_filters, **kwargs)
            return rows
        steps = self._plan_steps(embedding, limit, metadata_filters, **kwargs)
        assert self._async_engine is not None  # set by aquery()'s _initialize
        async with self._async_engine.execution_options(**{_PLANNED: True}).begin() as connection:
            if _holds_acl(metadata_filters) and not self._indexes_checked:
                await connection.run_sync(self._check_acl_indexes)
            plan = await run_async(steps, connection)
        return _embedding_rows(plan)

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
        self._iterative = True
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


def _checked_acl(acl: Any) -> MetadataAcl | None:
    return None if acl is None else _required_acl(acl)


def _required_acl(acl: Any) -> MetadataAcl:
    if not isinstance(acl, MetadataAcl):
        raise TypeError(f"acl_indexes must be the MetadataAcl whose keys to index, not {type(acl).__name__}")
    return acl


def _holds_acl(filters: Any) -> bool:
    """Whether ``filters`` carry an ACL (``AclFilters``), at any depth."""
    if isinstance(filters, AclFilters):
        return True
    return isinstance(filters, MetadataFilters) and any(_holds_acl(part) for part in filters.filters)


def _embedding_rows(plan: Plan) -> list[DBEmbeddingRow]:
    """The plan's rows as the stock store's ``DBEmbeddingRow`` (similarity = 1 - cosine distance)."""
    return [
        DBEmbeddingRow(
            node_id=row.node_id,
            text=row.text,
            metadata=row.metadata_,
            custom_fields={},
            similarity=(1 - row.distance) if row.distance is not None else 0,
        )
        for row in plan.rows
    ]


def _version(text: str) -> tuple[int, ...]:
    """``"0.8.1"`` -> ``(0, 8, 1)``; a part that is not a number ends the version."""
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)
