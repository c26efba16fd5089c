"""The differential test of issue 34: CerbosAcl behind JevRetriever on every pushdown store, against an oracle.

A corpus of multi-chunk documents (a chunk's grant sometimes malformed where its siblings' are
not: a string where the policy reads a list, a number for a tenant, the string "true" for the
public flag) sits in each store an adapter speaks: in memory, Qdrant local, embedded PostgreSQL
(exact scan) and Chroma embedded (written natively, with lists). 137 principals across tenants,
users and roles, hostile values included (``acme' OR 1=1 --``, ``$ne``, quotes), a caller with
no tenant (always denied), a platform administrator (always allowed) and auditors (a plan with
``le``: nothing pushed down), query each store through ``JevRetriever.from_index`` with the
example policy, in OFF and ENFORCE (a ScriptedJudge accepting everything), sync and async.

The oracle asks the PDP directly through the SDK, one CheckResources call per (principal,
document), apart from the code under test. Every retrieval returns no node the oracle denies and
``min(k, permitted)`` nodes; in OFF they are the first ``k`` permitted nodes of the store's own
ranking.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import TextNode

from llama_jev import CandidateSelector, ExecutionOptions, JevRetriever, Mode, RuntimeContext, ScriptedJudge
from llama_jev.core.context import runtime_context
from llama_jev.errors import PermissionsUnavailableError

from .cerbos_support import POLICIES, require_cerbos, running_pdp
from .support import HashEmbedding

pytestmark = pytest.mark.slow

K = 5
DIMENSIONS = 8
QUERY = "refund conditions"
TENANTS = ["acme", "globex", "acme' OR 1=1 --"]
USERS = ["u1", "u2", "u3", "u4", "u5", "$ne", 'o"brien', "u1' --"]
CALLERS = [*USERS, "u9"]  # u9 is named in no grant: public documents only
ROLES = ["support", "sales", "admin' --"]
ROLE_SETS: list[set[str]] = [set(), {"support"}, {"sales", "support"}, {"auditor"}, {"admin' --"}]


def _id(name: str) -> str:
    # A UUID: Qdrant takes no other string ids.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"llama-jev-cerbos/{name}"))


def corpus(seed: int = 34) -> list[TextNode]:
    """60 documents of 1-4 chunks; about one document in four has a chunk whose grant is malformed."""
    rng = random.Random(seed)
    nodes = []
    for doc in range(60):
        grant: dict[str, Any] = {"tenant": rng.choice(TENANTS), "doc": f"d{doc}"}
        if rng.random() < 0.6:
            grant["allowed_users"] = rng.sample(USERS, rng.randint(1, 3))
        if rng.random() < 0.5:
            grant["allowed_roles"] = rng.sample(ROLES, rng.randint(1, 2))
        if rng.random() < 0.06:
            grant["public"] = True
        if rng.random() < 0.4:
            grant["owner"] = rng.choice(USERS)
        if rng.random() < 0.5:
            grant["level"] = rng.randint(1, 4)
        for chunk in range(rng.randint(1, 4)):
            metadata = dict(grant)
            if rng.random() < 0.12:
                # A malformed sibling: the store's filter may still admit it; the PDP does not.
                malformed = rng.choice(["users-as-string", "roles-as-string", "tenant-number", "public-string"])
                if malformed == "users-as-string":
                    metadata["allowed_users"] = rng.choice(USERS)
                elif malformed == "roles-as-string":
                    metadata["allowed_roles"] = rng.choice(ROLES)
                elif malformed == "tenant-number":
                    metadata["tenant"] = 7
                else:
                    metadata["public"] = "true"
            vector = [rng.gauss(0, 1) for _ in range(DIMENSIONS)]
            nodes.append(
                TextNode(id_=_id(f"d{doc}#{chunk}"), text=f"{QUERY} {doc}.{chunk}", embedding=vector, metadata=metadata)
            )
    return nodes


def principals() -> list[RuntimeContext]:
    found = [
        RuntimeContext(user_id=user, tenant_id=tenant, roles=roles)
        for tenant in TENANTS
        for user in CALLERS
        for roles in ROLE_SETS
    ]
    found += [RuntimeContext(user_id="u1"), RuntimeContext(user_id="root", roles={"platform-admin"})]
    return found


NODES = corpus()
PRINCIPALS = principals()


@pytest.fixture(scope="module")
def pdp() -> Iterator[Any]:
    require_cerbos()
    from llama_jev.testing.cerbos import cerbos_server

    with cerbos_server(POLICIES) as server:
        yield server


@pytest.fixture(scope="module")
def oracle(pdp: Any) -> dict[tuple[int, str], bool]:
    """(principal index, node id) -> the PDP's verdict: one CheckResources call per (principal, document)."""
    from cerbos.sdk.client import CerbosClient
    from cerbos.sdk.model import Principal, Resource, ResourceList

    documents: dict[str, list[TextNode]] = {}
    for item in NODES:
        documents.setdefault(item.metadata["doc"], []).append(item)
    verdicts: dict[tuple[int, str], bool] = {}

    def ask(index: int, ctx: RuntimeContext, client: Any) -> None:
        attributes = {**ctx.attributes, **({"tenant": ctx.tenant_id} if ctx.tenant_id else {})}
        principal = Principal(ctx.user_id, roles=set(ctx.roles or {"user"}), attr=attributes)
        for chunks in documents.values():
            asked = ResourceList()
            for item in chunks:
                asked.add(Resource(item.node_id, "document", attr=dict(item.metadata)), {"view"})
            answer = client.check_resources(principal, asked).raise_if_failed()
            for item in chunks:
                result = answer.get_resource(item.node_id)
                assert result is not None
                verdicts[index, item.node_id] = result.is_allowed("view")

    with CerbosClient(pdp.url, timeout_secs=30) as client, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda pair: ask(pair[0], pair[1], client), enumerate(PRINCIPALS)))
    assert len(verdicts) == len(PRINCIPALS) * len(NODES)
    return verdicts


