"""The public namespaces: ``llama_jev`` and every module beside which a ``.pyi`` stub lists exports."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parent.parent / "llama_jev"


def public_namespace_names() -> list[str]:
    """Dotted names of the public namespaces, ``llama_jev`` first."""
    names = []
    for stub in sorted(PACKAGE.rglob("*.pyi")):
        parts = stub.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names, key=lambda name: (name != "llama_jev", name))


def public_namespaces() -> list[ModuleType]:
    return [importlib.import_module(name) for name in public_namespace_names()]
