"""Starting and stopping judge server processes for tests: 127.0.0.1, a free port, always killed.

``python -m tests.serve_support --delay 0.3 [serve flags]`` is the production runner
(``llama_jev.server.http.run_draining`` around ``create_app``) with a judge whose answers take
``--delay`` seconds per call and say how many candidates it was given, so admission, batching,
disconnects and the drain can be provoked deterministically; ``python -m llama_jev.serve --judge
local`` is started the same way for the real thing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 120.0  # a guard against a hang, not a measurement


@dataclass
class ServerProcess:
    """A running server: its process, base URL, and the lines it has printed so far."""

    process: subprocess.Popen[str]
    base_url: str
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def stdout(self) -> str:
        return "".join(self.out)

    def stderr(self) -> str:
        return "".join(self.err)


def _pump(stream: object, into: list[str]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        into.append(line)


@contextlib.contextmanager
def server_process(
    command: Sequence[str], *, env: dict[str, str] | None = None, ready: bool = True
) -> Iterator[ServerProcess]:
    """Start ``command`` (a serve command with ``--port 0``), wait for its banner (and ``/readyz``), kill it after."""
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_pump, args=(process.stdout, out), daemon=True),
        threading.Thread(target=_pump, args=(process.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + START_SECONDS
        base_url = ""
        while not base_url:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the server did not start: {''.join(out)} {''.join(err)}")
            for line in list(out):
                if " at http://" in line:
                    base_url = line.split(" at ")[-1].strip().removesuffix("/v1/systemone")
            time.sleep(0.02)
        server = ServerProcess(process, base_url, out, err)
        if ready:
            wait_ready(base_url, deadline)
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        for reader in readers:
            reader.join(5)


def wait_ready(base_url: str, deadline: float) -> None:
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if client.get(base_url + "/readyz").status_code == 200:
                    return
            time.sleep(0.05)
    raise AssertionError("the server never became ready")


def serve_local(*flags: str) -> list[str]:
    return [sys.executable, "-m", "llama_jev.serve", "--judge", "local", "--port", "0", *flags]


def serve_slow(delay: float, *flags: str) -> list[str]:
    return [sys.executable, "-m", "tests.serve_support", "--delay", str(delay), "--port", "0", *flags]


def raw_exchange(base_url: str, data: bytes, *, wait: float = 10.0, then_send: bytes = b"") -> bytes:
    """Send ``data`` on a raw socket and read until the server closes it or ``wait`` passes."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(data)
        if then_send:
            sock.sendall(then_send)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def metric(base_url: str, name: str) -> float:
    """The sum of a metric's samples named ``name`` (any labels) in ``/metrics``."""
    text = httpx.get(base_url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _main() -> None:
    from llama_jev.server import create_app
    from llama_jev.server.http import bind, run_draining
    from llama_jev.systemone.judge import ScriptedJudge
    from llama_jev.systemone.wire import SystemOneRequest, SystemOneResult

    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--queue", type=int, default=16)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--drain-seconds", type=float, default=10.0)
    parser.add_argument("--header-timeout", type=float, default=10.0)
    parser.add_argument("--body-timeout", type=float, default=30.0)
    args = parser.parse_args()

    class SlowJudge(ScriptedJudge):
        """Answers each question with the number of candidates in the call / 1000, after ``delay`` s."""

        def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
            if timeout is not None and timeout < args.delay:
                from llama_jev.core.errors import JevTimeoutError

                raise JevTimeoutError("no time left", retryable=False)
            time.sleep(args.delay)
            return super().system_one(request, timeout=timeout)

    calls: list[int] = []

    def answer(state: object, question_id: str, instructions: object) -> float:
        return min(1.0, calls[-1] / 1000) if calls else 0.0

    judge = SlowJudge(answer, model="slow-test")
    original = judge.system_one

    def counting(request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        calls.append(len(request.questions))
        return original(request, timeout=timeout)

    judge.system_one = counting  # type: ignore[method-assign]
    app = create_app(
        judge,
        max_in_flight=args.max_in_flight,
        queue=args.queue,
        max_batch_tokens=args.max_batch_tokens,
        body_timeout=args.body_timeout,
        # One call at a time: which requests wait together (and merge) is then deterministic.
        judge_threads=1,
        on_request=lambda exchange: print(f"{exchange.method} {exchange.status}", flush=True),
    )
    sock = bind("127.0.0.1", args.port)
    print(f"slow judge at http://127.0.0.1:{sock.getsockname()[1]}/v1/systemone", flush=True)
    server = app.state.judge_server
    run_draining(
        app,
        sock,
        drain_seconds=args.drain_seconds,
        header_timeout=args.header_timeout,
        on_signal=lambda: server.drain(args.drain_seconds),
    )
    print("stopped", flush=True)


if __name__ == "__main__":
    _main()
