"""The README's Python snippets run as they are, and print what the README says they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _expected_output(block: str) -> list[str]:
    """The ``# ...`` lines after a block's last line of code: what it prints."""
    lines = block.rstrip("\n").splitlines()
    expected: list[str] = []
    while lines and lines[-1].startswith("# "):
        expected.insert(0, lines.pop()[2:])
    return expected


def _matches(expected: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


def test_readme_snippets_run_and_print_what_they_say() -> None:
    blocks = _BLOCK.findall(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "readme"}
    for number, block in enumerate(blocks):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(block, f"README block {number}", "exec"), namespace)
        printed = output.getvalue().splitlines()
        expected = _expected_output(block)
        assert len(printed) == len(expected), (number, printed)
        for want, got in zip(expected, printed, strict=True):
            assert _matches(want, got), (number, want, got)
