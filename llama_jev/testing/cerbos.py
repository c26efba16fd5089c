"""A throwaway Cerbos PDP: the ``@cerbos/cerbos-linux-x64`` binary from the npm registry, on 127.0.0.1.

For tests, benchmarks and the example of :class:`~llama_jev.acl.CerbosAcl` against the real PDP:

    with cerbos_server("examples/cerbos/policies") as pdp:
        acl = CerbosAcl(pdp.url)               # HTTP; CerbosAcl(pdp.grpc_address) for gRPC

The binary (``cerbos_binary()``) is fetched once with ``npm pack`` into
``~/.cache/llama_jev/cerbos/0.55.0/`` (:mod:`llama_jev.testing.npm`) and reused. The server reads
the policies from ``policy_dir`` (disk store, no watching), listens on free HTTP and gRPC ports of
127.0.0.1 only, sends no telemetry, and is stopped and its folder removed when the block ends,
however it ends. ``pause()`` / ``resume()`` freeze it (SIGSTOP / SIGCONT) to play a PDP that
accepts connections and never answers; ``stop()`` ends it early (a PDP gone mid-test).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llama_jev.testing.npm import BinaryUnavailableError, linux_cpu, npm_binary

__all__ = [
    "CERBOS_VERSION",
    "PUBLISHED_CPUS",
    "BinaryUnavailableError",
    "CerbosServer",
    "cerbos_binary",
    "cerbos_published",
    "cerbos_server",
]

CERBOS_VERSION = "0.55.0"
"""The PDP version the tests and docs are measured with."""


PUBLISHED_CPUS: tuple[str, ...] = ("x64",)
"""The CPUs the npm registry has a Cerbos PDP for (``@cerbos/cerbos-linux-<cpu>`` 0.55.0): no arm64 build."""


def cerbos_published() -> bool:
    """Whether the npm registry publishes a Cerbos PDP for this machine's CPU (see :data:`PUBLISHED_CPUS`)."""
    return linux_cpu() in PUBLISHED_CPUS


def cerbos_binary(version: str = CERBOS_VERSION) -> Path:
    """The ``cerbos`` executable for this CPU, from the cache or fetched by ``npm pack``.

    Raises:
        BinaryUnavailableError: not cached and npm is missing, or the registry has no package for
            this CPU (``@cerbos/cerbos-linux-<cpu>``).
    """
    cpu = linux_cpu()
    return npm_binary(f"@cerbos/cerbos-linux-{cpu}", version, f"cerbos-linux-{cpu}", cache_name="cerbos")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - a 127.0.0.1 URL built here
            return bool(json.loads(response.read()).get("status") == "SERVING")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path) -> str:
    return path.read_bytes()[-2000:].decode("utf-8", "replace").strip()


@dataclass
class CerbosServer:
    """A running PDP: where it listens, and the controls a test needs to play its faults."""

    host: str
    http_port: int
    grpc_port: int
    started_in: float
    """Seconds until the PDP answered its health check (reported by benchmarks, never asserted)."""
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def url(self) -> str:
        """The HTTP address, for ``CerbosAcl(url)``: ``http://127.0.0.1:<port>``."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        """The gRPC ``host:port``, for ``CerbosAcl(address)``."""
        return f"{self.host}:{self.grpc_port}"

    def pause(self) -> None:
        """Freeze the PDP (SIGSTOP): connections are accepted, nothing is answered (a PDP past any timeout)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused PDP run again (SIGCONT)."""
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """End the PDP now (idempotent); the block's end does it too."""
        if self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _config(folder: Path, policy_dir: Path, http_port: int, grpc_port: int) -> Path:
    config = {
        "server": {"httpListenAddr": f"127.0.0.1:{http_port}", "grpcListenAddr": f"127.0.0.1:{grpc_port}"},
        "storage": {"driver": "disk", "disk": {"directory": str(policy_dir), "watchForChanges": False}},
        "telemetry": {"disabled": True},
        "audit": {"enabled": False},
    }
    path = folder / "config.yaml"
    # JSON is YAML: no YAML writer needed.
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@contextlib.contextmanager
def cerbos_server(
    policy_dir: str | Path, *, timeout: float = 30.0, binary: Path | None = None
) -> Iterator[CerbosServer]:
    """Start ``cerbos server`` on 127.0.0.1 with the policies in ``policy_dir``; stop it when the block ends.

    Args:
        policy_dir: a folder of Cerbos policy files (``examples/cerbos/policies``).
        timeout: seconds the PDP may take to report ``SERVING``.
        binary: the ``cerbos`` executable; by default :func:`cerbos_binary` (cached, else ``npm pack``).

    Raises:
        BinaryUnavailableError: no binary and no way to fetch one.
        FileNotFoundError: ``policy_dir`` is not a folder.
        RuntimeError: the PDP exited or did not serve within ``timeout`` (the end of its log is
            in the message: a policy that does not compile says so there).
    """
    policies = Path(policy_dir).resolve()
    if not policies.is_dir():
        raise FileNotFoundError(f"policy_dir {policies} is not a folder of Cerbos policies")
    executable = binary if binary is not None else cerbos_binary()
    folder = Path(tempfile.mkdtemp(prefix="llama-jev-cerbos-"))
    http_port, grpc_port, debug_port = _free_port(), _free_port(), _free_port()
    config = _config(folder, policies, http_port, grpc_port)
    log_path = folder / "server.log"
    command = [
        str(executable), "server", f"--config={config}", "--log-level=warn",
        # gops listens on :6666 of every interface by default: two PDPs would collide.
        f"--debug-listen-addr=127.0.0.1:{debug_port}",
    ]  # fmt: skip
    started = time.monotonic()
    with open(log_path, "wb") as log:
        # The command is the pinned binary and arguments built here: nothing from outside.
        process = subprocess.Popen(  # noqa: S603
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"CERBOS_NO_TELEMETRY": "1", "PATH": "/usr/bin:/bin"},
        )
    server = CerbosServer("127.0.0.1", http_port, grpc_port, 0.0, process)
    try:
        health = f"{server.url}/_cerbos/health"
        while not _serving(health):
            if process.poll() is not None:
                raise RuntimeError(f"cerbos server exited with status {process.returncode}: {_tail(log_path)}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"cerbos server did not serve within {timeout:.0f} s: {_tail(log_path)}")
            time.sleep(0.05)
        server.started_in = time.monotonic() - started
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
