"""A throwaway Milvus standalone server: PyPI ``milvus`` 2.3.5 (the server as a wheel), on free loopback ports.

For tests and benchmarks of the Milvus pushdown against the real server (Milvus Lite, the other
engine, runs in-process from a ``.db`` path and needs no helper):

    with milvus_server() as server:
        store = MilvusVectorStore(uri=server.uri, dim=8, collection_name="docs")

The wheel ships the server's binaries compressed; they are unpacked once into a cache folder
(``~/.cache/llama_jev/milvus-2.3.5``, or ``$LLAMA_JEV_CACHE``) and shared by every start. Each
server runs in a fresh temporary folder with its own ports (the proxy, its embedded etcd and each
internal service), and is stopped and its folder removed when the block ends, however it ends.
The server binds its ports on every interface (2.3.5 has no listen-address setting); they are
free ports chosen here, nothing is published.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MilvusServer", "milvus_server", "typed_acl_collection"]

_VERSION = "2.3.5"


@dataclass(frozen=True)
class MilvusServer:
    """Where the server listens (gRPC, no authentication)."""

    host: str
    port: int
    started_in: float
    """Seconds until the server answered its health check (reported by benchmarks, never asserted)."""

    @property
    def uri(self) -> str:
        """The ``pymilvus`` / ``MilvusVectorStore`` URI, ``http://127.0.0.1:<port>``."""
        return f"http://{self.host}:{self.port}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 - a 127.0.0.1 URL built here
            return b"OK" in response.read()
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path) -> str:
    try:
        text = path.read_bytes().decode("utf-8", "replace")
        panic = text.find("panic:")  # a Go panic says why first; its stack follows
        return (text[panic : panic + 1500] if panic >= 0 else text[-2000:]).strip()
    except OSError:
        return ""


def _package() -> Any:
    try:
        import milvus  # type: ignore[import-untyped]
    except ImportError as error:
        raise RuntimeError(
            f'milvus_server needs PyPI milvus=={_VERSION} (the standalone server as a wheel): pip install -e ".[test]" '
            "in a clone of llama_jev"
        ) from error
    if getattr(milvus, "__version__", None) != _VERSION:
        raise RuntimeError(f"milvus_server is built for PyPI milvus=={_VERSION}, found {milvus.__version__}")
    return milvus


def _binaries(milvus: Any) -> Path:
    """The server's binaries, unpacked once into the cache (under a lock: several test processes may start)."""
    cache = Path(os.environ.get("LLAMA_JEV_CACHE") or Path.home() / ".cache" / "llama_jev") / f"milvus-{_VERSION}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        milvus._initialize_data_files(str(cache))  # unpacks what is missing or changed, else nothing
    return cache / "bin"


def _own_etcd(folder: Path, client_port: int) -> None:
    """Give the embedded etcd its own ports: without a config file it takes 2379 and 2380 whatever is set.

    (Measured: a second 2.3.5 server beside a first crashed in the etcd client, nil.)
    """
    peer = f"http://127.0.0.1:{_free_port()}"
    client = f"http://127.0.0.1:{client_port}"
    etcd = folder / "configs" / "embedEtcd.yaml"
    etcd.write_text(
        f"listen-client-urls: {client}\nadvertise-client-urls: {client}\nlisten-peer-urls: {peer}\n"
        f"initial-advertise-peer-urls: {peer}\ninitial-cluster: default={peer}\n"
        f"data-dir: {folder / 'data' / 'etcd.data'}\n"
    )
    config = folder / "configs" / "milvus.yaml"
    text = config.read_text()
    config.write_text(text.replace("\netcd:\n", f"\netcd:\n  config:\n    path: {etcd}\n", 1))


@contextlib.contextmanager
def milvus_server(*, timeout: float = 180.0) -> Iterator[MilvusServer]:
    """Start the ``milvus`` 2.3.5 standalone server on free ports; stop it when the block ends.

    Raises:
        RuntimeError: the ``milvus`` wheel is not installed (or another version), or the server
            did not become healthy within ``timeout`` seconds (the end of its log is in the message).
    """
    milvus = _package()
    binaries = _binaries(milvus)
    folder = Path(tempfile.mkdtemp(prefix="llama-jev-milvus-"))
    (folder / "bin").symlink_to(binaries, target_is_directory=True)
    ports = {f"{key}": _free_port() for key in milvus.MilvusServerConfig().configurable_items if key.endswith("_port")}
    config = milvus.MilvusServerConfig(data_dir=str(folder), **ports)
    config.resolve()  # writes configs/milvus.yaml with these ports and folders
    _own_etcd(folder, ports["etcd_port"])
    health_port = _free_port()
    environment = {
        **os.environ,
        "DEPLOY_MODE": "STANDALONE",
        "METRICS_PORT": str(health_port),
        "MILVUS_RUN_DIR": str(folder / "run"),
        "LD_LIBRARY_PATH": ":".join(filter(None, [str(binaries), os.environ.get("LD_LIBRARY_PATH")])),
    }
    log_path = folder / "logs" / "milvus.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        # The command is the wheel's own binary and fixed arguments: nothing from outside.
        process = subprocess.Popen(  # noqa: S603
            [str(binaries / "milvus"), "run", "standalone"],
            cwd=folder,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        health = f"http://127.0.0.1:{health_port}/healthz"
        while not _healthy(health):
            if process.poll() is not None:
                raise RuntimeError(f"the milvus server exited with status {process.returncode}: {_tail(log_path)}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"the milvus server was not healthy within {timeout:.0f} s: {_tail(log_path)}")
            time.sleep(0.2)
        yield MilvusServer(host="127.0.0.1", port=ports["proxy_port"], started_in=time.monotonic() - started)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def typed_acl_collection(uri: str, name: str, *, dim: int, metric: str = "L2") -> None:
    """Create collection ``name`` at ``uri`` with the ACL keys as schema fields, as docs/stores-and-pushdown.md does.

    ``tenant`` VARCHAR, ``users`` and ``roles`` ARRAY of VARCHAR, ``public`` BOOL, the rest of the
    metadata in the dynamic field; a FLAT index with ``metric``; ``Session`` consistency, as
    LlamaIndex's store creates its own (a search sees the writes made before it). Open it with
    ``MilvusVectorStore(uri=uri, collection_name=name, overwrite=False, ...)``.
    """
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri=uri)
    try:
        schema = client.create_schema(auto_id=False, enable_dynamic_field=True)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=65_535)
        schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("tenant", DataType.VARCHAR, max_length=256)
        for field in ("users", "roles"):
            schema.add_field(field, DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=64, max_length=256)
        schema.add_field("public", DataType.BOOL)
        index = client.prepare_index_params()
        index.add_index("embedding", index_type="FLAT", metric_type=metric)
        client.create_collection(name, schema=schema, index_params=index, consistency_level="Session")
    finally:
        client.close()
