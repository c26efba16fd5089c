# ruff: noqa: E402
"""k permitted results at any selectivity: every pushdown store, as a user gets them.

    python benchmarks/bench_filtered.py [--n 10000] [--dim 384] [--stores memory,qdrant,postgres,chroma]
                                        [--queries 30] [--database-url URL] [--keep [DIR]]
                                        [--baseline REF] [--jsonb]

Clustered vectors (``--dim``, 384 by default; ``max(64, n / 1000)`` Gaussian centres, a fixed
seed). Callers:

- a tenant caller per share, 50 / 5 / 3 / 1 / 0.5 / 0.3 / 0.1 / 0.05 % of the nodes (every node of
  that tenant grants the caller's role, spread over the clusters at random), under a
  ``MetadataAcl`` on tenant, users, roles and a public flag;
- a caller of the 50 % tenant with no role, who reads only the nodes whose ``users`` list names
  it (1 in 31 of them: 1.6 % of the nodes);
- a grant-list caller per share, 1 / 0.3 / 0.1 %: its user id is in the ``users`` list of that
  share of the nodes, spread over all tenants, under a ``MetadataAcl`` without a tenant key.

For each store (LlamaIndex's in-memory store, Qdrant local mode, ``AclPGVectorStore`` over
PostgreSQL + pgvector with an HNSW index, Chroma's embedded client; Chroma stores one user, so it
has no grant-list callers; ``MilvusVectorStore`` over Milvus Lite 2.5 with the metadata in the
dynamic field (``milvus-lite``) or the ACL keys declared schema fields (``milvus-lite-typed``),
and over the 2.3.5 server (``milvus``)) x caller, ``--queries`` queries near the centres go through
``JevRetriever.from_index(index, selector, acl, top_k=10)`` in mode OFF (pushdown on, what users
get), and the table says:

- ``path``: the path ``AclPGVectorStore``'s plan took (``exact`` / ``hnsw``, per store round);
- ``returned``: nodes returned per query, mean and worst, of ``min(10, readable)``; ``full``:
  the queries that got all of them;
- ``recall@10``: mean and worst query, against the exact filtered top 10 (numpy, cosine, over the
  readable nodes);
- ``leaks``: nodes returned that the ACL denies (must be 0);
- ``p50 ms``: the median latency of one retrieval; with ``--baseline``, the new store's over main's;
  ``p50 / unfiltered`` (the stores in this process): over the same query through LlamaIndex's
  plain retriever, no ACL and no filter, timed right after it.

PostgreSQL is an embedded PostgreSQL 18 + pgvector started for the run (``--keep [DIR]`` keeps its
data folder, so a second run reuses the table and its HNSW index), or ``--database-url`` /
``DATABASE_URL``: its table ``data_filtered_<n>_<dim>`` is bulk-loaded by ``COPY`` once and
reused. Each PostgreSQL store runs in a worker process: ``--baseline REF`` adds the store of a
``git worktree`` of REF (main's, ``dff3a63``) beside this checkout's, on the same table, the
queries interleaved. ``--jsonb`` measures a ``use_jsonb=True`` table too. The docs' runs::

    python benchmarks/bench_filtered.py --n 100000 --dim 128 --stores postgres --keep --baseline dff3a63 --jsonb
    python benchmarks/bench_filtered.py --n 1000000 --dim 128 --stores postgres --keep --baseline dff3a63 --jsonb

(10⁶ rows: about 2 GB of table and index; the first run loads and indexes for several minutes.)
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import collections
import contextlib
import io
import logging
import statistics
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _milvus_bench  # benchmarks/ is on the path when this file is run
import numpy as np
from _filtered_pg import KEPT, REPO, Worker, build_table, checkout, database
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.indices.base import BaseIndex
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
from llama_jev.testing import HashEmbedding

K = 10
SEED = 0
TENANT_SHARES = (0.5, 0.05, 0.03, 0.01, 0.005, 0.003, 0.001, 0.0005)
GRANT_SHARES = (0.01, 0.003, 0.001)
ACLS = {
    "tenant": MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public"),
    "grant": MetadataAcl(users_key="users", roles_key="roles", public_key="public"),
}
STORES = ("memory", "qdrant", "postgres", "chroma", "milvus-lite", "milvus-lite-typed", "milvus")


def tenant_of(share: float) -> str:
    return f"share-{share * 100:g}"


def grantee_of(share: float) -> str:
    return f"grantee-{share * 100:g}"


@dataclass
class Caller:
    name: str
    acl: str  # "tenant" or "grant"
    ctx: RuntimeContext
    rows: np.ndarray  # the readable rows, sorted

    def spec(self) -> dict[str, Any]:
        return {"user_id": self.ctx.user_id, "tenant_id": self.ctx.tenant_id, "roles": sorted(self.ctx.roles),
                "acl": self.acl}  # fmt: skip


@dataclass
class Data:
    """The nodes' vectors (unit length) and ACL fields; the queries; the callers."""

    vectors: np.ndarray
    tenant_codes: np.ndarray  # index into TENANT_SHARES, or -1: one of 97 other tenants
    granted: list[np.ndarray]  # per GRANT_SHARES: which rows list that grantee
    queries: np.ndarray
    callers: list[Caller]
    centres: int
    truths: dict[str, list[set[int]]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.vectors)

    def node_id(self, i: int) -> str:
        return str(uuid.UUID(int=i + 1))  # UUIDs: Qdrant takes no other string ids

    def row_of(self, node_id: str) -> int:
        return uuid.UUID(node_id).int - 1

    def metadata(self, i: int) -> dict[str, Any]:
        code = int(self.tenant_codes[i])
        tenant = tenant_of(TENANT_SHARES[code]) if code >= 0 else f"other-{i % 97}"
        users = [f"user-{i % 31}"] + [
            grantee_of(s) for s, rows in zip(GRANT_SHARES, self.granted, strict=True) if rows[i]
        ]
        roles = (["staff"], "staff", ["staff", "admin"], ["sales", "staff"])[i % 4]
        return {"tenant": tenant, "users": users, "roles": roles, "public": False}

    def nodes(self) -> list[TextNode]:
        return [
            TextNode(id_=self.node_id(i), text=f"passage {i}", metadata=self.metadata(i),
                     embedding=self.vectors[i].tolist())
            for i in range(self.n)
        ]  # fmt: skip

    def rows(self, start: int, end: int) -> Iterator[tuple[str, dict[str, Any], str]]:
        """``(node_id, metadata, vector as pgvector text)`` of rows ``start..end``, for ``COPY``."""
        text = io.StringIO()
        np.savetxt(text, self.vectors[start:end], fmt="%.9g", delimiter=",")  # float32 round-trips at 9 digits
        for i, line in zip(range(start, end), text.getvalue().splitlines(), strict=True):
            yield self.node_id(i), self.metadata(i), f"[{line}]"

    def truth(self, caller: Caller) -> list[set[int]]:
        """Per query, the exact filtered top k (cosine over the caller's readable rows only)."""
        if caller.name not in self.truths:
            scores = self.vectors[caller.rows] @ self.queries.T
            best = np.argsort(-scores, axis=0, kind="stable")[:K] if len(caller.rows) <= K else None
            found = []
            for q in range(len(self.queries)):
                column = scores[:, q]
                top = best[:, q] if best is not None else np.argpartition(-column, K)[:K]
                found.append({int(caller.rows[j]) for j in top})
            self.truths[caller.name] = found
        return self.truths[caller.name]


