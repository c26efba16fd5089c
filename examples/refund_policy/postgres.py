"""The knowledge base in PostgreSQL + pgvector instead of Qdrant, when ``DATABASE_URL`` is set.

``DATABASE_URL=postgresql://user:password@localhost:5432/db`` (the ``pgvector`` service of
``docker/docker-compose.yml`` answers at ``postgresql://postgres:postgres@localhost:5432/postgres``)
switches the example to one table per embedding model (the table LlamaIndex's ``PGVectorStore``
writes), read through :class:`~llama_jev.stores.AclPGVectorStore`, into which
``JevRetriever`` pushes the ACL as bound SQL parameters. Needs the ``postgres`` extra.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding

from examples.refund_policy import kb, store
from examples.refund_policy.ingest import Ingestion

__all__ = ["database_url", "describe", "ensure_table", "open_index", "table_name"]


def database_url(environ: Mapping[str, str] | None = None) -> str | None:
    """``DATABASE_URL`` when set (PostgreSQL is then used instead of Qdrant), else ``None``."""
    environ = os.environ if environ is None else environ
    return environ.get("DATABASE_URL", "").strip() or None


def table_name(embed_model: BaseEmbedding) -> str:
    """One table per embedding model, as with Qdrant collections, within PostgreSQL's 63-character names.

    ``PGVectorStore`` prefixes ``data_``; the digest keeps two long model names from colliding.
    """
    collection = store.collection_name(embed_model)
    slug = collection.removeprefix(f"{store.COLLECTION_PREFIX}__")[:40]
    return f"refund_{slug}_{hashlib.sha256(collection.encode()).hexdigest()[:8]}"


def _urls(url: str) -> tuple[str, str]:
    """The SQLAlchemy URLs for the sync (psycopg2) and async (asyncpg) drivers."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return (
        parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False),
        parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False),
    )


def describe(url: str, embed_model: BaseEmbedding) -> str:
    """A line saying where the data is (never the password)."""
    from sqlalchemy.engine import make_url

    where = make_url(url).set(drivername="postgresql").render_as_string(hide_password=True)
    return f"PostgreSQL + pgvector at {where}, table data_{table_name(embed_model)} (AclPGVectorStore)"


def _store(url: str, embed_model: BaseEmbedding) -> Any:
    from llama_jev.stores import AclPGVectorStore

    sync_url, async_url = _urls(url)
    return AclPGVectorStore(
        connection_string=sync_url,
        async_connection_string=async_url,
        table_name=table_name(embed_model),
        embed_dim=len(embed_model.get_text_embedding("dimension probe")),
        # Fail on the first call when the server is unreachable or lacks pgvector, with the cause.
        initialization_fail_on_error=True,
    )


def _rows(vector_store: Any) -> int:
    import sqlalchemy

    vector_store._initialize()
    table = vector_store._table_class.__table__
    with vector_store._engine.connect() as connection:
        return int(connection.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(table)).scalar_one())


def ensure_table(url: str, embed_model: BaseEmbedding, *, rebuild: bool = False) -> Ingestion:
    """Write every document into the table unless it already holds them all (or ``rebuild`` is asked)."""
    started = time.perf_counter()
    vector_store = _store(url, embed_model)
    try:
        rows = _rows(vector_store)
        built = rebuild or rows != len(kb.DOCUMENTS)
        if built:
            vector_store.clear()
            VectorStoreIndex(
                nodes=kb.nodes(),
                storage_context=StorageContext.from_defaults(vector_store=vector_store),
                embed_model=embed_model,
            )
            rows = _rows(vector_store)
    finally:
        vector_store._engine.dispose()
    return Ingestion(
        collection=f"data_{table_name(embed_model)}",
        points=rows,
        built=built,
        seconds=time.perf_counter() - started,
    )


def open_index(url: str, embed_model: BaseEmbedding) -> tuple[VectorStoreIndex, int]:
    """The existing table as a ``VectorStoreIndex`` (nothing re-embedded) and its row count."""
    vector_store = _store(url, embed_model)
    return VectorStoreIndex.from_vector_store(vector_store, embed_model=embed_model), _rows(vector_store)
