"""SpiceDB behind ``JevRetriever`` over every pushdown store: no leak, and ``min(k, permitted)`` results.

The differential test, as for Cerbos: 80 documents of 3 chunks each (each chunk's source is its
document, ``ref_doc_id``, as a LlamaIndex splitter leaves it) in the in-memory store, Qdrant
local, PostgreSQL + pgvector (embedded) and Chroma (embedded); their grants in a real SpiceDB
(users, nested groups, folders with inherited viewers, a public folder, bans, caveated grants).
The oracle is separate from the code under test: one CheckPermission per (subject, document),
read straight from SpiceDB with the ``authzed`` client. For every caller and k, with the
allow-list pushed down (``max_ids`` large) and without it (``max_ids`` small: no pushdown,
widening and the final check), the retriever returns only chunks of permitted documents and
exactly ``min(k, permitted chunks)`` of them; over the exact stores (memory, Qdrant local) they
are the top k of the permitted chunks, in order.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("authzed")
pytest.importorskip("spicedb_embedded")

from authzed.api.v1 import (
    CheckPermissionRequest,
    CheckPermissionResponse,
    Consistency,
    InsecureClient,
    ObjectReference,
    SubjectReference,
)
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

from llama_jev import CandidateSelector, ExecutionOptions, JevRetriever, Mode, RuntimeContext, ScriptedJudge
from llama_jev import runtime_context as bound
from llama_jev.acl import SpiceDBAcl
from llama_jev.errors import PermissionsUnavailableError
from llama_jev.testing.postgres import PostgresServer
from llama_jev.testing.spicedb import SpiceDBServer

from .store_data import embedding
from .support import HashEmbedding
from .test_spicedb import SCHEMA, closed_port, running_spicedb

DOCUMENTS = [f"doc-{n:03d}" for n in range(80)]
CHUNKS = 3
USERS = [f"u{n:02d}" for n in range(16)]
HOSTILE = ["*", "u01' OR 1=1 --", "$ne", "u01 ", "user:u01"]
QUERY = "refund policy"
K = (3, 10)


def grants(seed: int = 35) -> list[str]:
    """Relationships in the shape of tests/test_spicedb.py's schema, drawn at random (fixed seed)."""
    rng = random.Random(seed)
    out = [f"group:g{g}#member@user:{user}" for g in range(4) for user in rng.sample(USERS, 4)]
    out += ["group:g4#member@group:g0#member", "group:g4#member@user:u15"]  # nested
    out += [f"folder:f{f}#viewer@group:g{rng.randrange(5)}#member" for f in range(5)]
    out += ["folder:f5#parent@folder:f0", "folder:f6#parent@folder:f1", "folder:public#viewer@user:*"]
    folders = [f"f{f}" for f in range(7)]
    for n, document in enumerate(DOCUMENTS):
        if n < 2:
            out.append(f"document:{document}#folder@folder:public")
        elif rng.random() < 0.5:
            out.append(f"document:{document}#folder@folder:{rng.choice(folders)}")
        out += [f"document:{document}#viewer@user:{user}" for user in rng.sample(USERS, rng.randint(0, 2))]
        if rng.random() < 0.15:
            out.append(f"document:{document}#viewer@group:g{rng.randrange(5)}#member")
        if rng.random() < 0.2:  # held only under a condition nobody shows: conditional, denied
            out.append(f'document:{document}#viewer@user:{rng.choice(USERS)}[clearance:{{"required": 3}}]')
        if rng.random() < 0.1:
            out.append(f"document:{document}#banned@user:{rng.choice(USERS)}")
    return out


def corpus() -> list[TextNode]:
    rng = random.Random(7)
    return [
        TextNode(
            id_=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{document}/{chunk}")),  # Qdrant takes UUIDs
            text=f"refund policy, {document} part {chunk}",
            embedding=embedding(rng),
            metadata={"part": chunk},
            # As a splitter leaves them: each chunk points at its source Document (ref_doc_id).
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=document)},
        )
        for document in DOCUMENTS
        for chunk in range(CHUNKS)
    ]


NODES = corpus()


@pytest.fixture(scope="module")
def spicedb() -> Iterator[SpiceDBServer]:
    with running_spicedb(SCHEMA, grants()) as server:
        yield server


@pytest.fixture(scope="module")
def oracle(spicedb: SpiceDBServer) -> dict[str, set[str]]:
    """Per user, the documents SpiceDB says it may read: one CheckPermission per (user, document)."""
    client = InsecureClient(spicedb.target, spicedb.preshared_key or "")
    readable: dict[str, set[str]] = {}
    for user in USERS:
        readable[user] = set()
        for document in DOCUMENTS:
            answer = client.CheckPermission(
                CheckPermissionRequest(
                    consistency=Consistency(fully_consistent=True),
                    resource=ObjectReference(object_type="document", object_id=document),
                    permission="view",
                    subject=SubjectReference(object=ObjectReference(object_type="user", object_id=user)),
                )
            )
            if answer.permissionship == CheckPermissionResponse.PERMISSIONSHIP_HAS_PERMISSION:
                readable[user].add(document)
    # The data must exercise the range: public-only readers, many readers, and conditional denials.
    sizes = sorted(len(documents) for documents in readable.values())
    assert sizes[0] <= 6 < 20 <= sizes[-1]
    return readable


