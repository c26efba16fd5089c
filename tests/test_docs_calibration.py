"""docs/calibration.md's Python snippets run as they are and print what the page says they print."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from .test_readme import _BLOCK, _expected_output, _matches

PAGE = Path(__file__).resolve().parent.parent / "docs" / "calibration.md"


def test_calibration_page_snippets_run_and_print_what_they_say() -> None:
    blocks = _BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 2
    for number, block in enumerate(blocks):
        namespace: dict[str, object] = {"__name__": "docs"}
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(block, f"docs/calibration.md block {number}", "exec"), namespace)
        printed = output.getvalue().splitlines()
        expected = _expected_output(block)
        assert len(printed) == len(expected), (number, printed)
        for want, got in zip(expected, printed, strict=True):
            assert _matches(want, got), (number, want, got)
