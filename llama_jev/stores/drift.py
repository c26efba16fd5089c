"""Drift: the grants a store holds against a source of truth, node by node, page by page.

What is compared is **who may read** each node, not the bytes of its metadata: ``["u1", "u2"]``
and ``["u2", "u1"]`` are no drift, while a stored public flag the source does not set is. For
a ``MetadataAcl`` the readers of a node are read with the ACL's own rules (a node with a
malformed users list, or a tenant that is not a string, is read by nobody), and two kinds of
drift are counted, each exactly:

- **would widen**: someone may read the node as stored whom the source of truth denies: a
  different tenant, a public flag the source lacks, a user or role the source does not list (and
  the source's grants are not public), or any reader where the source admits nobody.
- **would narrow**: the other way round: someone the source admits is denied as stored.

A node can be both (a different tenant; ``users: ["a"]`` stored where the source says ``["b"]``).

The source of truth is either a function from a stored node to its expected grants (a mapping
of metadata key to value, the keys the ACL reads; an absent key grants nothing), or an engine
through the ACL protocol (a ``BatchAcl``, such as ``CerbosAcl``) with the callers to ask about:
then widen / narrow are counted over those callers only, comparing the ACL's reading of the
stored grants with the engine's verdict.

The scan reads the store page by page through its re-tag writer (:mod:`llama_jev.stores.retagging`),
so memory stays bounded whatever the store's size: a sample is kept in a reservoir of its size,
and only the first ``keep`` drifted nodes are listed (every one is counted).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.schema import TextNode

from llama_jev.acl.batch import BatchAcl
from llama_jev.acl.rules import MetadataAcl, _is_public, _string_set
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.grants import NODE_CONTENT, Stored
from llama_jev.stores.retagging import retagger_for

__all__ = ["Drifted", "DriftReport", "Expected", "check_drift"]

Expected = Callable[[Stored], Mapping[str, Any]]
"""The source of truth as a function: a stored node -> the grants it should hold."""

Progress = Callable[[int, "int | None"], None]
"""Called after each page: (nodes scanned so far, nodes in the store or ``None``)."""


@dataclass(frozen=True)
class Drifted:
    """One node whose stored grants differ from the source of truth; key names only, never values.

    Attributes:
        node_id: the node.
        widens: someone may read it as stored whom the source denies.
        narrows: someone the source admits is denied as stored.
        keys: the ACL keys whose stored value differs from the expected one (function source only).
    """

    node_id: str
    widens: bool
    narrows: bool
    keys: tuple[str, ...] = ()


@dataclass
class DriftReport:
    """What a drift check found.

    Attributes:
        scanned: nodes compared.
        total: nodes in the store (``None`` when the store cannot count cheaply).
        sampled: a random sample was compared, not every node.
        widen: nodes that would widen access (stored grants admit someone the source denies).
        narrow: nodes that would narrow it.
        drifted: the first ``keep`` drifted nodes, in scan order.
    """

    scanned: int = 0
    total: int | None = None
    sampled: bool = False
    widen: int = 0
    narrow: int = 0
    drifted: list[Drifted] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """No node would widen or narrow access."""
        return self.widen == 0 and self.narrow == 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (node ids and key names; no grant value)."""
        return {
            "scanned": self.scanned,
            "total": self.total,
            "sampled": self.sampled,
            "would_widen": self.widen,
            "would_narrow": self.narrow,
            "drifted": [
                {"node_id": d.node_id, "widens": d.widens, "narrows": d.narrows, "keys": list(d.keys)}
                for d in self.drifted
            ],
        }


def check_drift(
    vector_store: Any,
    acl: MetadataAcl,
    expected: Expected | BatchAcl,
    *,
    callers: Sequence[RuntimeContext] | None = None,
    sample: int | None = None,
    seed: int | None = None,
    page_size: int = 500,
    keep: int = 1000,
    progress: Progress | None = None,
) -> DriftReport:
    """Compare who may read each node of ``vector_store`` as stored (read by ``acl``) with the source of truth.

    ``expected`` is a function ``Stored -> grants`` or an engine (``BatchAcl``) with ``callers``.
    ``sample`` compares a uniform random sample of that many nodes (still one paged pass, the
    sample held in memory); ``progress(scanned, total)`` is called after each page.

    Raises:
        TypeError: ``acl`` is not a ``MetadataAcl``, or an engine without ``callers``, or a store
            no writer speaks.
        ValueError: a non-positive ``sample``, ``page_size`` or negative ``keep``.

    Example::

        report = check_drift(store, acl, lambda node: directory.grants_of(node.metadata["ref_doc_id"]))
        if report.widen:
            ...  # re-tag those nodes now
    """
    if not isinstance(acl, MetadataAcl):
        raise TypeError(f"check_drift reads stored grants with a MetadataAcl, not {type(acl).__name__}")
    engine = expected if hasattr(expected, "allowed") else None  # an ACL-protocol engine, else a function
    if engine is not None and not callers:
        raise TypeError("an engine as the source of truth needs callers=[RuntimeContext(...), ...] to ask about")
    for name, value, least in (("page_size", page_size, 1), ("keep", keep, 0), ("sample", sample or 1, 1)):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, not {value!r}")
    writer = retagger_for(vector_store)
    report = DriftReport(total=writer.count(), sampled=sample is not None)
    pages: Iterator[list[Stored]] = writer.scan(page_size)
    if sample is not None:
        pages = _reservoir(pages, sample, random.Random(seed), report, progress)  # noqa: S311  # a sample, not a secret
    for page in pages:
        if engine is not None:
            found = _engine_drift(acl, engine, list(callers or ()), page)  # type: ignore[arg-type]
        else:
            found = [_function_drift(acl, expected, stored) for stored in page]  # type: ignore[arg-type]
        for drifted in found:
            if drifted is None:
                continue
            report.widen += drifted.widens
            report.narrow += drifted.narrows
            if len(report.drifted) < keep:
                report.drifted.append(drifted)
        if sample is None:
            report.scanned += len(page)
            if progress is not None:
                progress(report.scanned, report.total)
    return report