def _index_over(store: Any) -> VectorStoreIndex:
    return VectorStoreIndex(
        NODES, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=HashEmbedding(dimensions=8)
    )


def _memory(request: pytest.FixtureRequest) -> Iterator[VectorStoreIndex]:
    yield VectorStoreIndex(NODES, embed_model=HashEmbedding(dimensions=8))


def _qdrant(request: pytest.FixtureRequest) -> Iterator[VectorStoreIndex]:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    try:
        yield _index_over(QdrantVectorStore(client=client, collection_name="spicedb"))
    finally:
        client.close()


def _postgres(request: pytest.FixtureRequest) -> Iterator[VectorStoreIndex]:
    pytest.importorskip("llama_index.vector_stores.postgres")
    from llama_jev.stores.postgres import AclPGVectorStore

    from .postgres_support import store_kwargs

    server: PostgresServer = request.getfixturevalue("postgres_server")
    store = AclPGVectorStore(**store_kwargs(server, f"spicedb_{random.randrange(10**9)}", embed_dim=8))
    try:
        yield _index_over(store)
    finally:
        assert store._engine is not None
        store._engine.dispose()


def _chroma(request: pytest.FixtureRequest) -> Iterator[VectorStoreIndex]:
    pytest.importorskip("llama_index.vector_stores.chroma")
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.EphemeralClient().create_collection(
        f"spicedb-{random.randrange(10**9)}", embedding_function=None
    )
    yield _index_over(ChromaVectorStore(chroma_collection=collection))


def _milvus(engine: str) -> Callable[[pytest.FixtureRequest], Iterator[VectorStoreIndex]]:
    def build(request: pytest.FixtureRequest) -> Iterator[VectorStoreIndex]:
        from .milvus_support import closing, milvus_index, uri_for

        yield from closing(milvus_index(uri_for(engine, request), NODES, dim=8, use_async_client=False))

    return build


STORES = {
    "memory": _memory,
    "qdrant": _qdrant,
    "postgres": _postgres,
    "chroma": _chroma,
    "milvus-lite": _milvus("lite"),
    "milvus": _milvus("server"),
}
EXACT = {"memory", "qdrant"}


@pytest.fixture(
    scope="module",
    params=[pytest.param(name, marks=[pytest.mark.slow] if name in ("postgres", "milvus") else []) for name in STORES],
)
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, VectorStoreIndex]]:
    yield from ((request.param, index) for index in STORES[request.param](request))


def off_selector() -> CandidateSelector:
    return CandidateSelector(
        ScriptedJudge(lambda *_: pytest.fail("OFF never asks the judge")), ExecutionOptions(mode=Mode.OFF)
    )


def acl_for(spicedb: SpiceDBServer, **options: Any) -> SpiceDBAcl:
    return SpiceDBAcl(
        spicedb.target, preshared_key=spicedb.preshared_key, insecure=True, document_id_key="ref_doc_id", **options
    )


def ranked(index: VectorStoreIndex) -> list[str]:
    """Every node id, best first, as the store ranks them without any restriction."""
    return [hit.node.node_id for hit in index.as_retriever(similarity_top_k=len(NODES)).retrieve(QUERY)]


DOCUMENT_OF = {node.node_id: node.ref_doc_id for node in NODES}


@pytest.mark.parametrize("pushdown", [True, False], ids=["allow-list", "past-max-ids"])
def test_no_leak_and_min_k_permitted_for_every_caller(
    spicedb: SpiceDBServer,
    oracle: dict[str, set[str]],
    store: tuple[str, VectorStoreIndex],
    pushdown: bool,
) -> None:
    name, index = store
    acl = acl_for(spicedb, max_ids=1000 if pushdown else 4)
    order = ranked(index) if name in EXACT else []
    for user in USERS:
        permitted = [node_id for node_id in DOCUMENT_OF if DOCUMENT_OF[node_id] in oracle[user]]
        for k in K:
            retriever = JevRetriever.from_index(index, off_selector(), acl, top_k=k)
            with bound(RuntimeContext(user_id=user)):
                returned = [hit.node.node_id for hit in retriever.retrieve(QUERY)]
            leaked = [node_id for node_id in returned if DOCUMENT_OF[node_id] not in oracle[user]]
            assert leaked == [], f"{name}: {len(leaked)} leaked"
            assert len(returned) == min(k, len(permitted)), f"{name}, k={k}: {len(returned)} of {len(permitted)}"
            assert len(set(returned)) == len(returned)
            if order:  # an exact store: the top k of the permitted chunks, in order
                assert returned == [node_id for node_id in order if node_id in set(permitted)][:k]
    acl.close()


