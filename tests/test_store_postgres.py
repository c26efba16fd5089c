"""The ACL pushed into PostgreSQL + pgvector equals ``MetadataAcl.allows``, on a real server.

A differential test: a few hundred nodes with random, malformed and hostile ACL metadata, well
over a hundred callers with hostile identities; for each, the rows ``AclPGVectorStore`` returns
under the pushed-down ACL are exactly the rows ``MetadataAcl.allows`` admits over the whole table
(read back as LlamaIndex reads it), on every SQL path, sync and async, with and without the
caller's own filter. The server is the session's embedded PostgreSQL 18 (tests/postgres_server.py).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("llama_index.vector_stores.postgres")

import sqlalchemy
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.stores.postgres import AclPGVectorStore, acl_filters
from llama_jev.testing.postgres import PostgresServer

from .postgres_support import ACLS, FULL_ACL, acl_nodes, callers, store_kwargs

pytestmark = pytest.mark.slow  # PostgreSQL

NODES = 300
CALLERS = callers(120)
OWN_FILTER = MetadataFilters(filters=[MetadataFilter(key="topic", operator=FilterOperator.EQ, value="refund")])
# Rotated per caller, so that across the callers every path meets every kind of identity.
MODES = [VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.TEXT_SEARCH, VectorStoreQueryMode.HYBRID]

Rows = list[tuple[str, dict[str, Any]]]


@pytest.fixture(scope="module", params=[False, True], ids=["json", "jsonb"])
def acl_table(request: pytest.FixtureRequest, postgres_server: PostgresServer) -> tuple[dict[str, Any], Rows]:
    """A table written by the store (JSON metadata, the default, and JSONB), and its rows as stored."""
    use_jsonb: bool = request.param
    kwargs = store_kwargs(
        postgres_server, f"acl_diff_{'jsonb' if use_jsonb else 'json'}", embed_dim=8, hybrid_search=True,
        use_jsonb=use_jsonb,
    )  # fmt: skip
    store = AclPGVectorStore(**kwargs)
    store.add(acl_nodes(NODES))
    table = store._table_class.__table__
    assert store._engine is not None
    with store._engine.connect() as connection:
        rows = [
            (row.node_id, row.metadata_)
            for row in connection.execute(sqlalchemy.select(table.c.node_id, table.c.metadata_))
        ]
    store._engine.dispose()
    assert len(rows) == NODES
    return kwargs, rows


def allowed(rows: Rows, acl: MetadataAcl, ctx: RuntimeContext, *, own_filter: bool = False) -> set[str]:
    return {
        node_id
        for node_id, metadata in rows
        if acl.allows(ctx, metadata) and (not own_filter or metadata.get("topic") == "refund")
    }


def query(acl: MetadataAcl, ctx: RuntimeContext, mode: VectorStoreQueryMode, *, own_filter: bool) -> VectorStoreQuery:
    restriction = acl_filters(acl, ctx)
    filters = (
        MetadataFilters(filters=[OWN_FILTER, restriction], condition=FilterCondition.AND) if own_filter else restriction
    )
    # k = the whole table, so the answer is the set of rows the clause admits.
    return VectorStoreQuery(
        query_embedding=[0.5] * 8, query_str="refund policy", similarity_top_k=NODES, filters=filters, mode=mode
    )


def test_the_pushed_down_acl_admits_exactly_what_metadata_acl_allows_sync(
    acl_table: tuple[dict[str, Any], Rows],
) -> None:
    kwargs, rows = acl_table
    store = AclPGVectorStore(**kwargs)
    leaks = misses = 0
    for i, ctx in enumerate(CALLERS):
        for own_filter in (False, True):
            got = set(store.query(query(FULL_ACL, ctx, MODES[i % len(MODES)], own_filter=own_filter)).ids)
            want = allowed(rows, FULL_ACL, ctx, own_filter=own_filter)
            leaks += len(got - want)
            misses += len(want - got)
    assert (leaks, misses) == (0, 0)
    assert any(allowed(rows, FULL_ACL, ctx) for ctx in CALLERS)  # the data grants something at all


async def test_the_pushed_down_acl_admits_exactly_what_metadata_acl_allows_async(
    acl_table: tuple[dict[str, Any], Rows],
) -> None:
    kwargs, rows = acl_table
    store = AclPGVectorStore(**kwargs)
    leaks = misses = 0
    try:
        for i, ctx in enumerate(CALLERS):
            for own_filter in (False, True):
                # Another rotation than the sync test: each caller meets other paths here.
                mode = MODES[(i + 1) % len(MODES)]
                got = set((await store.aquery(query(FULL_ACL, ctx, mode, own_filter=own_filter))).ids)
                want = allowed(rows, FULL_ACL, ctx, own_filter=own_filter)
                leaks += len(got - want)
                misses += len(want - got)
    finally:
        await store.close()
    assert (leaks, misses) == (0, 0)


@pytest.mark.parametrize("acl", ACLS[1:], ids=lambda acl: "+".join(acl.keys))
def test_every_acl_configuration_admits_exactly_what_it_allows(
    acl_table: tuple[dict[str, Any], Rows], acl: MetadataAcl
) -> None:
    kwargs, rows = acl_table
    store = AclPGVectorStore(**kwargs)
    for i, ctx in enumerate(CALLERS[:30]):
        got = set(store.query(query(acl, ctx, MODES[i % len(MODES)], own_filter=bool(i % 2))).ids)
        assert got == allowed(rows, acl, ctx, own_filter=bool(i % 2))


def test_mmr_returns_only_readable_nodes(acl_table: tuple[dict[str, Any], Rows]) -> None:
    kwargs, rows = acl_table
    store = AclPGVectorStore(**kwargs)
    for ctx in CALLERS[:20]:
        readable = allowed(rows, FULL_ACL, ctx)
        mmr = VectorStoreQuery(
            query_embedding=[0.5] * 8, similarity_top_k=3, filters=acl_filters(FULL_ACL, ctx),
            mode=VectorStoreQueryMode.MMR,
        )  # fmt: skip
        got = set(store.query(mmr, mmr_prefetch_k=NODES).ids)
        assert got <= readable
        assert len(got) == min(3, len(readable))


def test_get_nodes_applies_the_acl(acl_table: tuple[dict[str, Any], Rows]) -> None:
    kwargs, rows = acl_table
    store = AclPGVectorStore(**kwargs)
    ctx = next(ctx for ctx in CALLERS if allowed(rows, FULL_ACL, ctx))
    assert {node.node_id for node in store.get_nodes(filters=acl_filters(FULL_ACL, ctx))} == allowed(
        rows, FULL_ACL, ctx
    )


def test_a_caller_without_a_tenant_reads_nothing_where_the_acl_checks_tenants(
    acl_table: tuple[dict[str, Any], Rows],
) -> None:
    kwargs, _ = acl_table
    store = AclPGVectorStore(**kwargs)
    nobody = RuntimeContext(user_id="u1", roles={"admin", "support"})
    assert store.query(query(FULL_ACL, nobody, VectorStoreQueryMode.DEFAULT, own_filter=False)).ids == []


# JSON text LlamaIndex never writes but a hand-made row can hold: numbers in exponent form (JSONB
# stores 1e0 as 1, JSON keeps the text; Python reads either back as it is stored), escaped
# strings, duplicate keys (the last one counts, in PostgreSQL as in Python).
HAND_WRITTEN = [
    '{"tenant": "acme", "public": 1}',
    '{"tenant": "acme", "public": 1e0}',
    '{"tenant": "acme", "public": 1E0}',
    '{"tenant": "acme", "public": 0.1e1}',
    '{"tenant": "acme", "public": 1.0}',
    '{"tenant": "acme", "public": -1}',
    '{"tenant": "\\u0061cme", "public": true}',
    '{"tenant": "acme", "tenant": "globex", "public": "true"}',
    '{"tenant": "globex", "tenant": "acme", "public": "true"}',
    '{"tenant": "acme", "users": ["u1", "\\u0075\\u0031"], "public": false}',
    '{"tenant": "acme", "users": "u1", "users": 3, "public": "true"}',
    '{"tenant": "acme", "roles": [], "public": null}',
]


@pytest.mark.parametrize("use_jsonb", [False, True], ids=["json", "jsonb"])
def test_hand_written_json_is_judged_as_python_reads_it_back(postgres_server: PostgresServer, use_jsonb: bool) -> None:
    table = f"acl_hand_{'jsonb' if use_jsonb else 'json'}"
    store = AclPGVectorStore(**store_kwargs(postgres_server, table, embed_dim=2, use_jsonb=use_jsonb))
    store._initialize()
    assert store._engine is not None
    with store._engine.begin() as connection:
        for i, text in enumerate(HAND_WRITTEN):
            connection.execute(
                sqlalchemy.text(
                    f"INSERT INTO data_{table} (node_id, text, metadata_, embedding) "
                    "VALUES (:node_id, 'hand written', CAST(:metadata AS JSON), '[0.5, 0.5]')"
                ),
                {"node_id": f"hand-{i}", "metadata": text},
            )
        rows = connection.exec_driver_sql(f"SELECT node_id, metadata_ FROM data_{table}").all()
    acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
    for ctx in (RuntimeContext(user_id="u1", tenant_id="acme"), RuntimeContext(user_id="u2", tenant_id="globex")):
        got = set(
            store.query(
                VectorStoreQuery(query_embedding=[0.5, 0.5], similarity_top_k=50, filters=acl_filters(acl, ctx))
            ).ids
        )
        assert got == {node_id for node_id, metadata in rows if acl.allows(ctx, metadata)}
    store._engine.dispose()
