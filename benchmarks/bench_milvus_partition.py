# ruff: noqa: E402
"""Partition key on the tenant: a tenant's query searches one partition; against the same collection without it.

    python benchmarks/bench_milvus_partition.py [--n 100000] [--tenants 100] [--queries 30]

The ``milvus`` 2.3.5 standalone server (``llama_jev.testing.milvus_server``); two collections of the
same rows (clustered 128-d unit vectors, ``--tenants`` tenants of equal size, HNSW), laid out as
LlamaIndex's ``MilvusVectorStore`` lays them out plus a ``tenant`` VARCHAR field: in one it is the
partition key (``is_partition_key=True``, 64 partitions), in the other a plain field. Each is read
through ``JevRetriever.from_index(..., MetadataAcl(tenant_key="tenant"), top_k=10)`` in mode OFF
(pushdown: ``tenant == "..."`` on that field), ``--queries`` queries, each by a caller of another
tenant. The table: median and p90 latency, returned per query, recall@10 against the exact
filtered top 10, leaks.
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import logging
import statistics
import time
import warnings
from typing import Any

import _milvus_bench  # benchmarks/ is on the path when this file is run
import numpy as np
from llama_index.core import VectorStoreIndex
from llama_index.core.schema import QueryBundle, TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.testing import HashEmbedding, milvus_server

DIMENSIONS = 128
K = 10
ACL = MetadataAcl(tenant_key="tenant")


def create(client: Any, name: str, *, partition_key: bool) -> None:
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False, enable_dynamic_field=True)
    schema.add_field("id", DataType.VARCHAR, max_length=65_535, is_primary=True)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=65_535)
    schema.add_field("text", DataType.VARCHAR, max_length=65_535)
    schema.add_field("tenant", DataType.VARCHAR, max_length=256, is_partition_key=partition_key)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=DIMENSIONS)
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="HNSW", metric_type="IP", params={"M": 16, "efConstruction": 128})
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Session")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--queries", type=int, default=30)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("llama_jev").setLevel(logging.ERROR)
    from llama_index.vector_stores.milvus import MilvusVectorStore

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((64, DIMENSIONS)).astype(np.float32)
    vectors = centres[rng.integers(0, 64, args.n)] + 0.6 * rng.standard_normal((args.n, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    tenants = np.array([f"tenant-{i % args.tenants}" for i in range(args.n)])
    queries = centres[rng.integers(0, 64, args.queries)] + 0.6 * rng.standard_normal((args.queries, DIMENSIONS))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    ids = [f"n{i}" for i in range(args.n)]
    nodes = [
        TextNode(id_=ids[i], text=f"passage {i}", metadata={"tenant": str(tenants[i])}, embedding=vectors[i].tolist())
        for i in range(args.n)
    ]
    selector = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
    results = []
    with milvus_server() as server:
        for name, partition_key in (("with_partition_key", True), ("without", False)):
            store = MilvusVectorStore(uri=server.uri, collection_name=name, dim=DIMENSIONS, similarity_metric="IP",
                                      search_config={"ef": 64}, overwrite=True)  # fmt: skip
            store.client.drop_collection(name)
            create(store.client, name, partition_key=partition_key)
            store = MilvusVectorStore(uri=server.uri, collection_name=name, dim=DIMENSIONS, similarity_metric="IP",
                                      search_config={"ef": 64}, batch_size=5000)  # fmt: skip
            begun = time.perf_counter()
            for start in range(0, args.n, 10_000):  # as LlamaIndex writes nodes: tenant lands in its field
                store.add(nodes[start : start + 10_000])
            _milvus_bench.settled(store.client, name, "embedding")
            print(f"{name}: {args.n:,} rows written and flushed in {time.perf_counter() - begun:.1f} s", flush=True)
            store = MilvusVectorStore(uri=server.uri, collection_name=name, dim=DIMENSIONS, similarity_metric="IP",
                                      search_config={"ef": 64})  # fmt: skip
            index = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=DIMENSIONS))
            retriever = JevRetriever.from_index(index, selector, ACL, top_k=K)
            assert retriever.prefilter
            seconds, returned, recalls, leaks = [], [], [], 0
            for q in range(args.queries):
                tenant = f"tenant-{(q * 7) % args.tenants}"
                ctx = RuntimeContext(user_id="reader", tenant_id=tenant)
                bundle = QueryBundle("a question", embedding=queries[q].tolist())
                if q == 0:
                    retriever.retrieve(bundle, ctx=ctx)  # warm-up
                started = time.perf_counter()
                got = [hit.node.node_id for hit in retriever.retrieve(bundle, ctx=ctx)]
                seconds.append(time.perf_counter() - started)
                rows_of = np.flatnonzero(tenants == tenant)
                truth = {ids[i] for i in rows_of[np.argsort(-(vectors[rows_of] @ queries[q]))[:K]]}
                returned.append(len(got))
                recalls.append(len(truth & set(got)) / K)
                leaks += sum(not node_id.startswith("n") or tenants[int(node_id[1:])] != tenant for node_id in got)
            results.append((name, seconds, returned, recalls, leaks))
            store.client.close()
    print(f"\n{args.n:,} rows, {args.tenants} tenants ({args.n // args.tenants:,} rows each), {DIMENSIONS}-d, k = {K}, "
          f"{args.queries} queries, the milvus 2.3.5 server\n")  # fmt: skip
    print("| collection | median ms | p90 ms | returned (mean / worst) | recall@10 | leaks |")
    print("|---|---|---|---|---|---|")
    for name, seconds, returned, recalls, leaks in results:
        ordered = sorted(seconds)
        print(
            f"| {name.replace('_', ' ')} | {statistics.median(seconds) * 1000:.1f} | "
            f"{ordered[int(0.9 * (len(ordered) - 1))] * 1000:.1f} | "
            f"{statistics.mean(returned):.1f} / {min(returned)} | "
            f"{statistics.mean(recalls):.2f} | {leaks} |"
        )


if __name__ == "__main__":
    main()