def make_data(n: int, dim: int, queries: int, seed: int = SEED) -> Data:
    rng = np.random.default_rng(seed)
    count = max(64, n // 1000)
    centres = rng.standard_normal((count, dim)).astype(np.float32)
    vectors = centres[rng.integers(0, count, n)]
    vectors += 0.6 * rng.standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    order = rng.permutation(n)
    codes = np.full(n, -1, dtype=np.int8)
    callers = []
    start = 0
    for code, share in enumerate(TENANT_SHARES):
        size = max(1, round(share * n))
        rows = np.sort(order[start : start + size])
        codes[rows] = code
        start += size
        ctx = RuntimeContext(user_id="reader", tenant_id=tenant_of(share), roles={"staff"})
        callers.append(Caller(f"tenant {share * 100:g} %", "tenant", ctx, rows))
        if code == 0:
            # The same tenant read through the user's own grants only (no role): 1 row in 31 of it.
            own = RuntimeContext(user_id="user-3", tenant_id=tenant_of(share))
            callers.append(Caller(f"tenant {share * 100:g} %, own grants", "tenant", own, rows[rows % 31 == 3]))
    granted = []
    for share in GRANT_SHARES:
        rows = np.sort(rng.choice(n, max(1, round(share * n)), replace=False))
        mask = np.zeros(n, dtype=bool)
        mask[rows] = True
        granted.append(mask)
        ctx = RuntimeContext(user_id=grantee_of(share))
        callers.append(Caller(f"grant list {share * 100:g} %", "grant", ctx, rows))
    asked = centres[rng.integers(0, count, queries)] + 0.6 * rng.standard_normal((queries, dim))
    asked = (asked / np.linalg.norm(asked, axis=1, keepdims=True)).astype(np.float32)
    return Data(vectors, codes, granted, asked, callers, count)


# --- the stores in this process ---------------------------------------------------------------------------


def memory_index(data: Data, dim: int) -> Iterator[BaseIndex[Any]]:
    yield VectorStoreIndex(data.nodes(), embed_model=HashEmbedding(dimensions=dim))


def qdrant_index(data: Data, dim: int) -> Iterator[BaseIndex[Any]]:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    try:
        store = QdrantVectorStore(client=client, collection_name="filtered", batch_size=1000)
        yield VectorStoreIndex(
            data.nodes(), storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=HashEmbedding(dimensions=dim),
        )  # fmt: skip
    finally:
        client.close()


def chroma_index(data: Data, dim: int) -> Iterator[BaseIndex[Any]]:
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.EphemeralClient().create_collection(
        f"filtered-{data.n}", embedding_function=None, get_or_create=True
    )
    if collection.count() != data.n:
        for start in range(0, data.n, 5000):  # Chroma caps one add's batch
            end = min(start + 5000, data.n)
            metadata = [data.metadata(i) for i in range(start, end)]
            collection.upsert(
                ids=[data.node_id(i) for i in range(start, end)],
                embeddings=data.vectors[start:end],
                documents=[f"passage {i}" for i in range(start, end)],
                metadatas=[{**m, "users": m["users"][0], "roles": "staff"} for m in metadata],
            )
    yield VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=HashEmbedding(dimensions=dim)
    )


