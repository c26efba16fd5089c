# ruff: noqa: E402
"""k permitted results at any selectivity: every pushdown store, as a user gets them.

    python benchmarks/bench_filtered.py [--n 10000] [--stores memory,qdrant,postgres,chroma]
                                        [--queries 20] [--database-url URL]

Clustered 384-d vectors (64 centres, a fixed seed); the caller's tenant holds 50 %, 5 %, 0.5 % or
0.05 % of the nodes (one caller per share, every node of that tenant grants the caller's role,
spread over the clusters at random). For each store (LlamaIndex's in-memory store, Qdrant local
mode, ``AclPGVectorStore`` over PostgreSQL + pgvector with an HNSW index, Chroma's embedded client)
x share, ``--queries`` queries near the centres go through ``JevRetriever.from_index(index,
selector, MetadataAcl(...), top_k=10)`` in mode OFF (pushdown on, what users get), and the table
says:

- ``returned``: nodes returned per query, mean and worst, of ``min(10, readable)``;
- ``full``: the queries that got all ``min(10, readable)``;
- ``recall@10``: against the exact filtered top 10 (numpy, cosine, over the readable nodes);
- ``leaks``: nodes returned that the ACL denies (must be 0);
- ``median ms``: the median latency of one retrieval.

PostgreSQL is an embedded PostgreSQL 18 + pgvector started for the run, or ``--database-url`` /
``DATABASE_URL`` (its table ``filtered_<n>`` is written once and reused). ``--n 100000`` is the
docs' run: minutes of CPU (the HNSW index, filling Qdrant local and Chroma).
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import contextlib
import logging
import statistics
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import _milvus_bench  # benchmarks/ is on the path when this file is run
import numpy as np
import sqlalchemy
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.indices.base import BaseIndex
from llama_index.core.schema import QueryBundle, TextNode
from llama_index.core.vector_stores.utils import node_to_metadata_dict

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.testing import HashEmbedding, embedded_postgres

DIMENSIONS = 384
CENTRES = 64
K = 10
SHARES = (0.5, 0.05, 0.005, 0.0005)
ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
STORES = ("memory", "qdrant", "postgres", "chroma", "milvus-lite", "milvus")


def tenant_of(share: float) -> str:
    return f"share-{share * 100:g}"


def caller(share: float) -> RuntimeContext:
    return RuntimeContext(user_id="reader", tenant_id=tenant_of(share), roles={"staff"})


@dataclass
class Data:
    """The nodes' vectors (unit length), metadata and ids; the queries; the readable rows per share."""

    vectors: np.ndarray
    metadata: list[dict[str, Any]]
    ids: list[str]
    queries: np.ndarray
    readable: dict[float, np.ndarray]

    def nodes(self) -> list[TextNode]:
        return [
            TextNode(
                id_=self.ids[i], text=f"passage {i}", metadata=self.metadata[i], embedding=self.vectors[i].tolist()
            )
            for i in range(len(self.ids))
        ]

    def truth(self, share: float, q: int) -> list[str]:
        """The exact filtered top k: cosine over the readable rows only."""
        rows = self.readable[share]
        scores = self.vectors[rows] @ self.queries[q]
        best = rows[np.argsort(-scores, kind="stable")[:K]]
        return [self.ids[i] for i in best]


