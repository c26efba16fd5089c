"""A recommendation must hold on data it was not chosen on (DESIGN Part 3): proven on the held-out
split or exit 1 with the candidate and the miss named; thresholds with 3 decimals rounded toward
caution; labels from spreadsheets in any common dialect; two labellers' agreement."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from llama_jev import DecisionRecord
from llama_jev.calibrate import main
from llama_jev.calibration import CalibrationInputError, calibrate, cohen_kappa
from llama_jev.calibration.statistics import split_by_group

from .calibration_support import record, write_jsonl

LEVELS = (0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95)
RELEVANT_PER_LEVEL = (0, 0, 0, 0, 1, 1, 2, 2, 2, 2)  # of two candidates per level


def log(
    decisions: int, *, spoil: frozenset[str] = frozenset(), digits: int = 0
) -> tuple[list[DecisionRecord], list[dict[str, Any]]]:
    """``decisions`` alike decisions with two labelled candidates per level of p; in the decisions
    named in ``spoil`` every candidate at p >= 0.65 is irrelevant (a judge that fails there).
    ``digits`` adds a tail of digits to each p, as a real judge's probabilities have."""
    records, labels = [], []
    for d in range(decisions):
        decision_id = f"d{d}"
        scores = {}
        for level, (p, relevant) in enumerate(zip(LEVELS, RELEVANT_PER_LEVEL, strict=True)):
            for copy in range(2):
                node_id = f"{decision_id}-l{level}-{copy}"
                scores[node_id] = p + (0.000123 if digits else 0.0)
                truth = copy < relevant and not (decision_id in spoil and p >= 0.65)
                labels.append({"decision_id": decision_id, "node_id": node_id, "relevant": truth})
        records.append(record(decision_id, scores))
    return records, labels


def held_out(decisions: int, holdout: float = 0.3, seed: int = 0) -> frozenset[str]:
    return split_by_group([f"d{d}" for d in range(decisions)], holdout, seed)


def test_a_candidate_that_holds_on_held_out_data_is_recommended() -> None:
    records, labels = log(20)
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95)
    assert report.recommended == report.candidate
    assert report.recommended is not None
    assert (report.recommended.reject, report.recommended.accept) == (0.35, 0.65)
    assert report.holdout is not None
    assert report.holdout.selected >= 10
    assert report.holdout.rejected >= 10
    assert report.exit_code == 0
    assert report.reason is None


def test_too_few_held_out_selections_leave_the_candidate_unproven() -> None:
    records, labels = log(10)
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95, holdout=0.1)
    assert report.recommended is None
    assert report.candidate is not None
    assert (report.candidate.reject, report.candidate.accept) == (0.35, 0.65)
    assert report.holdout is not None
    assert report.holdout.selected == 8  # one held-out decision
    assert report.reason is not None
    assert "only 8 held-out selections at accept=0.650" in report.reason
    assert report.labels_needed is not None
    assert report.labels_needed > 0
    assert f"about {report.labels_needed} more labels" in report.reason
    assert report.exit_code == 1


def test_a_held_out_precision_under_the_target_is_named_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the judge fails on the held-out questions: chosen on the rest, the candidate does not hold
    records, labels = log(20, spoil=held_out(20))
    r, lab = write_jsonl(tmp_path / "r.jsonl", records), write_jsonl(tmp_path / "l.jsonl", labels)
    code = main(["--records", str(r), "--labels", str(lab), "--json", "--report", str(tmp_path / "report.html")])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["recommended"] is None
    assert data["candidate"] == {"reject": 0.35, "accept": 0.65}
    assert "held-out precision 0.000 < target 0.9" in data["reason"]
    assert data["holdout"]["precision"] == 0.0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Stay in SHADOW" in page
    assert "held-out precision 0.000 &lt; target 0.9" in page or "held-out precision 0.000 < target 0.9" in page


