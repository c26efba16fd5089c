"""Calibration: statistics against hand-computed values, joining, bad input, and the recommendation
on a synthetic over-confident judge whose truth is known."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JsonlObserver,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    Status,
)
from llama_jev.calibration import (
    CalibrationInputError,
    CalibrationReport,
    InsufficientLabelsError,
    MixedRecordsError,
    brier_score,
    calibrate,
    expected_calibration_error,
    reliability_table,
    wilson_lower_bound,
)
from llama_jev.calibration.statistics import (
    band_metrics,
    choose_accept,
    choose_thresholds,
    enforce_outcomes,
    split_by_group,
    sweep_accept,
    sweep_reject,
)
from llama_jev.core.records import QUERY_KEY_SECRET_ENVIRONMENT, query_key
from llama_jev.engine import RELEVANCE_QUESTION, Candidate

from .calibration_support import SECRET, overconfident_log, record, write_jsonl
from .support import marked, marked_answer

# --- statistics against hand-computed values --------------------------------------------------


def test_wilson_lower_bound_matches_hand_computation() -> None:
    # 5 of 10, z = 1.6449 (one-sided 95%): (0.5 + z²/20 - z * sqrt(0.025 + z²/400)) / (1 + z²/10)
    z2 = 1.6448536269514722**2
    expected = (0.5 + z2 / 20 - 1.6448536269514722 * math.sqrt(0.025 + z2 / 400)) / (1 + z2 / 10)
    assert expected == pytest.approx(0.26927, abs=1e-5)
    assert wilson_lower_bound(5, 10) == pytest.approx(expected, abs=1e-12)


def test_wilson_lower_bound_of_all_successes_is_below_one() -> None:
    # 10 of 10: n / (n + z²) = 10 / 12.7055
    assert wilson_lower_bound(10, 10) == pytest.approx(0.78706, abs=1e-5)
    assert wilson_lower_bound(0, 10) == 0.0
    assert wilson_lower_bound(0, 0) == 0.0


def test_wilson_lower_bound_tightens_with_more_data() -> None:
    assert wilson_lower_bound(9, 10) < wilson_lower_bound(90, 100) < wilson_lower_bound(900, 1000) < 0.9


def test_wilson_lower_bound_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_lower_bound(11, 10)


def test_ece_matches_hand_computation() -> None:
    # bins: 0.9-1 {0.95 T} |0.95-1| = 0.05; 0.8-0.9 {0.85 T, 0.85 F} |0.85-0.5| x2 = 0.7;
    # 0.1-0.2 {0.15 F} 0.15; 0.0-0.1 {0.05 F} 0.05 -> (0.05 + 0.7 + 0.15 + 0.05) / 5 = 0.19
    pairs = [(0.95, True), (0.85, True), (0.85, False), (0.15, False), (0.05, False)]
    assert expected_calibration_error(pairs) == pytest.approx(0.19, abs=1e-12)


def test_ece_of_a_perfectly_calibrated_bin_is_zero() -> None:
    pairs = [(0.75, True), (0.75, True), (0.75, True), (0.75, False)]
    assert expected_calibration_error(pairs) == pytest.approx(0.0, abs=1e-12)


def test_brier_matches_hand_computation() -> None:
    # (0.1² + 0.2² + 0.4²) / 3 = 0.21 / 3
    assert brier_score([(0.9, True), (0.2, False), (0.6, True)]) == pytest.approx(0.07, abs=1e-12)


def test_reliability_table_has_ten_equal_bins_and_puts_one_in_the_last() -> None:
    table = reliability_table([(1.0, True), (0.0, False), (0.1, True)])
    assert [(row.lower, row.upper) for row in table][:2] == [(0.0, 0.1), (0.1, 0.2)]
    assert len(table) == 10
    assert table[9].count == 1
    assert table[9].rate == 1.0
    assert table[0].count == 1
    assert table[1].count == 1  # 0.1 starts the second bin
    assert table[5].count == 0
    assert table[5].mean_p is None


def test_sweeps_count_boundaries_inclusively() -> None:
    pairs = [(0.8, True), (0.2, False), (0.5, False)]
    accept = {row.accept: row for row in sweep_accept(pairs, grid=[0.8])}
    reject = {row.reject: row for row in sweep_reject(pairs, grid=[0.2])}
    assert accept[0.8].selected == 1  # p == accept is selected
    assert reject[0.2].rejected == 1  # p == reject is rejected


def test_sweeps_match_a_direct_count() -> None:
    rng = random.Random(3)
    pairs = [(round(rng.random(), 2), rng.random() < 0.4) for _ in range(500)]
    for row in sweep_accept(pairs):
        chosen = [y for p, y in pairs if p >= row.accept]
        assert (row.selected, row.precision) == (len(chosen), sum(chosen) / len(chosen))
    for row in sweep_reject(pairs):
        chosen = [y for p, y in pairs if p <= row.reject]
        assert (row.rejected, row.npv) == (len(chosen), (len(chosen) - sum(chosen)) / len(chosen))


def test_accept_is_the_lowest_threshold_whose_lower_bound_meets_the_target() -> None:
    rng = random.Random(5)
    pairs = [(p, rng.random() < p) for p in (rng.random() for _ in range(3000))]
    rows = sweep_accept(pairs)
    chosen = choose_accept(rows, 0.8)
    assert chosen is not None
    assert chosen.precision_lower >= 0.8
    assert all(row.precision_lower < 0.8 for row in rows if row.accept < chosen.accept)


def test_reject_is_the_highest_observed_p_below_accept_meeting_the_npv() -> None:
    # Everything below 1.0 is irrelevant: any reject meets the NPV, yet it must stay under accept.
    pairs = [(i / 50, False) for i in range(50)] + [(1.0, True)] * 30
    choice = choose_thresholds(pairs, 0.9, 0.9)
    assert choice.accept is not None
    # 30 of 30 has a lower bound of 0.917, 30 of 31 (with the 0.98) only 0.855: the lowest observed
    # p that meets 0.9 is 1.0 (a grid's 0.99 would accept a future 0.99 that no label speaks for)
    assert choice.accept.accept == 1.0
    assert choice.reject is not None
    assert choice.reject.reject == 0.98


def test_band_metrics_on_a_tiny_example() -> None:
    pairs = [(0.9, True), (0.85, False), (0.5, True), (0.1, False), (0.05, True)]
    band = band_metrics(pairs, reject=0.1, accept=0.8)
    assert (band.selected, band.rejected, band.uncertain_count) == (2, 2, 1)
    assert band.precision == 0.5
    assert band.npv == 0.5
    assert band.coverage == pytest.approx(0.4)
    assert band.uncertain == pytest.approx(0.2)


def test_enforce_replay_tells_empty_from_inconclusive_and_unavailable() -> None:
    outcomes = enforce_outcomes(
        [
            (Status.DECIDED, [0.9, 0.1]),  # answered
            (Status.DECIDED, [0.1, 0.2]),  # all rejected: empty
            (Status.INCONCLUSIVE, [0.5]),  # uncertain: inconclusive
            (Status.ERROR, []),  # unavailable
            (Status.SKIPPED, []),  # not a judged retrieval
        ],
        reject=0.2,
        accept=0.8,
    )
    assert (outcomes.retrievals, outcomes.answered, outcomes.empty, outcomes.inconclusive, outcomes.unavailable) == (
        4,
        1,
        1,
        1,
        1,
    )


def test_split_is_seeded_and_keeps_groups_whole() -> None:
    groups = [f"g{i}" for i in range(40)]
    first = split_by_group(groups, 0.25, seed=7)
    assert first == split_by_group(reversed(groups), 0.25, seed=7)
    assert first != split_by_group(groups, 0.25, seed=8)
    assert len(first) == 10


@pytest.mark.parametrize("holdout", [0.0, 1.0, -0.1])
def test_split_refuses_a_holdout_outside_zero_one(holdout: float) -> None:
    with pytest.raises(ValueError, match="holdout"):
        split_by_group(["a", "b"], holdout, seed=0)


# --- the recommendation on a judge whose truth is known -----------------------------------------


def _precision_on(records: list, labels: list, accept: float) -> tuple[float, int]:
    scores = {r.decision_id: r.scores for r in records}
    selected = [label["relevant"] for label in labels if scores[label["decision_id"]][label["node_id"]] >= accept]
    return sum(selected) / len(selected), len(selected)


def test_recommended_accept_meets_the_target_on_fresh_data_from_an_overconfident_judge() -> None:
    records, labels = overconfident_log(400, seed=1)  # relevance rate at p is p**1.5
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95)
    assert report.recommended is not None
    accept = report.recommended.accept
    # The raw 0.8 of this judge is worth 0.8**1.5 = 0.72: taking p at face value would not do.
    assert accept > 0.85
    fresh_records, fresh_labels = overconfident_log(2000, seed=2)
    precision, selected = _precision_on(fresh_records, fresh_labels, accept)
    assert selected > 200
    assert precision >= 0.9
    # and analytically: E[p**1.5 | p >= a] for p uniform
    assert (1 - accept**2.5) / (2.5 * (1 - accept)) >= 0.9
    assert report.recommended.reject < accept


def test_held_out_numbers_come_from_the_held_out_split_only() -> None:
    records, labels = overconfident_log(300, seed=3)
    report = calibrate(records, labels, target_precision=0.8, min_npv=0.9, holdout=0.3, seed=4)
    assert report.holdout is not None
    assert report.labels == len(labels) == report.split.calibration_labels + report.split.holdout_labels
    assert report.holdout.labels == report.split.holdout_labels
    assert report.split.unit == "decision"
    assert report.split.holdout_groups == 90
    assert report.holdout.enforce.retrievals == 90


def test_targets_out_of_reach_give_no_recommendation_and_say_why() -> None:
    records, labels = overconfident_log(60, seed=5)
    report = calibrate(records, labels, target_precision=0.99)
    assert report.recommended is None
    assert report.holdout is None
    assert report.exit_code == 1
    assert "0.99" in (report.reason or "")
    assert report.thresholds  # the sweep is still there to look at


def test_the_report_fits_a_mapping_that_corrects_the_overconfidence() -> None:
    records, labels = overconfident_log(300, seed=6)
    report = calibrate(records, labels, target_precision=0.8, min_npv=0.9)
    assert report.mapping["kind"] == "platt"
    assert report.mapping_holdout["ece_mapped"] < report.mapping_holdout["ece_raw"]


def test_report_json_has_the_contract_keys() -> None:
    records, labels = overconfident_log(200, seed=7)
    data = json.loads(calibrate(records, labels, target_precision=0.8, min_npv=0.9).to_json())
    assert {"labels", "recommended", "reason", "holdout", "ece", "brier", "thresholds"} <= set(data)
    assert set(data["recommended"]) == {"reject", "accept"}
    assert {"precision", "npv", "coverage", "uncertain"} <= set(data["holdout"])
    assert {"accept", "precision", "precision_lower", "recall", "coverage"} <= set(data["thresholds"][0])
    assert isinstance(data["labels"], int)


def test_report_objects_read_by_attribute_and_by_key_like_the_json() -> None:
    records, labels = overconfident_log(200, seed=7)
    report = calibrate(records, labels, target_precision=0.8, min_npv=0.9)
    assert report.recommended is not None
    assert report.holdout is not None
    assert report.recommended["accept"] == report.recommended.accept
    assert report.recommended["reject"] == report.recommended.reject
    assert report.thresholds[0]["precision_lower"] == report.thresholds[0].precision_lower
    assert report.holdout["npv"] == report.holdout.npv
    assert report.holdout["enforce"]["answered"] == report.holdout.enforce.answered
    assert report["recommended"]["accept"] == report.recommended.accept
    assert "accept" in report.recommended
    assert "precision_lower" in report.thresholds[0]
    assert "exit_code" not in report  # a property, not a JSON key
    assert dict(report.recommended) == {"reject": report.recommended.reject, "accept": report.recommended.accept}
    assert report.holdout.get("no such key") is None
    with pytest.raises(KeyError, match="acept"):
        report.recommended["acept"]


def test_every_object_in_the_report_reads_by_key_as_its_json_does() -> None:
    records, labels = overconfident_log(200, seed=7)
    report = calibrate(records, labels, target_precision=0.8, min_npv=0.9)

    def same(value: Any, data: Any) -> None:
        if isinstance(data, dict) and not isinstance(value, dict):  # an object of ours: keys are its fields
            assert list(value.keys()) == list(data)
            for key in data:
                assert key in value
                same(value[key], data[key])
        elif isinstance(data, list):
            assert isinstance(value, list)
            for item, item_data in zip(value, data, strict=True):
                same(item, item_data)
        else:
            assert value == data

    same(report, json.loads(report.to_json()))


def test_report_html_is_self_contained() -> None:
    records, labels = overconfident_log(200, seed=8)
    page = calibrate(records, labels, target_precision=0.8, min_npv=0.9).to_html()
    assert page.count("<svg") == 3
    assert "Recommended: reject" in page
    assert "<script" not in page
    assert "src=" not in page
    assert "href=" not in page


def test_calibrate_reads_jsonl_paths_like_the_cli(tmp_path: Path) -> None:
    records, labels = overconfident_log(200, seed=9)
    from_paths = calibrate(write_jsonl(tmp_path / "r.jsonl", records), write_jsonl(tmp_path / "l.jsonl", labels))
    assert from_paths == calibrate(records, labels)
    assert isinstance(from_paths, CalibrationReport)


# --- joining ----------------------------------------------------------------------------------


def test_labels_by_query_join_through_the_query_key(monkeypatch: pytest.MonkeyPatch) -> None:
    records, labels = overconfident_log(100, seed=10, by_query=True)
    report = calibrate(records, labels, target_precision=0.8, min_npv=0.9, query_key_secret=SECRET)
    assert report.labels == 800
    assert report.split.unit == "query"
    assert "held-out queries" in report.to_html()
    monkeypatch.setenv(QUERY_KEY_SECRET_ENVIRONMENT, SECRET)
    assert calibrate(records, labels, target_precision=0.8, min_npv=0.9) == report


def test_labels_by_query_need_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(QUERY_KEY_SECRET_ENVIRONMENT, raising=False)
    records, labels = overconfident_log(10, seed=11, by_query=True)
    with pytest.raises(CalibrationInputError, match="--query-key-secret") as caught:
        calibrate(records, labels)
    assert caught.value.line == 1


def test_one_query_asked_twice_labels_both_decisions() -> None:
    key = query_key("refund rules?", SECRET)
    records = [record("a", {"n1": 0.9}, query_key=key), record("b", {"n1": 0.7}, query_key=key)]
    records += [record(f"x{i}", {f"m{i}": 0.5}) for i in range(60)]
    labels = [{"query": "Refund rules?", "node_id": "n1", "relevant": True}]
    labels += [{"decision_id": f"x{i}", "node_id": f"m{i}", "relevant": i % 2 == 0} for i in range(60)]
    report = calibrate(records, labels, query_key_secret=SECRET, target_precision=0.5, min_npv=0.5)
    assert report.labels == 62


def _sixty(prefix: str = "d") -> tuple[list, list]:
    rng = random.Random(0)
    records = [record(f"{prefix}{i}", {"n": round(rng.random(), 3)}) for i in range(60)]
    labels = [{"decision_id": f"{prefix}{i}", "node_id": "n", "relevant": i % 2 == 0} for i in range(60)]
    return records, labels


def test_unjoined_labels_are_counted_with_examples() -> None:
    records, labels = _sixty()
    labels += [{"decision_id": "nope", "node_id": "n", "relevant": True}]
    labels += [{"decision_id": "d1", "node_id": "not-judged", "relevant": True}]
    report = calibrate(records, labels)
    assert report.unjoined.count == 2
    reasons = {example["reason"] for example in report.unjoined.examples}
    assert reasons == {"no such decision", "node not judged in that decision"}
    assert report.labels == 60


def test_disagreeing_duplicate_labels_are_reported_not_averaged() -> None:
    records, labels = _sixty()
    labels.append({"decision_id": "d0", "node_id": "n", "relevant": False})  # d0/n was True
    labels.append({"decision_id": "d2", "node_id": "n", "relevant": True})  # agrees: counted once
    report = calibrate(records, labels)
    assert report.conflicts.count == 1
    assert report.conflicts.examples[0]["decision_id"] == "d0"
    assert report.duplicate_labels == 1
    assert report.labels == 59  # the conflicting pair is left out, not averaged
    with pytest.raises(InsufficientLabelsError, match="1 pairs had disagreeing labels"):
        calibrate(records, labels[:49] + labels[-2:])


def test_error_records_are_counted_and_never_used_as_scores() -> None:
    records, labels = _sixty()
    records.append(record("e1", {"n": 0.99}, status=Status.ERROR))
    records.append(record("e2", {}, status=Status.ERROR))
    labels.append({"decision_id": "e1", "node_id": "n", "relevant": False})
    report = calibrate(records, labels)
    assert report.log.errors == 2
    assert report.log.error_rate == pytest.approx(2 / 62)
    assert report.labels_on_error_records == 1
    assert report.labels == 60
    assert report.enforce_default.unavailable == pytest.approx(2 / 62)


def test_mixed_versions_are_refused_unless_one_is_chosen() -> None:
    records, labels = _sixty()
    other, other_labels = _sixty("v2-")
    records += [r.model_copy(update={"version": "v2"}) for r in other]
    with pytest.raises(MixedRecordsError, match="--version"):
        calibrate(records, labels + other_labels)
    report = calibrate(records, labels + other_labels, version="v2")
    assert report.log.version == "v2"
    assert report.labels == 60
    assert report.unjoined.count == 60


def test_mixed_purposes_are_refused_unless_one_is_chosen() -> None:
    records, labels = _sixty()
    records.append(record("r", {"n": 0.5}, purpose="draft_review"))
    with pytest.raises(MixedRecordsError, match="--purpose"):
        calibrate(records, labels)
    assert calibrate(records, labels, purpose="retrieval_relevance").log.records == 60
    with pytest.raises(MixedRecordsError, match="no record has purpose='nothing'"):
        calibrate(records, labels, purpose="nothing")


def test_fewer_than_fifty_labels_are_refused() -> None:
    records, labels = _sixty()
    with pytest.raises(InsufficientLabelsError, match="49 joined labels") as caught:
        calibrate(records, labels[:49])
    assert caught.value.labels == 49


def test_a_class_with_fewer_than_ten_is_refused() -> None:
    records, labels = _sixty()
    for label in labels[9:]:
        label["relevant"] = False
    labels[0]["relevant"] = labels[1]["relevant"] = True
    with pytest.raises(InsufficientLabelsError, match=r"(\d) relevant \(need at least 10: \d more\)") as caught:
        calibrate(records, labels)
    assert caught.value.labels_needed == 10 - caught.value.relevant


# --- unreadable input ---------------------------------------------------------------------------


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_json_names_the_file_and_line(tmp_path: Path) -> None:
    records, labels = _sixty()
    record_path = write_jsonl(tmp_path / "r.jsonl", records)
    bad = _write(tmp_path / "labels.jsonl", [json.dumps(labels[0]), "", '{"node_id": "n",'])
    with pytest.raises(CalibrationInputError, match=r"labels\.jsonl:3: not valid JSON") as caught:
        calibrate(record_path, bad)
    assert caught.value.line == 3


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"decision_id": "a", "purpose": "p", "version": "v1", "status": "maybe"}', "'status' must be one of"),
        ('{"purpose": "p", "version": "v1", "status": "decided"}', "'decision_id' must be a non-empty string"),
        (
            '{"decision_id": "a", "purpose": "p", "version": "v1", "status": "decided", "scores": {"n": 1.5}}',
            "score of node 'n' must be a probability",
        ),
        ("[1, 2]", "a record must be a JSON object"),
    ],
)
def test_bad_records_name_the_line_and_the_problem(tmp_path: Path, line: str, problem: str) -> None:
    path = _write(tmp_path / "records.jsonl", [record("ok", {"n": 0.5}).to_json(), line])
    with pytest.raises(CalibrationInputError, match=r"records\.jsonl:2: not a decision record") as caught:
        calibrate(path, [])
    assert problem in str(caught.value)


def test_duplicate_decision_ids_are_refused(tmp_path: Path) -> None:
    line = record("same", {"n": 0.5}).to_json()
    path = _write(tmp_path / "records.jsonl", [line, line])
    with pytest.raises(CalibrationInputError, match=r"records\.jsonl:2: decision_id 'same' appears twice"):
        calibrate(path, [])


@pytest.mark.parametrize(
    ("label", "problem"),
    [
        ({"decision_id": "d0", "node_id": "n", "relevant": "yes"}, "'relevant' must be true or false"),
        ({"decision_id": "d0", "node_id": "n", "relevant": 2}, "'relevant' must be true or false"),
        ({"decision_id": "d0", "node_id": "n", "relevant": 1}, "'relevant' must be true or false (a JSON boolean"),
        ({"decision_id": "d0", "node_id": "n", "relevant": 0}, "got 0"),
        ({"decision_id": "d0", "node_id": "n", "relevant": 1.0}, "got 1.0"),
        ({"decision_id": "d0", "relevant": True}, "'node_id' must be a non-empty string"),
        ({"node_id": "n", "relevant": True}, "needs 'decision_id'"),
    ],
)
def test_bad_labels_name_the_line_and_the_problem(tmp_path: Path, label: dict, problem: str) -> None:
    records, labels = _sixty()
    path = _write(tmp_path / "labels.jsonl", [json.dumps(labels[0]), json.dumps(label)])
    with pytest.raises(CalibrationInputError, match=r"labels\.jsonl:2: not a label") as caught:
        calibrate(records, path)
    assert problem in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CalibrationInputError, match=r"missing\.jsonl: cannot read the file"):
        calibrate(tmp_path / "missing.jsonl", [])


def test_unfilled_sheet_rows_are_counted_not_guessed() -> None:
    records, labels = _sixty()
    labels.append({"decision_id": "d0", "node_id": "n", "relevant": None})
    report = calibrate(records, labels)
    assert report.unlabelled == 1
    assert report.labels == 60


def test_a_filled_csv_sheet_reads_as_labels(tmp_path: Path) -> None:
    records, labels = _sixty()
    rows = ["decision_id,node_id,p,text,relevant"]
    rows += [f"{label['decision_id']},n,0.5,some text,{'yes' if label['relevant'] else 'no'}" for label in labels]
    report = calibrate(records, _write(tmp_path / "sheet.csv", rows))
    assert report.labels == 60
    assert report.relevant == 30


def test_relevant_as_one_or_zero_is_refused_in_labels_given_in_memory_too() -> None:
    records, labels = _sixty()
    labels[3]["relevant"] = 1
    with pytest.raises(CalibrationInputError, match=r"item 4: not a label: 'relevant' must be true or false"):
        calibrate(records, labels)


def test_a_csv_sheet_reads_one_and_zero_as_true_and_false(tmp_path: Path) -> None:
    # CSV cells have no types: "1" / "0" is how spreadsheets often spell a checkbox
    records, labels = _sixty()
    rows = ["decision_id,node_id,p,relevant,text"]
    rows += [f"{label['decision_id']},n,0.5,{1 if label['relevant'] else 0},some text" for label in labels]
    rows.append("d0,n,0.5,,some text")  # an empty cell: not labelled yet
    report = calibrate(records, _write(tmp_path / "sheet.csv", rows))
    assert (report.labels, report.relevant, report.unlabelled) == (60, 30, 1)


# --- real records ---------------------------------------------------------------------------------


def test_a_log_written_by_the_selector_and_jsonl_observer_calibrates(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    options = ExecutionOptions(
        mode=Mode.SHADOW, observer=JsonlObserver(log, include_user=True), query_key_secret=SECRET
    )
    selector = CandidateSelector(ScriptedJudge(marked_answer), options)
    rng = random.Random(12)
    labels = []
    for q in range(40):
        query = f"Question number {q}?"
        candidates = []
        for i in range(4):
            p = round(rng.random(), 2)
            candidates.append(Candidate(f"q{q}-n{i}", marked(p, "passage")))
            # the label names the query text, not the decision: joined through query_key
            labels.append({"query": query.upper(), "node_id": f"q{q}-n{i}", "relevant": rng.random() < p})
        selector.select(query, RELEVANCE_QUESTION, candidates, ctx=RuntimeContext(user_id="u1"))
    assert "Question number" not in log.read_text()  # the log never holds the query
    report = calibrate(log, labels, target_precision=0.6, min_npv=0.6, query_key_secret=SECRET)
    assert report.labels == 160
    assert report.split.unit == "query"
    assert report.log.records == 40
