"""``GovernorStats``: a snapshot of a governor, what ``JevClient.stats`` returns."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GovernorStats"]


@dataclass(frozen=True)
class GovernorStats:
    """A snapshot of a :class:`Governor` (``JevClient.stats``).

    Attributes:
        limit: requests currently allowed in flight (adapts between ``min_limit`` and ``max_limit``).
        min_limit / max_limit: the bounds of ``limit``.
        in_flight: requests admitted and not yet answered.
        queued: requests waiting for admission.
        paused_for: seconds until a ``Retry-After`` pause ends (0.0: not paused).
        admitted: requests admitted since the client was created.
        rate_limited / overloaded: 429 / 529 answers received.
        queue_timeouts: requests that gave up waiting because their deadline came first.
        queue_wait_seconds: total time requests spent waiting for admission.
        max_queue_wait_seconds: the longest single wait.
        timed_out: attempts that timed out (congestion, as a 429).
        ceiling: the most in flight the server has been seen to take (``max_limit`` until it pushes back).
    """

    limit: int
    min_limit: int
    max_limit: int
    in_flight: int
    queued: int
    paused_for: float
    admitted: int
    rate_limited: int
    overloaded: int
    queue_timeouts: int
    queue_wait_seconds: float
    max_queue_wait_seconds: float
    timed_out: int = 0
    ceiling: int = 0
