"""Warnings that turn a silent ACL misconfiguration into a log line, each said once.

A ``MetadataAcl`` that names a key the data spells differently (``is_public`` for ``public``,
even beside a right ``roles_key``), or a caller bound without a tenant, denies silently: the
result is ``[]`` or lacks what a grant should have given, exactly like "the knowledge base has no
answer". These checks notice the pattern and log one WARNING on the ``llama_jev`` logger per
distinct cause (per set of absent keys, per tenant key, per unreadable value type) and per
retriever or postprocessor (each passes its own ``seen`` set), never per query. Which keys a
whole store lacks is asked of the store (``llama_jev.stores``); these functions word the answer.
They name keys and counts only, never metadata values, node text or query text.

An engine (``CerbosAcl``, ``SpiceDBAcl``) denies silently too when it is asked about names its
policy or schema lacks, or about ids it holds no grant for: :func:`warn_engine_denied_all` says so
once per ACL object (the engine lists its likely causes, by option name, in ``denial_causes``),
and :func:`warn_engine_once` carries an engine's own once-per-ACL warnings.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llama_jev.acl.rules import MetadataAcl, _is_public, _string_set
from llama_jev.core.context import RuntimeContext

__all__ = [
    "absent_keys",
    "diagnose_denials",
    "malformed_values",
    "nothing_to_diagnose",
    "warn_engine_denied_all",
    "warn_engine_matched_nothing",
    "warn_engine_once",
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
# What each engine ACL object has already been warned about: weak, so an ACL's record goes with it.
_ENGINE_SEEN: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


def _warn_once(cause: tuple[str, ...], message: str, *args: object, seen: set[tuple[str, ...]]) -> None:
    # Once per cause *per owner* (the retriever or postprocessor passing ``seen``): a process-wide
    # set would stay silent for every later retriever with the same mistake, such as a new one
    # built with a corrected tenant but the same misspelled key.
    with _LOCK:
        if cause in seen:
            return
        seen.add(cause)
    logger.warning(message, *args, extra={"jev_cause": cause})


def absent_keys(acl: MetadataAcl, metadatas: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The configured keys that not one of ``metadatas`` holds (absent or ``None``), in ``acl.keys`` order.

    Every such key is reported, whichever other keys are present: a misspelled public flag
    (``is_public`` for ``public``) grants nothing even when the roles key is right, and the
    callers who should have read through it get ``[]`` without a word.

    Example::

        >>> acl = MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="is_public")
        >>> absent_keys(acl, [{"tenant": "acme", "public": "true"}, {"tenant": "acme", "roles": ["support"]}])
        ('is_public',)
    """
    missing = set(acl.keys)
    for metadata in metadatas:
        missing -= {key for key in missing if metadata.get(key) is not None}
        if not missing:
            break
    return tuple(key for key in acl.keys if key in missing)


def _consequence(acl: MetadataAcl, missing: set[str]) -> str:
    """What the absence of ``missing`` does, in words: the tenant or every grant denies all; one grant, its share."""
    grants = [key for key in (acl.users_key, acl.roles_key, acl.public_key) if key is not None]
    if acl.tenant_key in missing:
        return "no node has a tenant, so every node is denied to every caller"
    if set(grants) <= missing:
        return "no grant can succeed, so every node is denied to every caller"
    absent = [key for key in grants if key in missing]
    verb = "grants" if len(absent) == 1 else "grant"
    return (
        f"{', '.join(repr(key) for key in absent)} {verb} nothing: a node readable only through "
        f"{'it' if len(absent) == 1 else 'them'} is denied to every caller"
    )


