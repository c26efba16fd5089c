# ruff: noqa: E402
"""What pushing the ACL into Chroma costs and buys: 10,000 nodes, 384-d, top-20.

    python benchmarks/bench_chroma.py [--nodes 10000] [--top-k 20] [--queries 50] [--client embedded|server|both]

Writes the nodes once per client (half through LlamaIndex's ``ChromaVectorStore``, scalar ACL
values; half natively, users and roles as lists), into Chroma's embedded client and into a
``chroma run`` server started from the wheel on 127.0.0.1 (llama_jev.testing.chroma), then
times, interleaved so machine noise hits every variant alike:

- ``unfiltered``: LlamaIndex's ``ChromaVectorStore`` retriever, no ACL (what an app without llama_jev runs);
- ``pushdown``: ``JevRetriever`` OFF over the same store: the ACL is the query's ``where``;
- ``post-filter``: ``JevRetriever`` OFF with ``prefilter=False``: the store answers the top 20 of
  the whole collection and the ACL removes what the caller may not read.

and, to show where the time goes, Chroma's own ``collection.query`` with no ``where``, with the
tenant alone, and with the ``where`` the adapter writes for the caller (no LlamaIndex around it).

For each: the median (p50) and 90th-percentile latency, and how many of the top-20 returned the
caller may read. The ACL is a ``MetadataAcl`` on tenant, users, roles and a public flag; the
caller's tenant holds 2% of the nodes.
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import contextlib
import logging
import random
import statistics
import time
import warnings
from collections.abc import Iterator
from typing import Any

import chromadb
import numpy as np
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.vector_stores.chroma import ChromaVectorStore

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.stores import chroma_where
from llama_jev.testing import HashEmbedding, chroma_server

TENANTS = 50
ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
CALLER = RuntimeContext(user_id="user-7", tenant_id="tenant-7", roles={"support"})


def metadata(rng: random.Random, i: int, *, lists: bool) -> dict[str, Any]:
    users = rng.sample([f"user-{u}" for u in range(20)], 2)
    roles = rng.choice([["support"], ["sales"], ["support", "admin"], ["admin"]])
    return {
        "tenant": f"tenant-{i % TENANTS}",
        # LlamaIndex's Chroma store refuses lists: what it writes holds one user and one role.
        "users": users if lists else users[0],
        "roles": roles if lists else roles[0],
        "public": rng.choice(["true", False, False, False]),
    }


def fill(client: Any, nodes: int, dimensions: int) -> Any:
    """A fresh collection with ``nodes`` nodes, half written by LlamaIndex, half natively."""
    collection = client.create_collection(f"bench-acl-{random.randrange(10**9)}", embedding_function=None)
    rng = random.Random(0)
    vectors = np.random.default_rng(0).standard_normal((nodes, dimensions)).astype(np.float32)
    store = ChromaVectorStore(chroma_collection=collection)
    for start in range(0, nodes, 1000):
        batch = range(start, min(start + 1000, nodes))
        if start < nodes // 2:
            store.add(
                [
                    TextNode(
                        id_=f"node-{i}", text=f"passage {i}", embedding=vectors[i].tolist(),
                        metadata=metadata(rng, i, lists=False),
                    )
                    for i in batch
                ]
            )  # fmt: skip
        else:
            collection.add(
                ids=[f"node-{i}" for i in batch],
                embeddings=[vectors[i].tolist() for i in batch],
                documents=[f"passage {i}" for i in batch],
                metadatas=[metadata(rng, i, lists=True) for i in batch],
            )
    return collection


@contextlib.contextmanager
def clients(which: str) -> Iterator[list[tuple[str, Any]]]:
    with contextlib.ExitStack() as stack:
        found: list[tuple[str, Any]] = []
        if which in ("embedded", "both"):
            found.append(("embedded", chromadb.EphemeralClient()))
        if which in ("server", "both"):
            server = stack.enter_context(chroma_server())
            found.append(
                (
                    f"server ({server.started_in:.1f} s to start)",
                    chromadb.HttpClient(host=server.host, port=server.port),
                )
            )
        yield found


class RawQuery:
    """Chroma's ``collection.query`` alone, with a fixed ``where`` (or none)."""

    def __init__(self, collection: Any, where: dict[str, Any] | None, top_k: int) -> None:
        self.collection, self.where, self.top_k = collection, where, top_k

    def run(self, bundle: QueryBundle) -> list[dict[str, Any]]:
        extra = {"where": self.where} if self.where else {}
        found = self.collection.query(query_embeddings=[bundle.embedding], n_results=self.top_k, **extra)
        return list(found["metadatas"][0])


