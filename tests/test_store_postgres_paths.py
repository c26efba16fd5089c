"""``JevRetriever`` over PostgreSQL: pushdown by default over ``AclPGVectorStore``, a warning over the
stock ``PGVectorStore``, bound filters, and k rows under a selective ACL with an HNSW index."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("llama_index.vector_stores.postgres")

import sqlalchemy
from llama_index.core import VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.vector_stores.types import (
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)
from llama_index.vector_stores.postgres import PGVectorStore

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.stores.postgres import AclPGVectorStore, acl_filters
from llama_jev.testing.postgres import PostgresServer

from .postgres_support import FULL_ACL, HOSTILE, TOPICS, acl_nodes, callers, store_kwargs
from .support import HashEmbedding
from .test_integration_llamaindex import EventCollector

pytestmark = pytest.mark.slow  # PostgreSQL

NODES = 120
DIMENSIONS = 8
QUERY = "refund policy"


@pytest.fixture(scope="module")
def table(postgres_server: PostgresServer) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A table written by the stock PGVectorStore, as a user already has it; its rows by node id."""
    kwargs = store_kwargs(postgres_server, "acl_paths", embed_dim=DIMENSIONS, hybrid_search=True)
    stock = PGVectorStore(**kwargs)
    stock.add(acl_nodes(NODES, seed=3, dimensions=DIMENSIONS))
    assert stock._engine is not None
    with stock._engine.connect() as connection:
        rows = dict(connection.exec_driver_sql("SELECT node_id, metadata_ FROM data_acl_paths").all())
    stock._engine.dispose()
    return kwargs, rows


@pytest.fixture
def events() -> Iterator[list[Any]]:
    collector = EventCollector()
    root = get_dispatcher()
    root.add_event_handler(collector)
    yield collector.events
    root.event_handlers.remove(collector)


def off_selector() -> CandidateSelector:
    # OFF: the ACL alone decides, no judge call (the judge would fail the test if asked).
    return CandidateSelector(
        ScriptedJudge(lambda *_: pytest.fail("OFF never asks the judge")), ExecutionOptions(mode=Mode.OFF)
    )


def index_over(store: PGVectorStore) -> VectorStoreIndex:
    return VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=DIMENSIONS))


def readable(rows: dict[str, dict[str, Any]], ctx: RuntimeContext, acl: MetadataAcl = FULL_ACL) -> set[str]:
    return {node_id for node_id, metadata in rows.items() if acl.allows(ctx, metadata)}


def upstream_ids(events: list[Any]) -> set[str]:
    return {n.node.node_id for event in events if isinstance(event, RetrievalEndEvent) for n in event.nodes}


READERS = [ctx for ctx in callers(60, seed=5)]


def test_from_index_over_an_acl_store_pushes_down_by_default_sync(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]], events: list[Any]
) -> None:
    kwargs, rows = table
    retriever = JevRetriever.from_index(index_over(AclPGVectorStore(**kwargs)), off_selector(), FULL_ACL, top_k=NODES)
    assert retriever.prefilter
    for ctx in READERS:
        events.clear()
        got = {n.node.node_id for n in retriever.retrieve(QUERY, ctx=ctx)}
        assert got == readable(rows, ctx)
        # The store answered with readable nodes only: the wrapped retriever's events carry nothing else.
        assert upstream_ids(events) <= readable(rows, ctx)


async def test_from_index_over_an_acl_store_pushes_down_by_default_async(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]], events: list[Any]
) -> None:
    kwargs, rows = table
    store = AclPGVectorStore(**kwargs)
    own = MetadataFilters(filters=[MetadataFilter(key="topic", operator=FilterOperator.EQ, value=TOPICS[2])])
    retriever = JevRetriever.from_index(index_over(store), off_selector(), FULL_ACL, top_k=NODES, filters=own)
    try:
        for ctx in READERS:
            events.clear()
            got = {n.node.node_id for n in await retriever.aretrieve(QUERY, ctx=ctx)}
            want = {node_id for node_id in readable(rows, ctx) if rows[node_id].get("topic") == TOPICS[2]}
            assert got == want
            assert upstream_ids(events) <= want
    finally:
        await store.close()


def test_over_a_plain_pgvector_store_it_warns_once_naming_acl_pgvector_store_and_post_filters(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]], events: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    kwargs, rows = table
    caplog.set_level(logging.INFO, logger="llama_jev")
    retriever = JevRetriever.from_index(index_over(PGVectorStore(**kwargs)), off_selector(), FULL_ACL, top_k=NODES)
    ctx = next(ctx for ctx in READERS if readable(rows, ctx))
    for _ in range(3):
        events.clear()
        got = {n.node.node_id for n in retriever.retrieve(QUERY, ctx=ctx)}
        assert got == readable(rows, ctx)  # the post-filter still decides
    assert not retriever.prefilter
    assert upstream_ids(events) - readable(rows, ctx)  # and the store answered with everything
    # (The malformed values in the data get their own diagnostics; this is about pushdown.)
    advice = [r for r in caplog.records if r.name == "llama_jev" and "AclPGVectorStore" in r.getMessage()]
    assert [r.levelno for r in advice] == [logging.WARNING]


