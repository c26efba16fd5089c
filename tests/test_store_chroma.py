"""The ACL pushed into Chroma equals ``MetadataAcl.allows``, on a real ``chroma run`` server and the embedded client.

A differential test, like PostgreSQL's: 240 nodes with hostile ACL metadata (half written by
LlamaIndex's ``ChromaVectorStore``, scalars only; half natively, with lists), 120 callers with
hostile identities; for each, the nodes the store returns under the pushed-down ``where`` (k = the
whole collection) are exactly the nodes ``MetadataAcl.allows`` admits over the collection as read
back, sync and async, with and without the caller's own filter. The server runs from the
chromadb wheel on 127.0.0.1 and a free port (llama_jev.testing.chroma), stopped however the
module ends; the server tests are marked slow.
"""

from __future__ import annotations

import copy
import logging
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("chromadb")
pytest.importorskip("llama_index.vector_stores.chroma")

import chromadb
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import QueryBundle, TextNode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
from llama_index.vector_stores.chroma import ChromaVectorStore
from llama_index.vector_stores.chroma.base import _to_chroma_filter

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.acl import (
    And,
    Condition,
    Conditional,
    Equals,
    IdIn,
    Ids,
    In,
    Intersects,
    ListContains,
    Not,
    Or,
    Restriction,
    evaluate,
)
from llama_jev.acl.conditions import operators
from llama_jev.stores import adapter_for, aretrieve
from llama_jev.stores.base import CannotState
from llama_jev.stores.chroma import (
    ChromaPushdown,
    UntranslatableFilterError,
    chroma_condition,
    chroma_where,
    filters_where,
)
from llama_jev.testing.chroma import chroma_server

from .store_data import ACLS, FULL_ACL, acl_metadata, callers, embedding
from .support import HashEmbedding

NODES = 240
CALLERS = callers(120)
QUERY = "refund policy"
OWN_FILTER = MetadataFilters(
    filters=[
        MetadataFilter(key="topic", operator=FilterOperator.IN, value=["refund", "$ne"]),
        MetadataFilter(key="topic", operator=FilterOperator.NE, value='{"$ne": ""}'),
    ],
    condition=FilterCondition.AND,
)

Rows = dict[str, dict[str, Any]]


@pytest.fixture(scope="module", params=["embedded", pytest.param("server", marks=pytest.mark.slow)])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Chroma's embedded client, or an HTTP client of a ``chroma run`` server started for this module."""
    if request.param == "embedded":
        yield chromadb.EphemeralClient()
        return
    with chroma_server() as server:
        yield chromadb.HttpClient(host=server.host, port=server.port)


def _collection(client: Any, name: str) -> Any:
    # Unique per test session: the embedded client keeps its collections for the process.
    full = f"{name}-{random.randrange(10**9)}"
    return client.create_collection(full, embedding_function=None, metadata={"hnsw:space": "l2"})


