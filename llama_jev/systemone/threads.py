"""The threads synchronous judgements run their batches on: one bounded pool per process.

A judgement waits for its batches on other threads, even for a single batch, so its budget holds
for a judge that ignores its timeout; starting a pool per judgement cost ~2 ms of thread start-up
each time, so every judgement shares this one and bounds its own share with :class:`BoundedCalls`.

A judgement of one batch (a retrieval's 20 candidates) takes the lighter road,
:func:`call_within`: an idle worker thread woken by one lock and answering through another,
instead of a pool's queue, two futures, a done callback and ``concurrent.futures.wait``'s
condition variables; that hand-off was most of the wrapper's own cost per retrieval.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["EXECUTOR_THREADS", "BoundedCalls", "call_within", "shared_executor"]

EXECUTOR_THREADS = 64
"""Threads the shared pool may start; only as many as are busy at once are ever started."""

T = TypeVar("T")

_executor_lock = threading.Lock()
_shared_executor: concurrent.futures.ThreadPoolExecutor | None = None


def shared_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The threads every synchronous judgement of the process shares, started on first use.

    A pool per judgement cost ~2 ms of thread start-up each time; one shared, bounded pool
    costs nothing per call. Threads beyond what is busy are only started when needed.
    """
    global _shared_executor
    with _executor_lock:
        if _shared_executor is None:
            _shared_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=EXECUTOR_THREADS, thread_name_prefix="llama-jev-judge"
            )
        return _shared_executor


def _forget_executor() -> None:
    # A forked child has the parent's pool object but none of its threads.
    global _shared_executor, _executor_lock, _workers_lock, _worker_count
    _shared_executor = None
    _executor_lock = threading.Lock()
    _idle_workers.clear()
    _workers_lock = threading.Lock()
    _worker_count = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor)


class _Answer:
    """Where a worker leaves one call's outcome; ``done`` is held until it is there."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.result: object = None
        self.error: BaseException | None = None


class _Worker:
    """A daemon thread running one call at a time, woken by releasing ``wake``.

    Daemon, unlike a pool's threads: a judge that ignores its timeout must not hold the
    interpreter's exit either.
    """

    __slots__ = ("task", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.task: tuple[Callable[[], object], _Answer] | None = None
        threading.Thread(target=self._loop, name="llama-jev-judge-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.wake.acquire()
            task, self.task = self.task, None
            assert task is not None  # set before every wake-up
            run, answer = task
            del task
            try:
                answer.result = run()
            except BaseException as error:  # handed to the caller, who raises it
                answer.error = error
            del run  # nothing of a finished call is kept alive by an idle thread
            # Idle first, then the answer: the caller, woken by it, finds this thread about to
            # block rather than still holding the interpreter lock.
            _idle_workers.append(self)
            done = answer.done
            del answer
            done.release()


# Idle workers, last in first out (a warm thread answers); list.append / pop are atomic.
_idle_workers: list[_Worker] = []
_workers_lock = threading.Lock()
_worker_count = 0


def _idle_worker() -> _Worker | None:
    """An idle worker, a new one while fewer than :data:`EXECUTOR_THREADS` exist, else ``None``."""
    global _worker_count
    try:
        return _idle_workers.pop()
    except IndexError:
        pass
    with _workers_lock:
        if _worker_count >= EXECUTOR_THREADS:
            return None
        _worker_count += 1
    return _Worker()


def call_within(run: Callable[[], T], timeout: float, *, expired: str = "no answer in time") -> T:
    """``run()`` on another thread; its result or error, or ``TimeoutError(expired)`` after ``timeout`` seconds.

    The caller returns at the timeout even if ``run`` never does (a judge that ignores its own
    timeout): the call then finishes on its thread and its outcome is dropped. When every
    worker is busy (:data:`EXECUTOR_THREADS` of them), the call waits in the shared pool's queue.

    Example:
        >>> call_within(lambda: 6 * 7, timeout=5.0)
        42
    """
    worker = _idle_worker()
    if worker is None:
        future = shared_executor().submit(run)
        try:
            return future.result(timeout=max(timeout, 0.0))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(expired) from None
    answer = _Answer()
    worker.task = (run, answer)
    worker.wake.release()
    if not answer.done.acquire(timeout=max(timeout, 0.0)):
        raise TimeoutError(expired)
    if answer.error is not None:
        raise answer.error
    return answer.result  # type: ignore[return-value]


class BoundedCalls(Generic[T]):
    """Submits one judgement's batches to the shared pool, at most ``limit`` running at once.

    The rest wait here, not in the pool's queue, so one judgement of many batches never holds
    the shared threads while other judgements' batches wait behind it.

    Example:
        >>> calls: BoundedCalls[int] = BoundedCalls(2)
        >>> futures = [calls.submit(pow, 2, n) for n in range(4)]
        >>> [future.result() for future in futures]
        [1, 2, 4, 8]
    """

    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._running = 0
        self._waiting: list[tuple[concurrent.futures.Future[T], Callable[[], T]]] = []
        self._started: list[concurrent.futures.Future[T]] = []
        self._cancelled = False

    def submit(self, run: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
        """Run ``run(*args)`` on the shared pool when fewer than ``limit`` of this group run."""
        outer: concurrent.futures.Future[T] = concurrent.futures.Future()
        call = functools.partial(run, *args)
        with self._lock:
            if self._running >= self._limit:
                self._waiting.append((outer, call))
                return outer
            self._running += 1
        self._start(outer, call)
        return outer

    def _start(self, outer: concurrent.futures.Future[T], call: Callable[[], T]) -> None:
        if not outer.set_running_or_notify_cancel():
            self._next()
            return
        inner = shared_executor().submit(call)
        with self._lock:
            self._started.append(inner)
        inner.add_done_callback(lambda done: self._settle(outer, done))

    def _settle(self, outer: concurrent.futures.Future[T], inner: concurrent.futures.Future[T]) -> None:
        error = TimeoutError("the judgement ended before this batch ran") if inner.cancelled() else inner.exception()
        if error is not None:
            outer.set_exception(error)
        else:
            outer.set_result(inner.result())
        self._next()

    def _next(self) -> None:
        with self._lock:
            if self._cancelled or not self._waiting:
                self._running -= 1
                return
            outer, call = self._waiting.pop(0)
        self._start(outer, call)

    def cancel(self) -> None:
        """Drop the batches not running yet, here or in the pool's queue (the judgement has its
        answer or ran out of time); a batch already running finishes on its own."""
        with self._lock:
            self._cancelled = True
            waiting, self._waiting = self._waiting, []
            started = list(self._started)
        for outer, _ in waiting:
            outer.cancel()
        for inner in started:
            inner.cancel()
