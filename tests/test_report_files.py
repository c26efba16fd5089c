"""The calibration report names real files, or says what a stand-in name is (issue 36).

The example's report showed ``SAMPLES.jsonl`` and ``LABELS.jsonl``; every report suggested
``json.load(open("calibration.json"))``, a file no command wrote. Each command a report shows is
run here as a person pastes it (bash, in a fresh folder).
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.refund_policy import calibrate as example
from examples.refund_policy import models, store
from examples.refund_policy.ingest import build_collection
from examples.refund_policy.query import open_index
from llama_jev import ScriptedJudge
from llama_jev.calibration import calibrate, mapping_from_dict
from llama_jev.calibration.cli import main as calibrate_main

from .browser import Browser, find_chromium
from .calibration_support import overconfident_log, write_jsonl
from .support import HashEmbedding

_STAND_INS = ("SAMPLES", "LABELS.jsonl", "DECISIONS.jsonl")


def pre_blocks(page: str) -> list[str]:
    """Every ``<pre>`` of the page as a person copies it."""
    return [html.unescape(block) for block in re.findall(r"<pre>(.*?)</pre>", page, re.S)]


def run_pasted(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` in bash as pasted, with ``python`` being this interpreter."""
    command = command.replace("python -m", f"{shlex.quote(sys.executable)} -m")
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


def saved_mapping_works(page: str, cwd: Path) -> None:
    """The mapping section's command writes calibration.json, and the line it suggests reads it."""
    (save,) = [block for block in pre_blocks(page) if "calibration.json" in block]
    done = run_pasted(save, cwd)
    assert done.returncode in (0, 1), done.stderr  # recommended or not: the JSON is written either way
    assert 'mapping_from_dict(json.load(open("calibration.json"))["mapping"])' in page
    with (cwd / "calibration.json").open(encoding="utf-8") as handle:
        mapping = mapping_from_dict(json.load(handle)["mapping"])
    assert 0.0 < mapping(0.5) < 1.0


@pytest.mark.slow  # runs bash and the calibrate command
def test_the_cli_reports_mapping_command_writes_the_file_it_loads(tmp_path: Path) -> None:
    records, labels = overconfident_log(40, seed=5)
    records_path, labels_path = write_jsonl(tmp_path / "log.jsonl", records), write_jsonl(tmp_path / "l.jsonl", labels)
    report = tmp_path / "report.html"
    calibrate_main(["--records", str(records_path), "--labels", str(labels_path), "--report", str(report)])
    page = report.read_text(encoding="utf-8")
    assert not any(stand_in in page for stand_in in _STAND_INS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    saved_mapping_works(page, elsewhere)


def test_a_report_that_does_not_know_the_files_says_what_each_stand_in_is() -> None:
    records, labels = overconfident_log(14, seed=3)  # too few held out: the advice is to label more
    report = calibrate(records, labels)
    for page in (report.to_html(), report.to_html(cli=True)):
        assert not any(stand_in in page for stand_in in _STAND_INS)
        commands = "\n".join(pre_blocks(page))
        assert "--samples samples.jsonl" in commands
        assert "--exclude labels.jsonl" in commands
        text = html.unescape(re.sub(r"<[^>]+>", "", page))
        assert "samples.jsonl your labelling sample" in text
        assert "labels.jsonl the labels you calibrated with" in text
    cli = html.unescape(re.sub(r"<[^>]+>", "", report.to_html(cli=True)))
    assert "decisions.jsonl is your decision log" in cli
    assert "--json > calibration.json" in cli


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    with store.connect(tmp_path / "qdrant") as client:
        build_collection(client, HashEmbedding())
        yield open_index(client, HashEmbedding())


@pytest.mark.slow  # runs the example's calibration step, then its report's commands
def test_the_examples_report_names_its_own_files_and_its_commands_run(index: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert not example.steps(index, ScriptedJudge(models.keyword_answer), out, say=lambda line: None)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert not any(stand_in in page for stand_in in _STAND_INS)
    commands = pre_blocks(page)
    named = [Path(path) for block in commands for path in re.findall(r"--(?:records|labels|samples) (\S+)", block)]
    assert {path.name for path in named} == {"records.jsonl", "labels.jsonl", "samples.jsonl"}
    assert all(path.is_file() for path in named), named
    label_more = next(block for block in commands if "llama_jev.label_sheet" in block)
    assert f"--exclude {out / 'labels.jsonl'}" in label_more
    draw = "\n".join(label_more.splitlines()[:2])  # the sheet; the next line serves the labelling page
    done = run_pasted(draw, tmp_path)
    assert done.returncode == 2  # every pair of the example's sample carries a golden label already
    assert "labelled already" in done.stderr
    again = next(block for block in commands if "llama_jev.calibrate" in block and "--report" in block)
    rerun = run_pasted(again.replace(str(out / "report.html"), str(tmp_path / "again.html")), tmp_path)
    assert rerun.returncode == 1, rerun.stderr  # the same verdict from the same files: stay in SHADOW
    saved_mapping_works(page, tmp_path)


def _sweep_rows(page: str) -> list[tuple[str, str]]:
    """``(row class, first cell)`` of each row of the accept-threshold table."""
    table = page.split("<h2>Accept thresholds on the calibration split</h2>")[1].split("</table>")[0]
    return [(cls or "", cell) for cls, cell in re.findall(r'<tr(?: class="(\w+)")?><td>([^<]*)</td>', table)]


def test_the_thresholds_table_has_a_row_for_the_best_accept_the_verdict_names() -> None:
    records, labels = overconfident_log(40, seed=0)
    report = calibrate(records, labels, target_precision=0.8809)
    assert report.candidate is None
    named = re.search(r"the best is \d\.\d+ at accept=(\d\.\d+)", str(report.reason))
    assert named is not None
    assert round(float(named[1]) * 100) % 5 != 0  # not a row the table shows anyway
    rows = _sweep_rows(report.to_html())
    assert ("pick", f"{named[1]} (best)") in rows
    assert [cell for cls, cell in rows if cls] == [f"{named[1]} (best)"]


def test_the_thresholds_table_marks_the_chosen_accept() -> None:
    records, labels = overconfident_log(60, seed=4)
    report = calibrate(records, labels, target_precision=0.7, min_npv=0.8)
    assert report.candidate is not None
    rows = _sweep_rows(report.to_html())
    assert [cell for cls, cell in rows if cls] == [f"{report.candidate.accept:.3f} (chosen)"]


CHROMIUM = find_chromium()


@pytest.mark.slow  # a headless browser
@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"), reason="Chromium is not installed (.ci/run installs it)"
)
@pytest.mark.parametrize("width", [390, 1280])
def test_the_report_fits_a_phone_and_shows_the_best_row(tmp_path: Path, width: int) -> None:
    records, labels = overconfident_log(40, seed=0)
    report = calibrate(records, labels, target_precision=0.8809)
    page_file = report.write_html(tmp_path / "report.html", cli=True)
    assert CHROMIUM is not None, "CI needs Chromium: .ci/run installs Debian's chromium"
    browser = Browser(CHROMIUM)
    try:
        page = browser.page(width=width, height=844)
        page.goto(page_file.as_uri())
        page.wait_for("document.readyState === 'complete' && document.querySelector('tr.pick') !== null")
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # the page never scrolls sideways
        best = f"{report.best_accept:.3f} (best)"
        assert page.evaluate("document.querySelector('tr.pick td').textContent") == best
        # a chart shrinks to the width rather than running off it
        assert (
            page.evaluate(
                "Math.max(...[...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect().right))"
            )
            <= width
        )
    finally:
        browser.close()
