"""Stores to re-tag in tests: each kind built the way users build it, one fresh store per call."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

from llama_jev import MetadataAcl

from .support import HashEmbedding

ACL = MetadataAcl(tenant_key="tenant", users_key="users", public_key="public")
_SERVERS = ("postgres-json", "postgres-jsonb", "chroma", "milvus-server")  # a server the session starts: slow
KINDS = [
    pytest.param(kind, marks=[pytest.mark.slow] if kind in _SERVERS else [])
    for kind in ("memory", "qdrant", "postgres-json", "postgres-jsonb", "chroma", "milvus-lite", "milvus-server")
]
QUERY = "refund policy"


def chunks(document: str, count: int, *, start: int = 0) -> list[TextNode]:
    """``count`` chunks of ``document``, with scalar ACL metadata every store takes (no grant lists yet)."""
    return [
        TextNode(
            id_=f"00000000-0000-4000-8000-{start + i:012d}",  # a UUID: Qdrant takes no other string ids
            text=f"refund policy part {start + i}",
            metadata={"tenant": "acme", "public": False, "topic": f"t{start + i}"},
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=document)},
        )
        for i in range(count)
    ]


@contextmanager
def built(kind: str, nodes: list[TextNode], request: pytest.FixtureRequest) -> Iterator[tuple[Any, VectorStoreIndex]]:
    """(what to pass to retag, the index to retrieve from) for ``kind``, holding ``nodes``; closed after."""
    embed = HashEmbedding(dimensions=8)
    if kind == "memory":
        index = VectorStoreIndex(nodes, embed_model=embed)
        yield index, index
        return
    closers: list[Callable[[], Any]] = []
    store: Any
    if kind == "qdrant":
        from llama_index.vector_stores.qdrant import QdrantVectorStore
        from qdrant_client import QdrantClient

        client = QdrantClient(location=":memory:")
        closers.append(client.close)
        store = QdrantVectorStore(client=client, collection_name="retag")
    elif kind.startswith("postgres"):
        pytest.importorskip("llama_index.vector_stores.postgres")
        from llama_jev.stores import AclPGVectorStore

        from .postgres_support import store_kwargs

        server = request.getfixturevalue("postgres_server")
        store = AclPGVectorStore(
            **store_kwargs(server, f"retag_{random.randrange(10**9)}", embed_dim=8, use_jsonb=kind.endswith("jsonb"))
        )
        closers.append(lambda: store._engine.dispose())
    elif kind == "chroma":
        pytest.importorskip("llama_index.vector_stores.chroma")
        import chromadb
        from llama_index.vector_stores.chroma import ChromaVectorStore

        collection = chromadb.EphemeralClient().create_collection(
            f"retag-{random.randrange(10**9)}", embedding_function=None
        )
        store = ChromaVectorStore(chroma_collection=collection)
    elif kind.startswith("milvus"):
        from .milvus_support import milvus_store, uri_for

        store = milvus_store(uri_for(kind.removeprefix("milvus-"), request), dim=8)
        closers.append(lambda: store.client.close())
    else:
        raise AssertionError(kind)
    try:
        index = VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed
        )
        yield store, index
    finally:
        for close in closers:
            close()
