"""How long a judgement's requests waited for admission: the side channel beside the ``Judge`` protocol.

The governor reports each request's wait into the :class:`QueueWait` bound for the judgement it
belongs to (a ``ContextVar``, so threads started with a copy of the context and asyncio tasks
report too); the selector reads it to fill ``DecisionRecord.queue_ms``. A custom judge with a
queue of its own reports with :func:`report_queue_wait`.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator

__all__ = [
    "QueueWait",
    "current_meter",
    "current_queue_wait_ms",
    "measure_queue_wait",
    "report_queue_wait",
    "reporting_queue_wait",
]


class QueueWait:
    """The longest time one request of a judgement waited for admission (see :func:`measure_queue_wait`).

    A wait still going on counts as far as it has got, so a judgement that ends while a request
    is queued (its budget ran out) records that wait too.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._open: dict[int, float] = {}

    def add(self, seconds: float) -> None:
        """Note one request's finished wait (requests of a judgement report from several threads)."""
        with self._lock:
            self._seconds = max(self._seconds, seconds)

    def begin(self, key: int, at: float) -> None:
        """A request (``key``) started waiting at monotonic time ``at``."""
        with self._lock:
            self._open[key] = at

    def end(self, key: int, seconds: float) -> None:
        """The request ``key`` stopped waiting after ``seconds``."""
        with self._lock:
            self._open.pop(key, None)
            self._seconds = max(self._seconds, seconds)

    @property
    def seconds(self) -> float:
        """The longest single wait so far (finished or not), in seconds."""
        now = time.monotonic()
        with self._lock:
            ongoing = max((now - at for at in self._open.values()), default=0.0)
            return max(self._seconds, ongoing)

    @property
    def ms(self) -> float:
        """The same, in milliseconds."""
        return self.seconds * 1000.0


_CURRENT_WAIT: contextvars.ContextVar[QueueWait | None] = contextvars.ContextVar("llama_jev_queue_wait", default=None)


@contextlib.contextmanager
def measure_queue_wait() -> Iterator[QueueWait]:
    """Collect the admission waits of requests sent inside this block (threads started with a
    copy of the context and asyncio tasks included).

    The selector wraps each judgement in it to fill ``DecisionRecord.queue_ms``; a custom judge
    with a queue of its own reports into it with :func:`report_queue_wait`.

    Example:
        >>> with measure_queue_wait() as waited:
        ...     report_queue_wait(0.25)
        >>> waited.ms
        250.0
    """
    with reporting_queue_wait(QueueWait()) as meter:
        yield meter


@contextlib.contextmanager
def reporting_queue_wait(meter: QueueWait) -> Iterator[QueueWait]:
    """Like :func:`measure_queue_wait`, into a ``meter`` the caller already holds."""
    token = _CURRENT_WAIT.set(meter)
    try:
        yield meter
    finally:
        _CURRENT_WAIT.reset(token)


def report_queue_wait(seconds: float) -> None:
    """Tell the enclosing :func:`measure_queue_wait` block that a request waited ``seconds``."""
    meter = _CURRENT_WAIT.get()
    if meter is not None:
        meter.add(seconds)


def current_queue_wait_ms() -> float:
    """The longest wait reported so far in the enclosing :func:`measure_queue_wait` block (0.0 outside one)."""
    meter = _CURRENT_WAIT.get()
    return 0.0 if meter is None else meter.ms


def current_meter() -> QueueWait | None:
    """The :class:`QueueWait` of the enclosing :func:`measure_queue_wait` block (``None`` outside one)."""
    return _CURRENT_WAIT.get()
