"""The package's public names load on first use: the calibration CLI starts without LlamaIndex,
and ``from llama_jev import X``, ``dir()`` and ``__all__`` work as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import llama_jev

from .api_support import public_namespaces

pytestmark = pytest.mark.slow  # a Python subprocess per check

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(*args: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


def test_the_calibration_cli_never_imports_llama_index() -> None:
    for command in (["-m", "llama_jev.calibrate", "--help"], ["-m", "llama_jev.label", "--help"]):
        modules = imported_modules(*command)
        assert "llama_jev.calibration.analysis" in modules or command[1] == "llama_jev.label"
        assert not {name for name in modules if name.startswith("llama_index")}, command


def test_every_public_name_resolves_and_is_listed() -> None:
    for package in public_namespaces():
        for name in package.__all__:
            assert getattr(package, name) is not None, name
        assert set(package.__all__) <= set(dir(package))


def test_star_import_and_from_import_work() -> None:
    namespace: dict[str, object] = {}
    exec("from llama_jev import *", namespace)
    assert "JevRetriever" in namespace
    assert "SystemOneRequest" not in namespace  # moved to llama_jev.systemone: not in the top-level list
    from llama_jev import CandidateSelector, JevRetriever

    assert JevRetriever.__name__ == "JevRetriever"
    assert CandidateSelector.__name__ == "CandidateSelector"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        llama_jev.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