@pytest.fixture(scope="module")
def acl_collection(client: Any) -> tuple[Any, Rows]:
    """A collection written half by LlamaIndex (scalars), half natively (lists); its metadata as Chroma returns it."""
    rng = random.Random(7)
    collection = _collection(client, "acl-diff")
    scalar_nodes = [
        TextNode(
            id_=f"li-{i:04d}",
            text=f"refund policy {i}",
            embedding=embedding(rng),
            metadata=acl_metadata(rng, lists=False),
        )
        for i in range(NODES // 2)
    ]
    ChromaVectorStore(chroma_collection=collection).add(scalar_nodes)
    native = [(f"native-{i:04d}", acl_metadata(rng)) for i in range(NODES - NODES // 2)]
    collection.add(
        ids=[node_id for node_id, _ in native],
        embeddings=[embedding(rng) for _ in native],
        documents=[f"refund policy native {i}" for i in range(len(native))],
        metadatas=[metadata for _, metadata in native],
    )
    stored = collection.get(include=["metadatas"])
    rows = dict(zip(stored["ids"], stored["metadatas"], strict=True))
    assert len(rows) == NODES
    return collection, rows


def retriever_over(collection: Any, **kwargs: Any) -> BaseRetriever:
    store = ChromaVectorStore(chroma_collection=collection)
    index = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=8))
    return index.as_retriever(similarity_top_k=NODES, **kwargs)


def own_match(metadata: dict[str, Any]) -> bool:
    """What OWN_FILTER admits."""
    return metadata.get("topic") in ("refund", "$ne") and metadata.get("topic") != '{"$ne": ""}'


def allowed(rows: Rows, acl: MetadataAcl, ctx: RuntimeContext, *, own_filter: bool = False) -> set[str]:
    return {
        node_id
        for node_id, metadata in rows.items()
        if acl.allows(ctx, metadata) and (not own_filter or own_match(metadata))
    }


def pushed(retriever: BaseRetriever, acl: MetadataAcl, ctx: RuntimeContext) -> BaseRetriever:
    """This query's copy of ``retriever``, restricted by the adapter as ``JevRetriever`` restricts it."""
    upstream = copy.copy(retriever)
    ChromaPushdown(retriever, acl, set()).restrict(upstream, ctx)
    return upstream


def _ids(nodes: list[Any]) -> set[str]:
    return {node.node.node_id for node in nodes}


def test_the_pushed_down_where_admits_exactly_what_the_acl_allows_sync(acl_collection: tuple[Any, Rows]) -> None:
    collection, rows = acl_collection
    plain, own = retriever_over(collection), retriever_over(collection, filters=OWN_FILTER)
    leaks = misses = 0
    for ctx in CALLERS:
        for own_filter, retriever in ((False, plain), (True, own)):
            got = _ids(pushed(retriever, FULL_ACL, ctx).retrieve(QUERY))
            want = allowed(rows, FULL_ACL, ctx, own_filter=own_filter)
            leaks += len(got - want)
            misses += len(want - got)
    assert (leaks, misses) == (0, 0)
    assert sum(len(allowed(rows, FULL_ACL, ctx)) for ctx in CALLERS) > 50  # the data grants a good deal


async def test_the_pushed_down_where_admits_exactly_what_the_acl_allows_async(acl_collection: tuple[Any, Rows]) -> None:
    collection, rows = acl_collection
    plain, own = retriever_over(collection), retriever_over(collection, filters=OWN_FILTER)
    leaks = misses = 0
    for ctx in CALLERS:
        for own_filter, retriever in ((False, plain), (True, own)):
            # The path JevRetriever.aretrieve takes: ChromaVectorStore's aquery would block the loop.
            got = _ids(await aretrieve(pushed(retriever, FULL_ACL, ctx), QueryBundle(QUERY), threading.Event()))
            want = allowed(rows, FULL_ACL, ctx, own_filter=own_filter)
            leaks += len(got - want)
            misses += len(want - got)
    assert (leaks, misses) == (0, 0)


@pytest.mark.parametrize("acl", ACLS[1:], ids=lambda acl: "+".join(acl.keys))
def test_every_acl_configuration_admits_exactly_what_it_allows(
    acl_collection: tuple[Any, Rows], acl: MetadataAcl
) -> None:
    collection, rows = acl_collection
    retriever = retriever_over(collection)
    for ctx in CALLERS[:40]:
        assert _ids(pushed(retriever, acl, ctx).retrieve(QUERY)) == allowed(rows, acl, ctx)


async def test_a_caller_gets_exactly_what_the_acl_allows_through_jev_retriever(
    acl_collection: tuple[Any, Rows],
) -> None:
    collection, rows = acl_collection
    index = VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=HashEmbedding(dimensions=8)
    )
    retriever = JevRetriever.from_index(index, _selector(Mode.OFF), FULL_ACL, top_k=NODES)
    assert retriever.prefilter
    for ctx in CALLERS[:40]:
        assert _ids(retriever.retrieve(QUERY, ctx=ctx)) == allowed(rows, FULL_ACL, ctx)
        assert _ids(await retriever.aretrieve(QUERY, ctx=ctx)) == allowed(rows, FULL_ACL, ctx)


# --- top-k under a selective ACL --------------------------------------------------------------


def _selector(mode: Mode = Mode.ENFORCE, records: list[DecisionRecord] | None = None) -> CandidateSelector:
    observer = None if records is None else (lambda ctx, record: records.append(record))
    return CandidateSelector(ScriptedJudge(lambda s, q, i: 0.9), ExecutionOptions(mode=mode, observer=observer))


@pytest.fixture(scope="module")
def crowded_index(client: Any) -> VectorStoreIndex:
    """200 nodes: the 100 nearest the query belong to globex; acme's 11 readable ones lie further out."""
    collection = _collection(client, "crowded")
    query = HashEmbedding(dimensions=8).get_query_embedding(QUERY)
    nodes = []
    for i in range(200):
        near = i < 100
        # Distance grows with i: globex's nodes are the nearest.
        vector = [value + (0.01 if near else 0.5) * (i + 1) / 100 for value in query]
        metadata = (
            {"tenant": "globex", "roles": "support"}
            if near
            else {"tenant": "acme", "roles": "sales" if i % 9 else "support"}
        )
        nodes.append(TextNode(id_=f"crowd-{i:03d}", text=f"refund note {i}", embedding=vector, metadata=metadata))
    store = ChromaVectorStore(chroma_collection=collection)
    store.add(nodes)
    return VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=8))


