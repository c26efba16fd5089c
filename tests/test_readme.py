"""Every code block in README.md and docs/*.md runs as it is and prints what the page says it prints.

The conventions a page follows (write docs to them; this test enforces them):

- Blocks fenced ```` ```python ```` and ```` ```bash ```` run; any other fence (```` ```text ````
  for pictures and sample output) is prose and does not.
- The blocks of one page run in order, in a fresh temporary working directory of their own
  (so ``decisions.jsonl`` written by one block is there for the next); the python blocks of one
  page share one namespace, so a page may build on its earlier blocks. Pages never share state.
- The lines at the end of a block that start with ``# `` are what it prints on stdout, one line
  each, in order; ``...`` inside such a line matches anything. A block without them must print
  nothing. (Comments elsewhere in a block are ordinary comments.)
- bash blocks run with ``bash -e -o pipefail``, the interpreter running the tests first on
  ``PATH`` (so ``python`` is the test venv's), and must exit 0. Python and bash blocks run with
  no ``TYPESAFE_*`` / ``JEV_*`` / ``QDRANT_*`` variables: nothing reaches a real service.
- A block that must not run (it installs packages, serves until stopped, needs a server, a key
  or minutes) is preceded by the line ``<!-- not-run: <reason> -->``; the reason is required and
  says where the same behaviour is tested, when it is.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
RUNNABLE = ("python", "bash")
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.*?)\s*-->")
_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")
# Secrets and service addresses a developer may have exported: a snippet must never use them.
_SERVICE_VARIABLES = ("TYPESAFE_API_KEY", "TYPESAFE_BASE_URL", "JEV_API_KEY", "QDRANT_URL", "QDRANT_API_KEY")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_run: str | None  # the reason, when marked not-run

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with their language and not-run marker."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    number = 0
    while number < len(lines):
        fence = lines[number]
        if not fence.startswith("```"):
            number += 1
            continue
        language = fence[3:].strip()
        end = number + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        previous = next((line for line in reversed(lines[:number]) if line.strip()), "")
        marker = _NOT_RUN.fullmatch(previous.strip())
        code = "\n".join(lines[number + 1 : end]) + "\n"
        found.append(Block(page, number + 1, language, code, marker.group("reason") if marker else None))
        number = end + 1
    return found


def expected_output(code: str) -> list[str]:
    """The ``# ...`` lines after a block's last line of code: what it prints."""
    lines = code.rstrip("\n").splitlines()
    expected: list[str] = []
    while lines and lines[-1].startswith("# "):
        expected.insert(0, lines.pop()[2:])
    return expected


def _matches(expected: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


def _run_python(block: Block, namespace: dict[str, object]) -> str:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block.code, block.name, "exec"), namespace)
    return output.getvalue()


def _run_bash(block: Block, cwd: Path) -> str:
    env = {key: value for key, value in os.environ.items() if key not in _SERVICE_VARIABLES}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"  # examples.* as from the clone
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (block.name, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.mark.slow  # runs the example, PostgreSQL and subprocesses
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_page_blocks_run_and_print_what_they_say(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in _SERVICE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_page"}
    for block in blocks(page):
        if block.language not in RUNNABLE:
            continue
        if block.not_run is not None:
            assert block.not_run, f"{block.name}: a not-run block must say why"
            continue
        run = _run_python(block, namespace) if block.language == "python" else _run_bash(block, tmp_path)
        printed = run.splitlines()
        expected = expected_output(block.code)
        assert len(printed) == len(expected), (block.name, printed)
        for want, got in zip(expected, printed, strict=True):
            assert _matches(want, got), (block.name, want, got)


def test_readme_is_a_quick_start_whose_snippets_run() -> None:
    runnable = [b for b in blocks(README) if b.language in RUNNABLE and b.not_run is None]
    assert len(runnable) >= 6
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_every_docs_page_is_listed_in_the_index_and_every_link_resolves() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name})" in index, f"docs/index.md does not list {page.name}"
    for page in PAGES:
        for link in _LINK.finditer(page.read_text(encoding="utf-8")):
            target = link.group("target")
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_only_fenced_languages_the_test_knows_are_used() -> None:
    for page in PAGES:
        for block in blocks(page):
            assert block.language in (*RUNNABLE, "text", "json"), f"{block.name}: unknown fence {block.language!r}"


# --- install lines (issue 36): the package is not on PyPI, so every `pip install` of it names the clone ---

# Text a user reads and may paste: the pages, and the examples' and benchmarks' messages and docstrings.
INSTALL_TEXTS = [
    *PAGES,
    ROOT / "judge_training" / "README.md",
    *sorted((ROOT / "examples").rglob("*.py")),
    *sorted((ROOT / "benchmarks").rglob("*.py")),
    *sorted((ROOT / "judge_training").rglob("*.py")),
]
_PIP_INSTALL = re.compile(r"pip\s+install\s+(?P<args>[^`\n&;|)(#']*)")
# What a clone's path is written as: "." from the clone's root, or the README's placeholder.
_CLONE_PATHS = (".", "/path/to/llama_jev")
_OPTIONS_WITH_VALUE = ("-e", "--editable", "-r", "--requirement", "-c", "--constraint")


