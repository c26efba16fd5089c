"""``AclPGVectorStore`` plans a filtered query by the size of what it admits (llama_jev.stores.postgres.plan).

A table of 20,000 clustered vectors with an HNSW index, where one caller may read a sliver
(0.1 %): the store returns k rows and exactly the filtered top k (recall 1.0 against numpy over
the readable rows), sync and async, where the HNSW path alone (what 0.2 shipped) returned fewer
or the wrong ones; a broad caller still gets k readable rows through the HNSW index; the ACL's
indexes exist and the selective path reads through them; hostile values stay values.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

pytest.importorskip("llama_index.vector_stores.postgres")

import numpy as np
import sqlalchemy
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.types import VectorStoreQuery
from llama_index.core.vector_stores.utils import node_to_metadata_dict

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.stores.postgres import AclPGVectorStore, acl_filters
from llama_jev.stores.postgres import plan as postgres_plan
from llama_jev.testing.postgres import PostgresServer

from .postgres_support import store_kwargs

pytestmark = pytest.mark.slow  # PostgreSQL

ROWS = 20_000
DIMENSIONS = 32
SLIVER = 20  # 0.1 %: HNSW alone must visit ~10,000 candidates to find 10 of them
K = 10
ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
# The sliver's tenant is hostile: pasted into SQL it would read every row.
SLIVER_TENANT = "o'brien' OR '1'='1' --"
SLIVER_CALLER = RuntimeContext(user_id="u1", tenant_id=SLIVER_TENANT, roles={"staff"})
BROAD_CALLER = RuntimeContext(user_id="u1", tenant_id="big", roles={"staff"})


class Table:
    """The rows as written: vectors (unit length), tenants, and the table's store arguments."""

    def __init__(self, kwargs: dict[str, Any], vectors: np.ndarray, tenants: list[str], queries: np.ndarray) -> None:
        self.kwargs = kwargs
        self.vectors = vectors
        self.tenants = tenants
        self.queries = queries

    def top(self, tenant: str, query: np.ndarray) -> list[str]:
        """The exact filtered top k: cosine over the tenant's rows only."""
        rows = np.array([i for i, t in enumerate(self.tenants) if t == tenant])
        best = rows[np.argsort(-(self.vectors[rows] @ query), kind="stable")[:K]]
        return [f"n{i}" for i in best]


def _write(server: PostgresServer, name: str, *, use_jsonb: bool = False) -> Table:
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((16, DIMENSIONS))
    vectors = centres[rng.integers(0, 16, ROWS)] + 0.5 * rng.standard_normal((ROWS, DIMENSIONS))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    tenants = ["big"] * ROWS
    for i in rng.choice(ROWS, SLIVER, replace=False):
        tenants[i] = SLIVER_TENANT
    kwargs = store_kwargs(server, name, embed_dim=DIMENSIONS, use_jsonb=use_jsonb)
    store = AclPGVectorStore(**kwargs)
    store._initialize()
    table = store._table_class.__table__
    assert store._engine is not None
    with store._engine.begin() as connection:  # written as PGVectorStore.add writes rows, in bulk
        rows = []
        for i in range(ROWS):
            metadata = {"tenant": tenants[i], "users": ["u2"], "roles": ["staff"] if i % 2 else "staff"}
            node = TextNode(id_=f"n{i}", text=f"passage {i}", metadata=metadata)
            rows.append(
                {
                    "node_id": node.node_id,
                    "text": node.text,
                    "metadata_": node_to_metadata_dict(node, remove_text=True, flat_metadata=False),
                    "embedding": vectors[i].tolist(),
                }
            )
        connection.execute(table.insert(), rows)
        connection.exec_driver_sql(f"CREATE INDEX ON data_{name} USING hnsw (embedding vector_cosine_ops)")
        connection.exec_driver_sql(f"ANALYZE data_{name}")
    store._engine.dispose()
    queries = vectors[rng.choice(ROWS, 8, replace=False)] + 0.1 * rng.standard_normal((8, DIMENSIONS)).astype(
        np.float32
    )
    return Table(kwargs, vectors, tenants, queries)


@pytest.fixture(scope="module")
def table(postgres_server: PostgresServer) -> Table:
    """20,000 rows, an HNSW index, no index on a metadata key (as a table written by the stock store)."""
    return _write(postgres_server, "plan_sliver")


def _query(table: Table, q: int, ctx: RuntimeContext, k: int = K) -> VectorStoreQuery:
    return VectorStoreQuery(
        query_embedding=table.queries[q].tolist(), similarity_top_k=k, filters=acl_filters(ACL, ctx)
    )


