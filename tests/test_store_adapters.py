"""Every registered store adapter admits exactly what the in-process ACL allows, on the same hostile data.

One equivalence test over all of them: 160 nodes with hostile ACL metadata (operators and quotes
as values, look-alike public flags, tenants that are not strings, users and roles as strings and
lists of strings), 60 hostile callers, every ACL configuration. Each adapter restricts a query's
copy of a real retriever over its real store, as ``JevRetriever`` does; k is the whole store, so
the answer is the set of nodes the restriction admits, and it must equal ``MetadataAcl.allows``
node by node. A new adapter in ``llama_jev.stores`` fails this test until it has a store here.
Also: ``register()``, the public way for a store outside the package.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import QueryBundle, TextNode

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.stores import Pushdown, adapter_for, adapters, register
from llama_jev.testing.postgres import PostgresServer

from .store_data import ACLS, acl_metadata, callers, embedding
from .support import HashEmbedding

NODES = 160
CALLERS = callers(60, seed=5)
QUERY = "refund policy"


def hostile_nodes() -> list[TextNode]:
    """Data inside every adapter's exact domain (see tests/store_data.py), the same for every store."""
    rng = random.Random(23)
    return [
        TextNode(
            id_=f"00000000-0000-4000-8000-{i:012d}",  # a UUID: Qdrant takes no other string ids
            text=f"refund policy {i}",
            embedding=embedding(rng),
            metadata=acl_metadata(rng, list_flags=False),
        )
        for i in range(NODES)
    ]


NODE_SET = hostile_nodes()

Builder = Callable[[pytest.FixtureRequest], Iterator[BaseRetriever]]


def _memory(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    yield VectorStoreIndex(NODE_SET, embed_model=HashEmbedding(dimensions=8)).as_retriever(similarity_top_k=NODES)


def _index_over(store: Any) -> VectorStoreIndex:
    return VectorStoreIndex(
        NODE_SET,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=8),
    )


def _qdrant(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    try:
        yield _index_over(QdrantVectorStore(client=client, collection_name="equivalence")).as_retriever(
            similarity_top_k=NODES
        )
    finally:
        client.close()


def _postgres(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    pytest.importorskip("llama_index.vector_stores.postgres")
    from llama_jev.stores.postgres import AclPGVectorStore

    from .postgres_support import store_kwargs

    server: PostgresServer = request.getfixturevalue("postgres_server")
    store = AclPGVectorStore(**store_kwargs(server, f"equivalence_{random.randrange(10**9)}", embed_dim=8))
    try:
        yield _index_over(store).as_retriever(similarity_top_k=NODES)
    finally:
        assert store._engine is not None
        store._engine.dispose()


def _chroma(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    pytest.importorskip("llama_index.vector_stores.chroma")
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.EphemeralClient().create_collection(
        f"equivalence-{random.randrange(10**9)}", embedding_function=None
    )
    # Written natively: LlamaIndex's Chroma store refuses the list values.
    collection.add(
        ids=[node.node_id for node in NODE_SET],
        embeddings=[node.get_embedding() for node in NODE_SET],
        documents=[node.text for node in NODE_SET],
        metadatas=[node.metadata for node in NODE_SET],
    )
    store = ChromaVectorStore(chroma_collection=collection)
    yield VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=8)).as_retriever(
        similarity_top_k=NODES
    )


# Every adapter of the package, by name: a store to run it over.
BUILDERS: dict[str, Builder] = {"memory": _memory, "qdrant": _qdrant, "postgres": _postgres, "chroma": _chroma}
BUILT_IN = [adapter for adapter in adapters() if adapter.__module__.startswith("llama_jev.stores.")]


def test_every_registered_adapter_of_the_package_has_a_store_here() -> None:
    assert {adapter.name for adapter in BUILT_IN} == set(BUILDERS)


@pytest.fixture(
    params=[
        pytest.param(adapter, id=adapter.name, marks=[pytest.mark.slow] if adapter.name == "postgres" else [])
        for adapter in BUILT_IN
    ]
)
def restricted(request: pytest.FixtureRequest) -> Iterator[tuple[type[Pushdown], BaseRetriever]]:
    adapter: type[Pushdown] = request.param
    yield from ((adapter, retriever) for retriever in BUILDERS[adapter.name](request))


def test_every_adapter_admits_exactly_what_the_in_process_acl_allows(
    restricted: tuple[type[Pushdown], BaseRetriever],
) -> None:
    adapter, retriever = restricted
    assert adapter_for(retriever) is adapter
    leaks = misses = 0
    for acl in ACLS:
        pushdown = adapter(retriever, acl, set())
        for ctx in CALLERS:
            upstream = copy.copy(retriever)
            pushdown.restrict(upstream, ctx)
            got = {node.node.node_id for node in upstream.retrieve(QueryBundle(QUERY))}
            want = {node.node_id for node in NODE_SET if acl.allows(ctx, node.metadata)}
            leaks += len(got - want)
            misses += len(want - got)
    assert (leaks, misses) == (0, 0)
    readable = sum(1 for ctx in CALLERS for node in NODE_SET if ACLS[0].allows(ctx, node.metadata))
    assert readable > 20  # the data grants something under the full ACL


# --- register(): a store outside the package --------------------------------------------------


class _Anywhere(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[Any]:
        return []


def test_register_refuses_what_is_not_a_complete_adapter() -> None:
    class NoName(Pushdown):
        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return False

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            pass

    class Incomplete(Pushdown):
        name = "incomplete"

    with pytest.raises(TypeError, match="Pushdown subclass"):
        register(object)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not implement recognises, restrict"):
        register(Incomplete)
    with pytest.raises(TypeError, match="name"):
        register(NoName)
    assert NoName not in adapters()


def test_register_refuses_a_name_taken_and_is_idempotent() -> None:
    class Twin(Pushdown):
        name = "chroma"

        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return False

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            pass

    with pytest.raises(ValueError, match="'chroma' is already registered"):
        register(Twin)
    first = adapters()[0]
    assert register(first) is first
    assert adapters().count(first) == 1


def test_a_registered_adapter_is_asked_after_the_built_in_ones_and_pushes_down() -> None:
    class Anywhere(Pushdown):
        name = f"anywhere-{random.randrange(10**9)}"

        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return isinstance(retriever, _Anywhere)

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            upstream.restricted_for = ctx.tenant_id  # type: ignore[attr-defined]

    retriever = _Anywhere()
    assert adapter_for(retriever) is None
    assert register(Anywhere) is Anywhere
    assert adapters()[-1] is Anywhere
    assert adapter_for(retriever) is Anywhere
    acl = MetadataAcl(tenant_key="tenant")
    upstream = copy.copy(retriever)
    Anywhere(retriever, acl, set()).restrict(upstream, RuntimeContext(user_id="u1", tenant_id="acme"))
    assert upstream.restricted_for == "acme"  # type: ignore[attr-defined]
