"""Widening: ``min(k, permitted)`` nodes on every store adapter when the final check drops what the store returned.

The store is asked again with a doubled window until the count is met, the store is exhausted
or 1,024 candidates were recalled; a shortfall is never silent (record fields and one WARNING per
retriever and cause). The data puts the nodes the final check drops first in the store's ranking:
documents whose sibling grant is malformed (the store's filter admits them through ``users``,
``MetadataAcl`` denies them for the unreadable ``roles`` value), or a callable ACL that denies a
seeded random fraction.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
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
)
from llama_jev.retrieval.widening import MAX_RECALL, Widening
from llama_jev.testing.postgres import PostgresServer

from .acl_support import random_denial
from .support import HashEmbedding

DIMENSIONS = 8
QUERY = "refund conditions"
ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles")
ALICE = RuntimeContext(user_id="alice", tenant_id="acme")
MALFORMED = 30  # nearest first: admitted by the store's filter (users), denied by the ACL (roles: 7)
PERMITTED = 10
FOREIGN = 10


def _vector(rank: int) -> list[float]:
    # Cosine and L2 distances to the query grow with the rank: the store's ranking is the rank.
    return [1.0, 0.02 * rank, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def _node(rank: int, metadata: dict[str, Any]) -> TextNode:
    return TextNode(
        id_=f"00000000-0000-4000-8000-{rank:012d}",  # a UUID: Qdrant takes no other string ids
        text=f"refund conditions {rank}",
        embedding=_vector(rank),
        metadata=metadata,
    )


def sibling_nodes() -> list[TextNode]:
    """Malformed sibling grants nearest, then the permitted nodes, then another tenant's."""
    malformed = [_node(i, {"tenant": "acme", "users": "alice", "roles": 7}) for i in range(MALFORMED)]
    permitted = [_node(MALFORMED + i, {"tenant": "acme", "users": "alice"}) for i in range(PERMITTED)]
    foreign = [_node(MALFORMED + PERMITTED + i, {"tenant": "globex", "users": "alice"}) for i in range(FOREIGN)]
    return malformed + permitted + foreign


def plain_nodes(count: int) -> list[TextNode]:
    return [_node(i, {"tenant": "acme"}) for i in range(count)]


def _bundle() -> QueryBundle:
    return QueryBundle(QUERY, embedding=[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])


Build = Callable[[list[TextNode]], VectorStoreIndex]


def _over(store: Any, nodes: list[TextNode]) -> VectorStoreIndex:
    return VectorStoreIndex(
        nodes,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=DIMENSIONS),
    )


@pytest.fixture(
    params=[
        "memory",
        "qdrant",
        pytest.param("postgres", marks=pytest.mark.slow),
        "chroma",
        "milvus-lite",
        pytest.param("milvus", marks=pytest.mark.slow),
    ],
)
def build(request: pytest.FixtureRequest) -> Iterator[Build]:
    """An index over ``nodes`` in a real store of each adapter; closed after the test."""
    closers: list[Callable[[], None]] = []
    name = request.param

    def make(nodes: list[TextNode]) -> VectorStoreIndex:
        if name == "memory":
            return VectorStoreIndex(nodes, embed_model=HashEmbedding(dimensions=DIMENSIONS))
        if name == "qdrant":
            from llama_index.vector_stores.qdrant import QdrantVectorStore
            from qdrant_client import QdrantClient

            client = QdrantClient(location=":memory:")
            closers.append(client.close)
            collection = f"widening-{random.randrange(10**9)}"
            return _over(QdrantVectorStore(client=client, collection_name=collection), nodes)
        if name == "postgres":
            pytest.importorskip("llama_index.vector_stores.postgres")
            from llama_jev.stores.postgres import AclPGVectorStore

            from .postgres_support import store_kwargs

            server: PostgresServer = request.getfixturevalue("postgres_server")
            table = f"widening_{random.randrange(10**9)}"
            store = AclPGVectorStore(**store_kwargs(server, table, embed_dim=DIMENSIONS))
            closers.append(lambda: store._engine.dispose() if store._engine is not None else None)
            return _over(store, nodes)
        if name.startswith("milvus"):
            from .milvus_support import milvus_store, uri_for

            # IVF_FLAT with one probe of many lists: a filtered search returns fewer than asked while
            # more rows match (as HNSW may), so widening must not read a short answer as exhausted.
            store = milvus_store(uri_for("lite" if name == "milvus-lite" else "server", request), dim=DIMENSIONS)
            closers.append(store.client.close)
            return _over(store, nodes)
        pytest.importorskip("llama_index.vector_stores.chroma")
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        collection = chromadb.EphemeralClient().create_collection(
            f"widening-{random.randrange(10**9)}", embedding_function=None
        )
        return _over(ChromaVectorStore(chroma_collection=collection), nodes)

    try:
        yield make
    finally:
        for close in closers:
            close()


