"""A second label sheet adds only new pairs, and "too little data" says how many more (issue 36).

Issue 36 followed the small-sheet note's old advice (another ``--seed``): 13 of the 30 pairs came
back, and after labelling the 17 new ones calibrate still exited 2 (46 joined labels). Real parts:
a SHADOW retriever with a scripted judge writes the decision log and the labelling sample; the
commands run as a person runs them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    JsonlObserver,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.calibration import LabelSampler, write_sample_sheet
from llama_jev.calibration.cli import main as calibrate_main
from llama_jev.calibration.records import CalibrationInputError
from llama_jev.label_sheet import main as label_sheet_main
from llama_jev.testing import HashEmbedding

from .support import marked, marked_answer

PS = [0.05, 0.3, 0.5, 0.7, 0.95]


@pytest.fixture
def shadow(tmp_path: Path) -> tuple[Path, Path]:
    """``(decisions.jsonl, samples.jsonl)`` of 20 questions x 5 passages: 100 distinct pairs."""
    records, samples = tmp_path / "decisions.jsonl", tmp_path / "samples.jsonl"
    nodes = [TextNode(text=marked(p, f"passage {i}"), id_=f"n{i}", metadata={"public": True}) for i, p in enumerate(PS)]
    options = ExecutionOptions(
        mode=Mode.SHADOW, observer=JsonlObserver(records), label_sampler=LabelSampler(samples, rate=1.0)
    )
    retriever = JevRetriever(
        VectorStoreIndex(nodes, embed_model=HashEmbedding()).as_retriever(similarity_top_k=5),
        CandidateSelector(ScriptedJudge(marked_answer), options),
        MetadataAcl(public_key="public"),
    )
    with runtime_context(RuntimeContext(tenant_id="acme", user_id="u1")):
        for number in range(20):
            retriever.retrieve(f"question {number}")
    return records, samples


def label(sheet: Path, labels: Path, labeller: str = "ana") -> set[tuple[str, str]]:
    """Label every row of ``sheet`` into ``labels`` as the labelling page writes them; the pairs labelled."""
    with sheet.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    with labels.open("a", encoding="utf-8") as out:
        for row in rows:
            relevant = float(row["passage"].split("]")[0].removeprefix("[p=")) >= 0.5
            line = {"decision_id": row["decision_id"], "node_id": row["node_id"], "relevant": relevant}
            out.write(json.dumps({**line, "labeller": labeller}) + "\n")
    return {(row["question"], row["node_id"]) for row in rows}


def test_a_second_sheet_with_exclude_repeats_no_labelled_pair_and_calibrate_then_has_enough(
    shadow: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, samples = shadow
    labels = tmp_path / "labels.jsonl"
    first, second = tmp_path / "sheet.csv", tmp_path / "more.csv"

    assert label_sheet_main(["--samples", str(samples), "--out", str(first), "--size", "30"]) == 0
    printed = capsys.readouterr()
    # 30 of 100: the note says how to get 50 distinct pairs at once
    assert "30 pairs make 30, 20 fewer than the 50 labels calibrate needs" in printed.err
    assert "ask for --size 50 (the sample holds 100 pairs not labelled yet)" in printed.err
    assert "--seed" not in printed.err
    done = label(first, labels)
    assert calibrate_main(["--records", str(records), "--labels", str(labels)]) == 2
    short = capsys.readouterr().err
    assert "30 joined labels (need at least 50: 20 more)" in short
    assert f"Label at least 20 more pairs into {labels}" in short
    assert f"--exclude {labels}" in short

    command = ["--samples", str(samples), "--out", str(second), "--size", "30", "--exclude", str(labels)]
    assert label_sheet_main(command) == 0
    printed = capsys.readouterr()
    assert "wrote 30 pairs (of 70 not labelled yet, 30 labelled already left out)" in printed.out
    assert f"--out {labels}" in printed.out  # labelled into the same file
    assert "fewer than" not in printed.err  # 30 new + 30 labelled: enough
    added = label(second, labels)
    assert not done & added
    assert len(done | added) == 60
    assert calibrate_main(["--records", str(records), "--labels", str(labels)]) != 2  # enough labels now
    assert "60 joined" in capsys.readouterr().out


def test_exclude_knows_labels_by_query_and_filled_csv_sheets(shadow: tuple[Path, Path], tmp_path: Path) -> None:
    _, samples = shadow
    by_query = tmp_path / "by-query.jsonl"
    by_query.write_text(
        json.dumps({"query": "  QUESTION 3 ", "node_id": "n1", "relevant": False}) + "\n"
        + json.dumps({"query": "question 4", "node_id": "n2", "relevant": None}) + "\n",  # not labelled yet
        encoding="utf-8",
    )  # fmt: skip
    sheet = write_sample_sheet(samples, tmp_path / "a.csv", size=10, seed=0)
    with (tmp_path / "a.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows[:4]:
        row["relevant"] = "yes"
    with (tmp_path / "filled.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)  # 4 filled, 6 blank: the blank ones are not labelled
    again = write_sample_sheet(samples, tmp_path / "b.csv", size=100, exclude=[by_query, tmp_path / "filled.csv"])
    assert sheet.rows == 10
    assert again.excluded == 5
    assert again.rows == again.available == 95
    with (tmp_path / "b.csv").open(encoding="utf-8", newline="") as handle:
        drawn = {(row["question"], row["node_id"]) for row in csv.DictReader(handle)}
    assert ("question 3", "n1") not in drawn
    assert ("question 4", "n2") in drawn
    assert not {(row["question"], row["node_id"]) for row in rows[:4]} & drawn


def test_a_sample_labelled_to_the_last_pair_says_to_keep_sampling(shadow: tuple[Path, Path], tmp_path: Path) -> None:
    _, samples = shadow
    labels = tmp_path / "labels.jsonl"
    label(write_sample_sheet(samples, tmp_path / "all.csv", size=100).path, labels)
    with pytest.raises(CalibrationInputError, match="all 100 of the sample are labelled already; keep SHADOW"):
        write_sample_sheet(samples, tmp_path / "none.csv", exclude=labels)


def test_a_bad_labels_file_to_exclude_is_named_with_its_line(shadow: tuple[Path, Path], tmp_path: Path) -> None:
    _, samples = shadow
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"node_id": "n1", "relevant": true}\n{"decision_id": "d", "node_id": "n2", "relevant": 1}\n')
    with pytest.raises(CalibrationInputError) as caught:
        write_sample_sheet(samples, tmp_path / "x.csv", exclude=labels)
    assert f"{labels}:1" in str(caught.value)
    assert "2:" in str(caught.value)


def test_a_small_sample_says_to_keep_sampling_and_how_to_draw_only_new_pairs_later(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = tmp_path / "samples.jsonl"
    lines = [
        {"decision_id": f"d{q}", "query": f"q {q}", "candidates": [{"node_id": f"n{i}", "text": "t", "p": 0.5}]}
        for q in range(3)
        for i in range(4)
    ]
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert label_sheet_main(["--samples", str(samples), "--out", str(tmp_path / "s.csv")]) == 0
    err = capsys.readouterr().err
    assert "12 pairs make 12, 38 fewer than the 50 labels calibrate needs" in err
    assert "keep SHADOW sampling a while longer" in err
    assert f"--samples {samples} --out more.csv --exclude labels.jsonl" in err
