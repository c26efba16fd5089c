"""Milvus pushdown against both real engines: Milvus Lite 2.5 in-process and the ``milvus`` 2.3.5 server.

The adapter-equivalence test over the server is in tests/test_store_adapters.py; here Lite gets
the same hostile corpus and its own claims (it cannot run ``not (...)``), hostile values are
escaped, nodes written through LlamaIndex's store are found by the next search, and an engine
that is down is an error in every mode, never an empty answer.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import QueryBundle, TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.acl import And, Conditional, Equals, IdIn, ListContains, Not
from llama_jev.stores.milvus import MilvusPushdown, milvus_expression

from . import test_store_adapters as equivalence
from .milvus_support import ENGINES, closing, milvus_index, uri_for

LITE_REFUSES = {"not-list-contains", "not-intersects", "not-document"}


@pytest.fixture
def lite(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    for index in closing(milvus_index(uri_for("lite", request), equivalence.NODE_SET, dim=8)):
        yield index.as_retriever(similarity_top_k=equivalence.NODES)


def test_lite_admits_exactly_what_the_in_process_acl_allows(lite: BaseRetriever) -> None:
    equivalence.test_every_adapter_admits_exactly_what_the_in_process_acl_allows((MilvusPushdown, lite))


def test_lite_states_every_operator_exactly_but_a_negation_it_cannot_run(
    lite: BaseRetriever, caplog: pytest.LogCaptureFixture
) -> None:
    claims = {name: "refused" if name in LITE_REFUSES else "exact" for name in equivalence.RESTRICTIONS}
    assert equivalence._outcomes(MilvusPushdown, lite, caplog) == claims


HOSTILE = ["acme' OR 1=1 --", '"', "\\", '\\") or true or ("', "Zürich ✓ 東京 😀"]


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_values_and_ids_are_compared_as_strings_never_read_as_expression(
    engine: str, request: pytest.FixtureRequest
) -> None:
    nodes = [
        TextNode(id_=f"id-{value}", text="t", embedding=[1.0, float(i)], metadata={"tenant": value, "users": [value]})
        for i, value in enumerate(HOSTILE)
    ]
    for index in closing(milvus_index(uri_for(engine, request), nodes, dim=2)):
        retriever = index.as_retriever(similarity_top_k=len(nodes))
        pushdown = MilvusPushdown(retriever, MetadataAcl(tenant_key="tenant", users_key="users"), set())
        for node in nodes:
            value = node.metadata["tenant"]
            for condition in (
                Equals("tenant", value),
                ListContains("users", value),
                IdIn(frozenset({node.node_id})),
                And((Equals("tenant", value), IdIn(frozenset({node.node_id, "id-x' or 1=1"})))),
            ):
                upstream = copy.copy(retriever)
                assert pushdown.apply(upstream, Conditional(condition), RuntimeContext(user_id="u"))
                got = [hit.node.node_id for hit in upstream.retrieve(QueryBundle("q", embedding=[1.0, 0.0]))]
                assert got == [node.node_id], (engine, condition)


def test_the_expression_escapes_quotes_and_backslashes_and_refuses_control_characters() -> None:
    with pytest.raises(Exception, match="control character"):
        milvus_expression(Equals("tenant", "a\nb"))  # Lite reads an escaped newline as a backslash and an n
    assert milvus_expression(Equals("tenant", '\\") or true or ("')) == '$meta["tenant"] == "\\\\\\") or true or (\\""'
    assert milvus_expression(Not(ListContains("users", "u1"))).startswith("not (")
    with pytest.raises(Exception, match="Lite"):
        milvus_expression(Not(ListContains("users", "u1")), lite=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_nodes_written_through_llamaindex_are_found_by_the_next_search(
    engine: str, request: pytest.FixtureRequest
) -> None:
    """Written, then searched at once through JevRetriever with the store's default (Session) consistency."""
    acl = MetadataAcl(tenant_key="tenant")
    first = [TextNode(id_=f"a{i}", text="t", embedding=[1.0, i / 100], metadata={"tenant": "acme"}) for i in range(5)]
    for index in closing(milvus_index(uri_for(engine, request), first, dim=2)):
        selector = CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.OFF))
        retriever = JevRetriever.from_index(index, selector, acl, top_k=10)
        ctx = RuntimeContext(user_id="u", tenant_id="acme")
        assert len(retriever.retrieve(QueryBundle("q", embedding=[1.0, 0.0]), ctx=ctx)) == 5
        more = [TextNode(id_=f"b{i}", text="t", embedding=[1.0, i / 50], metadata={"tenant": "acme"}) for i in range(5)]
        index.insert_nodes(more)
        assert len(retriever.retrieve(QueryBundle("q", embedding=[1.0, 0.0]), ctx=ctx)) == 10


