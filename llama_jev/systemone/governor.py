"""``Governor``: one bound on the requests a :class:`~llama_jev.JevClient` has in flight.

Every thread and every event loop that uses one client shares its governor. It admits a request
when fewer than ``limit`` are in flight and the server has not asked for a pause, in the order
requests asked (first in, first out); otherwise the request waits in a queue. The limit adapts
to the server (AIMD, as TCP does): halved on congestion (a 429 or 529, or an attempt that timed
out: a request the server could not answer in time is as much a "too many" as a refusal), raised
by one after a limit's worth of successes (not by answers so slow that one more request would
take them past half their timeout), always within ``[min_limit, max_limit]``. Congestion also
teaches the client what the server admits: with ``n`` requests in flight when the server pushed
back, it takes at most ``n - 1``, so the limit does not grow past that again (the ``ceiling``)
until a long run of successes suggests it has more room (one more slot per four ceilings'
worth). A ``Retry-After`` pauses every admission until it has passed. A request never waits past
its deadline: when the deadline comes first (or
the pause ends after it) the request fails at once with :class:`~llama_jev.errors.JevTimeoutError`.

The core is a lock and a queue of waiters; a sync waiter sleeps on a ``threading.Event``, an async
waiter on a future of its own loop, woken with ``call_soon_threadsafe``, so an event loop never
blocks on the lock for longer than a few dictionary operations.

Queue wait is also reported to :func:`~llama_jev.systemone.queue_wait.measure_queue_wait`, the
side channel the selector reads to fill ``DecisionRecord.queue_ms`` without changing the
:class:`~llama_jev.Judge` protocol. The waiters and permits live in ``admission.py``, the
snapshot in ``governor_stats.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import deque

from llama_jev.core.errors import JevTimeoutError
from llama_jev.systemone.admission import Permit, Waiter, queue_timeout
from llama_jev.systemone.governor_stats import GovernorStats

# GovernorStats and Permit are what the governor hands out, re-exported beside it.
__all__ = ["Governor", "GovernorStats", "Permit"]

# What the server told us by a response's status: slow down, or all is well.
_SLOW_DOWN = frozenset({429, 529})
# Successes, in ceilings' worth, before the learned ceiling lets one more request in: slower than
# the limit's own growth, since each probe past what the server admits costs a refusal or a timeout.
_CEILING_PATIENCE = 4
_SLOW_SHARE = 0.5  # the share of its timeout an answer may take with one more request beside it


class Governor:
    """Bounds and adapts the requests in flight for one client, across threads and event loops.

    Args:
        max_limit: the most requests in flight, and the starting limit.
        min_limit: the limit never drops below this on 429/529.
        max_pause: the longest ``Retry-After`` pause honoured for the whole client (a longer one
            is cut to this, so one odd header cannot stall every caller for an hour).

    Example:
        >>> governor = Governor(max_limit=4)
        >>> permit = governor.acquire(timeout=1.0)
        >>> governor.stats.in_flight
        1
        >>> governor.release(permit, status=200)
        >>> governor.stats.in_flight
        0
    """

    def __init__(self, max_limit: int = 16, *, min_limit: int = 1, max_pause: float = 30.0) -> None:
        for name, value in (("max_limit", max_limit), ("min_limit", min_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if min_limit > max_limit:
            raise ValueError(f"min_limit ({min_limit}) must not exceed max_limit ({max_limit})")
        if not isinstance(max_pause, (int, float)) or not math.isfinite(max_pause) or max_pause < 0:
            raise ValueError(f"max_pause must be a finite number of seconds >= 0, got {max_pause!r}")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.max_pause = float(max_pause)
        self._lock = threading.Lock()
        self._limit = float(max_limit)
        self._ceiling = float(max_limit)
        self._in_flight = 0
        self._waiters: deque[Waiter] = deque()
        self._paused_until = 0.0
        # A decrease applies once per generation of requests: the 16 requests that were in flight
        # together when the server said "too many" are one signal, not sixteen halvings.
        self._epoch = 0
        self._admitted = 0
        self._rate_limited = 0
        self._overloaded = 0
        self._timed_out = 0
        self._queue_timeouts = 0
        self._waited = 0.0
        self._max_waited = 0.0

    def __repr__(self) -> str:
        stats = self.stats
        return f"Governor(limit={stats.limit}, in_flight={stats.in_flight}, queued={stats.queued})"

    @property
    def limit(self) -> int:
        """Requests currently allowed in flight."""
        with self._lock:
            return int(self._limit)

    @property
    def stats(self) -> GovernorStats:
        """A consistent snapshot of the governor's state and counters."""
        with self._lock:
            return GovernorStats(
                limit=int(self._limit),
                min_limit=self.min_limit,
                max_limit=self.max_limit,
                in_flight=self._in_flight,
                queued=len(self._waiters),
                paused_for=max(0.0, self._paused_until - time.monotonic()),
                admitted=self._admitted,
                rate_limited=self._rate_limited,
                overloaded=self._overloaded,
                queue_timeouts=self._queue_timeouts,
                queue_wait_seconds=self._waited,
                max_queue_wait_seconds=self._max_waited,
                timed_out=self._timed_out,
                ceiling=int(self._ceiling),
            )

    # --- the shared core (call with the lock held) ------------------------------------------

    def _can_admit(self, now: float) -> bool:
        return now >= self._paused_until and self._in_flight < int(self._limit)

    def _grant(self) -> Permit:
        self._in_flight += 1
        self._admitted += 1
        return Permit(epoch=self._epoch, waited=0.0)

    def _dispatch(self, now: float) -> None:
        # Slots go straight to the oldest waiters, so a release never starts a stampede of
        # waiters racing for one slot, and nobody overtakes the queue.
        while self._waiters and self._can_admit(now):
            waiter = self._waiters.popleft()
            if not waiter.wake():  # its event loop is gone: a slot given to it would never return
                continue
            waiter.granted = True
            self._in_flight += 1
            self._admitted += 1

    def _pause_until(self, until: float) -> None:
        if until > self._paused_until:
            self._paused_until = until
            # Sleeping waiters look again, to sleep until the pause ends (or give up now if it
            # ends after their deadline) rather than past it.
            for waiter in self._waiters:
                waiter.wake()

    def _enter(self, deadline: float | None, loop: asyncio.AbstractEventLoop | None) -> Permit | Waiter:
        now = time.monotonic()
        with self._lock:
            if not self._waiters and self._can_admit(now):
                return self._grant()
            if deadline is not None and (deadline <= now or self._paused_until >= deadline):
                self._queue_timeouts += 1
                raise queue_timeout(self._paused_until > now)
            waiter = Waiter(loop)
            self._waiters.append(waiter)
            return waiter

    def _next_wake(self, waiter: Waiter, deadline: float | None) -> Permit | float | None:
        """The permit once granted; else how long to sleep before looking again (None: until woken)."""
        now = time.monotonic()
        with self._lock:
            waiter.arm()
            if not waiter.granted:
                # A pause that has just ended wakes nobody by itself: the first waiter to notice does.
                self._dispatch(now)
            if waiter.granted:
                self._note_wait(waiter, now - waiter.started)
                return Permit(epoch=self._epoch, waited=now - waiter.started)
            if deadline is not None and (now >= deadline or self._paused_until >= deadline):
                self._waiters.remove(waiter)
                self._queue_timeouts += 1
                self._note_wait(waiter, now - waiter.started)
                raise queue_timeout(self._paused_until > now)
            wake_at = deadline
            if self._paused_until > now:
                wake_at = self._paused_until if wake_at is None else min(wake_at, self._paused_until)
            return None if wake_at is None else max(0.0, wake_at - now)

    def _note_wait(self, waiter: Waiter, waited: float) -> None:
        self._waited += waited
        self._max_waited = max(self._max_waited, waited)
        if waiter.meter is not None:
            waiter.meter.end(id(waiter), waited)

    def _abandon(self, waiter: Waiter) -> None:
        """The waiter's caller went away (cancelled, interrupted): give back what it holds."""
        with self._lock:
            if waiter.granted:
                self._in_flight -= 1
                self._dispatch(time.monotonic())
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if waiter.meter is not None:
                waiter.meter.end(id(waiter), time.monotonic() - waiter.started)

    # --- admission ----------------------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> Permit:
        """Wait (blocking this thread) until a request may be sent; at most ``timeout`` seconds.

        Raises:
            JevTimeoutError: the deadline came (or a pause ends after it) before admission.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        entered = self._enter(deadline, None)
        if isinstance(entered, Permit):
            return entered
        try:
            while True:
                step = self._next_wake(entered, deadline)
                if isinstance(step, Permit):
                    return step
                assert entered.event is not None
                entered.event.wait(step)
        except BaseException as error:
            if not isinstance(error, JevTimeoutError):
                self._abandon(entered)
            raise

    async def aacquire(self, timeout: float | None = None) -> Permit:
        """The async twin of :meth:`acquire`: waits on the event loop, never blocking it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        entered = self._enter(deadline, loop)
        if isinstance(entered, Permit):
            return entered
        try:
            while True:
                step = self._next_wake(entered, deadline)
                if isinstance(step, Permit):
                    return step
                assert entered.future is not None
                await asyncio.wait((entered.future,), timeout=step)
        except BaseException as error:
            if not isinstance(error, JevTimeoutError):
                self._abandon(entered)
            raise

    def release(
        self,
        permit: Permit,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        timed_out: bool = False,
        share_of_timeout: float | None = None,
    ) -> None:
        """Hand back ``permit`` with what the server said: its HTTP ``status`` (``None``: no
        answer), ``Retry-After`` in seconds, if it sent one, whether the attempt ``timed_out``,
        and the ``share_of_timeout`` its answer took (0.6: 60 % of the attempt's timeout).

        Congestion (a 429 or 529, or a timeout) halves the limit (once per generation of
        requests) and caps its growth at what the server took (the ``ceiling``); a 2xx raises it
        by ``1 / limit``, one more slot per limit's worth of successes, up to the ceiling, unless
        the answer was slow: when the server's time shared by one more request would take it past
        half its timeout (``share * (limit + 1) / limit`` over 0.5), the limit holds. A
        ``Retry-After`` on an error pauses every admission, capped at ``max_pause``.
        """
        now = time.monotonic()
        with self._lock:
            in_flight = self._in_flight
            self._in_flight -= 1
            if status in _SLOW_DOWN or timed_out:
                if status == 429:
                    self._rate_limited += 1
                elif status is not None:
                    self._overloaded += 1
                else:
                    self._timed_out += 1
                self._congested(permit, in_flight)
            elif status is not None and 200 <= status < 300:
                self._grow(share_of_timeout)
            if retry_after is not None and status is not None and status >= 400:
                self._pause_until(now + min(retry_after, self.max_pause))
            self._dispatch(now)

    def _congested(self, permit: Permit, in_flight: int) -> None:
        if permit.epoch == self._epoch:
            self._limit = max(float(self.min_limit), math.floor(self._limit / 2))
            self._epoch += 1
        # With `in_flight` out (this one included) the server pushed back: it takes fewer. Every
        # signal of a generation counts here, the lowest wins: a wave of 16 that met room for 6
        # leaves 6. It only stops growth: the limit itself is halved, no more.
        self._ceiling = max(float(self.min_limit), min(self._ceiling, float(in_flight - 1)))

    def _grow(self, share: float | None) -> None:
        if share is not None and share * (self._limit + 1) / self._limit > _SLOW_SHARE:
            return  # the server's time shared by one more would take answers past half their timeout
        self._ceiling = min(float(self.max_limit), self._ceiling + 1.0 / (_CEILING_PATIENCE * self._ceiling))
        if self._limit < self._ceiling:
            self._limit = min(self._ceiling, self._limit + 1.0 / self._limit)

    def pause(self, seconds: float) -> None:
        """Admit nothing for ``seconds`` (what a ``Retry-After`` does), capped at ``max_pause``."""
        with self._lock:
            self._pause_until(time.monotonic() + min(max(0.0, seconds), self.max_pause))