def test_a_caller_who_may_read_a_sliver_gets_k_rows_and_the_exact_top_k_sync(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    for q in range(len(table.queries)):
        result = store.query(_query(table, q, SLIVER_CALLER))
        # 0.2's HNSW path (strict_order) returned 10 rows here, only 6-9 of them of the nearest 10.
        assert result.ids == table.top(SLIVER_TENANT, table.queries[q])
        assert all(node.metadata["tenant"] == SLIVER_TENANT for node in result.nodes)
        assert result.similarities == sorted(result.similarities, reverse=True)


async def test_a_caller_who_may_read_a_sliver_gets_k_rows_and_the_exact_top_k_async(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    try:
        for q in range(len(table.queries)):
            result = await store.aquery(_query(table, q, SLIVER_CALLER))
            assert result.ids == table.top(SLIVER_TENANT, table.queries[q])
    finally:
        await store.close()


def test_a_sliver_smaller_than_k_returns_all_of_it_ranked(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    result = store.query(_query(table, 0, SLIVER_CALLER, k=50))
    assert sorted(result.ids) == sorted(f"n{i}" for i, t in enumerate(table.tenants) if t == SLIVER_TENANT)
    assert result.similarities == sorted(result.similarities, reverse=True)


def _plan(store: AclPGVectorStore, query: VectorStoreQuery) -> postgres_plan.Plan:
    """The plan the store runs for ``query`` (its path and counts), run as query() runs it."""
    store._initialize()
    assert store._engine is not None
    with store._engine.begin() as connection:
        return postgres_plan.run_sync(
            store._plan_steps(query.query_embedding, query.similarity_top_k, query.filters), connection
        )


def test_the_sliver_is_ranked_exactly_and_the_broad_caller_goes_through_hnsw(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    sliver = _plan(store, _query(table, 0, SLIVER_CALLER))
    assert (sliver.path, sliver.admitted) == ("exact", SLIVER)
    broad = _plan(store, _query(table, 0, BROAD_CALLER))
    assert broad.path == "hnsw"
    assert broad.known > postgres_plan.ESTIMATE_GATE  # estimated or counted over the line: the next query walks


def test_the_broad_path_returns_k_readable_rows_near_the_exact_top_k(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    found = 0
    for q in range(len(table.queries)):
        result = store.query(_query(table, q, BROAD_CALLER))
        assert len(result.ids) == K
        assert all(node.metadata["tenant"] == "big" for node in result.nodes)
        assert result.similarities == sorted(result.similarities, reverse=True)  # re-sorted exactly
        found += len(set(result.ids) & set(table.top("big", table.queries[q])))
    assert found / (K * len(table.queries)) >= 0.8  # approximate: the HNSW index (0.875 measured)


def test_the_broad_path_serves_a_wide_window(table: Table) -> None:
    # A widening retriever asks for more than pgvector's largest ef_search (1,000): still k rows.
    result = AclPGVectorStore(**table.kwargs).query(_query(table, 2, BROAD_CALLER, k=1200))
    assert len(result.ids) == 1200
    assert all(node.metadata["tenant"] == "big" for node in result.nodes)
    assert result.similarities == sorted(result.similarities, reverse=True)


async def test_the_broad_path_async(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    try:
        result = await store.aquery(_query(table, 1, BROAD_CALLER))
    finally:
        await store.close()
    assert len(result.ids) == K
    assert all(node.metadata["tenant"] == "big" for node in result.nodes)


class _CountingStore(AclPGVectorStore):
    """The store, counting the filter clauses it builds (every path builds them in this method)."""

    built: int = 0

    def _recursively_apply_filters(self, filters: Any) -> Any:
        self.built += 1
        return super()._recursively_apply_filters(filters)


async def test_a_broad_query_builds_its_acl_clause_once_sync_and_async(table: Table) -> None:
    # The clause cost about a third of a broad query's Python time, and the HNSW statement built it again.
    store = _CountingStore(**table.kwargs)
    try:
        for q in range(2):  # the first with an EXPLAIN, the second with the remembered estimate
            store.built = 0
            result = store.query(_query(table, q, BROAD_CALLER))
            assert (len(result.ids), store.built) == (K, 1)
            store.built = 0
            result = await store.aquery(_query(table, q, BROAD_CALLER))
            assert (len(result.ids), store.built) == (K, 1)
            assert all(node.metadata["tenant"] == "big" for node in result.nodes)
    finally:
        await store.close()


def test_a_table_without_acl_indexes_is_named_once_in_a_warning(table: Table, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="llama_jev")
    store = AclPGVectorStore(**table.kwargs)
    for q in range(3):
        store.query(_query(table, q, SLIVER_CALLER))
    warned = [m for m in caplog.messages if "create_acl_indexes" in m]
    assert len(warned) == 1
    assert "data_plan_sliver" in warned[0]
    assert "brien" not in warned[0]  # a table name, never a value


@pytest.fixture(scope="module")
def indexed(postgres_server: PostgresServer) -> Table:
    """The same rows, the store built with ``acl_indexes``: it creates the ACL's indexes on setup."""
    written = _write(postgres_server, "plan_indexed")
    AclPGVectorStore(**written.kwargs, acl_indexes=ACL)._initialize()
    return written


def _index_definitions(store: AclPGVectorStore) -> dict[str, str]:
    store._initialize()
    assert store._engine is not None
    with store._engine.connect() as connection:
        return dict(
            connection.exec_driver_sql(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %(table)s",
                {"table": store._table_class.__tablename__},
            ).all()
        )


def test_acl_indexes_creates_the_tenant_index_once(indexed: Table) -> None:
    store = AclPGVectorStore(**indexed.kwargs, acl_indexes=ACL)
    before = _index_definitions(store)
    tenant = [name for name, definition in before.items() if "metadata_ ->> 'tenant'" in definition]
    assert len(tenant) == 1
    # Idempotent: again, and through the method, nothing new.
    assert store.create_acl_indexes(ACL) == tenant
    assert _index_definitions(store) == before
    # A JSON column: no GIN index (the clause checks the grants on a JSONB copy no index serves).
    assert not [definition for definition in before.values() if "gin" in definition.lower()]


def test_the_selective_path_reads_through_the_tenant_index(indexed: Table) -> None:
    store = AclPGVectorStore(**indexed.kwargs)
    store._initialize()
    assert store._engine is not None
    (tenant_index,) = [name for name, d in _index_definitions(store).items() if "metadata_ ->> 'tenant'" in d]
    where = store._recursively_apply_filters(acl_filters(ACL, SLIVER_CALLER))
    statement = postgres_plan._exact(store._table_class, indexed.queries[0].tolist(), K, where)
    with store._engine.connect() as connection:  # EXPLAIN (FORMAT JSON) with the values bound, as the store runs it
        plan = json.dumps(connection.execute(postgres_plan._Explain(statement)).scalar_one())
    assert f'"Index Name": "{tenant_index}"' in plan, plan
    assert "embedding_idx" not in plan  # ranked exactly, never through the HNSW index
    assert store.query(_query(indexed, 0, SLIVER_CALLER)).ids == indexed.top(SLIVER_TENANT, indexed.queries[0])


def test_the_estimate_reads_the_tenant_index_statistics(indexed: Table) -> None:
    store = AclPGVectorStore(**indexed.kwargs)
    sliver = _plan(store, _query(indexed, 0, SLIVER_CALLER))
    assert sliver.path == "exact"
    assert sliver.estimate < 5 * SLIVER  # the index's statistics, not a default guess


def test_a_jsonb_table_gets_gin_indexes_on_users_and_roles_and_a_b_tree_on_the_flag(
    postgres_server: PostgresServer,
) -> None:
    store = AclPGVectorStore(
        **store_kwargs(postgres_server, "plan_jsonb", embed_dim=4, use_jsonb=True), acl_indexes=ACL
    )
    store._initialize()
    definitions = _index_definitions(store).values()
    assert any("USING gin" in d and "metadata_ -> 'users'" in d for d in definitions)
    assert any("USING gin" in d and "metadata_ -> 'roles'" in d for d in definitions)
    assert any("USING btree" in d and "metadata_ ->> 'tenant'" in d for d in definitions)
    assert any("USING btree" in d and "metadata_ -> 'public'" in d for d in definitions)


def test_hostile_acl_keys_are_quoted_in_the_indexes(postgres_server: PostgresServer) -> None:
    hostile = MetadataAcl(tenant_key="te'nant); DROP TABLE x; --", users_key='us"ers')
    store = AclPGVectorStore(
        **store_kwargs(postgres_server, "plan_hostile_keys", embed_dim=4, use_jsonb=True), acl_indexes=hostile
    )
    store._initialize()
    store.add([TextNode(id_="a", text="a", embedding=[1.0, 0, 0, 0], metadata={hostile.tenant_key: "t"})])
    names = store.create_acl_indexes(hostile)
    assert len(names) == 2
    assert all(re.fullmatch(r"[a-z0-9_]+", name) for name in names)  # a key never lands in a name
    assert set(names) <= set(_index_definitions(store))
    ctx = RuntimeContext(user_id='us"ers', tenant_id="t")
    query = VectorStoreQuery(query_embedding=[1.0, 0, 0, 0], similarity_top_k=5, filters=acl_filters(hostile, ctx))
    assert store.query(query).ids == []  # tenant matches, no grant: denied, and the table is still there


def test_acl_indexes_must_be_a_metadata_acl(postgres_server: PostgresServer) -> None:
    kwargs = store_kwargs(postgres_server, "plan_typed", embed_dim=4)
    with pytest.raises(TypeError, match="MetadataAcl"):
        AclPGVectorStore(**kwargs, acl_indexes="tenant")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MetadataAcl"):
        AclPGVectorStore.from_params(
            host="127.0.0.1", port="1", database="d", user="u", password="p", table_name="t", acl_indexes=["tenant"]
        )


def test_ddl_for_a_concurrent_build_is_offered(table: Table) -> None:
    store = AclPGVectorStore(**table.kwargs)
    store._initialize()
    (statement,) = store.acl_index_ddl(MetadataAcl(tenant_key="tenant"))
    assert statement.startswith("CREATE INDEX")
    assert "metadata_ ->> 'tenant'" in statement
    assert sqlalchemy.__version__  # (the DDL is SQLAlchemy's own, quoted by the dialect)
