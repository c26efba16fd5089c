"""Step 1: build the collection once. ``python -m examples.refund_policy.ingest [--storage PATH] [--rebuild]``.

Embeds every document of :mod:`examples.refund_policy.kb` and stores vectors, text and access
metadata in Qdrant. Querying never repeats this: :mod:`examples.refund_policy.query` reopens
the collection as it is.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import QdrantClient

from examples.plain_text import plain
from examples.refund_policy import kb, store
from examples.refund_policy.models import choose_embedding


@dataclass(frozen=True)
class Ingestion:
    """What :func:`ensure_collection` did."""

    collection: str
    points: int
    built: bool
    seconds: float


def build_collection(client: QdrantClient, embed_model: BaseEmbedding, *, collection: str | None = None) -> int:
    """(Re)create the collection from :data:`kb.DOCUMENTS` and return its point count.

    An existing collection of that name is dropped first, so a rebuild never leaves stale points.
    """
    name = collection or store.collection_name(embed_model)
    if client.collection_exists(name):
        client.delete_collection(name)
    # No doc_id payload index: nothing here deletes by document, and local mode has no payload
    # indexes (it would only warn).
    vector_store = QdrantVectorStore(collection_name=name, client=client, index_doc_id=False)
    VectorStoreIndex(
        nodes=kb.nodes(),
        storage_context=StorageContext.from_defaults(vector_store=vector_store),
        embed_model=embed_model,
    )
    return store.point_count(client, name)


def ensure_collection(client: QdrantClient, embed_model: BaseEmbedding, *, rebuild: bool = False) -> Ingestion:
    """Build the collection unless it already holds every document (or ``rebuild`` is asked)."""
    name = store.collection_name(embed_model)
    started = time.perf_counter()
    points = store.point_count(client, name)
    built = rebuild or points != len(kb.DOCUMENTS)
    if built:
        points = build_collection(client, embed_model, collection=name)
    return Ingestion(collection=name, points=points, built=built, seconds=time.perf_counter() - started)


@store.reports_unreachable
def main(argv: list[str] | None = None) -> int:
    """Build the collection (``--rebuild`` to redo it) and say where it is."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.refund_policy.ingest",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--storage", help=store.STORAGE_HELP)
    parser.add_argument("--rebuild", action="store_true", help="drop and rebuild the collection")
    args = parser.parse_args(argv)
    embedding = choose_embedding()
    database = os.environ.get("DATABASE_URL", "").strip()
    if database:
        # PostgreSQL + pgvector instead of Qdrant (examples/refund_policy/postgres.py).
        from examples.refund_policy import postgres

        print(f"Vector store : {postgres.describe(database, embedding.component)}")
        print(f"Embedding    : {embedding.label}")
        done = postgres.ensure_table(database, embedding.component, rebuild=args.rebuild)
        action = "Built" if done.built else "Already built:"
        print(f"{action} table {done.collection!r}: {done.points} rows ({done.seconds:.2f} s)")
        return 0
    options = store.client_options(args.storage)
    print(f"Vector store : {store.describe(options)}")
    print(f"Embedding    : {embedding.label}")
    with store.connect(args.storage) as client:
        done = ensure_collection(client, embedding.component, rebuild=args.rebuild)
    action = "Built" if done.built else "Already built:"
    print(f"{action} collection {done.collection!r}: {done.points} points ({done.seconds:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