def _over(store: Any) -> VectorStoreIndex:
    return VectorStoreIndex(
        [node.model_copy() for node in NODES],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=DIMENSIONS),
    )


@pytest.fixture(scope="module", params=["memory", "qdrant", "postgres", "chroma", "milvus-lite", "milvus"])
def index(request: pytest.FixtureRequest) -> Iterator[VectorStoreIndex]:
    """The corpus in one real store of each adapter."""
    name = request.param
    tag = f"cerbos_diff_{random.randrange(10**9)}"
    if name == "memory":
        yield VectorStoreIndex([node.model_copy() for node in NODES], embed_model=HashEmbedding(dimensions=DIMENSIONS))
    elif name == "qdrant":
        from llama_index.vector_stores.qdrant import QdrantVectorStore
        from qdrant_client import QdrantClient

        client = QdrantClient(location=":memory:")
        yield _over(QdrantVectorStore(client=client, collection_name=tag))
        client.close()
    elif name == "postgres":
        pytest.importorskip("llama_index.vector_stores.postgres")
        from llama_jev.stores.postgres import AclPGVectorStore

        from .postgres_support import store_kwargs

        store = AclPGVectorStore(**store_kwargs(request.getfixturevalue("postgres_server"), tag, embed_dim=DIMENSIONS))
        yield _over(store)
        if store._engine is not None:
            store._engine.dispose()
    elif name.startswith("milvus"):
        from .milvus_support import closing, milvus_index, uri_for

        engine = "lite" if name == "milvus-lite" else "server"
        yield from closing(milvus_index(uri_for(engine, request), NODES, dim=DIMENSIONS, use_async_client=False))
    else:
        pytest.importorskip("llama_index.vector_stores.chroma")
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        # Written natively: LlamaIndex's Chroma store refuses list values, the policy reads lists.
        collection = chromadb.EphemeralClient().create_collection(tag, embedding_function=None)
        collection.add(
            ids=[item.node_id for item in NODES],
            embeddings=[item.embedding for item in NODES],
            documents=[item.text for item in NODES],
            metadatas=[dict(item.metadata) for item in NODES],
        )
        store = ChromaVectorStore(chroma_collection=collection)
        yield VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=DIMENSIONS))


def _selector(mode: Mode) -> CandidateSelector:
    return CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=mode))


Retrieve = Callable[[JevRetriever, RuntimeContext], Any]


