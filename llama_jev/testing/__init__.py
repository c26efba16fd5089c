"""Test helpers that are real parts: a System One server on 127.0.0.1 with programmable faults,
``HashEmbedding``, a deterministic offline embedding for tests and demos, ``embedded_postgres()``,
a throwaway PostgreSQL + pgvector, ``chroma_server()``, a throwaway Chroma server (``chroma run``
from the ``chromadb`` wheel), ``cerbos_server()``, a throwaway Cerbos PDP (the npm registry's
binary, fetched once with ``npm pack``), and ``spicedb_server()``, a throwaway SpiceDB (the embedded
library from the npm registry) serving the standard gRPC API.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
