"""Widening: ask the store again, with a doubled window, until the final check leaves what was wanted.

The final check (the ACL's ``allowed``) may drop nodes the store returned: a pushdown looser than
the ACL, malformed metadata, an engine's verdict, or no pushdown at all. Without widening the
caller silently gets fewer than ``k``. :class:`Widening` is the logic of one query's rounds, pure
(no I/O): ``JevRetriever``'s sync and async paths run the same loop around it, each doing its own
store call and final check.

The window doubles until the count is met, the store returns fewer than asked and says that is
all it holds (``llama_jev.stores.completeness``: only a store that ranked every admitted row can
say so; an HNSW scan stopped by its budget cannot), or :data:`MAX_RECALL` candidates were recalled.
Nodes already seen are not counted twice: a later round's answer is deduplicated by node id, keeping
the store's ranking order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from llama_index.core.schema import NodeWithScore

__all__ = ["MAX_RECALL", "NO_PUSHDOWN_FACTOR", "Widening"]

MAX_RECALL = 1024
"""The most candidates one query recalls from the store, over all its rounds (the judgement's limit too)."""
NO_PUSHDOWN_FACTOR = 2
"""Without pushdown, once the final check has dropped nodes, the first window is this many times the count wanted.

Only then: a retriever whose final check has never dropped a node (one tenant, every node
readable) would fetch twice the nodes for nothing (measured: +24 points of CPU over a plain
top-20 Qdrant-local retrieval in OFF, the bar being 5)."""

# The package's logger (DESIGN names it for what a user must be told).
logger = logging.getLogger("llama_jev")


@dataclass
class Widening:
    """One query's rounds against the store.

    Args:
        wanted: how many permitted nodes the query wants (``None``: no count, one round as is).
        widen: whether the store can be asked for another ``k`` (a settable ``similarity_top_k``).
        pushdown: whether the store pre-selects for this query.
        denials_expected: without pushdown, whether the final check is expected to drop nodes (it
            did for an earlier query of this retriever): then the first window is
            :data:`NO_PUSHDOWN_FACTOR` times the count wanted.

    Example:
        >>> plan = Widening(wanted=5, widen=True, pushdown=True)
        >>> plan.next_window()
        5
    """

    wanted: int | None
    widen: bool
    pushdown: bool
    denials_expected: bool = False
    rounds: int = 0
    exhausted: bool = False
    # A round came back shorter than asked while the store did not say it holds no more.
    incomplete: bool = False
    window: int | None = None
    # Every distinct node recalled, in the store's ranking order, and the ones the final check kept.
    recalled: list[NodeWithScore] = field(default_factory=list)
    authorized: list[NodeWithScore] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)

    @property
    def bound(self) -> int:
        """The widest window: :data:`MAX_RECALL`, or the count wanted when that is larger."""
        return max(MAX_RECALL, self.wanted or 0)

    def next_window(self) -> int | None:
        """The ``k`` of the next round (``0``: ask the retriever as it is), or ``None``: done."""
        if self.rounds == 0:
            if not self.widen or self.wanted is None:
                return 0
            wider = not self.pushdown and self.denials_expected
            first = self.wanted * NO_PUSHDOWN_FACTOR if wider else self.wanted
            self.window = min(first, self.bound)
            return self.window
        if not self.widen or self.wanted is None or self.exhausted or self.window is None:
            return None
        if len(self.authorized) >= self.wanted or self.window >= self.bound:
            return None
        self.window = min(self.window * 2, self.bound)
        return self.window

    def fresh(self, returned: Sequence[NodeWithScore], complete: bool = True) -> list[NodeWithScore]:
        """What the final check has not seen of a round's answer; notes whether the store is exhausted.

        ``complete``: whether the store said (or its adapter's rule reads) that an answer shorter
        than asked holds every row it admits. Only then is a short answer "the store holds no
        more"; otherwise the next round asks again with a wider window.

        The first round's answer is taken as it is (repeated ids included, as without widening);
        a later round's keeps only nodes whose id no earlier round returned, each once.
        """
        self.rounds += 1
        short = len(returned) < self.window if self.window is not None else False
        if short and complete:
            self.exhausted = True
            self.incomplete = False
        elif short:
            self.incomplete = True
        if self.rounds == 1:
            return list(returned)
        if self.rounds == 2:  # only now needed: most queries end after one round
            self._seen.update(node.node.node_id for node in self.recalled)
        fresh = []
        for node in returned:
            node_id = node.node.node_id
            if node_id not in self._seen:
                fresh.append(node)
                self._seen.add(node_id)
        return fresh

    def add(self, fresh: Sequence[NodeWithScore], authorized: Sequence[NodeWithScore]) -> None:
        """Record a round: ``fresh`` as recalled, ``authorized`` (a subsequence of it) as kept."""
        self.recalled.extend(fresh)
        self.authorized.extend(authorized)

    def candidates(self) -> list[NodeWithScore]:
        """The permitted nodes to go on with: the first ``wanted`` when the store was widened, else all."""
        if self.widen and self.wanted is not None:
            return self.authorized[: self.wanted]
        return list(self.authorized)

    def counts(self) -> tuple[int, int]:
        """``(retrieved, denied)`` for the record: the recalled nodes up to the last candidate, and those denied.

        Nodes recalled beyond the last candidate were not needed (a wide first window); counting
        them would make ``retrieved - denied`` differ from the candidates judged.
        """
        used = len(self.candidates())
        if used == len(self.authorized):
            return len(self.recalled), len(self.recalled) - used
        # The position of the last candidate among the recalled nodes (the same objects, in order).
        candidates = {id(node) for node in self.authorized[:used]}
        seen = 0
        for position, node in enumerate(self.recalled):
            if id(node) in candidates:
                seen += 1
                if seen == used:
                    return position + 1, position + 1 - used
        return len(self.recalled), len(self.recalled) - used  # not reached: candidates come from recalled

    @property
    def dropped(self) -> int:
        """How many recalled nodes the final check dropped, over every round."""
        return len(self.recalled) - len(self.authorized)

    def shortfall(self) -> tuple[str, str] | None:
        """``(cause, message)`` when fewer than wanted were found though the store may hold more; else ``None``.

        Counts only, never an id or a value. No shortfall when the store was exhausted: then every
        permitted node it holds was found (``min(k, permitted)``).
        """
        found = len(self.candidates())
        if self.wanted is None or found >= self.wanted or self.exhausted:
            return None
        if not self.widen:
            if self.incomplete:
                return (
                    "incomplete",
                    f"the store answered {len(self.recalled)} nodes and said its search stopped before reading all "
                    f"it may hold (a filtered HNSW scan's budget), and this retriever cannot be asked for more (it "
                    f"has no settable similarity_top_k): {found} of the {self.wanted} wanted were returned",
                )
            if not self.dropped:
                return None
            return (
                "cannot-widen",
                f"the final check dropped {self.dropped} of the {len(self.recalled)} nodes the store returned, and "
                f"this retriever cannot be asked for more (it has no settable similarity_top_k): {found} of the "
                f"{self.wanted} wanted were returned",
            )
        if not self.pushdown:
            return (
                "no-pushdown",
                f"no pushdown: the store ranked nodes the caller may not read among the first {self.window}, the bound "
                f"of {self.bound:,} candidates per query was reached and {found} of the {self.wanted} wanted were "
                "found; push the ACL down (JevRetriever.from_index, or prefilter=True over a store "
                "llama_jev.stores speaks) so the store pre-selects",
            )
        if self.incomplete:
            return (
                "incomplete",
                f"the store's last answer was shorter than its window of {self.window} and the store said its "
                f"search stopped before reading all it may hold (a filtered HNSW scan's budget); the bound of "
                f"{self.bound:,} candidates per query was reached and {found} of the {self.wanted} wanted were found",
            )
        return (
            "bound",
            f"the final check dropped {self.dropped} of the {len(self.recalled)} nodes the store's pre-selection "
            f"returned (a looser store filter, malformed ACL metadata, or the engine's verdict), and the bound of "
            f"{self.bound:,} candidates per query was reached: {found} of the {self.wanted} wanted were found",
        )

    def warn(self, seen: set[tuple[str, ...]], component: str) -> None:
        """Log the shortfall at WARNING, once per retriever (``seen``) and cause."""
        shortfall = self.shortfall()
        if shortfall is None:
            return
        cause, message = shortfall
        key = ("widening", cause)
        if key in seen:
            return
        seen.add(key)
        logger.warning("%s returned fewer nodes than wanted: %s (said once per retriever)", component, message)