BUILDERS: dict[str, Callable[[Data, int], Iterator[BaseIndex[Any]]]] = {
    "memory": memory_index,
    "qdrant": qdrant_index,
    "chroma": chroma_index,
    # Milvus Lite (FLAT) and the 2.3.5 server (HNSW): benchmarks/_milvus_bench.py.
    "milvus-lite": lambda data, dim: _milvus_bench.milvus_lite_index(
        data, None, dimensions=dim, embed=HashEmbedding(dimensions=dim)
    ),
    "milvus-lite-typed": lambda data, dim: _milvus_bench.milvus_lite_typed_index(
        data, None, dimensions=dim, embed=HashEmbedding(dimensions=dim)
    ),
    "milvus": lambda data, dim: _milvus_bench.milvus_server_index(
        data, None, dimensions=dim, embed=HashEmbedding(dimensions=dim)
    ),
}

Ask = Callable[[Caller, list[float]], dict[str, Any]]


def in_process(index: BaseIndex[Any], store: str) -> Ask:
    selector = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
    retrievers = {name: JevRetriever.from_index(index, selector, acl, top_k=K) for name, acl in ACLS.items()}
    assert all(r.prefilter for r in retrievers.values()), f"{store}: the ACL is not pushed down"
    plain = index.as_retriever(similarity_top_k=K)  # no ACL, no filter: what "within 2x unfiltered" compares with

    def ask(caller: Caller, embedding: list[float]) -> dict[str, Any]:
        bundle = QueryBundle("a question", embedding=embedding)
        begun = time.perf_counter()
        nodes = retrievers[caller.acl].retrieve(bundle, ctx=caller.ctx)
        seconds = time.perf_counter() - begun
        begun = time.perf_counter()
        plain.retrieve(bundle)
        unfiltered = time.perf_counter() - begun
        return {"ids": [n.node.node_id for n in nodes], "seconds": seconds, "paths": [], "unfiltered": unfiltered}

    return ask


