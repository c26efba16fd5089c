"""What new users ran into (issue 25), each pinned: the calibration report's advice and commands,
the label sheet's size, the wording of counts."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RetrievalInconclusiveError,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.calibration import calibrate
from llama_jev.calibration.cli import main as calibrate_main
from llama_jev.calibration.samples import LabelSampler
from llama_jev.label_sheet import main as label_sheet_main
from llama_jev.testing import HashEmbedding

from .calibration_support import overconfident_log, write_jsonl
from .support import marked, marked_answer


def _pre_after(page: str, heading: str) -> str:
    """The text of the first ``<pre>`` after ``heading``, as a person copies it."""
    block = re.search(re.escape(heading) + r".*?<pre>(.*?)</pre>", page, re.S)
    assert block is not None, heading
    return html.unescape(block[1])


# --- the calibration report -------------------------------------------------------------------


def test_no_candidate_at_all_is_not_called_a_miss_on_held_out_data() -> None:
    records, labels = overconfident_log(40, seed=9)
    report = calibrate(records, labels, target_precision=0.995)
    assert report.candidate is None
    assert report.holdout is None
    page = report.to_html(cli=True)
    assert "No thresholds meet the targets even on the labels they are chosen from" in page
    assert "nothing was tested on held-out data" in page
    assert "not chosen on" not in page


def test_the_red_box_and_the_chart_name_the_same_best_accept() -> None:
    records, labels = overconfident_log(40, seed=0)
    report = calibrate(records, labels, target_precision=0.8809)
    assert report.candidate is None
    named = re.search(r"the best is (\d\.\d+) at accept=(\d\.\d+)", str(report.reason))
    assert named is not None, report.reason
    assert float(named[2]) == report.best_accept
    page = report.to_html()
    marks = re.findall(r"best (\d\.\d+): ≥ (\d\.\d+)", page)
    assert marks == [(named[2], named[1])]  # the chart marks the accept and bound the reason names, only those
    assert any(row.accept == report.best_accept for row in report.thresholds)


@pytest.mark.slow  # runs the command in bash
def test_the_run_again_and_label_commands_name_the_files_used_and_run_verbatim(tmp_path: Path) -> None:
    folder = tmp_path / "my calibration"
    folder.mkdir()
    records, labels = overconfident_log(14, seed=3)
    records_path = write_jsonl(folder / "shadow log.jsonl", records)
    labels_path = write_jsonl(folder / "ana's labels.jsonl", labels)
    report_path = folder / "first report.html"
    code = calibrate_main(
        ["--records", str(records_path), "--labels", str(labels_path), "--report", str(report_path), "--seed", "2"]
    )
    assert code == 1  # too few labels for the held-out split to prove the candidate
    page = report_path.read_text(encoding="utf-8")

    label_commands = _pre_after(page, "To label more pairs:")
    assert f"--out {shlex_quote(labels_path)}" in label_commands
    again = _pre_after(page, "Run calibration again:")
    assert "decisions.jsonl" not in again
    assert "DECISIONS" not in again
    assert "--seed 2" in again

    second = folder / "second report.html"
    command = again.replace("python -m", f"{shlex_quote(Path(sys.executable))} -m", 1).replace(
        shlex_quote(report_path), shlex_quote(second)
    )
    done = subprocess.run(["bash", "-e", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr  # the same verdict, from the same files
    assert second.read_text(encoding="utf-8").count("Run calibration again") == 1


def shlex_quote(path: Path) -> str:
    import shlex

    return shlex.quote(str(path))


def test_a_skipped_or_blank_row_is_counted_as_such_in_the_singular() -> None:
    records, labels = overconfident_log(40, seed=9)
    skipped = {**labels[0], "relevant": None}
    report = calibrate(records, [skipped, *labels[1:]], target_precision=0.8, min_npv=0.9)
    assert report.unlabelled == 1
    page = report.to_html()
    assert "1 sheet row has no relevant value (left blank or skipped): not used." in page
    assert "yet" not in re.sub(r"<[^>]+>", "", page).split("The data")[-1]


# --- the label sheet --------------------------------------------------------------------------


def _samples(path: Path, retrievals: int) -> Path:
    sampler = LabelSampler(path, rate=1.0)
    judge = ScriptedJudge(marked_answer)
    nodes = [
        TextNode(text=marked(p, f"passage {i}"), id_=f"n{i}", metadata={"public": True})
        for i, p in enumerate([0.05, 0.3, 0.5, 0.7, 0.95])
    ]
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding())
    options = ExecutionOptions(mode=Mode.SHADOW, label_sampler=sampler)
    retriever = JevRetriever(
        index.as_retriever(similarity_top_k=5), CandidateSelector(judge, options), MetadataAcl(public_key="public")
    )
    with runtime_context(RuntimeContext(tenant_id="acme", user_id="u1")):
        for number in range(retrievals):
            retriever.retrieve(f"question {number}")
    return path


def test_a_sheet_smaller_than_calibrate_needs_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = _samples(tmp_path / "samples.jsonl", 20)
    assert label_sheet_main(["--samples", str(samples), "--out", str(tmp_path / "s.csv"), "--size", "30"]) == 0
    err = capsys.readouterr().err
    assert "30 pairs make 30, 20 fewer than the 50 labels calibrate needs" in err
    assert "--size 50" in err  # not another --seed: that repeats pairs (issue 36, tests/test_label_more.py)
    assert label_sheet_main(["--samples", str(samples), "--out", str(tmp_path / "big.csv"), "--size", "60"]) == 0
    assert "fewer than" not in capsys.readouterr().err


# --- the engine's words -----------------------------------------------------------------------


def test_one_uncertain_passage_is_said_in_the_singular() -> None:
    nodes = [
        TextNode(text=marked(0.5, "refunds within 14 days"), id_="a", metadata={"public": True}),
        TextNode(text=marked(0.03, "opening hours"), id_="b", metadata={"public": True}),
    ]
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding())
    selector = CandidateSelector(ScriptedJudge(marked_answer), ExecutionOptions(mode=Mode.ENFORCE))
    retriever = JevRetriever(index.as_retriever(similarity_top_k=2), selector, MetadataAcl(public_key="public"))
    with (
        runtime_context(RuntimeContext(tenant_id="acme", user_id="u1")),
        pytest.raises(RetrievalInconclusiveError, match="no passage was clearly relevant and 1 was uncertain;"),
    ):
        retriever.retrieve("refund conditions?")
