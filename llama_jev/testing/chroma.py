"""A throwaway Chroma server: ``chroma run`` from the ``chromadb`` wheel, on 127.0.0.1 and a free port.

For tests and benchmarks of the Chroma pushdown against a real server:

    with chroma_server() as server:
        client = chromadb.HttpClient(host=server.host, port=server.port)

The wheel (the ``chroma`` extra) ships the server; it runs in a fresh temporary folder, is
stopped and its folder removed when the block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ChromaServer", "chroma_server"]


@dataclass(frozen=True)
class ChromaServer:
    """Where the server listens (HTTP, no authentication)."""

    host: str
    port: int
    started_in: float
    """Seconds until the server answered its heartbeat (reported by benchmarks, never asserted)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - a 127.0.0.1 URL built here
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: str) -> str:
    with open(path, "rb") as log:
        return log.read()[-2000:].decode("utf-8", "replace").strip()


@contextlib.contextmanager
def chroma_server(*, timeout: float = 60.0) -> Iterator[ChromaServer]:
    """Start ``chroma run`` on 127.0.0.1 and a free port; stop it when the block ends.

    Raises:
        RuntimeError: the ``chromadb`` wheel is not installed, or the server did not answer
            within ``timeout`` seconds (the end of its output is in the message).
    """
    try:
        import chromadb.cli.cli  # noqa: F401  (found here, so a missing extra says so plainly)
    except ImportError as error:
        raise RuntimeError(
            'chroma_server needs the chromadb wheel: pip install -e ".[chroma]" in a clone of llama_jev'
        ) from error
    folder = tempfile.mkdtemp(prefix="llama-jev-chroma-")
    port = _free_port()
    log_path = f"{folder}/server.log"
    command = [
        sys.executable, "-c", "import sys; from chromadb.cli.cli import app; sys.argv[0] = 'chroma'; app()",
        "run", "--host", "127.0.0.1", "--port", str(port), "--path", f"{folder}/data",
    ]  # fmt: skip
    started = time.monotonic()
    with open(log_path, "wb") as log:
        # The command is this interpreter and fixed arguments: nothing from outside.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # noqa: S603
    try:
        heartbeat = f"http://127.0.0.1:{port}/api/v2/heartbeat"
        while not _answers(heartbeat):
            if process.poll() is not None:
                raise RuntimeError(f"chroma run exited with status {process.returncode}: {_tail(log_path)}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"chroma run did not answer within {timeout:.0f} s: {_tail(log_path)}")
            time.sleep(0.1)
        yield ChromaServer(host="127.0.0.1", port=port, started_in=time.monotonic() - started)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)