def make_data(n: int, queries: int, seed: int = 0) -> Data:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CENTRES, DIMENSIONS)).astype(np.float32)
    vectors = centres[rng.integers(0, CENTRES, n)] + 0.6 * rng.standard_normal((n, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    order = rng.permutation(n)
    tenants = np.array([f"other-{i % 97}" for i in range(n)], dtype=object)
    readable: dict[float, np.ndarray] = {}
    start = 0
    for share in SHARES:
        count = max(1, round(share * n))
        rows = np.sort(order[start : start + count])
        tenants[rows] = tenant_of(share)
        readable[share] = rows
        start += count
    roles = (["staff"], "staff", ["staff", "admin"], ["sales", "staff"])
    metadata = [
        {"tenant": str(tenants[i]), "users": [f"user-{i % 31}"], "roles": roles[i % 4], "public": False}
        for i in range(n)
    ]
    asked = centres[rng.integers(0, CENTRES, queries)] + 0.6 * rng.standard_normal((queries, DIMENSIONS))
    asked = (asked / np.linalg.norm(asked, axis=1, keepdims=True)).astype(np.float32)
    # UUIDs: Qdrant takes no other string ids.
    return Data(vectors, metadata, [str(uuid.UUID(int=i + 1)) for i in range(n)], asked, readable)


# --- the stores -------------------------------------------------------------------------------------------

EMBED = HashEmbedding(dimensions=DIMENSIONS)  # unused: every node and query brings its vector


def memory_index(data: Data, _: argparse.Namespace) -> Iterator[BaseIndex[Any]]:
    yield VectorStoreIndex(data.nodes(), embed_model=EMBED)


def qdrant_index(data: Data, _: argparse.Namespace) -> Iterator[BaseIndex[Any]]:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    try:
        store = QdrantVectorStore(client=client, collection_name="filtered", batch_size=1000)
        yield VectorStoreIndex(
            data.nodes(), storage_context=StorageContext.from_defaults(vector_store=store), embed_model=EMBED
        )
    finally:
        client.close()


def chroma_index(data: Data, _: argparse.Namespace) -> Iterator[BaseIndex[Any]]:
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.EphemeralClient().create_collection(
        f"filtered-{len(data.ids)}", embedding_function=None, get_or_create=True
    )
    if collection.count() != len(data.ids):
        for start in range(0, len(data.ids), 5000):  # Chroma caps one add's batch
            end = start + 5000
            collection.upsert(
                ids=data.ids[start:end],
                embeddings=data.vectors[start:end],
                documents=[f"passage {i}" for i in range(start, min(end, len(data.ids)))],
                metadatas=[{**m, "users": m["users"][0], "roles": "staff"} for m in data.metadata[start:end]],
            )
    yield VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=collection), embed_model=EMBED)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[tuple[str, str]]:
    """(sync URL, async URL) of the given server, or of an embedded one for the run."""
    if url:
        parsed = sqlalchemy.engine.make_url(url)
        yield (
            parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False),
            parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False),
        )
        return
    with embedded_postgres() as server:
        yield server.url, server.async_url


def fill_postgres(url: str, async_url: str, data: Data) -> str:
    """Write the rows as ``PGVectorStore.add`` writes them, then an HNSW index; skipped when already there."""
    from llama_index.vector_stores.postgres import PGVectorStore

    table_name = f"filtered_{len(data.ids)}"
    store = PGVectorStore(
        connection_string=url, async_connection_string=async_url, table_name=table_name, embed_dim=DIMENSIONS
    )
    store._initialize()
    table = store._table_class.__table__
    assert store._engine is not None
    with store._engine.begin() as connection:
        count = connection.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(table)).scalar_one()
        last = connection.execute(sqlalchemy.select(table.c.id).where(table.c.node_id == data.ids[-1])).first()
        if count != len(data.ids) or last is None:
            connection.execute(table.delete())
            for start in range(0, len(data.ids), 1000):
                rows = [
                    {
                        "node_id": data.ids[i],
                        "text": f"passage {i}",
                        "metadata_": node_to_metadata_dict(
                            TextNode(id_=data.ids[i], text=f"passage {i}", metadata=data.metadata[i]),
                            remove_text=True,
                            flat_metadata=False,
                        ),
                        "embedding": data.vectors[i].tolist(),
                    }
                    for i in range(start, min(start + 1000, len(data.ids)))
                ]
                connection.execute(table.insert(), rows)
            # pgvector's defaults (m = 16, ef_construction = 64); the graph built in memory.
            connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '1GB'")
            connection.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS data_{table_name}_hnsw ON data_{table_name} "
                "USING hnsw (embedding vector_cosine_ops)"
            )
            connection.exec_driver_sql(f"ANALYZE data_{table_name}")
    store._engine.dispose()
    return table_name


def postgres_index(data: Data, args: argparse.Namespace) -> Iterator[BaseIndex[Any]]:
    from llama_jev.stores import AclPGVectorStore

    with database(args.database_url) as (url, async_url):
        table_name = fill_postgres(url, async_url, data)
        kwargs: dict[str, Any] = {"connection_string": url, "async_connection_string": async_url,
                                  "table_name": table_name, "embed_dim": DIMENSIONS}  # fmt: skip
        if hasattr(AclPGVectorStore, "create_acl_indexes"):  # (0.2's store, for a comparison, has none)
            kwargs["acl_indexes"] = ACL  # the tenant's B-tree, as docs/stores-and-pushdown.md advises
        store = AclPGVectorStore(**kwargs)
        try:
            yield VectorStoreIndex.from_vector_store(store, embed_model=EMBED)
        finally:
            if store._engine is not None:
                store._engine.dispose()


