"""One way for every public package to say what it exports: the names its ``__init__.pyi`` re-exports.

The stub is the package's only list. Type checkers and IDEs read it as usual; at run time
:func:`attach` reads the same file, so ``__all__``, ``dir()`` and the lazy attributes come from
it too, and nothing is kept twice. A name loads its module on first use (PEP 562), so a command
that needs one corner of the package (``python -m llama_jev.calibrate``) does not import
LlamaIndex.

A package whose names moved elsewhere passes ``moved``: the old name still resolves, with a
``DeprecationWarning`` that names its new home, until the release that removes it.

Example (``llama_jev/engine/__init__.py``)::

    from llama_jev._exports import attach

    __getattr__, __dir__, __all__ = attach(__name__, __file__)
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["attach", "stub_exports"]


def stub_exports(stub: Path, package: str) -> dict[str, str]:
    """Each name ``stub`` re-exports (``from module import name as name``) -> the module it comes from.

    Raises:
        ValueError: an import in the stub is not an explicit re-export (``as`` the same name), the
            stub re-exports a name twice, or imports a whole module: the stub is the package's list,
            so everything in it must say exactly what is exported.
    """
    homes: dict[str, str] = {}
    for node in ast.parse(stub.read_text(encoding="utf-8"), filename=str(stub)).body:
        if isinstance(node, ast.Import):
            raise ValueError(f"{stub}:{node.lineno}: import names from modules ('from m import x as x')")
        if not isinstance(node, ast.ImportFrom):
            continue
        module = _absolute(node, package)
        for alias in node.names:
            if alias.asname != alias.name:
                explicit = f"from {module} import {alias.name} as {alias.name}"
                raise ValueError(f"{stub}:{node.lineno}: re-export explicitly: '{explicit}'")
            if alias.name in homes:
                raise ValueError(f"{stub}:{node.lineno}: {alias.name} is exported twice")
            homes[alias.name] = module
    return homes


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def attach(
    package: str, init_file: str, *, moved: Mapping[str, str] | None = None, removed_in: str = "0.3"
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` from the stub beside ``init_file``.

    Args:
        package: the package's ``__name__``.
        init_file: its ``__file__``; the stub is the file of the same name ending in ``.pyi``.
        moved: names that left this package -> the public package that exports them now. They
            still resolve, each access warning with a ``DeprecationWarning``.
        removed_in: the release that removes the moved names, for the warning.
    """
    homes = stub_exports(Path(init_file).with_suffix(".pyi"), package)
    old = dict(moved or {})
    if clash := sorted(homes.keys() & old.keys()):
        raise ValueError(f"{package}: {', '.join(clash)} both exported and moved")
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
            namespace[name] = value  # later lookups are plain attribute reads
            return value
        if name in old:
            # Not cached: every import of the old spelling warns, wherever it is.
            warnings.warn(
                f"{package}.{name} has moved to {old[name]}.{name}; import it from there "
                f"(the old name goes in {removed_in})",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(old[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    exported = sorted(homes)

    def __dir__() -> list[str]:
        return sorted({*namespace, *exported})

    return __getattr__, __dir__, exported