def pip_install_lines(path: Path) -> list[tuple[int, str]]:
    """Every ``pip install ...`` in ``path`` (line number, arguments), except one quoted as what fails."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _PIP_INSTALL.finditer(text):
        line_number = text.count("\n", 0, match.start()) + 1
        line = text.splitlines()[line_number - 1]
        if "does not work" in line:  # the README saying that `pip install llama-jev` fails
            continue
        found.append((line_number, match.group("args").strip().removesuffix("\\").strip()))  # a continued line
    return found


def _requirements(arguments: str) -> list[str]:
    """The requirements of a ``pip install`` argument list (an editable one included), options dropped."""
    import shlex

    words = shlex.split(arguments if arguments.count('"') % 2 == 0 else arguments + '"')
    requirements, take_next = [], False
    for word in words:
        if take_next or not word.startswith("-"):
            requirements.append(word)
        take_next = word in ("-e", "--editable")
    return requirements


def check_install_requirement(requirement: str, extras: set[str]) -> str | None:
    """Why ``requirement`` fails from a clone as written (``None``: it works)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    local = re.fullmatch(r"(?P<path>[^\[\]\s@]+)(\[(?P<extras>[^\]]*)\])?", requirement)
    if local and (local["path"].startswith((".", "/")) or local["path"].startswith("file:")):
        named = {extra.strip() for extra in (local["extras"] or "").split(",") if extra.strip()}
        if local["path"] not in _CLONE_PATHS:
            return f"{requirement}: not a path to the clone (write . from its root, or /path/to/llama_jev)"
    else:
        try:
            parsed = Requirement(requirement)
        except InvalidRequirement as error:
            return f"{requirement}: pip cannot read it ({error})"
        named = set(parsed.extras)
        if canonicalize_name(parsed.name) == "llama-jev":
            if not parsed.url:
                return f'{requirement}: llama-jev is not on PyPI ("No matching distribution"): pip install -e ".[...]"'
            if parsed.url.removeprefix("file://") not in _CLONE_PATHS:
                return f"{requirement}: {parsed.url} is not the clone"
        elif named:
            return None  # another project's extras: not ours to check
    unknown = sorted(named - extras)
    return f"{requirement}: no extra {', '.join(unknown)} in pyproject.toml" if unknown else None


def _optional_dependencies() -> dict[str, list[str]]:
    """pyproject.toml's extras."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return dict(project["optional-dependencies"])


def _extras() -> set[str]:
    return set(_optional_dependencies())


def test_every_install_line_works_from_a_clone_as_written() -> None:
    extras, problems, checked = _extras(), [], 0
    for path in INSTALL_TEXTS:
        for line, arguments in pip_install_lines(path):
            for requirement in _requirements(arguments):
                checked += 1
                problem = check_install_requirement(requirement, extras)
                if problem:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: {problem}")
    assert checked >= 10  # the README's, the docs', the examples' and the benchmarks' lines were found
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("requirement", "fails"),
    [
        ("llama-jev[serve,local]", True),  # what the docs said: pip answers "No matching distribution found"
        ("llama-jev", True),
        (".[serve,local]", False),
        (".[serve,locall]", True),  # a misspelt extra: pip installs without it and only warns
        ("/path/to/llama_jev[qdrant]", False),
        ("llama-jev[qdrant] @ file:///path/to/llama_jev", False),
        ("../elsewhere[qdrant]", True),
        ("llama-index-postprocessor-jev", False),
        ("torch==2.13.0", False),
    ],
)
def test_the_install_line_check_tells_the_clone_from_the_index(requirement: str, fails: bool) -> None:
    assert (check_install_requirement(requirement, _extras()) is not None) is fails


def test_the_install_line_finder_reads_code_spans_docstrings_and_messages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        'Run `pip install "llama-jev[chroma]"` first.\n'
        'python3 -m venv .venv && .venv/bin/pip install -q -e ".[example]" && python -m x\n'
        "'For real embeddings offline: pip install -e \".[local]\" (in the llama_jev clone).'\n"
        "Not on the package index yet (`pip install llama-jev` does not work today)\n",
        encoding="utf-8",
    )
    found = [(line, _requirements(arguments)) for line, arguments in pip_install_lines(page)]
    assert found == [(1, ["llama-jev[chroma]"]), (2, [".[example]"]), (3, [".[local]"])]


# --- what the pages promise beyond their blocks (issue 36) ---------------------------------------------------


def test_every_api_md_line_is_a_whole_sentence_with_proper_names_capitalised() -> None:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    lines = re.findall(r"^- `\w+` — (.*)$", text, flags=re.M)
    assert len(lines) > 100
    cut = [line for line in lines if not line.rstrip().endswith((".", ")", "?", '"', "`"))]
    assert not cut, f"lines cut off mid-sentence: {cut}"
    prose = [re.sub(r"`[^`]*`", "", line) for line in lines]  # code keeps its own spelling
    lower = [line for line in prose if re.search(r"\b(platt|cohen|wilson|brier|qdrant|chroma|postgresql)\b", line)]
    assert not lower, f"proper names lower-cased: {lower}"


def test_the_index_names_every_store_the_stores_page_covers() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    (row,) = [line for line in index.splitlines() if line.startswith("| [stores-and-pushdown.md]")]
    for store in ("in-memory", "Qdrant", "PostgreSQL", "Chroma"):
        assert store in row, f"docs/index.md's stores row leaves out {store}"


@pytest.mark.slow  # chromadb's embedded engine
def test_the_chroma_snippet_run_twice_in_one_folder_adds_no_duplicate_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chromadb = pytest.importorskip("chromadb")
    page = DOCS / "stores-and-pushdown.md"
    runnable = [block for block in blocks(page) if block.language == "python" and block.not_run is None]
    setup = runnable[0]
    (chroma,) = [block for block in runnable if "chromadb.PersistentClient" in block.code]
    monkeypatch.chdir(tmp_path)
    printed = []
    try:
        for _ in range(2):  # as two runs of the page would: fresh nodes each time, the same folder
            # chromadb keeps one client per path string in the process ("chroma_data" is relative): a
            # fresh process has none, and the page's own test ran in another folder
            chromadb.api.client.SharedSystemClient.clear_system_cache()
            namespace: dict[str, object] = {"__name__": "docs_page"}
            _run_python(setup, namespace)
            printed.append(_run_python(chroma, namespace))
            assert namespace["collection"].count() == 3  # type: ignore[attr-defined]
    finally:
        chromadb.api.client.SharedSystemClient.clear_system_cache()
    assert printed[0] == printed[1]


def _closure(extra: str) -> set[str]:
    """The canonical names of everything ``llama-jev[extra]`` requires, through its own extras."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    extras = _optional_dependencies()
    names: set[str] = set()
    todo, seen = [extra], set()
    while todo:
        current = todo.pop()
        seen.add(current)
        for line in extras[current]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == "llama-jev":
                todo += [name for name in requirement.extras if name not in seen]
            else:
                names.add(canonicalize_name(requirement.name))
    return names


