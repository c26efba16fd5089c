"""The passages an agent run's ``search_knowledge`` calls returned, collected per run.

The tool adds what it returns to the collector bound in the current context; the reviewed agent
binds a fresh collector around each ``run()``. A ``ContextVar`` follows the run's asyncio tasks
(and threads started with a copy of the context), so two concurrent runs, each with its own
collector, never see each other's evidence.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from llama_index.core.schema import NodeWithScore

__all__ = ["EvidenceCollector", "collect_evidence", "current_evidence_collector", "record_evidence"]


class EvidenceCollector:
    """The nodes knowledge tools returned within one scope, first occurrence of each node id kept.

    Example:
        >>> with collect_evidence() as evidence:
        ...     handler = agent.run(user_msg="What are the refund conditions?")  # doctest: +SKIP
        >>> evidence.nodes  # doctest: +SKIP
    """

    def __init__(self, parent: EvidenceCollector | None = None) -> None:
        self._parent = parent
        # Parallel tool calls of one run may add from several threads at once.
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeWithScore] = {}

    def add(self, nodes: Sequence[NodeWithScore]) -> None:
        """Add ``nodes`` (what a tool returned); an enclosing collector receives them too."""
        with self._lock:
            for node in nodes:
                self._nodes.setdefault(node.node.node_id, node)
        if self._parent is not None:
            self._parent.add(nodes)

    @property
    def nodes(self) -> list[NodeWithScore]:
        """The collected nodes, in the order they were first returned."""
        with self._lock:
            return list(self._nodes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)

    def __repr__(self) -> str:
        return f"EvidenceCollector(nodes={len(self)})"


_COLLECTOR: ContextVar[EvidenceCollector | None] = ContextVar("llama_jev_evidence", default=None)


def current_evidence_collector() -> EvidenceCollector | None:
    """The collector bound in this context, if any."""
    return _COLLECTOR.get()


@contextmanager
def collect_evidence() -> Iterator[EvidenceCollector]:
    """Bind a fresh collector for the block; knowledge tools called inside it add to it.

    Bind it before an agent's ``run()`` starts: the run's tasks copy the context when created.
    A collector bound inside another also feeds the outer one.
    """
    collector = EvidenceCollector(parent=_COLLECTOR.get())
    token = _COLLECTOR.set(collector)
    try:
        yield collector
    finally:
        _COLLECTOR.reset(token)


def record_evidence(nodes: Sequence[NodeWithScore]) -> None:
    """Add ``nodes`` to the bound collector; without one, nothing happens."""
    collector = _COLLECTOR.get()
    if collector is not None:
        collector.add(nodes)