def retrieve(retriever: BaseRetriever | RawQuery, bundle: QueryBundle) -> list[dict[str, Any]]:
    """The metadata of what came back."""
    if isinstance(retriever, RawQuery):
        return retriever.run(bundle)
    nodes: list[NodeWithScore] = (
        retriever.retrieve(bundle, ctx=CALLER) if isinstance(retriever, JevRetriever) else retriever.retrieve(bundle)
    )
    return [node.node.metadata for node in nodes]


def measure(collection: Any, args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    embed = HashEmbedding(dimensions=args.dimensions)  # unused: every query brings its own vector
    index = VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=collection), embed_model=embed)
    off = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
    variants: dict[str, BaseRetriever | RawQuery] = {
        "unfiltered": index.as_retriever(similarity_top_k=args.top_k),
        "pushdown": JevRetriever.from_index(index, off, ACL, top_k=args.top_k),
        "post-filter": JevRetriever.from_index(index, off, ACL, top_k=args.top_k, prefilter=False),
        "raw query, no where": RawQuery(collection, None, args.top_k),
        "raw query, tenant only": RawQuery(collection, {"tenant": {"$eq": CALLER.tenant_id}}, args.top_k),
        "raw query, the ACL's where": RawQuery(collection, chroma_where(ACL, CALLER), args.top_k),
    }
    pushdown = variants["pushdown"]
    assert isinstance(pushdown, JevRetriever)
    assert pushdown.prefilter
    queries = np.random.default_rng(1).standard_normal((args.queries, args.dimensions)).astype(np.float32)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    readable: dict[str, list[int]] = {name: [] for name in variants}
    for round_ in range(args.queries + 3):
        bundle = QueryBundle("refund conditions", embedding=queries[round_ % args.queries].tolist())
        for name, retriever in variants.items():
            begun = time.perf_counter()
            nodes = retrieve(retriever, bundle)
            elapsed = time.perf_counter() - begun
            if round_ < 3:
                continue  # warm-up: connections, caches
            seconds[name].append(elapsed)
            readable[name].append(sum(ACL.allows(CALLER, metadata) for metadata in nodes))
    return {
        name: (
            statistics.median(times) * 1000,
            sorted(times)[int(0.9 * (len(times) - 1))] * 1000,
            statistics.mean(readable[name]),
        )
        for name, times in seconds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--client", choices=["embedded", "server", "both"], default="both")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("llama_jev").setLevel(logging.ERROR)

    print(
        f"chromadb {chromadb.__version__}; {args.nodes} nodes, {args.dimensions}-d, top-{args.top_k}, "
        f"{args.queries} queries; the caller's tenant holds {100 / TENANTS:.0f}% of the nodes"
    )
    print(f"| client | variant | p50 ms | p90 ms | readable of top-{args.top_k} |")
    print("|---|---|---|---|---|")
    with clients(args.client) as found:
        for label, client in found:
            started = time.perf_counter()
            collection = fill(client, args.nodes, args.dimensions)
            filled = time.perf_counter() - started
            results = measure(collection, args)
            for name, (p50, p90, mean_readable) in results.items():
                print(f"| {label} | {name} | {p50:.1f} | {p90:.1f} | {mean_readable:.1f} |")
            ratio = results["pushdown"][0] / results["unfiltered"][0]
            print(f"| {label} | pushdown / unfiltered p50 | {ratio:.2f}x | | (written in {filled:.0f} s) |")


if __name__ == "__main__":
    main()