def warn_keys_absent(
    acl: MetadataAcl,
    missing: Sequence[str],
    where: str,
    present: Iterable[str] = (),
    *,
    seen: set[tuple[str, ...]],
) -> None:
    """Log, once per key set (per ``seen``), that no node in ``where`` holds the configured ``missing`` keys.

    Names keys only: the configured ones, and (``present``) the metadata keys the nodes do hold,
    so a misspelling stands next to its right spelling. Never a value.
    """
    shown = sorted({key for key in present if not key.startswith("_") and key not in _INTERNAL_KEYS})[:_MAX_KEYS_SHOWN]
    _warn_once(
        ("missing", *sorted(missing)),
        "MetadataAcl: not one of %s holds the configured metadata key(s) %s, so %s; check the key names%s, "
        "or drop from MetadataAcl a grant key the data does not use",
        where,
        ", ".join(repr(key) for key in missing),
        _consequence(acl, set(missing)),
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


def warn_malformed(acl: MetadataAcl, metadatas: Iterable[Mapping[str, Any]], *, seen: set[tuple[str, ...]]) -> None:
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
    store_checked: bool = False,
) -> None:
    """Warn when ``acl`` denies for a configuration reason: no tenant, unreadable values, absent keys.

    ``metadatas`` are the retrieved nodes' metadata; ``authorized`` how many the ACL let through;
    ``seen`` the caller's record of warnings already given. ``store_checked``: the whole store was
    already asked which configured keys it lacks (see ``llama_jev.stores``), so the returned
    nodes, a sample of it, are not asked again. Otherwise, when the ACL denied one of them, a
    configured key none of them holds is named.
    """
    if nothing_to_diagnose(acl, ctx, len(metadatas), authorized):
        return
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
    if store_checked or authorized == len(metadatas):
        return
    missing = absent_keys(acl, metadatas)
    if missing:
        where = f"the {len(metadatas)} nodes the retriever returned (its store cannot be asked for every key)"
        warn_keys_absent(acl, missing, where, (key for metadata in metadatas for key in metadata), seen=seen)


def nothing_to_diagnose(acl: MetadataAcl, ctx: RuntimeContext, retrieved: int, authorized: int) -> bool:
    """Whether :func:`diagnose_denials` has nothing to say: every node passed and the caller has the tenant checked.

    A caller checks this before gathering the nodes' metadata for :func:`diagnose_denials`: on
    the usual retrieval (nothing denied) that gathering was a visit to every node for nothing.
    """
    return retrieved == authorized and not (acl.tenant_key is not None and ctx.tenant_id is None)


def warn_engine_once(acl: object, cause: str, message: str, *args: object) -> None:
    """Log ``message`` once per ``acl`` object and ``cause`` (a new ACL, corrected or not, is told again).

    For an engine's configuration warnings; ``message`` names options and counts, never an id or value.
    """
    with _LOCK:
        seen = _ENGINE_SEEN.setdefault(acl, set())
        if cause in seen:
            return
        seen.add(cause)
    logger.warning(message, *args, extra={"jev_cause": ("engine", cause)})


def warn_engine_denied_all(acl: object, asked: int, allowed: int) -> None:
    """Warn once per ACL when its engine denied every one of ``asked`` nodes (``allowed`` is 0).

    An engine asked about a resource kind, action or definition its policy or schema lacks, or
    about ids it holds no grant for (node ids where grants name documents), denies everything
    and ``[]`` reads like "no answer in the knowledge base". The ACL's ``denial_causes`` names
    what to check (option names); an ACL without one (``MetadataAcl``, a callable) is not told
    here: ``MetadataAcl`` has the key checks above.

    Example::

        >>> class Engine:
        ...     engine = "example"
        ...     denial_causes = "resource_kind and action (names the policy has)"
        >>> warn_engine_denied_all(Engine(), asked=3, allowed=0)   # logs one WARNING
    """
    if allowed or asked < 1:  # the usual case, decided before anything else is looked at
        return
    causes = getattr(acl, "denial_causes", None)
    if not isinstance(causes, str):
        return
    warn_engine_once(
        acl,
        "denied-all",
        "%s: the engine denied every node of %d; if this caller should read some of them, check %s",
        type(acl).__name__,
        asked,
        causes,
    )


def warn_engine_matched_nothing(acl: object, restriction: str) -> None:
    """Warn once per ACL when the store found no node at all under the engine's pushed-down ``restriction``.

    The engine permits something (an allow-list of documents, a condition), yet not one node of
    the store matches it: most often the ids or keys it names are not where the nodes keep them
    (``document_id_key``), so every caller gets ``[]`` without a denial to count. Said only for
    an ACL with ``denial_causes`` (an engine), naming options, never ids or values.
    """
    causes = getattr(acl, "denial_causes", None)
    if not isinstance(causes, str):
        return
    warn_engine_once(
        acl,
        "matched-nothing",
        "%s: the store holds no node matching the engine's pre-selection (%s), so the answer is []; if this "
        "caller should read some of them, check %s",
        type(acl).__name__,
        "an allow-list of document ids" if restriction == "ids" else f"a {restriction} restriction",
        causes,
    )
