"""Admission control: at most ``max_in_flight`` requests judged at once, ``queue`` more waiting,
and an immediate refusal (429 with ``Retry-After``) beyond, so back-pressure reaches the client
instead of piling up as latency."""

from __future__ import annotations

import asyncio
from collections import deque


class Admission:
    """Counts the requests in flight and queued on one event loop.

    A request first :meth:`reserve` s a place (refused when ``max_in_flight + queue`` are taken),
    then :meth:`enter` s (waiting in arrival order for one of ``max_in_flight`` slots), and
    finally :meth:`leave` s; a reserved request that gives up (its client left) calls
    :meth:`abandon` instead of entering.
    """

    def __init__(self, max_in_flight: int, queue: int) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
        if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
            raise ValueError(f"queue must be an integer >= 0, got {queue!r}")
        self.max_in_flight = max_in_flight
        self.queue = queue
        self.in_flight = 0
        self._reserved = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        """Requests admitted (their body read) but not yet in flight: waiting for a slot."""
        return self._reserved

    def has_room(self) -> bool:
        """Whether :meth:`reserve` would succeed now (a full server refuses before reading a body)."""
        return self.in_flight + self._reserved < self.max_in_flight + self.queue

    def reserve(self) -> bool:
        """Take a place in the queue; ``False`` when the server is full (answer 429)."""
        if not self.has_room():
            return False
        self._reserved += 1
        return True

    def abandon(self) -> None:
        """Give back a reserved place that never entered."""
        self._reserved -= 1

    async def enter(self) -> None:
        """Wait for a slot (first come, first served); the reserved place becomes in flight.

        Cancelled while waiting, the place stays reserved (the caller abandons it).
        """
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._hand_on()  # the slot was handed to us as we were cancelled: pass it on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._reserved -= 1

    def leave(self) -> None:
        """Give back the slot of a request that has been answered."""
        self._hand_on()

    def _hand_on(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to the waiter: in_flight is unchanged
                return
        self.in_flight -= 1
