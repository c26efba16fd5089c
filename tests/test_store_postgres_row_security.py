"""Row-level security as a floor: the database keeps every query of the application role inside one tenant.

On the session's embedded PostgreSQL 18: the table is written by its owner (the superuser), the
policy of ``row_security_ddl`` put on it, and everything read back as ``rls_app``, a login role
that owns nothing, as an application should connect. Queries that bypass the app's filter (the
stock ``PGVectorStore``, raw SQL) see only the tenant in the setting, or nothing without it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.vector_stores.postgres")

import sqlalchemy
from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode
from llama_index.vector_stores.postgres import PGVectorStore

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.stores import AclPGVectorStore, row_security_ddl
from llama_jev.stores.postgres import acl_filters
from llama_jev.stores.postgres.row_security import query_tenant
from llama_jev.testing.postgres import PostgresServer

from .support import HashEmbedding

pytestmark = pytest.mark.slow  # PostgreSQL

APP_ROLE = "rls_app"
TABLE = "rls_docs"
ACL = MetadataAcl(tenant_key="tenant", users_key="users")
DIMENSIONS = 4
# Tenants as stored: two real ones, and values whose text a hostile setting could match were the
# policy to compare text only (a number, a list, an object, an empty string, JSON null, no key).
STORED_TENANTS: list[Any] = ["acme"] * 5 + ["globex"] * 4 + [42, ["acme"], {"t": "acme"}, "", None, True]
HOSTILE_SETTINGS = [
    "acme' OR 1=1 --",
    "acme' OR '1'='1",
    "%",
    "acme%",
    "_cme",
    "'",
    "''",
    '"acme"',
    '["acme"]',
    '{"t": "acme"}',
    "42",
    "true",
    "null",
    "",
    " ",
    "*",
    "\\",
    "acme\\",
]


def _nodes() -> list[TextNode]:
    nodes = []
    for i, tenant in enumerate([*STORED_TENANTS, "missing"]):
        metadata: dict[str, Any] = {"users": ["u1"], "topic": "refund"}
        if tenant != "missing":
            metadata["tenant"] = tenant
        embedding = [1.0 + i % 3, 1.0, 0.5 + i % 2, 1.0]
        nodes.append(
            TextNode(id_=f"n{i:02d}", text=f"refund policy paragraph {i}", embedding=embedding, metadata=metadata)
        )
    return nodes


NODES = _nodes()
OF = {tenant: {n.node_id for n in NODES if n.metadata.get("tenant") == tenant} for tenant in ("acme", "globex")}


def app_url(server: PostgresServer, *, driver: str = "psycopg2") -> str:
    return f"postgresql+{driver}://{APP_ROLE}@{server.host}:{server.port}/{server.database}"


def app_kwargs(server: PostgresServer, **extra: Any) -> dict[str, Any]:
    return {
        "connection_string": app_url(server),
        "async_connection_string": app_url(server, driver="asyncpg"),
        "table_name": TABLE,
        "embed_dim": DIMENSIONS,
        "hybrid_search": True,
        "perform_setup": False,  # the application role creates nothing
        **extra,
    }


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> PostgresServer:
    """The table written by its owner, the policy on it (twice: the DDL is idempotent), the app role."""
    owner = AclPGVectorStore(
        connection_string=postgres_server.url, async_connection_string=postgres_server.async_url,
        table_name=TABLE, embed_dim=DIMENSIONS, hybrid_search=True,
    )  # fmt: skip
    owner.add(NODES)
    assert owner._engine is not None
    with owner._engine.begin() as connection:
        connection.exec_driver_sql(f"DROP ROLE IF EXISTS {APP_ROLE}")
        connection.exec_driver_sql(f"CREATE ROLE {APP_ROLE} LOGIN")
    for _ in range(2):
        with owner._engine.begin() as connection:
            for statement in owner.row_security_ddl(ACL, role=APP_ROLE):
                connection.exec_driver_sql(statement)
    owner._engine.dispose()
    return postgres_server


@pytest.fixture
def app(server: PostgresServer) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(app_url(server))
    yield engine
    engine.dispose()


def read_as(engine: sqlalchemy.Engine, setting: str | None) -> set[str]:
    """``SELECT node_id`` of the whole table, no filter, in one transaction with the setting (or none)."""
    with engine.begin() as connection:
        if setting is not None:
            connection.execute(
                sqlalchemy.text("SELECT set_config('llama_jev.tenant', :tenant, true)"), {"tenant": setting}
            )
        return set(connection.scalars(sqlalchemy.text(f"SELECT node_id FROM data_{TABLE}")))


def test_the_ddl_ran_twice_leaves_one_policy_on_a_table_with_row_security(server: PostgresServer) -> None:
    engine = sqlalchemy.create_engine(server.url)
    try:
        with engine.connect() as connection:
            policies = connection.scalars(
                sqlalchemy.text("SELECT policyname FROM pg_policies WHERE tablename = :table"),
                {"table": f"data_{TABLE}"},
            ).all()
            enabled = connection.scalar(
                sqlalchemy.text("SELECT relrowsecurity FROM pg_class WHERE relname = :table"),
                {"table": f"data_{TABLE}"},
            )
            everything = connection.scalar(sqlalchemy.text(f"SELECT count(*) FROM data_{TABLE}"))
    finally:
        engine.dispose()
    assert policies == ["llama_jev_tenant"]
    assert enabled is True
    assert everything == len(NODES)  # the superuser bypasses the policy, as PostgreSQL documents


def test_raw_sql_as_the_app_role_reads_only_the_tenant_in_the_setting(app: sqlalchemy.Engine) -> None:
    assert read_as(app, "acme") == OF["acme"]
    assert read_as(app, "globex") == OF["globex"]


def test_without_the_setting_the_app_role_reads_no_rows(app: sqlalchemy.Engine) -> None:
    assert read_as(app, None) == set()
    assert read_as(app, "acme") == OF["acme"]
    # The setting lasted one transaction: the pooled connection's next one reads nothing again.
    assert read_as(app, None) == set()


@pytest.mark.parametrize("setting", HOSTILE_SETTINGS)
def test_hostile_settings_match_no_row(app: sqlalchemy.Engine, setting: str) -> None:
    assert read_as(app, setting) == set()


def _setting_for(tenant: str) -> Any:
    def set_tenant(connection: sqlalchemy.Connection) -> None:
        connection.execute(sqlalchemy.text("SELECT set_config('llama_jev.tenant', :tenant, true)"), {"tenant": tenant})

    return set_tenant


EVERYTHING = VectorStoreQuery(query_embedding=[1.0] * DIMENSIONS, similarity_top_k=len(NODES))


def test_a_plain_pgvector_store_without_any_filter_reads_only_the_tenant_in_the_setting(server: PostgresServer) -> None:
    stock = PGVectorStore(**app_kwargs(server))
    stock._initialize()
    assert stock._engine is not None
    sqlalchemy.event.listen(stock._engine, "begin", _setting_for("globex"))
    try:
        assert set(stock.query(EVERYTHING).ids) == OF["globex"]
        text = VectorStoreQuery(query_str="refund", mode=VectorStoreQueryMode.TEXT_SEARCH, similarity_top_k=len(NODES))
        assert set(stock.query(text).ids) == OF["globex"]
    finally:
        stock._engine.dispose()


async def test_a_plain_pgvector_store_reads_nothing_without_the_setting_async(server: PostgresServer) -> None:
    stock = PGVectorStore(**app_kwargs(server))
    try:
        assert (await stock.aquery(EVERYTHING)).ids == []
    finally:
        await stock.close()


def off_selector() -> CandidateSelector:
    return CandidateSelector(ScriptedJudge(lambda *_: pytest.fail("OFF never asks")), ExecutionOptions(mode=Mode.OFF))


CALLERS = [
    RuntimeContext(user_id="u1", tenant_id="acme"),
    RuntimeContext(user_id="u1", tenant_id="globex"),
    *(RuntimeContext(user_id="u1", tenant_id=value) for value in HOSTILE_SETTINGS if value.strip()),
]


def test_acl_store_with_row_security_through_from_index_returns_the_callers_rows(server: PostgresServer) -> None:
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    index = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=DIMENSIONS))
    retriever = JevRetriever.from_index(index, off_selector(), ACL, top_k=len(NODES))
    assert retriever.prefilter
    for ctx in CALLERS:
        got = {n.node.node_id for n in retriever.retrieve("refund policy", ctx=ctx)}
        assert got == OF.get(ctx.tenant_id or "", set())


async def test_acl_store_with_row_security_through_from_index_returns_the_callers_rows_async(
    server: PostgresServer,
) -> None:
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    index = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=DIMENSIONS))
    retriever = JevRetriever.from_index(index, off_selector(), ACL, top_k=len(NODES))
    try:
        for ctx in CALLERS:
            got = {n.node.node_id for n in await retriever.aretrieve("refund policy", ctx=ctx)}
            assert got == OF.get(ctx.tenant_id or "", set())
    finally:
        await store.close()


QUERIES = {
    "dense": VectorStoreQuery(query_embedding=[1.0] * DIMENSIONS, similarity_top_k=len(NODES)),
    "text": VectorStoreQuery(query_str="refund", mode=VectorStoreQueryMode.TEXT_SEARCH, similarity_top_k=len(NODES)),
    "hybrid": VectorStoreQuery(
        query_embedding=[1.0] * DIMENSIONS,
        query_str="refund",
        mode=VectorStoreQueryMode.HYBRID,
        similarity_top_k=len(NODES),
        sparse_top_k=len(NODES),
    ),
    "mmr": VectorStoreQuery(query_embedding=[1.0] * DIMENSIONS, mode=VectorStoreQueryMode.MMR, similarity_top_k=3),
}

ALL_IDS = [node.node_id for node in NODES]  # asked for by id: only the tenant's come back
MMR = {"mmr": {"mmr_prefetch_k": len(NODES)}}


@pytest.mark.parametrize("path", QUERIES)
def test_every_path_without_the_apps_filter_stays_inside_the_bound_callers_tenant(
    server: PostgresServer, path: str
) -> None:
    # No AclFilters at all: only the database's policy keeps the tenant, from the bound caller.
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    try:
        with runtime_context(RuntimeContext(user_id="u1", tenant_id="globex")):
            got = set(store.query(QUERIES[path], **MMR.get(path, {})).ids)
            nodes = {node.node_id for node in store.get_nodes(node_ids=ALL_IDS)}
    finally:
        assert store._engine is not None
        store._engine.dispose()
    assert got <= OF["globex"]
    assert len(got) == (3 if path == "mmr" else len(OF["globex"]))
    assert nodes == OF["globex"]


@pytest.mark.parametrize("path", QUERIES)
async def test_every_path_without_the_apps_filter_stays_inside_the_bound_callers_tenant_async(
    server: PostgresServer, path: str
) -> None:
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    try:
        with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme")):
            got = set((await store.aquery(QUERIES[path], **MMR.get(path, {}))).ids)
            nodes = {node.node_id for node in await store.aget_nodes(node_ids=ALL_IDS)}
    finally:
        await store.close()
    assert got <= OF["acme"]
    assert len(got) == (3 if path == "mmr" else len(OF["acme"]))
    assert nodes == OF["acme"]


def test_a_query_without_a_caller_reads_no_rows_and_says_so_once(
    server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llama_jev")
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    try:
        assert store.query(EVERYTHING).ids == []
        assert store.query(EVERYTHING).ids == []
        with runtime_context(RuntimeContext(user_id="u1")):  # a caller without a tenant
            assert store.query(EVERYTHING).ids == []
    finally:
        assert store._engine is not None
        store._engine.dispose()
    said = [r for r in caplog.records if "row_security=True" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]


def test_the_setting_never_outlives_the_query(server: PostgresServer) -> None:
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    ctx = RuntimeContext(user_id="u1", tenant_id="acme")
    try:
        assert set(store.query(dataclasses.replace(EVERYTHING, filters=acl_filters(ACL, ctx))).ids) == OF["acme"]
        assert store._engine is not None
        # The store's own pool, the connection the query used: a transaction outside a query reads nothing.
        with store._engine.begin() as connection:
            assert connection.scalar(sqlalchemy.text("SELECT current_setting('llama_jev.tenant', true)")) == ""
            assert connection.scalar(sqlalchemy.text(f"SELECT count(*) FROM data_{TABLE}")) == 0
    finally:
        assert store._engine is not None
        store._engine.dispose()


def test_a_query_acting_for_two_tenants_is_refused() -> None:
    acme, globex = RuntimeContext(user_id="u1", tenant_id="acme"), RuntimeContext(user_id="u1", tenant_id="globex")
    assert query_tenant(acl_filters(ACL, acme)) == "acme"
    with runtime_context(acme):
        assert query_tenant(None) == "acme"
        with pytest.raises(ValueError, match="different tenants"):
            query_tenant(acl_filters(ACL, globex))
    assert query_tenant(None) is None


def test_the_owner_bypasses_the_policy_unless_forced(server: PostgresServer) -> None:
    # A table owned by an ordinary role (not a superuser): without FORCE its owner reads every
    # row; with FORCE the owner is held to the setting like anyone.
    engine = sqlalchemy.create_engine(server.url)
    owner = sqlalchemy.create_engine(server.url.replace("postgres@", "rls_owner@", 1))
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS data_rls_owned")
            connection.exec_driver_sql("DROP ROLE IF EXISTS rls_owner")
            connection.exec_driver_sql("CREATE ROLE rls_owner LOGIN")
            connection.exec_driver_sql(f"CREATE TABLE data_rls_owned AS SELECT node_id, metadata_ FROM data_{TABLE}")
            connection.exec_driver_sql("ALTER TABLE data_rls_owned OWNER TO rls_owner")
        for force, want in ((False, len(NODES)), (True, len(OF["acme"]))):
            with owner.begin() as connection:
                for statement in row_security_ddl(ACL, "data_rls_owned", force=force):
                    connection.exec_driver_sql(statement)
            with owner.begin() as connection:
                connection.exec_driver_sql("SELECT set_config('llama_jev.tenant', 'acme', true)")
                assert connection.scalar(sqlalchemy.text("SELECT count(*) FROM data_rls_owned")) == want
    finally:
        owner.dispose()
        engine.dispose()


@pytest.mark.parametrize("key", ["te'nant", "te\\nant", "o'brien\\'; DROP TABLE x; --", "tenant"])
def test_a_tenant_key_with_quotes_and_backslashes_is_a_literal_not_sql(server: PostgresServer, key: str) -> None:
    engine = sqlalchemy.create_engine(server.url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS data_rls_keys")
            connection.exec_driver_sql("CREATE TABLE data_rls_keys (node_id text, metadata_ json)")
            connection.execute(
                sqlalchemy.text(
                    "INSERT INTO data_rls_keys VALUES ('mine', json_build_object(:key, 'acme')), "
                    "('theirs', json_build_object(:key, 'globex')), ('other key', json_build_object('tenant2', 'acme'))"
                ),
                {"key": key},
            )
            for statement in row_security_ddl(MetadataAcl(tenant_key=key), "data_rls_keys", force=True):
                connection.exec_driver_sql(statement)
            connection.exec_driver_sql("ALTER TABLE data_rls_keys OWNER TO rls_app")  # held by FORCE
        app = sqlalchemy.create_engine(app_url(server))
        try:
            with app.begin() as connection:
                connection.exec_driver_sql("SELECT set_config('llama_jev.tenant', 'acme', true)")
                assert connection.scalars(sqlalchemy.text("SELECT node_id FROM data_rls_keys")).all() == ["mine"]
        finally:
            app.dispose()
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS data_rls_keys")
        engine.dispose()


def test_row_security_ddl_refuses_what_it_cannot_state() -> None:
    with pytest.raises(ValueError, match="tenant_key"):
        row_security_ddl(MetadataAcl(users_key="users"), "data_docs")
    with pytest.raises(TypeError, match="MetadataAcl"):
        row_security_ddl("tenant", "data_docs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role"):
        row_security_ddl(ACL, "data_docs", role="")
    with pytest.raises(ValueError, match="NUL"):
        row_security_ddl(MetadataAcl(tenant_key="ten\x00ant"), "data_docs")
    with pytest.raises(TypeError, match="row_security"):
        AclPGVectorStore(
            connection_string="postgresql+psycopg2://x@127.0.0.1:1/x",
            async_connection_string="postgresql+asyncpg://x@127.0.0.1:1/x",
            table_name="t",
            embed_dim=2,
            row_security="yes",
        )  # type: ignore[arg-type]


def test_row_security_ddl_quotes_names_and_the_key() -> None:
    statements = row_security_ddl(MetadataAcl(tenant_key="a'b"), 'my "docs"', schema="Tenant Data", role="rag-app")
    assert statements[0] == 'ALTER TABLE "Tenant Data"."my ""docs""" ENABLE ROW LEVEL SECURITY'
    assert "(metadata_ ->> 'a''b') = NULLIF(current_setting('llama_jev.tenant', true), '')" in statements[2]
    assert statements[-2:] == [
        'GRANT USAGE ON SCHEMA "Tenant Data" TO "rag-app"',
        'GRANT SELECT ON "Tenant Data"."my ""docs""" TO "rag-app"',
    ]


