"""docker/Dockerfile, checked without a Docker engine: its install and start steps run in a fresh
venv, and its health check must pass against what they start (127.0.0.1 only)."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    joined: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            joined.append(pending)
            pending = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def _exec_form(arguments: str) -> list[str]:
    command = json.loads(arguments)
    assert isinstance(command, list), f"use the exec form (a JSON array): {arguments}"
    return [str(part) for part in command]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_image_runs_as_a_non_root_user_and_checks_readiness() -> None:
    steps = instructions()
    users = [arguments for keyword, arguments in steps if keyword == "USER"]
    health = [arguments for keyword, arguments in steps if keyword == "HEALTHCHECK"]

    assert users, "the image must switch to a non-root user"
    assert users[-1] not in ("root", "0")
    assert [keyword for keyword, _ in steps].index("USER") > [keyword for keyword, _ in steps].index("RUN")
    assert len(health) == 1
    assert "/readyz" in health[0]


@pytest.mark.slow
def test_the_dockerfiles_install_and_start_steps_serve_a_ready_judge(tmp_path: Path) -> None:
    steps = instructions()
    workdir = tmp_path / "app"
    workdir.mkdir()
    for keyword, arguments in steps:
        if keyword == "COPY":
            *sources, _ = shlex.split(arguments)
            for source in sources:
                target = workdir / Path(source).name
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / source, target)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    installs = [arguments for keyword, arguments in steps if keyword == "RUN" and "pip install" in arguments]
    assert installs, "the Dockerfile installs the package with pip"
    for arguments in installs:
        command = shlex.split(arguments)
        assert command[:2] == ["pip", "install"], arguments
        subprocess.run([python, "-m", "pip", "install", "-q", *command[2:]], cwd=workdir, check=True, timeout=1800)

    port = str(_free_port())
    # Loopback only here: the image's 0.0.0.0 becomes 127.0.0.1, its port 8000 a free one.
    swap = {"0.0.0.0": "127.0.0.1", "8000": port, "python": python}
    (start,) = [_exec_form(arguments) for keyword, arguments in steps if keyword == "CMD"]
    start = [swap.get(part, part) for part in start]
    (health,) = [arguments for keyword, arguments in steps if keyword == "HEALTHCHECK"]
    check = [swap.get(part, part).replace(":8000/", f":{port}/") for part in _exec_form(health.split("CMD", 1)[1])]

    server = subprocess.Popen(start, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        healthy = False
        while not healthy and time.monotonic() < deadline and server.poll() is None:
            healthy = subprocess.run(check, capture_output=True, timeout=30).returncode == 0
            time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()

    assert healthy, err
    assert server.returncode == 0, err
    assert "llama_jev.serve: stopped" in out