BUILDERS: dict[str, Callable[[Data, argparse.Namespace], Iterator[BaseIndex[Any]]]] = {
    "memory": memory_index,
    "qdrant": qdrant_index,
    "postgres": postgres_index,
    "chroma": chroma_index,
    # Milvus Lite (FLAT) and the 2.3.5 server (HNSW): benchmarks/_milvus_bench.py.
    "milvus-lite": lambda data, args: _milvus_bench.milvus_lite_index(data, args, dimensions=DIMENSIONS, embed=EMBED),
    "milvus": lambda data, args: _milvus_bench.milvus_server_index(data, args, dimensions=DIMENSIONS, embed=EMBED),
}


# --- the measurement --------------------------------------------------------------------------------------


@dataclass
class Point:
    store: str
    share: float
    readable: int
    wanted: int
    returned: list[int]
    recalls: list[float]
    leaks: int
    seconds: list[float]


def measure(store: str, index: BaseIndex[Any], data: Data) -> list[Point]:
    selector = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
    retriever = JevRetriever.from_index(index, selector, ACL, top_k=K)
    assert retriever.prefilter, f"{store}: the ACL is not pushed down"
    allowed = {data.ids[i] for share in SHARES for i in data.readable[share]}
    points = []
    for share in SHARES:
        ctx = caller(share)
        readable = {data.ids[i] for i in data.readable[share]}
        point = Point(store, share, len(readable), min(K, len(readable)), [], [], 0, [])
        retriever.retrieve(QueryBundle("warm-up", embedding=data.queries[0].tolist()), ctx=ctx)
        for q in range(len(data.queries)):
            bundle = QueryBundle("a question", embedding=data.queries[q].tolist())
            begun = time.perf_counter()
            nodes = retriever.retrieve(bundle, ctx=ctx)
            point.seconds.append(time.perf_counter() - begun)
            got = [n.node.node_id for n in nodes]
            point.returned.append(len(got))
            point.leaks += sum(node_id not in readable for node_id in got)
            truth = data.truth(share, q)
            point.recalls.append(len(set(got) & set(truth)) / len(truth))
        assert allowed  # (every share's rows are distinct)
        points.append(point)
    return points


def print_table(points: list[Point], n: int, queries: int) -> None:
    print(f"\n{n:,} nodes, {DIMENSIONS}-d clustered, k = {K}, {queries} queries per point, mode OFF (pushdown)\n")
    print("| store | readable | returned (mean / worst) of wanted | full-k queries | recall@10 | leaks | median ms |")
    print("|---|---|---|---|---|---|---|")
    for p in points:
        print(
            f"| {p.store} | {p.share * 100:g} % ({p.readable:,}) | "
            f"{statistics.mean(p.returned):.1f} / {min(p.returned)} of {p.wanted} | "
            f"{sum(r >= p.wanted for r in p.returned)} / {len(p.returned)} | {statistics.mean(p.recalls):.2f} | "
            f"{p.leaks} | {statistics.median(p.seconds) * 1000:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="nodes (10,000: the quick run; 100,000: the docs')")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    stores = [name.strip() for name in args.stores.split(",") if name.strip()]
    unknown = sorted(set(stores) - set(STORES))
    if unknown:
        parser.error(f"unknown store(s) {', '.join(unknown)}: choose among {', '.join(STORES)}")
    warnings.filterwarnings("ignore")
    logging.getLogger("llama_jev").setLevel(logging.ERROR)

    data = make_data(args.n, args.queries)
    points: list[Point] = []
    for name in stores:
        started = time.perf_counter()
        builder = contextlib.contextmanager(BUILDERS[name])
        with builder(data, args) as index:
            print(f"{name}: {args.n:,} nodes ready in {time.perf_counter() - started:.1f} s", flush=True)
            points.extend(measure(name, index, data))
    print_table(points, args.n, args.queries)


if __name__ == "__main__":
    main()