def test_prefilter_over_a_plain_pgvector_store_is_refused_naming_acl_pgvector_store(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]],
) -> None:
    kwargs, _ = table
    inner = index_over(PGVectorStore(**kwargs)).as_retriever(similarity_top_k=5)
    with pytest.raises(TypeError, match="AclPGVectorStore"):
        JevRetriever(inner, off_selector(), FULL_ACL, prefilter=True)


@pytest.mark.parametrize("value", [*HOSTILE, "refund"])
def test_own_filter_values_are_bound_not_pasted(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]], value: str
) -> None:
    kwargs, rows = table
    store = AclPGVectorStore(**kwargs)
    # A value float() reads ("42", "nan") compares the field as a number under EQ / NE, as in the
    # stock store, and PostgreSQL refuses to cast "refund": loud, never a leak. IN compares text.
    numeric = value.strip().lower() in ("42", "nan", "1")
    operators = (FilterOperator.IN,) if numeric else (FilterOperator.EQ, FilterOperator.IN, FilterOperator.NE)
    for operator in operators:
        filters = MetadataFilters(
            filters=[
                MetadataFilter(
                    key="topic", operator=operator, value=[value] if operator == FilterOperator.IN else value
                )
            ]
        )
        got = set(
            store.query(
                VectorStoreQuery(query_embedding=[0.5] * DIMENSIONS, similarity_top_k=NODES, filters=filters)
            ).ids
        )
        holds = {node_id for node_id, metadata in rows.items() if metadata.get("topic") == value}
        with_topic = {node_id for node_id, metadata in rows.items() if "topic" in metadata}
        assert got == (with_topic - holds if operator == FilterOperator.NE else holds)


def test_own_filters_read_as_the_stock_store_reads_them(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]],
) -> None:
    kwargs, _ = table
    stock, safe = PGVectorStore(**kwargs), AclPGVectorStore(**kwargs)
    cases = [
        MetadataFilter(key="public", operator=FilterOperator.EQ, value="yes"),
        MetadataFilter(key="topic", operator=FilterOperator.NIN, value=["refund"]),
        MetadataFilter(key="users", operator=FilterOperator.ANY, value=["u1", "u2"]),
        MetadataFilter(key="users", operator=FilterOperator.ALL, value=["u1", "u2"]),
        MetadataFilter(key="roles", operator=FilterOperator.CONTAINS, value="admin"),
        MetadataFilter(key="topic", operator=FilterOperator.TEXT_MATCH, value="fun"),
        MetadataFilter(key="topic", operator=FilterOperator.TEXT_MATCH_INSENSITIVE, value="SHIP"),
        MetadataFilter(key="tenant", operator=FilterOperator.IS_EMPTY, value=None),
        MetadataFilter(key="topic", operator=FilterOperator.GTE, value="s"),
    ]
    for case in cases:
        q = VectorStoreQuery(
            query_embedding=[0.5] * DIMENSIONS, similarity_top_k=NODES, filters=MetadataFilters(filters=[case])
        )
        assert sorted(safe.query(q).ids) == sorted(stock.query(q).ids), case


@pytest.fixture(scope="module")
def hnsw_table(postgres_server: PostgresServer) -> dict[str, Any]:
    """5,000 rows with an HNSW index; one in a hundred belongs to the tenant "small"."""
    kwargs = store_kwargs(postgres_server, "acl_hnsw", embed_dim=16)
    store = AclPGVectorStore(**kwargs)
    store._initialize()
    assert store._engine is not None
    with store._engine.begin() as connection:
        connection.exec_driver_sql("SELECT setseed(0.42)")
        connection.exec_driver_sql(  # made in SQL: ingesting 5,000 nodes through LlamaIndex takes long
            "INSERT INTO data_acl_hnsw (node_id, text, metadata_, embedding) "
            "SELECT 'n' || i, 'text ' || i, "
            "json_build_object('tenant', CASE WHEN mod(i, 100) = 0 THEN 'small' ELSE 'big' END), "
            "(SELECT array_agg(random() + 0 * i * d) FROM generate_series(1, 16) AS d)::vector "
            "FROM generate_series(1, 5000) AS i"
        )
        connection.exec_driver_sql("CREATE INDEX ON data_acl_hnsw USING hnsw (embedding vector_cosine_ops)")
        connection.exec_driver_sql("ANALYZE data_acl_hnsw")
    store._engine.dispose()
    return kwargs