# --- the measurement --------------------------------------------------------------------------------------


@dataclass
class Point:
    store: str
    caller: Caller
    wanted: int
    returned: list[int] = field(default_factory=list)
    recalls: list[float] = field(default_factory=list)
    leaks: int = 0
    seconds: list[float] = field(default_factory=list)
    unfiltered: list[float] = field(default_factory=list)  # the same query, no ACL (in-process stores)
    paths: collections.Counter[str] = field(default_factory=collections.Counter)
    warnings: int = 0


def measure(stores: list[tuple[str, Ask]], data: Data, callers: list[Caller]) -> list[Point]:
    """Every caller's queries on every store, interleaved query by query so machine noise hits them alike."""
    points = []
    for caller in callers:
        readable = np.zeros(data.n, dtype=bool)
        readable[caller.rows] = True
        truth = data.truth(caller)
        mine = [Point(store, caller, min(K, len(caller.rows))) for store, _ in stores]
        for _, ask in stores:
            ask(caller, data.queries[-1].tolist())  # warm-up (its estimate, its index pages)
        for q in range(len(data.queries)):
            embedding = data.queries[q].tolist()
            for point, (_, ask) in zip(mine, stores, strict=True):
                answer = ask(caller, embedding)
                rows = [data.row_of(node_id) for node_id in answer["ids"]]
                point.seconds.append(answer["seconds"])
                if "unfiltered" in answer:
                    point.unfiltered.append(answer["unfiltered"])
                point.returned.append(len(rows))
                point.leaks += sum(not readable[row] for row in rows)
                point.recalls.append(len(set(rows) & truth[q]) / len(truth[q]))
                point.paths.update(answer["paths"])
                point.warnings += answer.get("warnings", 0)
        points.extend(mine)
        print(f"  {caller.name}: done", flush=True)
    return points