ACME_SUPPORT = RuntimeContext(user_id="sam", tenant_id="acme", roles=frozenset({"support"}))
TENANT_ROLES = MetadataAcl(tenant_key="tenant", roles_key="roles")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_k_readable_nodes_come_back_under_a_selective_acl(
    crowded_index: VectorStoreIndex, use_async: bool
) -> None:
    readable = 11  # acme nodes 100..199 with i % 9 == 0
    records: list[DecisionRecord] = []
    pushed_down = JevRetriever.from_index(crowded_index, _selector(records=records), TENANT_ROLES, top_k=5)
    post_only = JevRetriever.from_index(
        crowded_index, _selector(records=records), TENANT_ROLES, top_k=5, prefilter=False
    )
    if use_async:
        got = await pushed_down.aretrieve(QUERY, ctx=ACME_SUPPORT)
        without = await post_only.aretrieve(QUERY, ctx=ACME_SUPPORT)
    else:
        got = pushed_down.retrieve(QUERY, ctx=ACME_SUPPORT)
        without = post_only.retrieve(QUERY, ctx=ACME_SUPPORT)
    assert len(got) == 5
    assert all(node.node.metadata["tenant"] == "acme" and node.node.metadata["roles"] == "support" for node in got)
    # The 20 nearest are globex's: the post-filter alone widens until the store is exhausted.
    assert [node.node.node_id for node in without] == [node.node.node_id for node in got]
    assert readable > 5
    # The records say which retrieval the store restricted, and how widely the other had to look.
    assert [(record.pushdown, record.retrieved, record.denied, record.found, record.rounds) for record in records] == [
        (True, 11, 0, 11, 1),
        (False, 200, 189, 11, 5),  # 20, 40, 80, 160, 320: exhausted at 200
    ]


# --- the caller's own filters --------------------------------------------------------------------

STOCK_FILTERS = [
    MetadataFilters(filters=[MetadataFilter(key="topic", value="refund")]),
    MetadataFilters(filters=[MetadataFilter(key="n", operator=FilterOperator.GT, value=3)]),
    MetadataFilters(
        filters=[
            MetadataFilter(key="topic", operator=FilterOperator.NIN, value=["$ne", "x' OR '1'='1"]),
            MetadataFilters(
                filters=[
                    MetadataFilter(key="n", operator=FilterOperator.LTE, value=2.5),
                    MetadataFilter(key="n", operator=FilterOperator.GTE, value=7),
                    MetadataFilter(key="owner", operator=FilterOperator.NE, value='{"$ne": ""}'),
                ],
                condition=FilterCondition.OR,
            ),
        ]
    ),
]


@pytest.mark.parametrize("filters", STOCK_FILTERS, ids=["eq", "gt", "nested"])
def test_the_callers_filters_become_the_where_the_stock_store_writes_for_them(filters: MetadataFilters) -> None:
    assert filters_where(filters) == _to_chroma_filter(filters)


@pytest.mark.parametrize(
    ("filters", "named"),
    [
        (
            MetadataFilters(filters=[MetadataFilter(key="tags", operator=FilterOperator.CONTAINS, value="u1")]),
            "'tags' with operator 'contains'",
        ),
        (
            MetadataFilters(filters=[MetadataFilter(key="body", operator=FilterOperator.TEXT_MATCH, value="x")]),
            "'body' with operator 'text_match'",
        ),
        (
            MetadataFilters(filters=[MetadataFilter(key="topic", value="a")], condition=FilterCondition.NOT),
            "condition 'not'",
        ),
        (MetadataFilters(filters=[MetadataFilter(key="$or", value="a")]), "'$or'"),
    ],
    ids=["contains", "text-match", "not", "operator-key"],
)
def test_a_filter_it_cannot_translate_exactly_is_named_and_refused(filters: MetadataFilters, named: str) -> None:
    with pytest.raises(UntranslatableFilterError, match=named.replace("$", r"\$")):
        filters_where(filters)


