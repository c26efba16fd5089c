"""PostgreSQL for ``bench_filtered.py``: the server, the table bulk-loaded by ``COPY``, and the stores in workers.

- :func:`database`: ``--database-url``, or an embedded PostgreSQL 18 + pgvector (its data folder kept
  with ``--keep``, so a second run reuses the table and its index);
- :func:`build_table`: LlamaIndex's ``PGVectorStore`` creates the table; the rows go in by ``COPY``
  in the exact shape ``PGVectorStore.add`` writes (``metadata_`` from ``node_to_metadata_dict``);
  then the HNSW index, the ACL indexes and ``ANALYZE``. A table whose comment names this data set
  (rows, dimension, seed, column type) is reused as it is;
- :class:`Worker`: one ``AclPGVectorStore`` in a subprocess (``_filtered_worker.py``) with
  ``PYTHONPATH`` set to a checkout: this branch's, or a ``git worktree`` of ``--baseline``
  (:func:`checkout`), so main's store and the new one answer the same queries in one run.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KEPT = Path("/var/tmp/llama_jev-bench-filtered-pg")  # (not under /root: the server runs as 'nobody')
CHUNK = 20_000
HNSW = {"m": 16, "ef_construction": 64}


@contextlib.contextmanager
def database(url: str | None, keep: Path | None) -> Iterator[tuple[str, str, str]]:
    """(sync URL, async URL, where) of the given server, or of an embedded one (its data kept in ``keep``)."""
    if url:
        parsed = sqlalchemy.engine.make_url(url)
        yield (
            parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False),
            parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False),
            parsed.set(drivername="postgresql").render_as_string(hide_password=True),
        )
        return
    from llama_jev.testing import embedded_postgres

    with embedded_postgres(data=keep) as server:
        kept = f", data kept in {keep}" if keep else ", throwaway data"
        yield server.url, server.async_url, f"embedded PostgreSQL (started in {server.started_in:.1f} s{kept})"


def build_table(
    url: str, async_url: str, *, name: str, n: int, dim: int, jsonb: bool, tag: str,
    rows: Callable[[int, int], Iterator[tuple[str, dict[str, Any], list[float] | Any]]],
) -> str:  # fmt: skip
    """Create and fill ``data_<name>`` unless its comment says it holds ``tag``; return what was done and its cost.

    ``rows(start, end)`` yields ``(node_id, metadata, vector)`` for rows ``start..end``.
    """
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.utils import node_to_metadata_dict
    from llama_index.vector_stores.postgres import PGVectorStore

    store = PGVectorStore(
        connection_string=url, async_connection_string=async_url, table_name=name, embed_dim=dim, use_jsonb=jsonb
    )
    store._initialize()
    assert store._engine is not None
    table = f"data_{name}"
    with store._engine.connect() as connection:
        found = connection.exec_driver_sql(f"SELECT obj_description('public.{table}'::regclass)").scalar()
        server = connection.exec_driver_sql(
            "SELECT current_setting('server_version'), (SELECT extversion FROM pg_extension WHERE extname = 'vector'), "
            "current_setting('shared_buffers'), current_setting('work_mem')"
        ).one()
        print(f"  PostgreSQL {server[0]}, pgvector {server[1]}, shared_buffers {server[2]}, work_mem {server[3]}")
        if found == tag:
            size = connection.exec_driver_sql(f"SELECT pg_size_pretty(pg_total_relation_size('{table}'))").scalar()
            store._engine.dispose()
            return f"{table}: reused ({n:,} rows, {size} with its indexes)"
    raw = store._engine.raw_connection()
    timings: dict[str, float] = {}
    try:
        cursor = raw.cursor()
        cursor.execute(f"DROP INDEX IF EXISTS {table}_hnsw")
        cursor.execute(f"TRUNCATE {table}")
        raw.commit()
        started = time.perf_counter()
        for start in range(0, n, CHUNK):
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            for node_id, metadata, vector in rows(start, min(start + CHUNK, n)):
                node = TextNode(id_=node_id, text="passage", metadata=metadata)
                # What PGVectorStore.add stores: the node's metadata dict, serialised as SQLAlchemy does.
                stored = node_to_metadata_dict(node, remove_text=True, flat_metadata=False)
                writer.writerow(("passage", json.dumps(stored), node_id, vector))
            buffer.seek(0)
            columns = "text, metadata_, node_id, embedding"
            cursor.copy_expert(f"COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv)", buffer)
            raw.commit()
            if start and start % (10 * CHUNK) == 0:
                print(f"  loaded {start:,} rows ({time.perf_counter() - started:.0f} s)", flush=True)
        timings["COPY"] = time.perf_counter() - started
        workers = max(0, min(7, (os.cpu_count() or 1) - 1))
        started = time.perf_counter()
        cursor.execute("SET maintenance_work_mem = '2GB'")
        cursor.execute(f"SET max_parallel_maintenance_workers = {workers}")
        cursor.execute(
            f"CREATE INDEX {table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops) "
            f"WITH (m = {HNSW['m']}, ef_construction = {HNSW['ef_construction']})"
        )
        raw.commit()
        timings["HNSW"] = time.perf_counter() - started
        raw.dbapi_connection.autocommit = True  # (VACUUM runs outside a transaction)
        raw.dbapi_connection.cursor().execute(f"VACUUM ANALYZE {table}")
    finally:
        raw.close()
    started = time.perf_counter()
    _acl_indexes(url, async_url, name=name, dim=dim, jsonb=jsonb)
    timings["ACL indexes + ANALYZE"] = time.perf_counter() - started
    with store._engine.begin() as connection:
        connection.exec_driver_sql(f"COMMENT ON TABLE {table} IS '{tag}'")
        size = connection.exec_driver_sql(f"SELECT pg_size_pretty(pg_total_relation_size('{table}'))").scalar()
    store._engine.dispose()
    spent = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in timings.items())
    return (
        f"{table}: built ({n:,} rows, {size} with its indexes): {spent}; HNSW m {HNSW['m']}, ef_construction "
        f"{HNSW['ef_construction']}, maintenance_work_mem 2GB, max_parallel_maintenance_workers {workers}"
    )


def _acl_indexes(url: str, async_url: str, *, name: str, dim: int, jsonb: bool) -> None:
    from llama_jev import MetadataAcl
    from llama_jev.stores import AclPGVectorStore

    acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
    store = AclPGVectorStore(
        connection_string=url, async_connection_string=async_url, table_name=name, embed_dim=dim, use_jsonb=jsonb
    )
    store.create_acl_indexes(acl)
    if store._engine is not None:
        store._engine.dispose()


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """A ``git worktree`` of ``ref`` in a temporary folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bench-filtered-baseline-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(folder), ref], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)], check=False)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()


class Worker:
    """An ``AclPGVectorStore`` of the checkout at ``root``, answering queries in a subprocess."""

    def __init__(self, label: str, root: Path, spec: dict[str, Any]) -> None:
        self.label = label
        env = {**os.environ, "PYTHONPATH": str(root)}
        self._process = subprocess.Popen(
            [sys.executable, str(HERE / "_filtered_worker.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, cwd=str(root),
        )  # fmt: skip
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(json.dumps(spec) + "\n")
        self._process.stdin.flush()
        ready = self._process.stdout.readline()
        if not ready:
            raise RuntimeError(f"{label}: the worker stopped before it was ready (its error is above)")
        self.version = json.loads(ready)["version"]

    def ask(self, caller: str, embedding: list[float]) -> dict[str, Any]:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(json.dumps({"caller": caller, "embedding": embedding}) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"{self.label}: the worker stopped (its error is above)")
        return dict(json.loads(answer))

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
