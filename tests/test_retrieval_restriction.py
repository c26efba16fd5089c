"""The restriction per query: asked once, handed to the store's adapter; ``Nothing`` asks no store.

``JevRetriever`` asks the ACL ``restriction(ctx)`` (awaited on the async path) once per query,
whatever the rounds, and gives it to the store adapter; the record and the spans say which kind
was used. A restriction the engine cannot give fails the retrieval, with no store call.
"""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.vector_stores.simple import SimpleVectorStore

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    Status,
)
from llama_jev.acl import Everything, IdIn, Ids, Nothing, Restriction
from llama_jev.acl.conditions import Conditional
from llama_jev.errors import PermissionsUnavailableError

from .acl_support import AllowListAcl, DownAcl
from .support import HashEmbedding

QUERY = "refund conditions"
DIMENSIONS = 8
ALICE = RuntimeContext(user_id="alice", tenant_id="acme")
NO_TENANT = RuntimeContext(user_id="alice")
TENANT = MetadataAcl(tenant_key="tenant")
MODES = [Mode.OFF, Mode.SHADOW, Mode.ENFORCE]


class CountingStore(SimpleVectorStore):
    """The in-memory store, counting the queries it answers."""

    def query(self, query: Any, **kwargs: Any) -> Any:
        self.__dict__["queries"] = self.__dict__.get("queries", 0) + 1
        return super().query(query, **kwargs)

    @property
    def queries(self) -> int:
        count: int = self.__dict__.get("queries", 0)
        return count


def _nodes(count: int = 30) -> list[TextNode]:
    return [
        TextNode(
            id_=f"n{i:03d}",
            text=f"refund conditions {i}",
            embedding=[1.0, 0.02 * i, 0, 0, 0, 0, 0, 0],
            metadata={"tenant": "acme" if i % 3 else "globex"},
        )
        for i in range(count)
    ]


def _index(nodes: list[TextNode] | None = None) -> tuple[VectorStoreIndex, CountingStore]:
    store = CountingStore()
    index = VectorStoreIndex(
        _nodes() if nodes is None else nodes,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=DIMENSIONS),
    )
    return index, store


def _selector(mode: Mode, records: list[DecisionRecord]) -> CandidateSelector:
    observer = None if mode is Mode.OFF else (lambda ctx, record: records.append(record))
    return CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=mode, observer=observer))


async def _retrieve(retriever: JevRetriever, use_async: bool, ctx: RuntimeContext = ALICE) -> list[NodeWithScore]:
    bundle = QueryBundle(QUERY, embedding=[1.0, 0, 0, 0, 0, 0, 0, 0])
    return await retriever.aretrieve(bundle, ctx=ctx) if use_async else retriever.retrieve(bundle, ctx=ctx)


# --- Nothing: no store call ------------------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_caller_who_may_read_nothing_costs_no_store_call(mode: Mode, use_async: bool) -> None:
    records: list[DecisionRecord] = []
    index, store = _index()
    retriever = JevRetriever.from_index(index, _selector(mode, records), TENANT, top_k=5)
    assert await _retrieve(retriever, use_async, ctx=NO_TENANT) == []  # no tenant: MetadataAcl says Nothing
    assert store.queries == 0
    if mode is not Mode.OFF:
        (record,) = records
        assert (record.status, record.restriction, record.pushdown, record.retrieved, record.rounds) == (
            Status.SKIPPED,
            "nothing",
            True,
            0,
            0,
        )


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_an_engine_saying_nothing_is_asked_once_and_no_store_is_called(use_async: bool) -> None:
    records: list[DecisionRecord] = []
    index, store = _index()
    acl = AllowListAcl({"n001"}, restriction=Nothing())
    retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), acl, top_k=5)
    assert await _retrieve(retriever, use_async) == []
    assert (store.queries, acl.restriction_calls, acl.sync_calls + acl.async_calls) == (0, 1, 0)
    assert (records[0].engine, records[0].restriction) == ("allow-list", "nothing")


# --- the restriction reaches the store, once per query ---------------------------------------


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_an_engines_id_allow_list_is_pushed_down_by_default_and_asked_once_per_query(use_async: bool) -> None:
    records: list[DecisionRecord] = []
    nodes = _nodes()
    allowed = {node.node_id for node in nodes[20:]}
    index, store = _index(nodes)
    acl = AllowListAcl(allowed, restriction=Ids(frozenset(allowed)))
    retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), acl, top_k=5)
    assert retriever.prefilter  # any BatchAcl with a real restriction, over a store an adapter speaks
    got = await _retrieve(retriever, use_async)
    assert [node.node.node_id for node in got] == sorted(allowed)[:5]
    assert (acl.restriction_calls, store.queries) == (1, 1)  # the store pre-selected: one round
    (record,) = records
    assert (record.engine, record.restriction, record.pushdown, record.denied) == ("allow-list", "ids", True, 0)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_looser_restriction_widens_but_asks_the_engine_for_it_once(use_async: bool) -> None:
    records: list[DecisionRecord] = []
    nodes = _nodes()
    allowed = {node.node_id for node in nodes[24:]}
    index, store = _index(nodes)
    acl = AllowListAcl(allowed, restriction=Everything())
    retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), acl, top_k=5)
    got = await _retrieve(retriever, use_async)
    assert [node.node.node_id for node in got] == sorted(allowed)[:5]
    assert acl.restriction_calls == 1
    assert store.queries == 4  # 5, 10, 20, 40 (exhausted at 30)
    (record,) = records
    assert (record.restriction, record.wanted, record.found, record.rounds) == ("everything", 5, 5, 4)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_condition_restriction_is_recorded_as_its_kind_never_its_values(use_async: bool) -> None:
    records: list[DecisionRecord] = []
    index, _ = _index()
    retriever = JevRetriever.from_index(index, _selector(Mode.ENFORCE, records), TENANT, top_k=5)
    await _retrieve(retriever, use_async)
    (record,) = records
    assert (record.engine, record.restriction, record.pushdown) == ("metadata", "condition", True)
    assert "acme" not in record.to_json().replace(record.decision_id, "")


