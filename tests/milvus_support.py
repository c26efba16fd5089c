"""The two Milvus engines the tests run: Milvus Lite (in-process, a .db file) and the ``milvus`` 2.3.5 server.

Outside CI a missing engine skips its tests; with ``CI=1`` it fails them (``.ci/run`` installs both
from the test extra).
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import BaseNode

from .support import HashEmbedding

ENGINES = ["lite", pytest.param("server", marks=pytest.mark.slow)]  # the server: a subprocess


def unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs both Milvus engines (the test extra installs milvus-lite<3 and milvus==2.3.5): {why}")
    pytest.skip(why)


def require_milvus(engine: str) -> None:
    """Skip (outside CI) or fail (``CI=1``) when the client or ``engine`` cannot be had."""
    if importlib.util.find_spec("llama_index.vector_stores.milvus") is None:
        unavailable("llama-index-vector-stores-milvus (extra milvus) is not installed")
    package = "milvus_lite" if engine == "lite" else "milvus"
    if importlib.util.find_spec(package) is None:
        unavailable(f"the {package} package (test extra) is not installed")


def uri_for(engine: str, request: pytest.FixtureRequest) -> str:
    """Where ``engine`` is: a fresh .db file for Lite, the session's server for the server."""
    require_milvus(engine)
    if engine == "lite":
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")  # any fixture scope
        return str(factory.mktemp("milvus-lite") / f"milvus-{random.randrange(10**9)}.db")
    server = request.getfixturevalue("milvus_server")
    return str(server.uri)


def milvus_store(uri: str, *, dim: int, name: str | None = None, **kwargs: Any) -> Any:
    """A ``MilvusVectorStore`` as a user builds it, with a FLAT index (exact ranking: the tests compare sets)."""
    from llama_index.vector_stores.milvus import MilvusVectorStore

    kwargs.setdefault("index_config", {"index_type": "FLAT"})
    kwargs.setdefault("similarity_metric", "L2")
    return MilvusVectorStore(
        uri=uri,
        dim=dim,
        collection_name=name or f"c{random.randrange(10**9)}",
        # Lite's async client cannot share the .db file; overwrite=False: a collection created beforehand
        **{"use_async_client": uri.startswith("http"), "overwrite": True, **kwargs},
    )


def milvus_index(uri: str, nodes: Sequence[BaseNode], *, dim: int, **kwargs: Any) -> VectorStoreIndex:
    """``nodes`` written through LlamaIndex's own store (lists and JSON values in the dynamic field)."""
    store = milvus_store(uri, dim=dim, **kwargs)
    return VectorStoreIndex(
        [node.model_copy() for node in nodes],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=dim),
    )


def closing(index: VectorStoreIndex) -> Iterator[VectorStoreIndex]:
    try:
        yield index
    finally:
        store = index.vector_store
        store.client.drop_collection(store.collection_name)  # type: ignore[attr-defined]
        store.client.close()  # type: ignore[attr-defined]


def typed_acl_collection(uri: str, *, dim: int) -> str:
    """A new collection whose ACL keys are schema fields (``llama_jev.testing.milvus``'s); its name."""
    from llama_jev.testing.milvus import typed_acl_collection as create

    name = f"typed{random.randrange(10**9)}"
    create(uri, name, dim=dim)
    return name
