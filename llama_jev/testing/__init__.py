"""Test helpers that are real parts: a System One server on 127.0.0.1 with programmable faults,
and ``HashEmbedding``, a deterministic offline embedding for tests and demos."""

from llama_jev.testing.embedding import HashEmbedding
from llama_jev.testing.server import Fault, RecordedRequest, SystemOneTestServer

__all__ = ["Fault", "HashEmbedding", "RecordedRequest", "SystemOneTestServer"]