def test_a_plain_callable_is_not_pushed_down_and_says_so_in_the_record() -> None:
    records: list[DecisionRecord] = []
    index, _ = _index()
    retriever = JevRetriever.from_index(
        index, _selector(Mode.SHADOW, records), lambda ctx, node: node.metadata["tenant"] == ctx.tenant_id, top_k=5
    )
    assert not retriever.prefilter
    retriever.retrieve(QUERY, ctx=ALICE)
    assert (records[0].engine, records[0].restriction, records[0].pushdown) == ("callable", "none", False)


# --- an engine that cannot say fails the retrieval -------------------------------------------


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
async def test_a_restriction_that_cannot_be_given_fails_the_retrieval_before_any_store_call(
    mode: Mode, use_async: bool
) -> None:
    records: list[DecisionRecord] = []
    index, store = _index()
    acl = DownAcl(in_restriction=True)
    retriever = JevRetriever.from_index(index, _selector(mode, records), acl, top_k=5)
    with pytest.raises(PermissionsUnavailableError) as raised:
        await _retrieve(retriever, use_async)
    assert raised.value is acl.error
    assert (store.queries, records) == (0, [])


class OddRestriction(AllowListAcl):
    """An engine answering ``restriction()`` with something that is not a restriction."""

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        return IdIn(frozenset({"n001"}))  # type: ignore[return-value]  # a condition, not a restriction

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        return self.restriction(ctx)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_an_unreadable_restriction_fails_closed(use_async: bool) -> None:
    index, store = _index()
    retriever = JevRetriever.from_index(index, _selector(Mode.OFF, []), OddRestriction({"n001"}), top_k=5)
    with pytest.raises(PermissionsUnavailableError) as raised:
        await _retrieve(retriever, use_async)
    assert (raised.value.engine, raised.value.reason) == ("allow-list", "INVALID_RESPONSE")
    assert store.queries == 0


def test_an_engines_condition_is_pushed_down_and_recorded_as_a_condition() -> None:
    records: list[DecisionRecord] = []
    index, _ = _index()
    acl = AllowListAcl({"n001", "n002"}, restriction=Conditional(IdIn(frozenset({"n001", "n002"}))))
    retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), acl, top_k=5)
    got = retriever.retrieve(QUERY, ctx=ALICE)
    assert sorted(node.node.node_id for node in got) == ["n001", "n002"]
    assert records[0].restriction == "condition"


def test_a_restriction_the_store_cannot_state_runs_that_query_without_pushdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Qdrant cannot state `not`: no pushdown for the query (one warning naming the operator), the
    # final check keeps the answer the same, and the record says no restriction was used.
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    from llama_jev.acl import Equals, Not

    client = QdrantClient(location=":memory:")
    nodes = [
        TextNode(
            id_=f"00000000-0000-4000-8000-{i:012d}",
            text=f"refund conditions {i}",
            embedding=[1.0, 0.02 * i, 0, 0, 0, 0, 0, 0],
            metadata={"tenant": "acme" if i % 3 else "globex"},
        )
        for i in range(30)
    ]
    allowed = {node.node_id for node in nodes if node.metadata["tenant"] == "acme"}
    try:
        index = VectorStoreIndex(
            nodes,
            storage_context=StorageContext.from_defaults(
                vector_store=QdrantVectorStore(client=client, collection_name="refused")
            ),
            embed_model=HashEmbedding(dimensions=DIMENSIONS),
        )
        records: list[DecisionRecord] = []
        acl = AllowListAcl(allowed, restriction=Conditional(Not(Equals("tenant", "globex"))))
        retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), acl, top_k=5)
        with caplog.at_level("WARNING", logger="llama_jev"):
            got = [
                retriever.retrieve(QueryBundle(QUERY, embedding=[1.0, 0, 0, 0, 0, 0, 0, 0]), ctx=ALICE) for _ in "ab"
            ]
    finally:
        client.close()
    expected = [node.node_id for node in nodes if node.node_id in allowed][:5]
    assert [[node.node.node_id for node in result] for result in got] == [expected, expected]
    assert [(record.pushdown, record.restriction) for record in records] == [(False, "none")] * 2
    refusals = [r.getMessage() for r in caplog.records if "no pushdown into qdrant" in r.getMessage()]
    assert len(refusals) == 1
    assert "'not'" in refusals[0]