def _reservoir(
    pages: Iterator[list[Stored]], size: int, rng: random.Random, report: DriftReport, progress: Progress | None
) -> Iterator[list[Stored]]:
    """A uniform sample of ``size`` nodes from one pass (Algorithm R), then yielded page by page."""
    kept: list[Stored] = []
    seen = 0
    for page in pages:
        for stored in page:
            seen += 1
            if len(kept) < size:
                kept.append(stored)
            elif (slot := rng.randrange(seen)) < size:
                kept[slot] = stored
        if progress is not None:
            progress(seen, report.total)
    report.scanned = len(kept)
    for start in range(0, len(kept), 500):
        yield kept[start : start + 500]


@dataclass(frozen=True)
class _Readers:
    """Who may read a node under a ``MetadataAcl``: everyone of ``tenant``, or the users and roles listed."""

    tenant: str | None
    everyone: bool
    users: frozenset[str]
    roles: frozenset[str]


def _readers(acl: MetadataAcl, metadata: Mapping[str, Any]) -> _Readers | None:
    """The readers ``acl.allows`` admits for ``metadata``, as sets; ``None``: nobody (the same rules)."""
    tenant = None
    if acl.tenant_key is not None:
        tenant = metadata.get(acl.tenant_key)
        if not isinstance(tenant, str):
            return None
    grant_keys = (acl.users_key, acl.roles_key, acl.public_key)
    if all(key is None for key in grant_keys):
        return _Readers(tenant, True, frozenset(), frozenset())
    listed: list[frozenset[str]] = []
    for key in (acl.users_key, acl.roles_key):
        value = None if key is None else metadata.get(key)
        found = frozenset() if value is None else _string_set(value)
        if found is None:
            return None  # malformed: the ACL denies the node whatever else it holds
        listed.append(found)
    public = acl.public_key is not None and _is_public(metadata.get(acl.public_key))
    if not (public or listed[0] or listed[1]):
        return None
    return _Readers(tenant, public, listed[0], listed[1])


def _admits_beyond(wide: _Readers | None, narrow: _Readers | None) -> bool:
    """Someone ``wide`` admits whom ``narrow`` does not (exact over every possible caller)."""
    if wide is None:
        return False
    if narrow is None or wide.tenant != narrow.tenant:
        return True
    if narrow.everyone:
        return False
    return wide.everyone or bool(wide.users - narrow.users) or bool(wide.roles - narrow.roles)


def _function_drift(acl: MetadataAcl, expected: Expected, stored: Stored) -> Drifted | None:
    want = expected(stored)
    if not isinstance(want, Mapping):
        raise TypeError(f"the expected-grants function returned {type(want).__name__} for a node, not a mapping")
    have, should = _readers(acl, stored.metadata), _readers(acl, want)
    widens, narrows = _admits_beyond(have, should), _admits_beyond(should, have)
    if not (widens or narrows):
        return None
    keys = tuple(key for key in acl.keys if stored.metadata.get(key) != want.get(key))
    return Drifted(stored.node_id, widens, narrows, keys)


def _engine_drift(
    acl: MetadataAcl, engine: BatchAcl, callers: Sequence[RuntimeContext], page: Sequence[Stored]
) -> list[Drifted | None]:
    nodes = [
        TextNode(id_=stored.node_id, metadata={k: v for k, v in stored.metadata.items() if k != NODE_CONTENT})
        for stored in page
    ]
    widens: set[str] = set()
    narrows: set[str] = set()
    for ctx in callers:
        as_stored = {stored.node_id for stored in page if acl.allows(ctx, stored.metadata)}
        truth = engine.allowed(ctx, nodes)
        widens |= as_stored - truth
        narrows |= truth - as_stored
    return [
        Drifted(stored.node_id, stored.node_id in widens, stored.node_id in narrows)
        if stored.node_id in widens or stored.node_id in narrows
        else None
        for stored in page
    ]