# One event loop for the module: the PostgreSQL store's async engine belongs to the loop it first ran on.
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", [Mode.OFF, Mode.ENFORCE])
async def test_no_node_the_oracle_denies_and_min_k_permitted_on_every_store(
    index: VectorStoreIndex, pdp: Any, oracle: dict[tuple[int, str], bool], mode: Mode, sync: bool
) -> None:
    from llama_jev.acl import CerbosAcl

    # The store's own ranking of every node: the first k permitted of it is what OFF must return.
    ranking = [hit.node.node_id for hit in index.as_retriever(similarity_top_k=len(NODES)).retrieve(QUERY)]
    assert sorted(ranking) == sorted(item.node_id for item in NODES)
    shortfalls, leaks, wrong = [], [], []
    # Both transports: gRPC on the sync path, HTTP on the async one.
    with CerbosAcl(pdp.grpc_address if sync else pdp.url, timeout=30.0) as acl:
        retriever = JevRetriever.from_index(index, _selector(mode), acl, candidate_limit=10, top_k=K)
        for who, ctx in enumerate(PRINCIPALS):
            with runtime_context(ctx):
                nodes = retriever.retrieve(QUERY) if sync else await retriever.aretrieve(QUERY)
            got = [hit.node.node_id for hit in nodes]
            permitted = [node_id for node_id in ranking if oracle[who, node_id]]
            leaks += [(who, node_id) for node_id in got if not oracle[who, node_id]]
            if len(got) != min(K, len(permitted)):
                shortfalls.append((who, len(got), min(K, len(permitted))))
            elif mode is Mode.OFF and set(got) != set(permitted[:K]):
                wrong.append(who)
    assert leaks == [], "nodes the PDP denies were returned"
    assert shortfalls == [], "(principal, returned, expected) where fewer than min(k, permitted) came back"
    assert wrong == [], "principals whose OFF results are not the store's first k permitted nodes"


def test_the_corpus_exercises_every_path(oracle: dict[tuple[int, str], bool]) -> None:
    """Principals see from nothing to everything, several below k; malformed siblings are denied."""
    permitted = [sum(oracle[who, item.node_id] for item in NODES) for who in range(len(PRINCIPALS))]
    assert len(PRINCIPALS) >= 100
    assert min(permitted) == 0
    assert max(permitted) == len(NODES)
    assert sum(0 < count < K for count in permitted) >= 3
    assert sum(count >= K for count in permitted) >= 30
    siblings: dict[str, list[TextNode]] = {}
    for item in NODES:
        siblings.setdefault(item.metadata["doc"], []).append(item)
    split = [
        doc
        for doc, chunks in siblings.items()
        if any(len({oracle[who, c.node_id] for c in chunks}) == 2 for who in range(len(PRINCIPALS)))
    ]
    assert len(split) >= 3, "documents whose chunks the PDP decides differently (a malformed sibling)"


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW, Mode.ENFORCE])
async def test_a_pdp_gone_mid_session_fails_the_retrieval_in_every_mode(mode: Mode, sync: bool) -> None:
    from llama_jev.acl import CerbosAcl

    index = VectorStoreIndex([node.model_copy() for node in NODES], embed_model=HashEmbedding(dimensions=DIMENSIONS))
    ctx = RuntimeContext(user_id="u1", tenant_id="acme")
    with running_pdp() as own, CerbosAcl(own.url if sync else own.grpc_address, timeout=30.0) as acl:
        retriever = JevRetriever.from_index(index, _selector(mode), acl, top_k=K)
        with runtime_context(ctx):
            assert (retriever.retrieve(QUERY) if sync else await retriever.aretrieve(QUERY)) != []
            own.stop()
            with pytest.raises(PermissionsUnavailableError) as raised:
                retriever.retrieve(QUERY) if sync else await retriever.aretrieve(QUERY)
    assert (raised.value.engine, raised.value.reason) == ("cerbos", "UNREACHABLE")


async def test_records_name_the_engine_and_the_restriction_kind_never_the_caller() -> None:
    from llama_jev import DecisionRecord
    from llama_jev.acl import CerbosAcl

    records: list[DecisionRecord] = []
    selector = CandidateSelector(
        ScriptedJudge(lambda *args: 0.9),
        ExecutionOptions(mode=Mode.ENFORCE, observer=lambda ctx, record: records.append(record)),
    )
    index = VectorStoreIndex([node.model_copy() for node in NODES], embed_model=HashEmbedding(dimensions=DIMENSIONS))
    callers = {
        "condition": RuntimeContext(user_id="user-7f3a", tenant_id="acme", roles={"support"}),
        "none": RuntimeContext(user_id="user-7f3a", tenant_id="acme", roles={"auditor"}),
        "everything": RuntimeContext(user_id="user-7f3a", roles={"platform-admin"}),
    }
    with running_pdp() as own, CerbosAcl(own.url, timeout=30.0) as acl:
        retriever = JevRetriever.from_index(index, selector, acl, top_k=K)
        for kind, ctx in callers.items():
            records.clear()
            with runtime_context(ctx):
                assert len(await retriever.aretrieve(QUERY)) == K
            (record,) = records
            assert (record.engine, record.restriction) == ("cerbos", kind)
            assert "user-7f3a" not in record.model_dump_json()
            assert "acme" not in record.model_dump_json()
