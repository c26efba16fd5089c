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
