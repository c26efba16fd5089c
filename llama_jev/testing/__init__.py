"""Test helpers that are real parts: a System One server on 127.0.0.1 with programmable faults,
``HashEmbedding``, a deterministic offline embedding for tests and demos, and
``embedded_postgres()``, a throwaway PostgreSQL + pgvector (``llama_jev.testing.postgres``)."""

from llama_jev.testing.embedding import HashEmbedding
from llama_jev.testing.postgres import PostgresServer, embedded_postgres
from llama_jev.testing.server import Fault, RecordedRequest, SystemOneTestServer

__all__ = ["Fault", "HashEmbedding", "PostgresServer", "RecordedRequest", "SystemOneTestServer", "embedded_postgres"]