def test_hostile_callers_get_nothing(spicedb: SpiceDBServer, store: tuple[str, VectorStoreIndex]) -> None:
    name, index = store
    acl = acl_for(spicedb)
    retriever = JevRetriever.from_index(index, off_selector(), acl, top_k=10)
    for user in HOSTILE:
        with bound(RuntimeContext(user_id=user)):
            assert retriever.retrieve(QUERY) == [], name
    acl.close()


@pytest.mark.parametrize("max_ids", [1000, 4])
def test_the_async_path_returns_the_same(
    spicedb: SpiceDBServer, oracle: dict[str, set[str]], store: tuple[str, VectorStoreIndex], max_ids: int
) -> None:
    name, index = store
    if name == "postgres":
        # PGVectorStore's async engine stays bound to the first event loop that used it, and each
        # test here runs its own: the async PostgreSQL path is tested in tests/test_store_postgres*.py.
        pytest.skip(
            "PGVectorStore's async engine is bound to the first event loop that used it (this module's store "
            "is shared across loops); the async PostgreSQL path runs in tests/test_store_postgres*.py. "
            "In an app: build the store inside the event loop that queries it, one store per loop"
        )
    acl = acl_for(spicedb, max_ids=max_ids)
    retriever = JevRetriever.from_index(index, off_selector(), acl, top_k=10)
    synced: dict[str, list[str]] = {}
    for user in USERS[:6]:
        with bound(RuntimeContext(user_id=user)):
            synced[user] = [hit.node.node_id for hit in retriever.retrieve(QUERY)]

    async def awaited() -> dict[str, list[str]]:
        try:
            found = {}
            for user in USERS[:6]:
                with bound(RuntimeContext(user_id=user)):
                    found[user] = [hit.node.node_id for hit in await retriever.aretrieve(QUERY)]
            return found
        finally:
            await acl.aclose()

    assert asyncio.run(awaited()) == synced
    assert all(DOCUMENT_OF[node_id] in oracle[user] for user, ids in synced.items() for node_id in ids)


def test_the_record_names_the_engine_and_the_restriction_never_an_id(
    spicedb: SpiceDBServer, oracle: dict[str, set[str]]
) -> None:
    index = VectorStoreIndex(NODES, embed_model=HashEmbedding(dimensions=8))
    records: list[Any] = []
    selector = CandidateSelector(
        ScriptedJudge(lambda *_: 0.5),
        ExecutionOptions(mode=Mode.SHADOW, observer=lambda ctx, record: records.append(record)),
    )
    user = max(USERS, key=lambda name: len(oracle[name]))  # more documents than max_ids=4
    for max_ids, kind in ((1000, "ids"), (4, "none")):
        acl = acl_for(spicedb, max_ids=max_ids)
        with bound(RuntimeContext(user_id=user)):
            JevRetriever.from_index(index, selector, acl, top_k=5).retrieve(QUERY)
        record = records[-1]
        assert (record.engine, record.restriction) == ("spicedb", kind)
        dumped = record.model_dump_json()
        assert user not in dumped
        assert not any(document in dumped for document in oracle[user])
        acl.close()
    with bound(RuntimeContext(user_id="$ne")):
        assert JevRetriever.from_index(index, selector, acl_for(spicedb), top_k=5).retrieve(QUERY) == []
    assert records[-1].restriction == "nothing"


@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW, Mode.ENFORCE])
@pytest.mark.parametrize("fault", ["slow", "down"])
def test_spicedb_slow_or_down_fails_the_retrieval_in_every_mode(spicedb: SpiceDBServer, mode: Mode, fault: str) -> None:
    index = VectorStoreIndex(NODES, embed_model=HashEmbedding(dimensions=8))
    selector = CandidateSelector(ScriptedJudge(lambda *_: 0.9), ExecutionOptions(mode=mode))
    if fault == "down":
        acl = SpiceDBAcl(closed_port(), preshared_key=None, insecure=True, document_id_key="ref_doc_id", timeout=2)
    else:
        acl = acl_for(spicedb, timeout=0.1)
    retriever = JevRetriever.from_index(index, selector, acl, top_k=5)
    spicedb.delay = 0.5 if fault == "slow" else 0.0
    try:
        with bound(RuntimeContext(user_id=USERS[0])), pytest.raises(PermissionsUnavailableError) as raised:
            retriever.retrieve(QUERY)
    finally:
        spicedb.delay = 0.0
        acl.close()
    assert raised.value.reason == ("TIMEOUT" if fault == "slow" else "UNREACHABLE")
