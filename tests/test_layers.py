"""The package's layers: imports only go down, no circles, no module too long to read.

The layers, in the order data flows (docs/architecture.md draws them): a module may import from
its own layer or from a layer below it, never from one above. Inside a layer, modules import
each other without a circle. Every import counts, including ``TYPE_CHECKING`` and deferred ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llama_jev"

# First path component under llama_jev/ -> its layer, lowest first.
LAYERS: dict[str, int] = {
    "_exports.py": 0,  # the lazy-export helper every package's __init__ calls
    "_moved_modules.py": 0,  # 0.2's module paths of what is a folder now, with a DeprecationWarning
    "core": 0,  # identity, records, errors, context binding, the JSONL observer
    "acl": 1,  # MetadataAcl, check_acl, the missing-key diagnostics
    "stores": 2,  # one pushdown adapter per store
    "systemone": 3,  # wire models, HTTP client, governor, the Judge protocol
    "engine": 4,  # selector, pipeline
    "retrieval": 5,  # JevRetriever, JevNodePostprocessor, search_knowledge
    "review": 6,  # the final-draft review
    "calibration": 7,  # calibration and labelling
    "local": 8,  # the offline judge
    "server": 8,  # the judge server: the protocol as an ASGI app, run on uvicorn
    "testing": 8,  # the System One test server (the judge server with faults), HashEmbedding
    # The command-line programs (python -m llama_jev.<name>) sit on top of everything they use.
    "calibrate.py": 9,
    "label_sheet.py": 9,
    "label.py": 9,
    "serve.py": 9,
    "drift.py": 9,
    "__init__.py": 10,  # the public API re-exports every layer
    "errors.py": 10,  # every error, from the core's and calibration's
}

MAX_LINES = 500


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


MODULES = _modules()


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS["__init__.py"]
    first = parts[1]
    key = first if first in LAYERS else f"{first}.py"
    if key not in LAYERS:
        raise AssertionError(f"{module} is in no layer: add its folder to LAYERS and docs/architecture.md")
    return LAYERS[key]


def _imports(module: str) -> set[str]:
    """The llama_jev modules ``module`` imports (resolved to the longest existing module name), its
    ``.pyi`` stub's re-exports included (they are what the module loads on first use)."""
    path = MODULES[module]
    sources = [path, *[stub for stub in [path.with_suffix(".pyi")] if stub.exists()]]
    found: set[str] = set()
    for node in (node for source in sources for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from llama_jev.x import y" imports the submodule llama_jev.x.y when there is one,
            # else a name defined in llama_jev.x.
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names
            ]
        for name in names:
            if name.split(".")[0] != "llama_jev":
                continue
            while name not in MODULES:
                name = name.rpartition(".")[0]
            found.add(name)
    found.discard(module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def test_every_module_belongs_to_a_layer() -> None:
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_or_below(module: str) -> None:
    upward = sorted(imported for imported in GRAPH[module] if _layer(imported) > _layer(module))
    assert not upward, f"{module} (layer {_layer(module)}) imports upward: {upward}"


def test_no_import_circles() -> None:
    # A package's __init__ importing its own submodules is not a circle: only its submodules
    # importing the package back would be, and those edges resolve to the submodule itself.
    def edges(module: str) -> set[str]:
        return {target for target in GRAPH[module] if not module.startswith(f"{target}.") and target != "llama_jev"}

    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges(module)):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_stays_short_enough_to_read(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by job (not by line count)"