def test_an_untranslatable_caller_filter_means_no_pushdown_and_a_warning_naming_it(
    acl_collection: tuple[Any, Rows], caplog: pytest.LogCaptureFixture
) -> None:
    collection, _ = acl_collection
    index = VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=HashEmbedding(dimensions=8)
    )
    secret = "secret-filter-value"
    own = MetadataFilters(filters=[MetadataFilter(key="topic", operator=FilterOperator.CONTAINS, value=secret)])
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        retriever = JevRetriever.from_index(index, _selector(), FULL_ACL, top_k=5, filters=own)
    assert retriever.prefilter is False
    (warning,) = [record.getMessage() for record in caplog.records if "Chroma" in record.getMessage()]
    assert "'topic' with operator 'contains'" in warning
    assert "applied after retrieval only" in warning
    assert secret not in warning
    with pytest.raises(TypeError, match="'topic' with operator 'contains'"):
        JevRetriever(index.as_retriever(filters=own), _selector(), FULL_ACL, prefilter=True)


def test_a_where_in_vector_store_kwargs_is_anded_with_the_acl(acl_collection: tuple[Any, Rows]) -> None:
    collection, rows = acl_collection
    retriever = retriever_over(collection, vector_store_kwargs={"where": {"topic": {"$eq": "refund"}}})
    assert adapter_for(retriever) is ChromaPushdown
    for ctx in CALLERS[:30]:
        want = {node_id for node_id in allowed(rows, FULL_ACL, ctx) if rows[node_id]["topic"] == "refund"}
        assert _ids(pushed(retriever, FULL_ACL, ctx).retrieve(QUERY)) == want
    assert retriever._kwargs == {"where": {"topic": {"$eq": "refund"}}}  # type: ignore[attr-defined]  # the caller's, untouched


def test_an_acl_key_chroma_would_read_as_an_operator_is_refused_loudly(acl_collection: tuple[Any, Rows]) -> None:
    collection, _ = acl_collection
    with pytest.raises(ValueError, match=r"key '\$or' cannot be pushed into Chroma"):
        ChromaPushdown(retriever_over(collection), MetadataAcl(tenant_key="tenant", roles_key="$or"), set())


def test_hostile_identities_are_values_of_the_where_never_operators() -> None:
    ctx = RuntimeContext(user_id="$ne", tenant_id='{"$ne": ""}', roles=frozenset({"$in"}))
    assert chroma_where(FULL_ACL, ctx) == {
        "$and": [
            {"tenant": {"$eq": '{"$ne": ""}'}},
            {
                "$or": [
                    {"users": {"$eq": "$ne"}},
                    {"users": {"$contains": "$ne"}},
                    {"roles": {"$in": ["$in"]}},
                    {"roles": {"$contains": "$in"}},
                    {"public": {"$eq": "true"}},
                    {"public": {"$eq": 1}},
                    {"public": {"$eq": True}},
                ]
            },
        ]
    }


# --- any restriction, not only a MetadataAcl's: the condition language stated as one where ------------


def _engine_restricted(retriever: BaseRetriever, restriction: Restriction) -> tuple[BaseRetriever, bool]:
    """This query's copy of ``retriever`` with an engine's ``restriction`` applied (and whether it was)."""
    upstream = copy.copy(retriever)
    acl = MetadataAcl(tenant_key="tenant")  # any BatchAcl: apply() states the restriction it is given
    return upstream, ChromaPushdown(retriever, acl, set()).apply(upstream, restriction, CALLERS[0])


ENGINE_CONDITIONS = [
    Not(ListContains("users", "u1")),
    Not(Intersects("roles", ("admin", "$ne"))),
    Or((Not(Equals("public", True)), Equals("tenant", "$ne"))),
    Not(Or((Equals("tenant", "acme"), In("public", ("true", 1))))),
    And(
        (IdIn(frozenset({"li-0003", "native-0007", "li-0099", "missing", "x' OR '1'='1"})), Not(Equals("topic", "$ne")))
    ),
    IdIn(frozenset({"acme", "globex", "$ne"}), key="tenant"),
    And((Not(Or(())), Equals("tenant", "acme"))),
]


@pytest.mark.parametrize("condition", ENGINE_CONDITIONS, ids=lambda condition: "+".join(sorted(operators(condition))))
async def test_an_engines_condition_is_one_exact_where_sync_and_async(
    acl_collection: tuple[Any, Rows], condition: Condition
) -> None:
    collection, rows = acl_collection
    want = {node_id for node_id, metadata in rows.items() if evaluate(condition, node_id, metadata)}
    assert 0 < len(want) < len(rows)
    for retriever, own_filter in (
        (retriever_over(collection), False),
        (retriever_over(collection, filters=OWN_FILTER), True),
    ):
        upstream, applied = _engine_restricted(retriever, Conditional(condition))
        assert applied
        expected = {node_id for node_id in want if not own_filter or own_match(rows[node_id])}
        assert _ids(upstream.retrieve(QUERY)) == expected
        assert _ids(await aretrieve(upstream, QueryBundle(QUERY), threading.Event())) == expected