def test_the_test_extras_install_the_instrumentation_example_users_get() -> None:
    # llama-index-observability-otel 0.7 pins llama-index-instrumentation < 0.6 (issue 36): in [test]
    # it downgraded the suite's to 0.5.0 while [example] users get 0.6.0. It has an extra of its own.
    for extra in ("test", "dev"):
        assert "llama-index-observability-otel" not in _closure(extra), extra
    assert "llama-index-observability-otel" in _closure("test-otel")
    assert _closure("test") <= _closure("test-otel")


# --- saying what a long command is doing (issue 36) -----------------------------------------------------------

_LONG_STEPS = re.compile(r"pip install|-m pytest|mypy$|ruff check|wheel_check$")


def test_ci_prints_a_line_before_every_long_step() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    long_steps = [number for number, line in enumerate(code) if _LONG_STEPS.search(line) and "step " not in line]
    assert len(long_steps) >= 6  # pip twice (and pip's upgrade), ruff, mypy, the suite, the otel run, the wheel check
    for number in long_steps:
        before = code[max(0, number - 3) : number]
        assert any(line.startswith("step ") for line in before), f".ci/run runs {code[number]!r} without a step line"
    assert 'step "the test suite passed in $((SECONDS - suite_started)) s"' in code  # how long the suite took


def test_the_readmes_test_command_says_what_it_is_doing_before_each_long_part() -> None:
    text = README.read_text(encoding="utf-8")
    command = text[text.index("# 2. Run the tests") : text.index("```", text.index("# 2. Run the tests"))]
    assert command.index('echo "== installing the test extra') < command.index("pip install")
    assert command.index('echo "== running the tests') < command.index("-m pytest")


_MADE_BY_RUNNING = {"examples/refund_policy/storage"}  # the example's Qdrant folder (ignored by git)
_REPO_PATH = re.compile(
    r"(?<![\w/.])(?:benchmarks|judge_training|examples|tests|docs|data|llama_jev|docker)/[\w./-]*\w"
)


def test_every_repository_path_the_pages_name_exists() -> None:
    # Moving a file (issue 36 moved the judge's training to judge_training/) must not leave a page
    # pointing at its old place; the judge_training README is a page too.
    missing = []
    for page in [*PAGES, ROOT / "judge_training" / "README.md"]:
        for line_number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            for path in _REPO_PATH.findall(line):
                if "<" in path or "*" in path or path in _MADE_BY_RUNNING:
                    continue
                if not (ROOT / path).exists():
                    missing.append(f"{page.relative_to(ROOT)}:{line_number}: {path}")
    assert not missing, "\n".join(missing)
