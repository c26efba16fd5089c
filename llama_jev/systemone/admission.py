"""The governor's queue, one waiter at a time: a permit, a sleeping request, the timeout it gets.

A sync waiter sleeps on a ``threading.Event``, an async waiter on a future of its own loop, woken
with ``call_soon_threadsafe``, so an event loop never blocks on the governor's lock for longer
than a few dictionary operations. The governor (``governor.py``) decides who is granted; this
module only holds what a waiter is.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from llama_jev.core.errors import JevTimeoutError
from llama_jev.systemone.queue_wait import current_meter

__all__ = ["Permit", "Waiter", "queue_timeout"]


@dataclass(frozen=True)
class Permit:
    """An admitted request; hand it back to :meth:`Governor.release` exactly once."""

    epoch: int
    waited: float


class Waiter:
    """One queued request: woken by whoever grants it a slot, by a new pause (to look at its
    end), or by its own timeout. The ``granted`` flag, read under the governor's lock, is the
    truth; a wake only says "look again"."""

    __slots__ = ("event", "future", "granted", "loop", "meter", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.granted = False
        self.loop = loop
        self.started = time.monotonic()
        # The judgement this request belongs to (a contextvar, read here in the caller's context).
        self.meter = current_meter()
        if self.meter is not None:
            self.meter.begin(id(self), self.started)
        self.event: threading.Event | None = None if loop is not None else threading.Event()
        self.future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None

    def arm(self) -> None:
        """Ready the wake-up for the next sleep (with the governor's lock held, in the waiter's
        own thread or loop), so no wake given after this is lost."""
        if self.event is not None:
            self.event.clear()
        elif self.loop is not None and self.future is not None and self.future.done():
            self.future = self.loop.create_future()

    def wake(self) -> bool:
        """Wake the waiter; ``False`` when it cannot be woken (its event loop is closed)."""
        if self.event is not None:
            self.event.set()
            return True
        if self.loop is not None and self.future is not None:
            try:
                self.loop.call_soon_threadsafe(_resolve, self.future)
            except RuntimeError:
                return False
        return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def queue_timeout(paused: bool) -> JevTimeoutError:
    """The error of a request whose deadline came before its admission (``paused``: a Retry-After ends after it)."""
    why = "the server asked for a pause (Retry-After) that ends" if paused else "no request slot was free"
    return JevTimeoutError(
        f"the time budget ran out waiting for admission: {why} after the deadline "
        "(the client's requests in flight are bounded; see JevClient.stats)",
        retryable=True,
    )