def test_an_allow_list_naming_only_ids_the_collection_lacks_matches_nothing(acl_collection: tuple[Any, Rows]) -> None:
    collection, _ = acl_collection
    upstream, applied = _engine_restricted(retriever_over(collection), Ids(frozenset({"missing", "li-9999"})))
    assert applied
    assert upstream.retrieve(QUERY) == []


def test_the_condition_translation_operator_by_operator() -> None:
    assert chroma_condition(Not(Intersects("roles", ("a", "b")))) == {
        "$and": [{"roles": {"$nin": ["a", "b"]}}, {"roles": {"$not_contains": "a"}}, {"roles": {"$not_contains": "b"}}]
    }
    assert chroma_condition(Not(Or((Equals("n", 1), Equals("b", True))))) == {
        "$and": [{"n": {"$ne": 1}}, {"b": {"$ne": True}}]
    }
    assert chroma_condition(Not(Not(Equals("t", "$ne")))) == {"t": {"$eq": "$ne"}}
    assert chroma_condition(IdIn(frozenset({"d2", "d1"}), key="doc")) == {"doc": {"$in": ["d1", "d2"]}}
    assert chroma_condition(And(())) == {}
    assert chroma_condition(Or((And(()), Equals("t", "x")))) == {}  # true absorbs an OR
    nothing = chroma_condition(Or(()))
    assert nothing == chroma_condition(In("t", ())) == chroma_condition(Not(And(())))
    assert list(nothing) == ["$and"]
    for refused, operator in (
        (Not(Equals("n", 1.5)), "not"),
        (Or((IdIn(frozenset({"a"})), Equals("t", "x"))), "id-in"),
        (Equals("$or", "x"), "equals"),
        (Equals("t", [1]), "equals"),  # type: ignore[arg-type]
    ):
        with pytest.raises(CannotState) as raised:
            chroma_condition(refused)
        assert raised.value.operator == operator


# --- where Chroma's where is not exact: the ACL removes the rest -----------------------------------


def test_a_float_one_flag_and_number_grants_come_from_the_store_and_the_acl_removes_them(client: Any) -> None:
    # Chroma compares numbers by value (1.0 == 1) and cannot tell a malformed number grant from a
    # missing one; both nodes are denied by the ACL, which still checks every node.
    collection = _collection(client, "inexact")
    rng = random.Random(3)
    collection.add(
        ids=["float-flag", "number-users", "readable"],
        embeddings=[embedding(rng) for _ in range(3)],
        documents=["a", "b", "c"],
        metadatas=[
            {"tenant": "acme", "public": 1.0},
            {"tenant": "acme", "users": [3, 4], "public": "true"},
            {"tenant": "acme", "public": 1},
        ],
    )
    retriever = retriever_over(collection)
    ctx = RuntimeContext(user_id="u1", tenant_id="acme")
    assert _ids(pushed(retriever, FULL_ACL, ctx).retrieve(QUERY)) == {"float-flag", "number-users", "readable"}
    index = VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=HashEmbedding(dimensions=8)
    )
    assert _ids(JevRetriever.from_index(index, _selector(Mode.OFF), FULL_ACL, top_k=3).retrieve(QUERY, ctx=ctx)) == {
        "readable"
    }


def test_the_census_names_a_key_no_record_holds(acl_collection: tuple[Any, Rows]) -> None:
    collection, _ = acl_collection
    census = ChromaPushdown.census(retriever_over(collection), ("tenant", "allowed_users"))
    assert census is not None
    assert (census.absent, census.nodes) == (("allowed_users",), NODES)
    assert {"tenant", "users", "roles"} <= set(census.present)


@pytest.mark.slow
def test_the_test_server_stops_even_when_the_block_fails() -> None:
    ports: list[int] = []

    def failing_test() -> None:
        with chroma_server() as server:
            ports.append(server.port)
            assert chromadb.HttpClient(host=server.host, port=server.port).heartbeat() > 0
            raise RuntimeError("a failing test")

    with pytest.raises(RuntimeError, match="a failing test"):
        failing_test()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", ports[0]), timeout=1).close()