def print_table(title: str, points: list[Point], baseline: str | None) -> None:
    print(f"\n{title}\n")
    unfiltered = all(p.unfiltered for p in points)
    ratio = (" p50 new / main |" if baseline else "") + (" p50 / unfiltered |" if unfiltered else "")
    print(f"| caller | store | readable | path | returned (mean / worst) of wanted | full-k | recall@10 (worst) "
          f"| leaks | p50 ms |{ratio}")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if baseline else "") + ("---|" if unfiltered else ""))
    main_p50 = {p.caller.name: statistics.median(p.seconds) for p in points if baseline and p.store == baseline}
    for p in points:
        p50 = statistics.median(p.seconds)
        paths = ", ".join(f"{path} {count}" for path, count in sorted(p.paths.items())) or "-"
        if p.warnings:
            paths += f"; {p.warnings} warnings"
        cell = ""
        if baseline:
            cell = " |" if p.store == baseline else f" {p50 / main_p50[p.caller.name]:.2f} |"
        if unfiltered:
            plain = statistics.median(p.unfiltered)
            cell += f" {p50 / plain:.2f} ({plain * 1000:.1f} ms) |"
        print(
            f"| {p.caller.name} | {p.store} | {len(p.caller.rows):,} | {paths} | "
            f"{statistics.mean(p.returned):.1f} / {min(p.returned)} of {p.wanted} | "
            f"{sum(r >= p.wanted for r in p.returned)} / {len(p.returned)} | "
            f"{statistics.mean(p.recalls):.3f} ({min(p.recalls):.1f}) | {p.leaks} | {p50 * 1000:.1f} |{cell}"
        )


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def run_postgres(args: argparse.Namespace, data: Data) -> None:
    keep = None if args.database_url else args.keep
    with contextlib.ExitStack() as stack:
        url, async_url, where = stack.enter_context(database(args.database_url, keep))
        print(f"postgres: {where}", flush=True)
        roots = [("postgres (this checkout)", REPO)]
        if args.baseline:
            roots.insert(0, (f"postgres main@{args.baseline}", stack.enter_context(checkout(args.baseline))))
        for jsonb in (False, True) if args.jsonb else (False,):
            column = "JSONB" if jsonb else "JSON"
            name = f"filtered_{data.n}_{args.dim}" + ("_jsonb" if jsonb else "")
            tag = f"bench_filtered v2 n={data.n} dim={args.dim} centres={data.centres} seed={SEED} jsonb={jsonb}"
            started = time.perf_counter()
            print(f"postgres: {column} table: loading / checking ({uptime()})", flush=True)
            done = build_table(url, async_url, name=name, n=data.n, dim=args.dim, jsonb=jsonb, tag=tag, rows=data.rows)
            print(f"postgres: {done} [{time.perf_counter() - started:.0f} s]", flush=True)
            spec = {"url": url, "async_url": async_url, "table": name, "dim": args.dim, "jsonb": jsonb, "k": K,
                    "callers": {c.name: c.spec() for c in data.callers}}  # fmt: skip
            workers = []
            try:
                for label, root in roots:  # one at a time: each creates the ACL indexes it lacks
                    workers.append(Worker(label, root, spec))
                    print(f"postgres: {label} ready (llama_jev {workers[-1].version})", flush=True)
                stores: list[tuple[str, Ask]] = [
                    (w.label, lambda c, e, w=w: w.ask(c.name, e)) for w in workers
                ]  # fmt: skip
                before = uptime()
                points = measure(stores, data, data.callers)
                title = (
                    f"{data.n:,} nodes, {args.dim}-d, {data.centres} clusters, {column} metadata_, k = {K}, "
                    f"{len(data.queries)} queries per caller, mode OFF (pushdown). Load before: {before}; "
                    f"after: {uptime()}"
                )
                print_table(title, points, roots[0][0] if args.baseline else None)
            finally:
                for worker in workers:
                    worker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="nodes (10,000: the quick run; 100,000: the docs')")
    parser.add_argument("--dim", type=int, default=384, help="the vectors' dimension")
    parser.add_argument("--queries", type=int, default=30, help="queries per caller")
    parser.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument(
        "--keep",
        type=Path,
        nargs="?",
        const=KEPT,
        default=None,
        metavar="DIR",
        help=f"keep the embedded PostgreSQL's data folder in DIR (default {KEPT}) and reuse its tables",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="REF",
        help="also measure the PostgreSQL store of this git ref (a worktree), e.g. dff3a63",
    )
    parser.add_argument("--jsonb", action="store_true", help="measure a use_jsonb=True table too (PostgreSQL)")
    args = parser.parse_args()  # fmt: skip
    stores = [name.strip() for name in args.stores.split(",") if name.strip()]
    unknown = sorted(set(stores) - set(STORES))
    if unknown:
        parser.error(f"unknown store(s) {', '.join(unknown)}: choose among {', '.join(STORES)}")
    warnings.filterwarnings("ignore")
    logging.getLogger("llama_jev").setLevel(logging.ERROR)

    started = time.perf_counter()
    data = make_data(args.n, args.dim, args.queries)
    spent = time.perf_counter() - started
    print(f"data: {args.n:,} x {args.dim}-d, {data.centres} clusters, seed {SEED} ({spent:.0f} s)")
    points: list[Point] = []
    for name in stores:
        if name == "postgres":
            run_postgres(args, data)
            continue
        started = time.perf_counter()
        with contextlib.contextmanager(BUILDERS[name])(data, args.dim) as index:
            print(f"{name}: {args.n:,} nodes ready in {time.perf_counter() - started:.1f} s", flush=True)
            callers = [c for c in data.callers if name != "chroma" or c.acl == "tenant"]
            points.extend(measure([(name, in_process(index, name))], data, callers))
    if points:
        title = f"{args.n:,} nodes, {args.dim}-d, k = {K}, {args.queries} queries per caller, mode OFF"
        print_table(title, points, None)


if __name__ == "__main__":
    main()
