"""Milvus stores for benchmarks/bench_filtered.py: Milvus Lite (in-process) and the 2.3.5 standalone server.

Kept apart from bench_filtered.py so that file stays the measurement; each builder yields a
``VectorStoreIndex`` over LlamaIndex's ``MilvusVectorStore`` with the rows written through the
store's own ``add`` (the metadata in the dynamic field, as users' collections hold it), or, for
``milvus-lite-typed``, with the ACL keys declared schema fields (docs/stores-and-pushdown.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.indices.base import BaseIndex

from llama_jev.testing import HashEmbedding
from llama_jev.testing.milvus import typed_acl_collection

# HNSW on the server (ef is raised to the window when widening asks for more; the adapter does it);
# Lite 2.5 has FLAT and IVF_FLAT only: FLAT, exact.
SERVER_INDEX = {"index_type": "HNSW", "M": 16, "efConstruction": 128}
SERVER_SEARCH = {"ef": 128}


def _store(uri: str, dimensions: int, *, server: bool, overwrite: bool = True) -> Any:
    from llama_index.vector_stores.milvus import MilvusVectorStore

    return MilvusVectorStore(
        uri=uri,
        dim=dimensions,
        collection_name="filtered",
        overwrite=overwrite,
        similarity_metric="IP",  # the vectors are unit length: inner product is cosine
        index_config=SERVER_INDEX if server else {"index_type": "FLAT"},
        search_config=SERVER_SEARCH if server else {},
        batch_size=2000,
        use_async_client=server,
    )


def settled(client: Any, collection: str, field: str, timeout: float = 600.0) -> None:
    """Flush, wait for the index over every row, then reload: what a long-lived collection is.

    Measured on the 2.3.5 server: right after a flush, a filtered count(*) saw 0 of 100,000 rows
    until the sealed segments were indexed and loaded (the "2.3 of 10 until reloaded" of issue 41).
    """
    client.flush(collection)
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        described = client.describe_index(collection, index_name=field)
        if int(described.get("pending_index_rows", 0)) == 0 and int(described.get("indexed_rows", 0)) >= int(
            described.get("total_rows", 0)
        ):
            break
        time.sleep(1)
    client.release_collection(collection)
    client.load_collection(collection)


def _filled(store: Any, data: Any, embed: HashEmbedding, *, lists: bool = False) -> VectorStoreIndex:
    nodes = data.nodes()
    if lists:  # an ARRAY field holds lists only: a role given as one string becomes a list of one
        for node in nodes:
            roles = node.metadata["roles"]
            node.metadata["roles"] = [roles] if isinstance(roles, str) else roles
    for start in range(0, len(nodes), 10_000):
        store.add(nodes[start : start + 10_000])
    settled(store.client, store.collection_name, store.embedding_field)
    return VectorStoreIndex.from_vector_store(store, embed_model=embed)


def milvus_lite_index(
    data: Any, args: argparse.Namespace | None, *, dimensions: int, embed: HashEmbedding
) -> Iterator[BaseIndex[Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-milvus-lite-") as folder:
        store = _store(f"{folder}/filtered.db", dimensions, server=False)
        try:
            yield _filled(store, data, embed)
        finally:
            store.client.close()


def milvus_lite_typed_index(
    data: Any, args: argparse.Namespace | None, *, dimensions: int, embed: HashEmbedding
) -> Iterator[BaseIndex[Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-milvus-lite-") as folder:
        typed_acl_collection(f"{folder}/filtered.db", "filtered", dim=dimensions, metric="IP")
        store = _store(f"{folder}/filtered.db", dimensions, server=False, overwrite=False)
        try:
            yield _filled(store, data, embed, lists=True)
        finally:
            store.client.close()


def milvus_server_index(
    data: Any, args: argparse.Namespace | None, *, dimensions: int, embed: HashEmbedding
) -> Iterator[BaseIndex[Any]]:
    from llama_jev.testing import milvus_server

    with milvus_server() as server:
        print(f"milvus: the 2.3.5 server started in {server.started_in:.1f} s", flush=True)
        store = _store(server.uri, dimensions, server=True)
        try:
            yield _filled(store, data, embed)
        finally:
            store.client.close()
