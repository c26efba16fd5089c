"""The refund-policy example runs on PostgreSQL + pgvector when ``DATABASE_URL`` is set."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("llama_index.vector_stores.postgres")

from examples.refund_policy import kb, postgres
from llama_jev.testing.postgres import PostgresServer

from .test_examples import ALICE, COMPENSATION, REPO, SAM, _offline_environment, _section

pytestmark = pytest.mark.slow  # runs the example


def test_database_url_switches_the_example_to_postgres() -> None:
    assert postgres.database_url({}) is None
    assert postgres.database_url({"DATABASE_URL": "  "}) is None
    url = "postgresql://app:s3cret@db.internal:5432/rag"
    assert postgres.database_url({"DATABASE_URL": url}) == url


def test_the_example_never_prints_the_database_password() -> None:
    from llama_jev.testing import HashEmbedding

    line = postgres.describe("postgresql://app:s3cret@db.internal:5432/rag", HashEmbedding())
    assert "s3cret" not in line
    assert "db.internal:5432/rag" in line


def test_python_m_examples_refund_policy_runs_on_postgres(postgres_server: PostgresServer) -> None:
    environment = _offline_environment()
    environment["DATABASE_URL"] = f"postgresql://postgres@{postgres_server.host}:{postgres_server.port}/postgres"
    command = [sys.executable, "-m", "examples.refund_policy", "--user", "alice", "--user", "sam"]
    first = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "PostgreSQL + pgvector at postgresql://postgres@127.0.0.1" in first.stdout
    assert f"Ingested {len(kb.DOCUMENTS)} documents" in first.stdout
    alice = _section(first.stdout, ALICE)
    assert "Refunds are available for unused items returned within seven days" in alice
    assert COMPENSATION.text[:40] not in alice
    assert "Globex" not in alice
    assert "store credit" in _section(first.stdout, SAM)
    # Pushed down: the retriever did not warn that it post-filters only, and the example names the store.
    assert "AclPGVectorStore" not in first.stderr
    assert "pushed down into PostgreSQL, so these never leave" in alice.replace("\n  ", " ")
    assert "pushed down into Qdrant" not in first.stdout

    # The query step alone reopens the table the first run wrote.
    query = [sys.executable, "-m", "examples.refund_policy.query", "--user", "alice"]
    second = subprocess.run(query, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "Ingested" not in second.stdout
    assert f"Reopened {len(kb.DOCUMENTS)} rows" in second.stdout
    assert "Refunds are available for unused items" in second.stdout


def test_each_embedding_model_has_its_own_table_within_postgres_name_limits() -> None:
    from llama_jev.testing import HashEmbedding

    names = {postgres.table_name(HashEmbedding(dimensions=d, model_name="x" * 80 + str(d))) for d in (8, 16)}
    assert len(names) == 2
    assert all(len(f"data_{name}") <= 63 for name in names)