def _selector(mode: Mode, records: list[DecisionRecord] | None = None) -> CandidateSelector:
    observer = None if records is None or mode is Mode.OFF else (lambda ctx, record: records.append(record))
    return CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=mode, observer=observer))


async def _retrieve(retriever: JevRetriever, use_async: bool, ctx: RuntimeContext = ALICE) -> list[NodeWithScore]:
    if use_async:
        return await retriever.aretrieve(_bundle(), ctx=ctx)
    return retriever.retrieve(_bundle(), ctx=ctx)


def _ids(nodes: list[NodeWithScore]) -> list[str]:
    return [node.node.node_id for node in nodes]


# --- every store: k permitted nodes whatever the final check drops ---------------------------


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")  # Qdrant local mode says so of its indexes
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("top_k", [5, 25])
async def test_malformed_sibling_grants_do_not_cost_results_on_any_store(
    build: Build, top_k: int, use_async: bool
) -> None:
    """Fails without widening: the store's five nearest are all denied, so 0 of 5 came back."""
    nodes = sibling_nodes()
    retriever = JevRetriever.from_index(build(nodes), _selector(Mode.OFF), ACL, top_k=top_k)
    assert retriever.prefilter
    got = await _retrieve(retriever, use_async)
    permitted = [node.node_id for node in nodes if ACL.allows(ALICE, node.metadata)]
    assert len(permitted) == PERMITTED
    assert _ids(got) == permitted[: min(top_k, len(permitted))]  # min(k, permitted), in the store's order


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("top_k", [5, 30])
async def test_a_callable_denying_a_random_fraction_still_gets_min_k_permitted_on_any_store(
    build: Build, top_k: int, use_async: bool
) -> None:
    nodes = plain_nodes(120)
    acl = random_denial(0.85, seed=3)
    permitted = [node.node_id for node in nodes if acl(ALICE, node)]
    assert 5 < len(permitted) < 30  # the seed leaves some, fewer than the larger k
    assert sum(1 for node in nodes[:10] if acl(ALICE, node)) < 5  # the first window (2 x 5) is not enough
    retriever = JevRetriever.from_index(build(nodes), _selector(Mode.OFF), acl, top_k=top_k)
    assert not retriever.prefilter  # a callable cannot be pushed down
    got = await _retrieve(retriever, use_async)
    assert _ids(got) == permitted[: min(top_k, len(permitted))]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
async def test_the_record_says_what_was_wanted_found_and_how_many_rounds(
    build: Build, mode: Mode, use_async: bool
) -> None:
    records: list[DecisionRecord] = []
    nodes = sibling_nodes()
    retriever = JevRetriever.from_index(build(nodes), _selector(mode, records), ACL, top_k=5, candidate_limit=8)
    got = await _retrieve(retriever, use_async)
    (record,) = records
    wanted = 5 if mode is Mode.SHADOW else 8
    assert (record.wanted, record.found, record.candidates) == (wanted, wanted, wanted)
    assert record.rounds is not None
    assert record.rounds >= 1
    assert record.engine == "metadata"
    assert record.pushdown
    assert record.restriction == "condition"
    assert record.retrieved is not None
    assert record.candidates == record.retrieved - (record.denied or 0)
    assert len(got) == 5


# --- the rounds -----------------------------------------------------------------------------


class CountingStore(SimpleVectorStore):
    """The in-memory store, noting the ``k`` of every query it answers."""

    def query(self, query: Any, **kwargs: Any) -> Any:
        self.asked.append(query.similarity_top_k)
        return super().query(query, **kwargs)

    @property
    def asked(self) -> list[int]:
        if "_asked" not in self.__dict__:
            self.__dict__["_asked"] = []
        asked: list[int] = self.__dict__["_asked"]
        return asked


def _counting_index(nodes: list[TextNode]) -> tuple[VectorStoreIndex, CountingStore]:
    store = CountingStore()
    return _over(store, nodes), store


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_the_window_doubles_until_k_are_found_and_starts_wider_once_denials_are_seen(use_async: bool) -> None:
    nodes = plain_nodes(200)
    # Only every 9th node is readable: 5 readable need the first 37 nodes.
    index, store = _counting_index(nodes)
    retriever = JevRetriever.from_index(
        index, _selector(Mode.OFF), lambda ctx, node: int(node.text.split()[-1]) % 9 == 0, top_k=5
    )
    for _ in range(2):
        got = await _retrieve(retriever, use_async)
        assert [int(node.node.text.split()[-1]) for node in got] == [0, 9, 18, 27, 36]
    # The first query starts at k; the final check dropped nodes, so the next starts at 2k.
    assert store.asked == [5, 10, 20, 40, 10, 20, 40]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_the_store_is_asked_once_when_the_first_window_suffices(use_async: bool) -> None:
    index, store = _counting_index(plain_nodes(50))
    retriever = JevRetriever.from_index(index, _selector(Mode.OFF), ACL_TENANT, top_k=5)
    got = await _retrieve(retriever, use_async)
    assert len(got) == 5
    assert store.asked == [5]  # pushdown: the first window is k