def test_the_cli_prints_not_recommended_with_the_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records, labels = log(20, spoil=held_out(20))
    code = main(
        [
            "--records",
            str(write_jsonl(tmp_path / "r.jsonl", records)),
            "--labels",
            str(write_jsonl(tmp_path / "l.jsonl", labels)),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "NOT recommended: candidate reject=0.350 accept=0.650" in out
    assert "recommended: reject" not in out.replace("NOT recommended", "")


def test_thresholds_have_3_decimals_rounded_toward_caution_and_figures_at_those_values() -> None:
    records, labels = log(20, digits=6)  # levels 0.650123 ...
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95)
    assert report.recommended is not None
    # accept rounded up (0.650123 -> 0.651, which then selects from the next level up), reject down
    assert (report.recommended.reject, report.recommended.accept) == (0.35, 0.651)
    row = next(row for row in report.thresholds if row.accept == 0.651)
    assert row.selected == 14 * 6  # p >= 0.651: the levels 0.750123 and up, 14 calibration decisions
    assert report.holdout is not None
    assert report.holdout.selected == 6 * 6


def test_every_bad_line_of_a_semicolon_sheet_is_reported(tmp_path: Path) -> None:
    records, labels = log(10)
    sheet = tmp_path / "labels.csv"
    with sheet.open("w", encoding="utf-8-sig", newline="") as handle:  # a spreadsheet in a European locale
        writer = csv.writer(handle, delimiter=";")
        writer.writerow(["decision_id", "node_id", "question", "passage", "relevant"])
        for number, label in enumerate(labels):
            relevant = "ja" if number in (4, 9) else ("yes" if label["relevant"] else "no")
            node_id = "" if number == 30 else label["node_id"]
            writer.writerow([label["decision_id"], node_id, "a question", "a passage", relevant])
    with pytest.raises(CalibrationInputError) as raised:
        calibrate(records, sheet)
    message = str(raised.value)
    assert "3 bad labels" in message
    for line, problem in ((6, "'ja'"), (11, "'ja'"), (32, "column 'node_id' is empty")):
        assert f"{sheet}:{line}: not a label: " in message
        assert problem in message
    assert "accepted: true/false, yes/no" in message
    assert "JSON" not in message  # a CSV's cells are text: the words are for a spreadsheet
    assert [line for line, _ in raised.value.problems] == [6, 11, 32]


@pytest.mark.parametrize("delimiter", [",", ";", "\t"])
def test_a_sheet_reads_the_same_in_every_common_dialect(tmp_path: Path, delimiter: str) -> None:
    records, labels = log(10)
    sheet = tmp_path / "labels.csv"
    with sheet.open("w", encoding="utf-8-sig", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(["decision_id", "node_id", "question", "passage", "relevant"])
        writer.writerows(
            [
                label["decision_id"],
                label["node_id"],
                "q; with, both",
                "line one\nline two",
                str(label["relevant"]).upper(),
            ]
            for label in labels
        )
    assert calibrate(records, sheet).to_json() == calibrate(records, labels).to_json()


def test_a_sheet_without_the_columns_says_what_it_found(tmp_path: Path) -> None:
    records, _ = log(10)
    sheet = tmp_path / "labels.csv"
    sheet.write_text("id|node|answer\nd0|d0-l0-0|yes\n", encoding="utf-8")
    with pytest.raises(CalibrationInputError, match=r"labels\.csv:1: the header has no node_id, relevant"):
        calibrate(records, sheet)


def test_two_labellers_agreement_is_reported_and_disagreements_left_out() -> None:
    records, labels = log(10)
    named = [{**label, "labeller": "ana"} for label in labels]
    second = []
    for number, label in enumerate(labels[:100]):
        flipped = number % 10 == 0  # ben disagrees on 10 of the 100 pairs both labelled
        second.append({**label, "labeller": "ben", "relevant": label["relevant"] != flipped})
    report = calibrate(records, named + second, target_precision=0.8, min_npv=0.8)
    assert report.agreement is not None
    assert (report.agreement.pairs, report.agreement.disagreements) == (100, 10)
    answers = [(label["relevant"], other["relevant"]) for label, other in zip(labels[:100], second, strict=True)]
    assert report.agreement.kappa == pytest.approx(cohen_kappa(answers))
    assert report.labels == 200 - 10
    assert report.to_dict()["agreement"]["kappa"] == pytest.approx(report.agreement.kappa)


def test_one_labellers_correction_replaces_the_earlier_answer() -> None:
    records, labels = log(10)
    named = [{**label, "labeller": "ana"} for label in labels]
    corrected = {**named[0], "relevant": not named[0]["relevant"]}
    withdrawn = {**named[1], "relevant": None}  # went back and skipped it
    report = calibrate(records, [*named, corrected, withdrawn])
    assert report.conflicts.count == 0  # one person's later answer is not a disagreement
    assert report.labels == 199
    assert report.unlabelled == 1
    assert report.agreement is None


def test_cohen_kappa_by_hand() -> None:
    # 20 pairs: both yes 8, both no 6, yes/no 4, no/yes 2 -> po 0.7, pe 0.6*0.5 + 0.4*0.5 = 0.5 -> 0.4
    answers = [(True, True)] * 8 + [(False, False)] * 6 + [(True, False)] * 4 + [(False, True)] * 2
    assert cohen_kappa(answers) == pytest.approx(0.4)
