"""Over an exact (FLAT) Milvus index: cheaper filters searched first, their nearest rows checked by the ACL's rule.

Split from :mod:`llama_jev.stores.milvus_answer` by job: this is the plan, that the query side.

Over a FLAT index a filter's cost is its comparisons over every row of the collection. On Milvus
Lite 2.5, over 100,000 rows written by LlamaIndex (384-d), an unfiltered search took 13 ms and
each comparison on a key of the dynamic field about 17 ms more (the row's JSON is parsed per
comparison), and an ``or`` of grants was evaluated in full over every row even under an ``and``
whose first term kept few: a ``MetadataAcl`` with users, roles and a public flag cost 4-5x the
unfiltered search. So the store is first asked with filters that admit every row the exact
expression admits and cost less (:class:`Probes`, cheapest first: no ACL filter at all, then the
``and``'s cheap terms such as the tenant's ``==``), for the nearest :func:`probe_window` rows, and
each row is checked here by the ACL's own rule (:func:`~llama_jev.acl.evaluate`). The index is
exact, so when k of them pass they are the exact top k; when fewer rows came back than were
asked, every row the filter admits was read. Otherwise the next filter, and last the exact
expression, is searched. :class:`ProbeHistory` remembers where each restriction was answered, so
a caller the cheap filters serve badly is not charged every search on every query.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any

from llama_jev.stores import completeness

__all__ = ["SEARCH_LIMIT", "ProbeHistory", "Probes", "probe_window", "probing"]

# Milvus refuses a search for more rows than this ("invalid parameter").
SEARCH_LIMIT = 16_384


def probe_window(k: int) -> int:
    """How many of a cheaper filter's nearest rows are read and checked for a query of ``k``.

    4k (at least 40): a caller reading half the rows finds k among them with room to spare; at
    most what Milvus searches for (:data:`SEARCH_LIMIT`).
    """
    return min(SEARCH_LIMIT, max(40, 4 * k))


class ProbeHistory:
    """Per restriction, which search answered it last (bounded; one per retriever).

    A restriction answered by the n-th search starts there next time, and from the cheapest again
    every :attr:`RETRY` queries (the data or the caller's grants may have changed). Only the cost
    depends on it: every search gives the same exact top k.
    """

    RETRY = 10
    SIZE = 1024

    def __init__(self) -> None:
        self._answered: dict[str, tuple[int, int]] = {}  # key -> (the search that answered, queries since)
        # A retriever over Milvus Lite answers aretrieve in worker threads: one history, many threads.
        self._lock = threading.Lock()

    def start(self, key: str) -> int:
        """The search to start from for ``key`` (0: the cheapest)."""
        with self._lock:
            known = self._answered.get(key)
            if known is None:
                return 0
            level, since = known
            self._answered[key] = (level, since + 1)
            return 0 if (since + 1) % self.RETRY == 0 else level

    def record(self, key: str, level: int) -> None:
        """``key`` was answered by search ``level``."""
        with self._lock:
            self._answered.pop(key, None)
            if level == 0:
                return  # the default: nothing to remember
            self._answered[key] = (level, 0)
            if len(self._answered) > self.SIZE:
                del self._answered[next(iter(self._answered))]  # the oldest recorded


@dataclasses.dataclass(frozen=True)
class Probes:
    """Filters that admit every row the exact expression admits, cheapest first, and the exact rule.

    ``expressions``: each a Milvus expression (``""``: no filter); ``admits(node_id, metadata)``:
    the ACL's rule; ``history`` and ``key`` (the exact expression): where it was answered before.
    """

    expressions: tuple[str, ...]
    admits: Callable[[str, Mapping[str, Any]], bool]
    history: ProbeHistory
    key: str


def probing(probes: Probes, query: Any) -> Generator[tuple[Any, str], Any, Any]:
    """The searches to make, as ``(query, expression)``; sent each result; returns the answer, or ``None``.

    ``None``: no cheaper filter answered, so the caller searches the exact expression. One
    implementation for the store's ``query`` and ``aquery`` (they differ only in how they ask).
    """
    window = dataclasses.replace(query, similarity_top_k=probe_window(query.similarity_top_k))
    start = probes.history.start(probes.key)
    for level in range(start, len(probes.expressions)):
        result = yield window, probes.expressions[level]
        found = _answer(probes, result, query.similarity_top_k, window.similarity_top_k)
        if found is not None:
            probes.history.record(probes.key, level)
            return found
    probes.history.record(probes.key, len(probes.expressions))
    return None


def _answer(probes: Probes, result: Any, k: int, window: int) -> Any:
    """The rows of ``result`` the rule admits, when they answer a query of ``k``; else ``None``."""
    from llama_index.core.vector_stores.types import VectorStoreQueryResult

    nodes = list(result.nodes or [])
    admitted = [i for i, node in enumerate(nodes) if probes.admits(node.node_id, node.metadata)]
    if len(admitted) < k and len(nodes) >= window:
        return None  # too few passed, and the filter admits rows not read
    kept = admitted[:k]
    completeness.report_complete(True)  # the nearest admitted rows, or every one there is
    similarities, ids = result.similarities or [], result.ids or [node.node_id for node in nodes]
    return VectorStoreQueryResult(
        nodes=[nodes[i] for i in kept],
        similarities=[similarities[i] for i in kept] if similarities else None,
        ids=[ids[i] for i in kept],
    )
