"""Warnings that turn a silent ACL misconfiguration into a log line, each said once.

A ``MetadataAcl`` that names a key the data spells differently, or a caller bound without a
tenant, denies everything: the result is ``[]``, exactly like "the knowledge base has no
answer". These checks notice the pattern and log one WARNING on the ``llama_jev.acl`` logger per
distinct cause (per set of missing keys, per tenant key), never per query. They name keys and
counts only, never metadata values, node text or query text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llama_jev.acl import MetadataAcl
from llama_jev.context import RuntimeContext

__all__ = ["diagnose_denials", "missing_everywhere", "reset_warnings", "warn_keys_absent"]

logger = logging.getLogger("llama_jev.acl")

_WARNED: set[tuple[str, ...]] = set()
_LOCK = threading.Lock()
_MAX_KEYS_SHOWN = 20
# Keys LlamaIndex itself adds to stored metadata: naming them would only hide the user's keys.
_INTERNAL_KEYS = frozenset({"doc_id", "document_id", "ref_doc_id"})


def reset_warnings() -> None:
    """Forget which warnings were given, so each is logged again once (for tests)."""
    with _LOCK:
        _WARNED.clear()


def _warn_once(cause: tuple[str, ...], message: str, *args: object) -> None:
    with _LOCK:
        if cause in _WARNED:
            return
        _WARNED.add(cause)
    logger.warning(message, *args, extra={"jev_cause": cause})


def missing_everywhere(acl: MetadataAcl, metadatas: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The configured keys that no one of ``metadatas`` holds (absent or ``None`` in every one)."""
    missing = set(acl.keys)
    for metadata in metadatas:
        missing -= {key for key in missing if metadata.get(key) is not None}
        if not missing:
            break
    return tuple(key for key in acl.keys if key in missing)


def warn_keys_absent(missing: Sequence[str], where: str, present: Iterable[str] = ()) -> None:
    """Log, once per key set, that no node in ``where`` holds ``missing``, so the ACL denies them all."""
    shown = sorted({key for key in present if not key.startswith("_") and key not in _INTERNAL_KEYS})[:_MAX_KEYS_SHOWN]
    _warn_once(
        ("missing", *sorted(missing)),
        "MetadataAcl denied every node: not one of %s holds the configured metadata key(s) %s, so no caller "
        "can read them; check the key names%s",
        where,
        ", ".join(repr(key) for key in sorted(missing)),
        f" (the nodes' metadata keys: {', '.join(repr(key) for key in shown)})" if shown else "",
    )


def diagnose_denials(
    acl: MetadataAcl, ctx: RuntimeContext, metadatas: Sequence[Mapping[str, Any]], authorized: int
) -> None:
    """Warn when ``acl`` denies for a configuration reason: no tenant, or keys absent from every node.

    ``metadatas`` are the retrieved nodes' metadata; ``authorized`` how many the ACL let through.
    """
    if acl.tenant_key is not None and ctx.tenant_id is None:
        _warn_once(
            ("no-tenant", acl.tenant_key),
            "MetadataAcl checks tenant_key %r but the caller's RuntimeContext has no tenant_id, so every "
            "node is denied; set tenant_id when binding the identity",
            acl.tenant_key,
        )
        return
    if not metadatas or authorized:
        return
    missing = missing_everywhere(acl, metadatas)
    if missing:
        where = f"the {len(metadatas)} retrieved nodes"
        warn_keys_absent(missing, where, (key for metadata in metadatas for key in metadata))
