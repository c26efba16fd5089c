"""Whether a store's short answer holds everything its filter admits: the store says so, widening reads it.

A store asked for ``k`` rows that returns fewer may hold no more (an exact read: every admitted
row was ranked), or may have stopped early: an HNSW scan under a filter stops on its tuple or
memory budget (pgvector's ``hnsw.max_scan_tuples``), and a filtered HNSW search in Milvus can
return fewer than its ``limit`` while more rows match. Read as "the store holds no more", such an
answer silently leaves the caller short. So a store that knows reports it while it answers:

- :func:`report_complete` — called by the store inside its query (``True``: the answer holds every
  admitted row up to the limit, as an exact read does; ``False``: it may hold more). Several
  reports in one round (a hybrid query's two searches) are complete only when all are.
- :func:`listening` — the retriever's side: one :class:`StoreAnswer` per round, bound in a
  ``ContextVar`` so the report reaches it from the store's sync, async or worker-thread path
  (``retrieve_in_thread`` copies the context, and the answer object with it).

A store that says nothing is read by its adapter's :attr:`~llama_jev.stores.Pushdown.short_is_complete`
(``True`` for stores that rank every admitted row, as before; ``False`` for Milvus, whose HNSW
may stop short).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["StoreAnswer", "listening", "report_complete"]


@dataclass
class StoreAnswer:
    """What the store said of one round's answer.

    Attributes:
        complete: ``True``: the answer holds every row the store's filter admits, up to the limit
            asked; ``False``: the store may hold more (its scan stopped on a budget); ``None``: it
            said nothing.
    """

    complete: bool | None = None

    def reads_complete(self, default: bool) -> bool:
        """Whether a short answer is complete: what the store said, else ``default`` (its adapter's rule)."""
        return default if self.complete is None else self.complete


_ANSWER: ContextVar[StoreAnswer | None] = ContextVar("llama_jev_store_answer", default=None)


def report_complete(complete: bool) -> None:
    """Say, from inside a store's query, whether its answer holds every admitted row up to the limit.

    A no-op when no retriever listens (a store used on its own). Reports of one round combine
    with AND: a round is complete only when each of its searches is.

    Example::

        rows = run_exact_read(...)
        report_complete(True)   # every admitted row was ranked
    """
    answer = _ANSWER.get()
    if answer is not None:
        answer.complete = complete if answer.complete is None else (answer.complete and complete)


@contextlib.contextmanager
def listening() -> Iterator[StoreAnswer]:
    """One round's :class:`StoreAnswer`, bound for the store call made inside the block."""
    answer = StoreAnswer()
    token = _ANSWER.set(answer)
    try:
        yield answer
    finally:
        _ANSWER.reset(token)