def _force_index(connection: sqlalchemy.Connection) -> None:
    # On 5,000 rows the planner may prefer an exact scan; these tests are about the index path.
    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")


def _forcing_index(store: PGVectorStore) -> PGVectorStore:
    store._initialize()
    assert store._engine is not None
    assert store._async_engine is not None
    for engine in (store._engine, store._async_engine.sync_engine):
        sqlalchemy.event.listen(engine, "begin", _force_index)
    return store


SMALL_TENANT = RuntimeContext(user_id="u", tenant_id="small")
SELECTIVE = VectorStoreQuery(
    query_embedding=[0.5] * 16, similarity_top_k=20, filters=acl_filters(MetadataAcl(tenant_key="tenant"), SMALL_TENANT)
)


def test_an_hnsw_index_under_a_selective_acl_still_returns_k_rows(hnsw_table: dict[str, Any]) -> None:
    result = _forcing_index(AclPGVectorStore(**hnsw_table)).query(SELECTIVE)
    assert len(result.ids) == 20
    assert all(node.metadata["tenant"] == "small" for node in result.nodes)
    # Without iterative scans (the stock store) the index stops after ef_search candidates.
    stock = _forcing_index(PGVectorStore(**hnsw_table))
    stock_filter = MetadataFilters(filters=[MetadataFilter(key="tenant", value="small")])
    assert (
        len(stock.query(VectorStoreQuery(query_embedding=[0.5] * 16, similarity_top_k=20, filters=stock_filter)).ids)
        < 20
    )


async def test_an_hnsw_index_under_a_selective_acl_still_returns_k_rows_async(hnsw_table: dict[str, Any]) -> None:
    store, stock = _forcing_index(AclPGVectorStore(**hnsw_table)), _forcing_index(PGVectorStore(**hnsw_table))
    stock_filter = MetadataFilters(filters=[MetadataFilter(key="tenant", value="small")])
    try:
        result = await store.aquery(SELECTIVE)
        unscanned = await stock.aquery(
            VectorStoreQuery(query_embedding=[0.5] * 16, similarity_top_k=20, filters=stock_filter)
        )
    finally:
        await store.close()
        await stock.close()
    assert len(result.ids) == 20
    assert all(node.metadata["tenant"] == "small" for node in result.nodes)
    assert len(unscanned.ids) < 20  # the async path reached the index too


def test_llama_jev_imports_without_the_postgres_extra() -> None:
    script = (
        "import sys\n"
        "sys.modules['llama_index.vector_stores.postgres'] = None  # as if the extra were not installed\n"
        "import llama_jev, llama_jev.stores\n"
        "from llama_jev.stores import postgres, qdrant_filters, simple_filters\n"
        "for load in (lambda: postgres.AclPGVectorStore, lambda: llama_jev.stores.AclPGVectorStore):\n"
        "    try:\n"
        "        load()\n"
        "    except ImportError as error:\n"
        "        print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    lines = done.stdout.splitlines()
    assert len(lines) == 2  # the old module path and the package both say what to install
    assert all('pip install -e ".[postgres]" in a clone of llama_jev' in line for line in lines)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_misspelled_grant_key_is_named_from_the_table_although_pushdown_returns_nothing(
    table: tuple[dict[str, Any], dict[str, dict[str, Any]]], caplog: pytest.LogCaptureFixture, use_async: bool
) -> None:
    # is_public beside a correct roles_key: with pushdown the store returns only what the ACL
    # allows, so only the table itself can say that no row holds is_public.
    kwargs, rows = table
    acl = MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="is_public")
    caplog.set_level(logging.WARNING, logger="llama_jev")
    store = AclPGVectorStore(**kwargs)
    retriever = JevRetriever.from_index(index_over(store), off_selector(), acl, top_k=NODES)
    try:
        for ctx in READERS[:3]:
            got = await retriever.aretrieve(QUERY, ctx=ctx) if use_async else retriever.retrieve(QUERY, ctx=ctx)
            assert {n.node.node_id for n in got} == readable(rows, ctx, acl)
    finally:
        await store.close()
    named = [m for m in caplog.messages if "holds the configured metadata key(s) 'is_public'" in m]
    assert len(named) == 1, named  # once per retriever, not per query
    assert "PostgreSQL table 'data_acl_paths'" in named[0]
    assert "'public'" in named[0]  # the right spelling, from the table's key names
    assert "OR '1'='1" not in named[0]  # key names only, never a value
    assert "o'brien" not in named[0]
