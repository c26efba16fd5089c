"""Recommended thresholds sit at observed probabilities of the calibration split, never in a gap
between two of them where no label says anything; the sweeps stay on the 0.01 grid for reading."""

from __future__ import annotations

from typing import Any

import pytest

from llama_jev import DecisionRecord
from llama_jev.calibration import calibrate, format_threshold
from llama_jev.calibration.statistics import (
    Z_ONE_SIDED_95,
    choose_accept,
    choose_thresholds,
    observed_thresholds,
    round_accept,
    round_reject,
    sweep_accept,
)

from .calibration_support import overconfident_log, record

# Ten coarse levels; per decision two candidates at each, this many of them relevant.
RELEVANT_PER_LEVEL = (0, 0, 0, 0, 1, 1, 2, 2, 2, 2)


def coarse_log(decisions: int = 10, *, offset: float = 0.0) -> tuple[list[DecisionRecord], list[dict[str, Any]]]:
    """Every decision holds the same 20 labelled candidates at p = 0.05, 0.15, ..., 0.95 (+ offset).

    With ``holdout=0.3`` the split keeps exactly 7 of 10 decisions whatever the seed, and every
    decision looks alike, so the calibration split is 7 copies of the pattern: hand-computable.
    """
    records, labels = [], []
    for d in range(decisions):
        scores: dict[str, float] = {}
        for level, relevant in enumerate(RELEVANT_PER_LEVEL):
            p = round(0.05 + 0.1 * level + offset, 3)
            for copy in range(2):
                node_id = f"d{d}-l{level}-{copy}"
                scores[node_id] = p
                labels.append({"decision_id": f"d{d}", "node_id": node_id, "relevant": copy < relevant})
        records.append(record(f"d{d}", scores))
    return records, labels


def test_thresholds_on_coarse_levels_are_observed_levels_not_values_in_the_gaps() -> None:
    records, labels = coarse_log()
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95, holdout=0.3, seed=0)
    assert report.split.calibration_labels == 140
    # By hand, on 7 copies: p >= 0.65 selects 56, all relevant, lower bound 56 / (56 + z^2) = 0.954
    # >= 0.9; p >= 0.55 selects 70 with 63 relevant (0.9, lower bound 0.825). A 0.01 grid would say
    # 0.56, which accepts a future 0.6 that no label speaks for; the lowest observed level is 0.65.
    # Mirrored for reject: p <= 0.35 rejects 56 irrelevant of 56 (0.954 >= 0.95), p <= 0.45 does not.
    assert report.recommended is not None
    assert (report.recommended.reject, report.recommended.accept) == (0.35, 0.65)
    row = next(row for row in report.thresholds if row.accept == 0.65)
    assert row.precision_lower == pytest.approx(56 / (56 + Z_ONE_SIDED_95**2))
    assert row.selected == 56
    # held out: 3 copies of the pattern
    assert report.holdout is not None
    assert (report.holdout.selected, report.holdout.precision) == (24, 1.0)
    assert (report.holdout.rejected, report.holdout.npv) == (24, 1.0)
    assert report.holdout.uncertain == pytest.approx(0.2)


def test_the_grid_alone_would_have_chosen_inside_the_gap() -> None:
    # the regression this guards against: the calibration split of coarse_log, chosen on the 0.01 grid
    pairs = [
        (round(0.05 + 0.1 * level, 2), copy < relevant)
        for level, relevant in enumerate(RELEVANT_PER_LEVEL)
        for copy in range(2)
        for _ in range(7)
    ]
    grid = choose_accept(sweep_accept(pairs), 0.9)
    assert grid is not None
    assert grid.accept == 0.56
    chosen = choose_thresholds(pairs, 0.9, 0.95).accept
    assert chosen is not None
    assert chosen.accept == 0.65


def test_the_recommended_thresholds_are_rows_of_the_sweeps_which_stay_on_the_grid() -> None:
    records, labels = coarse_log(offset=0.003)  # levels 0.053, 0.153, ...: none on the grid
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95)
    assert report.recommended is not None
    assert (report.recommended.reject, report.recommended.accept) == (0.353, 0.653)
    accepts = [row.accept for row in report.thresholds]
    assert accepts == sorted(accepts)
    assert accepts.count(0.653) == 1
    assert set(accepts) - {0.653} <= {round(i / 100, 2) for i in range(101)}
    rejects = [row.reject for row in report.reject_thresholds]
    assert rejects == sorted(rejects)
    assert rejects.count(0.353) == 1


def test_a_recommended_threshold_on_the_grid_is_one_row_not_two() -> None:
    records, labels = coarse_log()
    report = calibrate(records, labels, target_precision=0.9, min_npv=0.95)
    assert [row.accept for row in report.thresholds].count(0.65) == 1
    assert [row.reject for row in report.reject_thresholds].count(0.35) == 1


def test_an_observed_threshold_is_printed_with_every_digit() -> None:
    records, labels = coarse_log(offset=0.003)
    page = calibrate(records, labels, target_precision=0.9, min_npv=0.95).to_html()
    # 0.65 would reach below the observed 0.653 into a range with no labels
    assert "Recommended: reject = 0.353, accept = 0.653" in page
    assert "reject=0.353, accept=0.653)" in page
    assert '<tr class="pick"><td>0.653 (chosen)</td>' in page
    assert (format_threshold(0.8), format_threshold(0.653), format_threshold(1.0)) == ("0.800", "0.653", "1.000")


def test_reject_stays_below_accept_when_the_npv_would_be_met_above_it() -> None:
    # 300 irrelevant at 0.05 carry the NPV bound past 0.9 even at p <= 0.95 (300 of 320: 0.911),
    # while 20 of 20 relevant at p >= 0.5 already meet precision 0.8 (lower bound 0.881).
    pairs = [(0.05, False)] * 300 + [(0.5, True)] * 10 + [(0.95, True)] * 10
    choice = choose_thresholds(pairs, 0.8, 0.9)
    assert choice.accept is not None
    assert choice.accept.accept == 0.5
    # precision comes first: reject is the highest qualifying observed p under accept
    assert choice.reject is not None
    assert choice.reject.reject == 0.05


def test_accept_is_the_lowest_observed_p_whose_lower_bound_meets_the_target() -> None:
    records, labels = overconfident_log(300, seed=5)
    scores = {r.decision_id: r.scores for r in records}
    pairs = [(scores[label["decision_id"]][label["node_id"]], label["relevant"]) for label in labels]
    choice = choose_thresholds(pairs, 0.8, 0.9)
    assert choice.accept is not None
    # the lowest observed p (4 decimals here) that meets the target, rounded up to 3 decimals
    meeting = [row.accept for row in sweep_accept(pairs, observed_thresholds(pairs)) if row.precision_lower >= 0.8]
    assert choice.accept.accept == round_accept(meeting[0])
    assert choice.accept.precision_lower >= 0.8  # measured at the rounded value
    assert choice.reject is not None
    assert choice.reject.reject in {round_reject(p) for p in observed_thresholds(pairs)}
    assert choice.reject.reject < choice.accept.accept
