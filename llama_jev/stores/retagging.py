"""Re-tag in place: change the grants of nodes already in a store, without re-ingesting them.

:func:`retag` sets ACL keys of existing nodes (by node id, or every chunk of a document)
through the store's own partial update: text and embeddings are never rewritten, other
metadata keys stay as they were. The grants are checked first (:func:`~llama_jev.stores.grants.checked_grants`):
bad input is an error and nothing is written. The next query reads the new grants, pushed
down or not.

One writer per store (:class:`~llama_jev.stores.grants.Retagger`): in memory, Qdrant, Chroma,
PostgreSQL. A store added later is one ``Retagger`` subclass in its own module, added to
:data:`_BUILT_IN` or passed to :func:`register_retagger`.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from llama_jev.stores.grants import (
    Retagger,
    RetagIncompleteError,
    RetagResult,
    Selection,
    checked_grants,
    retagged,
)

__all__ = ["aretag", "register_retagger", "retag", "retagger_for", "retaggers"]

# module:class of the package's writers, loaded on first use so no store's client is imported
# before a store of that kind is re-tagged. A store added to the package adds its line here.
_BUILT_IN = (
    "llama_jev.stores.retag_memory:MemoryRetagger",
    "llama_jev.stores.retag_qdrant:QdrantRetagger",
    "llama_jev.stores.postgres.retag:PostgresRetagger",
    "llama_jev.stores.retag_chroma:ChromaRetagger",
    "llama_jev.stores.retag_milvus:MilvusRetagger",
)
_ADDED: list[type[Retagger]] = []
_LOCK = threading.Lock()

_BATCH = 256


def register_retagger(retagger: type[Retagger]) -> type[Retagger]:
    """Add a writer for a store outside the package; asked after the built-in ones. Returns it (a decorator).

    Raises:
        TypeError: not a concrete :class:`Retagger` subclass with a ``name``.

    Example::

        @register_retagger
        class MyStoreRetagger(Retagger):
            name = "mystore"
            ...
    """
    abstract: frozenset[str] = getattr(retagger, "__abstractmethods__", frozenset())
    if not (isinstance(retagger, type) and issubclass(retagger, Retagger)) or abstract:
        raise TypeError(f"register_retagger() takes a concrete Retagger subclass, not {retagger!r}")
    if not isinstance(getattr(retagger, "name", None), str):
        raise TypeError(f"{retagger.__qualname__} needs a class attribute name (the store's name in messages)")
    with _LOCK:
        if retagger not in _ADDED:
            _ADDED.append(retagger)
    return retagger


def retaggers() -> tuple[type[Retagger], ...]:
    """Every writer, in the order they are asked whether they speak a store."""
    built_in = []
    for path in _BUILT_IN:
        module, name = path.split(":")
        built_in.append(getattr(importlib.import_module(module), name))
    return (*built_in, *_ADDED)


def retagger_for(vector_store: Any) -> Retagger:
    """The writer of ``vector_store`` (a LlamaIndex vector store, or a ``VectorStoreIndex`` over one).

    Raises:
        TypeError: no writer speaks this store (names those that exist).
    """
    store = getattr(vector_store, "vector_store", vector_store)  # an index: its store
    for retagger in retaggers():
        if retagger.recognises(store):
            return retagger(_target(vector_store, store, retagger))
    names = ", ".join(retagger.name for retagger in retaggers())
    raise TypeError(f"re-tag speaks these stores: {names}; not {type(store).__name__}")


def _target(given: Any, store: Any, retagger: type[Retagger]) -> Any:
    # The in-memory store keeps no nodes: an index's docstore does, so it needs the index.
    return given if getattr(retagger, "needs_index", False) else store


def retag(
    vector_store: Any,
    grants: Mapping[str, Any],
    *,
    node_ids: Iterable[str] | None = None,
    document_ids: Iterable[str] | None = None,
    document_id_key: str = "ref_doc_id",
    acl: Any = None,
    batch_size: int = _BATCH,
) -> RetagResult:
    """Set ``grants`` (metadata key -> value) on the existing nodes selected, in their store; the next query sees them.

    Select either ``node_ids`` or ``document_ids`` (every chunk whose ``document_id_key`` metadata
    is one of them: ``ref_doc_id``, what LlamaIndex writes for a chunk of a document, or a key of
    your own). ``vector_store`` is a ``QdrantVectorStore``, a ``ChromaVectorStore``, a
    ``PGVectorStore`` (``AclPGVectorStore`` or plain; JSON or JSONB), or the ``VectorStoreIndex``
    over any of them, which the in-memory ``SimpleVectorStore`` needs (its nodes live in the index's
    docstore, which is updated too). Pass ``acl`` (your ``MetadataAcl``) to have each key checked
    as the key it reads.

    PostgreSQL writes in one transaction (all or nothing). Qdrant, Chroma and memory write one
    batch of ``batch_size`` nodes at a time: if the store fails part-way,
    :class:`~llama_jev.stores.grants.RetagIncompleteError` names the nodes written; the same
    re-tag run again finishes it.

    Returns:
        :class:`~llama_jev.stores.grants.RetagResult`: ``matched`` and ``changed`` counts, the ids
        written and the ids asked for that matched nothing.

    Raises:
        GrantsError: grants the ACL would misread (nothing is written).
        ValueError: neither or both of ``node_ids`` / ``document_ids``, or an id that is not a string.
        TypeError: a store no writer speaks.

    Example::

        result = retag(index, {"users": ["u2"]}, document_ids=["handbook.pdf"], acl=acl)
        assert result.matched == result.changed
    """
    retagger = retagger_for(vector_store)
    selection = _selection(node_ids, document_ids, document_id_key)
    checked = dict(retagger.checked(checked_grants(grants, acl=acl, document_id_key=document_id_key)))
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    return _run(retagger, selection, checked, batch_size)


async def aretag(
    vector_store: Any,
    grants: Mapping[str, Any],
    *,
    node_ids: Iterable[str] | None = None,
    document_ids: Iterable[str] | None = None,
    document_id_key: str = "ref_doc_id",
    acl: Any = None,
    batch_size: int = _BATCH,
) -> RetagResult:
    """:func:`retag` for async code: the same writes, run in a worker thread so the event loop stays free.

    One path for both (the stores' sync clients): the same checks, batches and transaction.

    Example::

        result = await aretag(store, {"public": False}, node_ids=[node_id], acl=acl)
    """
    return await asyncio.to_thread(
        retag,
        vector_store,
        grants,
        node_ids=node_ids,
        document_ids=document_ids,
        document_id_key=document_id_key,
        acl=acl,
        batch_size=batch_size,
    )


def _selection(node_ids: Iterable[str] | None, document_ids: Iterable[str] | None, key: str) -> Selection:
    if (node_ids is None) == (document_ids is None):
        raise ValueError("pass exactly one of node_ids= and document_ids= (which nodes to re-tag)")
    if not isinstance(key, str) or not key.strip():
        raise ValueError("document_id_key must be a non-blank string (the metadata key holding a chunk's document id)")
    chosen = node_ids if node_ids is not None else document_ids
    if isinstance(chosen, str):
        raise ValueError("pass ids as a list of strings, not one string")
    ids = tuple(dict.fromkeys(chosen or ()))  # repeated ids once, order kept
    if not all(isinstance(item, str) for item in ids):
        raise ValueError("node ids and document ids must be strings")
    return Selection(
        node_ids=ids if node_ids is not None else None,
        document_ids=ids if document_ids is not None else None,
        document_id_key=key,
    )


def _run(retagger: Retagger, selection: Selection, grants: dict[str, Any], size: int) -> RetagResult:
    """Read the selection page by page, write each page's changed nodes; the counts and ids written.

    Whatever fails part-way (a read, a stored node that cannot be read, a write) is a
    :class:`RetagIncompleteError` saying what was written: nothing in a transaction (rolled back),
    else the pages before it, and the page in flight as uncertain.
    """
    matched = 0
    found: set[str] = set()
    written: list[str] = []
    in_flight: tuple[str, ...] = ()
    keys = list(grants)
    try:
        with retagger.transaction():
            for page in retagger.pages(selection, size):
                matched += len(page)
                if selection.document_ids is not None:
                    found.update(str(stored.metadata.get(selection.document_id_key)) for stored in page)
                else:
                    found.update(stored.node_id for stored in page)
                updates = [update for stored in page if (update := retagged(stored, grants)) is not None]
                if not updates:
                    continue
                in_flight = tuple(update.node_id for update in updates)
                retagger.write(updates, keys)
                written.extend(in_flight)
                in_flight = ()
    except Exception as error:
        done, uncertain = ((), ()) if retagger.atomic else (tuple(written), in_flight)
        raise RetagIncompleteError(retagger.name, written=done, uncertain=uncertain, cause=error) from error
    missing = tuple(item for item in selection.asked if item not in found)
    return RetagResult(
        matched=matched, changed=len(written), written=tuple(written), missing=missing, atomic=retagger.atomic
    )