@pytest.mark.slow
async def test_a_server_that_is_down_is_an_error_in_every_mode_never_an_empty_answer() -> None:
    """One server of its own (stopped mid-test), three retrievers: OFF, SHADOW, ENFORCE; sync and async.

    Run apart from the session's server: two 2.3.5 servers starting side by side crashed one here.
    """
    from pymilvus.exceptions import MilvusException

    from llama_jev.testing.milvus import milvus_server

    from .milvus_support import require_milvus

    require_milvus("server")
    nodes = [TextNode(id_=f"n{i}", text="t", embedding=[1.0, i / 10], metadata={"tenant": "acme"}) for i in range(5)]
    ctx = RuntimeContext(user_id="u", tenant_id="acme")
    query = QueryBundle("q", embedding=[1.0, 0.0])
    with milvus_server() as server:
        index = milvus_index(server.uri, nodes, dim=2)
        retrievers = [
            JevRetriever.from_index(
                index,
                CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=mode)),
                MetadataAcl(tenant_key="tenant"),
                top_k=3,
            )
            for mode in (Mode.OFF, Mode.SHADOW, Mode.ENFORCE)
        ]
        for retriever in retrievers:
            assert len(retriever.retrieve(query, ctx=ctx)) == 3
    for retriever in retrievers:
        with pytest.raises(MilvusException):
            retriever.retrieve(query, ctx=ctx)
        with pytest.raises(MilvusException):
            await retriever.aretrieve(query, ctx=ctx)


@pytest.mark.slow  # the server
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_selective_caller_over_an_approximate_index_gets_the_exact_top_k(
    request: pytest.FixtureRequest, use_async: bool
) -> None:
    """IVF_FLAT probing 1 of 64 lists; a tenant of 30 spread rows is read and ranked exactly (count(*) <= 2,048).

    (The engine stopping short itself needs sealed, indexed segments of thousands of rows: measured
    in benchmarks/bench_filtered.py, where the 2.3.5 server's HNSW returned 0.5 of 5 at 0.05 %.)
    """
    import random

    rng = random.Random(41)
    nodes = [
        TextNode(
            id_=f"n{i}",
            text="t",
            embedding=[rng.uniform(-1, 1) for _ in range(8)],
            metadata={"tenant": "acme" if i % 20 == 0 else "globex"},
        )
        for i in range(600)
    ]
    store_options = {"index_config": {"index_type": "IVF_FLAT", "nlist": 64}, "search_config": {"nprobe": 1}}
    for index in closing(milvus_index(uri_for("server", request), nodes, dim=8, **store_options)):
        query = QueryBundle("q", embedding=[0.5] * 8)
        selector = CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.OFF))
        retriever = JevRetriever.from_index(index, selector, MetadataAcl(tenant_key="tenant"), top_k=10)
        ctx = RuntimeContext(user_id="u", tenant_id="acme")
        got = await retriever.aretrieve(query, ctx=ctx) if use_async else retriever.retrieve(query, ctx=ctx)
        permitted = [node for node in nodes if node.metadata["tenant"] == "acme"]
        distance = {node.node_id: sum((a - 0.5) ** 2 for a in node.embedding or []) for node in permitted}
        assert [hit.node.node_id for hit in got] == sorted(distance, key=distance.__getitem__)[:10]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tenant_declared_as_a_varchar_schema_field_is_read_as_that_field(
    engine: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """As a partition key must be: a schema field, not a key of the dynamic field."""
    from pymilvus import DataType

    nodes = [
        TextNode(
            id_=f"n{i}", text="t", embedding=[1.0, i / 10], metadata={"tenant": ["acme", "o'brien\\"][i % 2], "n": i}
        )
        for i in range(10)
    ]
    options = {"scalar_field_names": ["tenant", "n"], "scalar_field_types": [DataType.VARCHAR, DataType.INT64]}
    for index in closing(milvus_index(uri_for(engine, request), nodes, dim=2, **options)):
        retriever = index.as_retriever(similarity_top_k=10)
        pushdown = MilvusPushdown(retriever, MetadataAcl(tenant_key="tenant"), set())
        for tenant in ("acme", "o'brien\\"):
            upstream = copy.copy(retriever)
            assert pushdown.apply(upstream, Conditional(Equals("tenant", tenant)), RuntimeContext(user_id="u"))
            assert upstream._kwargs["string_expr"].startswith("tenant == ")  # type: ignore[attr-defined]
            got = {hit.node.node_id for hit in upstream.retrieve(QueryBundle("q", embedding=[1.0, 0.0]))}
            assert got == {node.node_id for node in nodes if node.metadata["tenant"] == tenant}
        # An INT64 schema field is not in $meta: refused, never read as "missing" (which would drop every node).
        upstream = copy.copy(retriever)
        assert not pushdown.apply(upstream, Conditional(Equals("n", 3)), RuntimeContext(user_id="u"))
