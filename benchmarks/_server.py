"""A ``SystemOneTestServer`` in a child process, for benchmarks: its CPU never competes with the
client's for the GIL, as a real server's would not."""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from llama_jev.testing import SystemOneTestServer


def _serve(latency: float, pipe: Connection, options: dict[str, Any]) -> None:
    with SystemOneTestServer(lambda state, qid, ins: 0.9, latency=latency, **options) as server:
        pipe.send(server.base_url)
        while True:
            with contextlib.suppress(EOFError):
                command = pipe.recv()
                if command == "stats":
                    pipe.send(
                        {
                            "requests": server.request_count,
                            "rate_limited": server.rate_limited_count,
                            "max_in_flight": server.max_in_flight,
                        }
                    )
                    continue
                if command == "reset":
                    server.reset()
                    pipe.send(None)
                    continue
            return


class ServerProcess:
    """Start with ``ServerProcess(latency, in_flight_limit=16)``; ``base_url``, ``stats()``, ``stop()``."""

    def __init__(self, latency: float, **options: Any) -> None:
        self._parent, child = multiprocessing.Pipe()
        self._process = multiprocessing.Process(target=_serve, args=(latency, child, options), daemon=True)
        self._process.start()
        self.base_url: str = self._parent.recv()

    def stats(self) -> dict[str, int]:
        """Requests received, 429s sent and the most requests handled at once, since the last reset."""
        self._parent.send("stats")
        stats: dict[str, int] = self._parent.recv()
        return stats

    def reset(self) -> None:
        """Forget the recorded requests and counters."""
        self._parent.send("reset")
        self._parent.recv()

    def stop(self) -> None:
        """Stop the server and its process."""
        self._parent.send("stop")
        self._process.join(5)
