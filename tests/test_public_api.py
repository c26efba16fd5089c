"""The public API a user can hold in their head: a small top level, every other name public in its
layer's package, moved names announced, every public name documented, no module doubling as a
function."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import llama_jev
from llama_jev._exports import stub_exports

from .api_support import PACKAGE, public_namespace_names, public_namespaces

ROOT = PACKAGE.parent

# Every name ``llama_jev.__all__`` held in 0.1: each still imports from ``llama_jev`` until 0.3.
NAMES_0_1 = [
    "GROUNDED_QUESTION",
    "PROBABILITY_KEY",
    "RELEVANCE_QUESTION",
    "Acl",
    "AnswerFunction",
    "CalibratedJudge",
    "CalibrationReport",
    "Candidate",
    "CandidateSelector",
    "CandidateTooLargeError",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "Decision",
    "DecisionRecord",
    "DraftReviewer",
    "EvidenceCollector",
    "EvidenceTooLargeError",
    "ExecutionOptions",
    "Governor",
    "GovernorStats",
    "JevAPIError",
    "JevAuthenticationError",
    "JevBadRequestError",
    "JevClient",
    "JevConnectionError",
    "JevDecisionEvent",
    "JevError",
    "JevGroundingEvaluator",
    "JevInvalidResponseError",
    "JevKnowledgeTool",
    "JevNodePostprocessor",
    "JevNotFoundError",
    "JevOverloadedError",
    "JevPermissionDeniedError",
    "JevRateLimitError",
    "JevRetriever",
    "JevReviewedAgent",
    "JevReviewedQueryEngine",
    "JevServerError",
    "JevTimeoutError",
    "LocalJudgeTimeoutError",
    "JsonlObserver",
    "Judge",
    "MetadataAcl",
    "MissingRuntimeContextError",
    "Mode",
    "NoulAnswer",
    "NoulCriteria",
    "NoulQuestion",
    "Observer",
    "QueryTooLargeError",
    "Reason",
    "ResponseWithheldError",
    "RetrievalInconclusiveError",
    "RetrievalUnavailableError",
    "RetryPolicy",
    "ReviewOutcome",
    "ReviewStatus",
    "RuntimeContext",
    "ScoreAnswer",
    "ScoreQuestion",
    "ScriptedJudge",
    "Selection",
    "Status",
    "SystemOneRequest",
    "SystemOneResult",
    "UnencodableTextError",
    "Usage",
    "WithheldReason",
    "__version__",
    "calibrate",
    "check_acl",
    "collect_evidence",
    "current_runtime_context",
    "resolve_runtime_context",
    "runtime_context",
]

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_top_level_offers_at_most_30_names() -> None:
    assert len(llama_jev.__all__) <= 30, llama_jev.__all__
    assert "JevRetriever" in llama_jev.__all__
    assert "SystemOneRequest" not in llama_jev.__all__


def test_every_error_is_public_in_llama_jev_errors() -> None:
    import llama_jev.errors

    errors = {
        name
        for namespace in public_namespaces()
        for name in namespace.__all__
        if isinstance(getattr(namespace, name), type) and issubclass(getattr(namespace, name), Exception)
    }
    assert errors <= set(llama_jev.errors.__all__)
    assert all(issubclass(getattr(llama_jev.errors, name), llama_jev.errors.JevError) for name in errors)


def test_the_chroma_filter_error_is_a_jev_error_and_still_a_value_error() -> None:
    import llama_jev.errors
    from llama_jev.stores import chroma

    error = llama_jev.errors.UntranslatableFilterError
    assert "UntranslatableFilterError" in llama_jev.errors.__all__
    assert issubclass(error, llama_jev.errors.JevError)
    assert issubclass(error, ValueError)  # 0.2's callers caught ValueError
    assert chroma.UntranslatableFilterError is error  # the module's old name is the same class


# ``calibrate`` is also the command's module (``python -m llama_jev.calibrate``): once that module is
# imported, ``llama_jev.calibrate`` is the module. Its deprecation path is checked in a fresh process.
MOVED = [name for name in NAMES_0_1 if name not in llama_jev.__all__ and name not in {"__version__", "calibrate"}]


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_still_imports_from_the_top_level_with_a_warning_naming_its_home(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"llama_jev\.\w+ has moved to (llama_jev\.[a-z]+)\.\w+") as caught:
        value = getattr(llama_jev, name)
    home = re.search(r"moved to (llama_jev\.[a-z]+)\.", str(caught[0].message))
    assert home is not None
    package = importlib.import_module(home[1])
    assert name in package.__all__
    assert getattr(package, name) is value
    assert caught[0].filename == __file__  # the warning points at the caller's line


@pytest.mark.slow  # a Python subprocess
def test_the_old_top_level_calibrate_is_still_the_function_with_a_warning() -> None:
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n    from llama_jev import calibrate\nexcept DeprecationWarning as w:\n    print(w)\n"
        "warnings.simplefilter('ignore')\nfrom llama_jev import calibrate\n"
        "import llama_jev.calibration\nprint(calibrate is llama_jev.calibration.calibrate)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    warning, same = result.stdout.splitlines()
    assert "llama_jev.calibrate has moved to llama_jev.calibration.calibrate" in warning
    assert same == "True"


def test_a_moved_name_warns_on_every_import_not_only_the_first() -> None:
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="llama_jev.systemone.SystemOneRequest"):
            exec("from llama_jev import SystemOneRequest", {})


def test_a_name_of_the_top_level_imports_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in llama_jev.__all__:
            getattr(llama_jev, name)


def test_every_name_of_0_1_still_imports() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in NAMES_0_1:
            assert getattr(llama_jev, name) is not None, name


def test_the_changelog_names_every_move() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for name, home in llama_jev._MOVED.items():
        assert f"`{name}` → `{home}`" in changelog, name


@pytest.mark.parametrize("namespace", public_namespace_names())
def test_api_md_lists_exactly_each_namespaces_names(namespace: str) -> None:
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## `([\w.]+)`\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S))
    assert namespace in sections, f"docs/api.md has no section for {namespace}"
    listed = re.findall(r"^- `(\w+)` — \S", sections[namespace], flags=re.M)
    assert sorted(listed) == sorted(importlib.import_module(namespace).__all__)


def test_no_public_name_is_missing_from_the_docs() -> None:
    text = "\n".join(page.read_text(encoding="utf-8") for page in DOCS)
    missing = sorted(
        f"{namespace.__name__}.{name}"
        for namespace in public_namespaces()
        for name in namespace.__all__
        if not re.search(rf"\b{re.escape(name)}\b", text)
    )
    assert not missing, f"public names in no page of docs/ or README.md: {missing}"


def test_each_stub_re_exports_names_that_exist() -> None:
    for namespace in public_namespace_names():
        module = importlib.import_module(namespace)
        stub = Path(module.__file__ or "").with_suffix(".pyi")
        for name, home in stub_exports(stub, namespace).items():
            assert hasattr(importlib.import_module(home), name), f"{stub.name}: {home}.{name}"


def test_a_stub_import_that_is_not_an_explicit_re_export_is_refused(tmp_path: Path) -> None:
    stub = tmp_path / "x.pyi"
    stub.write_text("from llama_jev.core.records import Mode\n")
    with pytest.raises(ValueError, match="re-export explicitly"):
        stub_exports(stub, "x")
    stub.write_text("import llama_jev.core\n")
    with pytest.raises(ValueError, match="import names from modules"):
        stub_exports(stub, "x")


def test_no_module_is_also_a_callable() -> None:
    callables = []
    for info in pkgutil.walk_packages(llama_jev.__path__, "llama_jev."):
        if callable(importlib.import_module(info.name)):
            callables.append(info.name)
    assert not callables
    for path in PACKAGE.rglob("*.py"):
        assert "__class__ = " not in path.read_text(encoding="utf-8"), f"{path} swaps a module's class"


@pytest.mark.slow  # a Python subprocess
def test_the_calibration_command_and_the_function_have_different_homes() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import llama_jev.calibrate as m, llama_jev.calibration as c; print(callable(m), c.calibrate.__module__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert result.stdout.split() == ["False", "llama_jev.calibration.analysis"]


def test_no_production_module_imports_the_test_helpers() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(module == "llama_jev.testing" or module.startswith("llama_jev.testing.") for module in modules):
                offenders.append(str(path.relative_to(ROOT)))
    assert sorted(set(offenders)) == EXPECTED_TESTING_IMPORTERS


# llama_jev.serve runs llama_jev.server; the test server imports the server, never the reverse.
EXPECTED_TESTING_IMPORTERS: list[str] = []


# What the docs tell users to import from llama_jev.stores, and the module each is defined in.
STORE_NAMES = {
    "AclPGVectorStore": "llama_jev.stores.postgres.store",
    "chroma_where": "llama_jev.stores.chroma",
    "qdrant_filters": "llama_jev.stores.qdrant",
    "simple_filters": "llama_jev.stores.memory",
}


@pytest.mark.parametrize("name", sorted(STORE_NAMES))
def test_each_stores_dialect_and_the_postgres_store_import_from_the_package(name: str) -> None:
    import llama_jev.stores

    assert name in llama_jev.stores.__all__
    value = getattr(llama_jev.stores, name)
    assert value is getattr(importlib.import_module(STORE_NAMES[name]), name)
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert f"- `{name}` — " in api


def test_the_postgres_store_is_the_same_class_from_the_package_and_the_old_module() -> None:
    import llama_jev.stores
    from llama_jev.stores import postgres

    assert llama_jev.stores.AclPGVectorStore is postgres.AclPGVectorStore


@pytest.mark.slow  # a Python subprocess
def test_importing_the_stores_package_loads_no_store_client() -> None:
    # The dialects are plain functions over llama_index.core; only AclPGVectorStore needs its extra,
    # and only when it is asked for.
    clients = ("psycopg", "psycopg2", "asyncpg", "pgvector", "qdrant_client", "chromadb", "llama_index.vector_stores")
    code = (
        "import sys\n"
        "from llama_jev.stores import adapters, chroma_where, qdrant_filters, simple_filters\n"
        "adapters()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {clients!r} or m.startswith({clients!r})))\n"
        "from llama_jev.stores import AclPGVectorStore\n"
        "print('llama_index.vector_stores.postgres' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded, postgres_loaded = result.stdout.splitlines()
    assert loaded == "[]"
    assert postgres_loaded == "True"


def test_the_stores_old_adapters_tuple_still_resolves_with_a_warning() -> None:
    import llama_jev.stores

    with pytest.warns(DeprecationWarning, match=r"llama_jev\.stores\.adapters\(\)"):
        old = llama_jev.stores.ADAPTERS
    assert old == tuple(llama_jev.stores.adapters())