def test_the_key_census_reads_as_the_bound_caller(server: PostgresServer) -> None:
    # Without a caller the table looks empty (and the retriever would ask again on every query).
    store = AclPGVectorStore(**app_kwargs(server, row_security=True))
    try:
        assert store.key_census(["tenant", "users", "is_public"]).nodes == 0
        with runtime_context(RuntimeContext(user_id="u1", tenant_id="globex")):
            census = store.key_census(["tenant", "users", "is_public"])
    finally:
        assert store._engine is not None
        store._engine.dispose()
    assert census.nodes == len(OF["globex"])
    assert census.absent == ("is_public",)


def test_the_policy_keeps_the_planners_estimate_of_a_large_tenant(server: PostgresServer) -> None:
    # A type check written "jsonb_typeof(...) = 'string'" is estimated at 0.5 % of the rows: with
    # it, the planner read a 25 % tenant through the tenant index instead of walking HNSW (450 ms
    # instead of 3 ms at 100,000 rows). The policy's own estimate must stay near the tenant's size.
    engine = sqlalchemy.create_engine(server.url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS data_rls_estimate")
            connection.exec_driver_sql(
                "CREATE TABLE data_rls_estimate AS SELECT i AS id, json_build_object('tenant', "
                "CASE WHEN mod(i, 4) = 0 THEN 'large' ELSE 'small-' || mod(i, 50) END) AS metadata_ "
                "FROM generate_series(1, 4000) AS i"
            )
            connection.exec_driver_sql("CREATE INDEX ON data_rls_estimate ((metadata_ ->> 'tenant'))")
            for statement in row_security_ddl(ACL, "data_rls_estimate", role=APP_ROLE):
                connection.exec_driver_sql(statement)
            connection.exec_driver_sql("ANALYZE data_rls_estimate")
        app = sqlalchemy.create_engine(app_url(server))
        try:
            with app.begin() as connection:
                connection.exec_driver_sql("SELECT set_config('llama_jev.tenant', 'large', true)")
                plan = connection.scalar(sqlalchemy.text("EXPLAIN (FORMAT JSON) SELECT id FROM data_rls_estimate"))
                rows = connection.scalar(sqlalchemy.text("SELECT count(*) FROM data_rls_estimate"))
        finally:
            app.dispose()
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE IF EXISTS data_rls_estimate")
        engine.dispose()
    assert rows == 1000
    assert plan[0]["Plan"]["Plan Rows"] >= 500  # estimated near 1,000, not 0.5 % of it
