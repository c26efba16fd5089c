"""Where the collection lives: Qdrant local mode on disk by default, a Qdrant server via QDRANT_URL.

The same code serves both; only the environment changes:

- ``QDRANT_URL`` unset: ``QdrantClient(path=...)``, an on-disk database inside this process
  (one client per folder at a time: close it before opening the folder again);
- ``QDRANT_URL=http://localhost:6333`` (see ``docker/docker-compose.yml``): that server, with
  ``QDRANT_API_KEY`` sent when set.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, ParamSpec

from llama_index.core.base.embeddings.base import BaseEmbedding
from qdrant_client import AsyncQdrantClient, QdrantClient

from llama_jev.errors import JevAuthenticationError

DEFAULT_STORAGE = Path(__file__).resolve().parent / "storage"
COLLECTION_PREFIX = "refund_policy"
P = ParamSpec("P")
STORAGE_HELP = f"the local-mode folder (default: {DEFAULT_STORAGE}); unused when QDRANT_URL is set"


def client_options(path: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``QdrantClient`` arguments for this environment: a server if ``QDRANT_URL`` is set, else ``path``."""
    environ = os.environ if environ is None else environ
    url = environ.get("QDRANT_URL", "").strip()
    if url:
        api_key = environ.get("QDRANT_API_KEY", "").strip()
        return {"url": url, "api_key": api_key or None}
    return {"path": str(Path(path) if path is not None else DEFAULT_STORAGE)}


def describe(options: Mapping[str, Any]) -> str:
    """A line saying where the data is (never the API key)."""
    if "url" in options:
        secured = ", with QDRANT_API_KEY" if options.get("api_key") else ""
        return f"Qdrant server at {options['url']}{secured}"
    return f"Qdrant local mode, on disk at {options['path']}"


class QdrantUnreachableError(RuntimeError):
    """The Qdrant server named by ``QDRANT_URL`` did not answer (not started, wrong URL or key)."""


def reports_unreachable(main: Callable[P, int]) -> Callable[P, int]:
    """Wrap a command's ``main`` so an unreachable Qdrant server, or a judge server that needs a key
    none was given for, is one line on stderr and exit status 2 (both are set-up errors)."""

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except (QdrantUnreachableError, JevAuthenticationError) as error:
            print(error, file=sys.stderr)
            return 2

    return wrapper


@contextmanager
def connect(path: str | os.PathLike[str] | None = None) -> Iterator[QdrantClient]:
    """A Qdrant client for this environment, closed on exit (which releases a local folder's lock).

    Raises:
        QdrantUnreachableError: ``QDRANT_URL`` is set and the server does not answer.
    """
    options = client_options(path)
    client = QdrantClient(**options)
    try:
        if "url" in options:
            # Ask once, up front: otherwise the first failure is a traceback deep in the ingestion.
            try:
                client.get_collections()
            except Exception as error:  # qdrant-client raises several unrelated types here
                raise QdrantUnreachableError(
                    f"cannot reach the Qdrant server at {options['url']} (QDRANT_URL): {type(error).__name__}: "
                    f"{str(error)[:200]}. Start it (docker compose -f docker/docker-compose.yml up -d, then wait "
                    "until `docker compose -f docker/docker-compose.yml ps` says healthy), check QDRANT_API_KEY, "
                    "or unset QDRANT_URL to use local mode."
                ) from error
        yield client
    finally:
        client.close()


@asynccontextmanager
async def connect_async(path: str | os.PathLike[str] | None = None) -> AsyncIterator[AsyncQdrantClient]:
    """The async twin of :func:`connect`, for async retrieval (agents, ``aretrieve``).

    ``QdrantVectorStore`` runs ``aquery`` only on an ``AsyncQdrantClient``. In local mode the
    async client takes the folder's lock just like a sync one, so never hold both at once.
    """
    client = AsyncQdrantClient(**client_options(path))
    try:
        yield client
    finally:
        await client.close()


def collection_name(embed_model: BaseEmbedding) -> str:
    """One collection per embedding model: vectors from different models must never be mixed.

    Switching the embedding (the local extra installed or not) then builds a new collection
    instead of querying 384-dimensional vectors with a 32-dimensional query.
    """
    model = f"{embed_model.class_name()}_{embed_model.model_name}"
    return f"{COLLECTION_PREFIX}__{re.sub(r'[^A-Za-z0-9]+', '_', model).strip('_').lower()}"


def point_count(client: QdrantClient, collection: str) -> int:
    """How many points ``collection`` holds; 0 when it does not exist."""
    if not client.collection_exists(collection):
        return 0
    return client.count(collection, exact=True).count
