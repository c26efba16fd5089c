"""Warnings that turn a silent ACL misconfiguration into a log line, each said once.

A ``MetadataAcl`` that names a key the data spells differently, or a caller bound without a
tenant, denies everything: the result is ``[]``, exactly like "the knowledge base has no
answer". These checks notice the pattern and log one WARNING on the ``llama_jev`` logger per
distinct cause (per set of missing keys, per tenant key) and per retriever or postprocessor
(each passes its own ``seen`` set), never per query. They name keys and counts only, never
metadata values, node text or query text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llama_jev.acl.rules import MetadataAcl, _is_public, _string_set
from llama_jev.core.context import RuntimeContext

__all__ = [
    "diagnose_denials",
    "explaining_denial",
    "malformed_values",
    "missing_everywhere",
    "warn_keys_absent",
    "warn_malformed",
]

# The package's one logger, where DESIGN says its warnings go (a handler on "llama_jev" sees them
# whatever it filters on); ``extra["jev_cause"]`` tells these apart.
logger = logging.getLogger("llama_jev")

_LOCK = threading.Lock()
_MAX_KEYS_SHOWN = 20
# Keys LlamaIndex itself adds to stored metadata: naming them would only hide the user's keys.
_INTERNAL_KEYS = frozenset({"doc_id", "document_id", "ref_doc_id"})


def _warn_once(cause: tuple[str, ...], message: str, *args: object, seen: set[tuple[str, ...]]) -> None:
    # Once per cause *per owner* (the retriever or postprocessor passing ``seen``): a process-wide
    # set would stay silent for every later retriever with the same mistake, such as a new one
    # built with a corrected tenant but the same misspelled key.
    with _LOCK:
        if cause in seen:
            return
        seen.add(cause)
    logger.warning(message, *args, extra={"jev_cause": cause})


def missing_everywhere(acl: MetadataAcl, metadatas: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The configured keys whose absence from every one of ``metadatas`` denies them all.

    The tenant key when no node holds it; the grant keys (users, roles, public) only when no node
    holds any of them. A grant key a node lacks simply grants nothing, so data that uses users
    lists but no roles or public flag is a legitimate schema, not a misconfiguration.
    """
    missing = set(acl.keys)
    for metadata in metadatas:
        missing -= {key for key in missing if metadata.get(key) is not None}
        if not missing:
            break
    return explaining_denial(acl, missing)


def explaining_denial(acl: MetadataAcl, absent: Iterable[str]) -> tuple[str, ...]:
    """Of the configured keys ``absent`` from every node, those that make every node unreadable."""
    absent = set(absent)
    grant_keys = {key for key in (acl.users_key, acl.roles_key, acl.public_key) if key is not None}
    if not grant_keys <= absent:
        absent -= grant_keys
    return tuple(key for key in acl.keys if key in absent)


def warn_keys_absent(
    missing: Sequence[str], where: str, present: Iterable[str] = (), *, seen: set[tuple[str, ...]]
) -> None:
    """Log, once per key set (per ``seen``), that no node in ``where`` holds ``missing``, so the ACL denies them all."""
    shown = sorted({key for key in present if not key.startswith("_") and key not in _INTERNAL_KEYS})[:_MAX_KEYS_SHOWN]
    _warn_once(
        ("missing", *sorted(missing)),
        "MetadataAcl denied every node: not one of %s holds the configured metadata key(s) %s, so no caller "
        "can read them; check the key names%s",
        where,
        ", ".join(repr(key) for key in sorted(missing)),
        f" (the nodes' metadata keys: {', '.join(repr(key) for key in shown)})" if shown else "",
        seen=seen,
    )


def _plainly_not_public(flag: Any) -> bool:
    # False, "false" and 0 say "not public"; anything else that is not public ("yes", "True",
    # 1.0) is a value the ACL cannot read, and is said so rather than silently not granting.
    return flag is False or (isinstance(flag, str) and flag == "false") or (type(flag) is int and flag == 0)


def _type_name(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        inner = sorted({type(item).__name__ for item in value if not isinstance(item, str)})
        return f"{type(value).__name__} holding {'/'.join(inner)}" if inner else type(value).__name__
    return type(value).__name__


def malformed_values(acl: MetadataAcl, metadata: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, type name)`` for each configured key whose value the ACL cannot read.

    A non-string tenant and a users / roles value that is not a string or a list of strings deny
    the node; a public flag other than ``"true"``, ``1``, ``True`` or a plain "no" (``False``,
    ``"false"``, ``0``) counts as not public. Names types only, never values.
    """
    found: list[tuple[str, str]] = []
    if acl.tenant_key is not None:
        tenant = metadata.get(acl.tenant_key)
        if tenant is not None and not isinstance(tenant, str):
            found.append((acl.tenant_key, _type_name(tenant)))
    for key in (acl.users_key, acl.roles_key):
        if key is not None and metadata.get(key) is not None and _string_set(metadata[key]) is None:
            found.append((key, _type_name(metadata[key])))
    if acl.public_key is not None:
        flag = metadata.get(acl.public_key)
        if flag is not None and not _is_public(flag) and not _plainly_not_public(flag):
            found.append((acl.public_key, _type_name(flag)))
    return found


def warn_malformed(
    acl: MetadataAcl, metadatas: Iterable[Mapping[str, Any]], *, seen: set[tuple[str, ...]]
) -> None:
    """Log, once per key and value type (per ``seen``), ACL values that deny or fail to grant.

    The design's promise: a value the ACL cannot read is never a *silent* denial.
    """
    for metadata in metadatas:
        for key, type_name in malformed_values(acl, metadata):
            if key == acl.public_key:
                _warn_once(
                    ("malformed", key, type_name),
                    "MetadataAcl cannot read the public flag %r: a node holds a value of type %s that is neither "
                    "public (the string 'true', the int 1 or True) nor a plain no (False, 'false', 0), so it "
                    "is treated as not public; store one of those values",
                    key,
                    type_name,
                    seen=seen,
                )
            else:
                _warn_once(
                    ("malformed", key, type_name),
                    "MetadataAcl denied a node whose metadata key %r holds a value of type %s, which the ACL cannot "
                    "read (a tenant must be a string; users and roles a string or a list of strings); fix "
                    "the data: no value is guessed",
                    key,
                    type_name,
                    seen=seen,
                )


def diagnose_denials(
    acl: MetadataAcl,
    ctx: RuntimeContext,
    metadatas: Sequence[Mapping[str, Any]],
    authorized: int,
    *,
    seen: set[tuple[str, ...]],
) -> None:
    """Warn when ``acl`` denies for a configuration reason: no tenant, or keys absent from every node.

    ``metadatas`` are the retrieved nodes' metadata; ``authorized`` how many the ACL let through;
    ``seen`` the caller's record of warnings already given.
    """
    if len(metadatas) > authorized:
        warn_malformed(acl, metadatas, seen=seen)
    if acl.tenant_key is not None and ctx.tenant_id is None:
        _warn_once(
            ("no-tenant", acl.tenant_key),
            "MetadataAcl checks tenant_key %r but the caller's RuntimeContext has no tenant_id, so every "
            "node is denied; set tenant_id when binding the identity",
            acl.tenant_key,
            seen=seen,
        )
        return
    if not metadatas or authorized:
        return
    missing = missing_everywhere(acl, metadatas)
    if missing:
        where = f"the {len(metadatas)} retrieved nodes"
        warn_keys_absent(missing, where, (key for metadata in metadatas for key in metadata), seen=seen)