ACL_TENANT = MetadataAcl(tenant_key="tenant")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_an_exhausted_store_ends_the_rounds_without_a_warning(
    use_async: bool, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = plain_nodes(12)
    index, store = _counting_index(nodes)
    records: list[DecisionRecord] = []
    retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), lambda ctx, node: True, top_k=20)
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        got = await _retrieve(retriever, use_async)
    assert len(got) == 12
    assert store.asked == [20]  # 12 < 20 asked: the store holds no more
    assert (records[0].wanted, records[0].found, records[0].rounds) == (20, 12, 1)
    assert not [record for record in caplog.records if "fewer nodes than wanted" in record.getMessage()]


def test_nodes_seen_in_an_earlier_round_are_not_counted_twice() -> None:
    first = [NodeWithScore(node=TextNode(id_=f"n{i}", text="t"), score=1.0) for i in range(4)]
    again = [*first, NodeWithScore(node=TextNode(id_="n4", text="t"), score=0.5), first[0]]
    widening = Widening(wanted=3, widen=True, pushdown=True)
    assert widening.next_window() == 3
    fresh = widening.fresh(first[:3])
    widening.add(fresh, [fresh[0]])  # the final check keeps one
    assert widening.next_window() == 6
    fresh = widening.fresh(again)
    assert [node.node.node_id for node in fresh] == ["n3", "n4"]  # the store's order, each once
    widening.add(fresh, fresh)
    assert [node.node.node_id for node in widening.candidates()] == ["n0", "n3", "n4"]
    assert widening.next_window() is None  # 3 found
    assert widening.counts() == (5, 2)


# --- a shortfall is never silent -----------------------------------------------------------


@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_the_bound_is_named_once_per_retriever_in_every_mode(
    mode: Mode, use_async: bool, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = plain_nodes(MAX_RECALL + 100)
    index, store = _counting_index(nodes)
    readable = {nodes[-1].node_id, nodes[-2].node_id}  # beyond the bound
    records: list[DecisionRecord] = []
    retriever = JevRetriever.from_index(
        index, _selector(mode, records), lambda ctx, node: node.node_id in readable, top_k=5
    )
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        assert await _retrieve(retriever, use_async) == []
        assert await _retrieve(retriever, use_async) == []
    rounds = [5, 10, 20, 40, 80, 160, 320, 640, MAX_RECALL]
    assert store.asked == rounds + rounds[1:]  # the second query starts wider: denials were seen
    warnings = [record.getMessage() for record in caplog.records if "fewer nodes than wanted" in record.getMessage()]
    assert len(warnings) == 1
    assert "no pushdown" in warnings[0]
    assert "1,024" in warnings[0]
    assert "0 of the 5" in warnings[0]
    assert not any(node_id in warnings[0] for node_id in readable)
    if mode is Mode.SHADOW:
        assert [(r.wanted, r.found, r.rounds) for r in records] == [(5, 0, 9), (5, 0, 8)]


async def test_a_bound_reached_with_pushdown_names_the_final_check(caplog: pytest.LogCaptureFixture) -> None:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    malformed = [_node(i, {"tenant": "acme", "users": "alice", "roles": 7}) for i in range(MAX_RECALL + 50)]
    client = QdrantClient(location=":memory:")
    try:
        index = _over(QdrantVectorStore(client=client, collection_name="bound"), malformed)
        records: list[DecisionRecord] = []
        retriever = JevRetriever.from_index(index, _selector(Mode.SHADOW, records), ACL, top_k=5)
        with caplog.at_level(logging.WARNING, logger="llama_jev"):
            assert retriever.retrieve(_bundle(), ctx=ALICE) == []
    finally:
        client.close()
    (warning,) = [r.getMessage() for r in caplog.records if "fewer nodes than wanted" in r.getMessage()]
    assert f"dropped {MAX_RECALL} of the {MAX_RECALL} nodes" in warning
    assert "1,024" in warning
    assert "alice" not in warning
    assert "acme" not in warning
    assert (records[0].wanted, records[0].found, records[0].denied) == (5, 0, MAX_RECALL)


class Delegating(BaseRetriever):
    """A retriever of the caller's own making with no ``similarity_top_k``: it cannot be asked for more."""

    def __init__(self, inner: BaseRetriever) -> None:
        super().__init__()
        self.inner = inner

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self.inner.retrieve(query_bundle)


async def test_a_retriever_that_cannot_widen_is_used_as_it_is_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    index = VectorStoreIndex(plain_nodes(20), embed_model=HashEmbedding(dimensions=DIMENSIONS))
    retriever = JevRetriever(
        Delegating(index.as_retriever(similarity_top_k=6)), _selector(Mode.OFF), random_denial(0.5, seed=1), top_k=6
    )
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        got = retriever.retrieve(_bundle(), ctx=ALICE)
    assert len(got) < 6
    (warning,) = [r.getMessage() for r in caplog.records if "fewer nodes than wanted" in r.getMessage()]
    assert "cannot be asked for more" in warning
