"""Test helpers that are real parts: a System One server on 127.0.0.1 with programmable faults,
``HashEmbedding``, a throwaway PostgreSQL + pgvector, a throwaway Chroma server, a throwaway
Cerbos PDP and SpiceDB, a throwaway Milvus standalone server."""

from llama_jev.testing.cerbos import (
    CerbosServer as CerbosServer,
)
from llama_jev.testing.cerbos import (
    cerbos_server as cerbos_server,
)
from llama_jev.testing.chroma import (
    ChromaServer as ChromaServer,
)
from llama_jev.testing.chroma import (
    chroma_server as chroma_server,
)
from llama_jev.testing.embedding import HashEmbedding as HashEmbedding
from llama_jev.testing.milvus import (
    MilvusServer as MilvusServer,
)
from llama_jev.testing.milvus import (
    milvus_server as milvus_server,
)
from llama_jev.testing.postgres import (
    PostgresServer as PostgresServer,
)
from llama_jev.testing.postgres import (
    embedded_postgres as embedded_postgres,
)
from llama_jev.testing.server import (
    Fault as Fault,
)
from llama_jev.testing.server import (
    RecordedRequest as RecordedRequest,
)
from llama_jev.testing.server import (
    SystemOneTestServer as SystemOneTestServer,
)
from llama_jev.testing.spicedb import (
    SpiceDBServer as SpiceDBServer,
)
from llama_jev.testing.spicedb import (
    spicedb_server as spicedb_server,
)
