"""Probability mappings (Platt, isotonic) and CalibratedJudge over a real HTTP judge."""

from __future__ import annotations

import json
import math
import random
from itertools import pairwise

import pytest

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    Judge,
    Mode,
    RetryPolicy,
    ScriptedJudge,
)
from llama_jev.calibration import (
    CalibratedJudge,
    IsotonicMapping,
    PlattMapping,
    fit_isotonic,
    fit_platt,
    mapping_from_dict,
)
from llama_jev.engine import RELEVANCE_QUESTION, Candidate
from llama_jev.systemone import ChoiceQuestion, NoulQuestion, SystemOneRequest
from llama_jev.testing import SystemOneTestServer

from .conftest import API_KEY
from .support import marked, marked_answer


def overconfident_sample(n: int, seed: int) -> tuple[list[float], list[bool]]:
    """A judge whose relevance rate at p is p**1.5 (it says 0.8 where 72% are relevant)."""
    rng = random.Random(seed)
    ps = [rng.random() for _ in range(n)]
    return ps, [rng.random() < p**1.5 for p in ps]


# --- PlattMapping ---------------------------------------------------------------------------


def test_identity_platt_mapping_returns_the_raw_probability() -> None:
    mapping = PlattMapping(slope=1.0, intercept=0.0)
    for p in (0.01, 0.2, 0.5, 0.8, 0.99):
        assert mapping(p) == pytest.approx(p, abs=1e-12)


def test_platt_mapping_is_sigmoid_of_slope_times_logit_plus_intercept() -> None:
    mapping = PlattMapping(slope=2.0, intercept=-1.0)
    p = 0.7
    expected = 1 / (1 + math.exp(-(2.0 * math.log(p / (1 - p)) - 1.0)))
    assert mapping(p) == pytest.approx(expected, abs=1e-12)


def test_platt_mapping_keeps_zero_and_one_finite_and_ordered() -> None:
    mapping = PlattMapping(slope=3.0, intercept=0.5)
    low, high = mapping(0.0), mapping(1.0)
    assert 0.0 <= low < mapping(0.5) < high <= 1.0
    assert math.isfinite(low)
    assert math.isfinite(high)


def test_platt_mapping_round_trips_through_json() -> None:
    mapping = PlattMapping(slope=0.75, intercept=-0.25)
    data = json.loads(json.dumps(mapping.to_dict()))
    assert data == {"kind": "platt", "slope": 0.75, "intercept": -0.25}
    assert PlattMapping.from_dict(data) == mapping
    assert mapping_from_dict(data) == mapping


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", True])
def test_platt_mapping_refuses_non_finite_parameters(bad: object) -> None:
    with pytest.raises(ValueError, match="slope must be a finite number"):
        PlattMapping(slope=bad, intercept=0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-0.1, 1.1, math.nan])
def test_platt_mapping_refuses_a_probability_outside_zero_one(bad: float) -> None:
    with pytest.raises(ValueError, match="finite probability"):
        PlattMapping(slope=1.0, intercept=0.0)(bad)


def test_mapping_from_dict_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown mapping kind 'beta'"):
        mapping_from_dict({"kind": "beta"})
    with pytest.raises(ValueError, match="needs 'intercept'"):
        mapping_from_dict({"kind": "platt", "slope": 1.0})


# --- fit_platt ------------------------------------------------------------------------------


def test_fit_platt_matches_the_smoothed_rate_at_two_points() -> None:
    # 3 of 4 relevant at 0.9, 1 of 4 at 0.1; Platt's targets are 5/6 and 1/6, so the fitted
    # probability at 0.9 is (3 * 5/6 + 1/6) / 4 = 2/3 and at 0.1 is 1/3.
    ps = [0.9] * 4 + [0.1] * 4
    ys = [True, True, True, False, False, False, False, True]
    mapping = fit_platt(ps, ys)
    assert mapping(0.9) == pytest.approx(2 / 3, abs=1e-6)
    assert mapping(0.1) == pytest.approx(1 / 3, abs=1e-6)


def test_fit_platt_stays_finite_on_separable_data() -> None:
    mapping = fit_platt([0.0, 0.1, 0.9, 1.0], [False, False, True, True])
    assert math.isfinite(mapping.slope)
    assert mapping.slope > 0
    assert mapping(1.0) < 1.0  # smoothed targets: never a certainty from four labels


def test_fit_platt_corrects_an_overconfident_judge() -> None:
    ps, ys = overconfident_sample(4000, seed=1)
    mapping = fit_platt(ps, ys)
    for p in (0.3, 0.5, 0.8, 0.9):
        assert mapping(p) == pytest.approx(p**1.5, abs=0.04)
    assert mapping(0.8) < 0.77  # the raw 0.8 was worth about 0.72


def test_fit_platt_is_deterministic() -> None:
    ps, ys = overconfident_sample(500, seed=2)
    assert fit_platt(ps, ys) == fit_platt(list(ps), list(ys))


@pytest.mark.parametrize(
    ("ps", "ys", "message"),
    [
        ([0.5, 0.6], [True], "2 probabilities but 1 labels"),
        ([0.5, 0.6], [True, True], "at least one relevant and one irrelevant"),
        ([0.5, 1.5], [True, False], "finite probability"),
        ([0.5, 0.6], [True, 1], "labels must be booleans"),
    ],
)
def test_fits_refuse_bad_training_data(ps: list[float], ys: list[bool], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_platt(ps, ys)
    with pytest.raises(ValueError, match=message):
        fit_isotonic(ps, ys)


# --- isotonic -------------------------------------------------------------------------------


def test_fit_isotonic_pools_adjacent_violators() -> None:
    mapping = fit_isotonic([0.1, 0.4, 0.6, 0.9], [False, True, False, True])
    assert mapping.points == (0.1, 0.5, 0.9)
    assert mapping.values == (0.0, 0.5, 1.0)
    assert mapping(0.3) == pytest.approx(0.25)  # interpolated between 0.1 -> 0 and 0.5 -> 0.5


def test_fit_isotonic_maps_equal_probabilities_alike() -> None:
    mapping = fit_isotonic([0.5, 0.5, 0.5, 0.2], [True, False, True, False])
    assert mapping(0.5) == pytest.approx(2 / 3)


def test_fit_isotonic_is_monotone_on_noisy_data() -> None:
    ps, ys = overconfident_sample(2000, seed=3)
    mapping = fit_isotonic(ps, ys)
    grid = [i / 100 for i in range(101)]
    mapped = [mapping(p) for p in grid]
    assert all(b >= a for a, b in pairwise(mapped))
    assert mapping(0.8) == pytest.approx(0.8**1.5, abs=0.08)


def test_isotonic_mapping_round_trips_and_refuses_decreasing_values() -> None:
    mapping = IsotonicMapping(points=(0.2, 0.8), values=(0.1, 0.6))
    assert mapping_from_dict(json.loads(json.dumps(mapping.to_dict()))) == mapping
    with pytest.raises(ValueError, match="non-decreasing"):
        IsotonicMapping(points=(0.2, 0.8), values=(0.6, 0.1))
    with pytest.raises(ValueError, match="strictly increasing"):
        IsotonicMapping(points=(0.8, 0.2), values=(0.1, 0.6))


# --- CalibratedJudge ------------------------------------------------------------------------


def http_judge(server: SystemOneTestServer) -> JevClient:
    return JevClient(api_key=API_KEY, base_url=server.base_url, retry=RetryPolicy(initial_backoff=0.01))


def test_calibrated_judge_is_a_judge() -> None:
    judge = CalibratedJudge(ScriptedJudge(marked_answer), PlattMapping(slope=1.0, intercept=0.0))
    assert isinstance(judge, Judge)


def test_calibrated_judge_maps_noul_answers_from_a_real_server(jev_server: SystemOneTestServer) -> None:
    mapping = PlattMapping(slope=0.5, intercept=-0.2)
    judge = CalibratedJudge(http_judge(jev_server), mapping)
    request = SystemOneRequest(
        state="q",
        questions={
            "item_0": NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": marked(0.9, "a")}),
            "item_1": NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": marked(0.3, "b")}),
        },
    )
    result = judge.system_one(request)
    assert result.noul("item_0") == pytest.approx(mapping(0.9))
    assert result.noul("item_1") == pytest.approx(mapping(0.3))
    assert result.model.endswith("+platt")
    assert jev_server.request_count == 1


async def test_calibrated_judge_maps_asynchronously_too(jev_server: SystemOneTestServer) -> None:
    mapping = fit_isotonic([0.1, 0.4, 0.6, 0.9], [False, True, False, True])
    judge = CalibratedJudge(http_judge(jev_server), mapping)
    request = SystemOneRequest(
        state="q", questions={"item_0": NoulQuestion(instructions={"candidate": marked(0.3, "a")})}
    )
    result = await judge.asystem_one(request)
    assert result.noul("item_0") == pytest.approx(0.25)
    assert result.model.endswith("+isotonic")


def test_calibrated_judge_leaves_choice_answers_untouched() -> None:
    raw = ScriptedJudge(lambda state, qid, ins: {"yes": 0.9, "no": 0.1} if qid == "c" else 0.9)
    judge = CalibratedJudge(raw, PlattMapping(slope=0.5, intercept=0.0))
    request = SystemOneRequest(
        state="q",
        questions={"c": ChoiceQuestion(criteria={"yes": None, "no": None}), "n": NoulQuestion()},
    )
    result = judge.system_one(request)
    assert result.answers["c"] == raw.system_one(request).answers["c"]
    assert result.noul("n") == pytest.approx(0.75)


def test_selector_records_hold_the_mapped_probabilities() -> None:
    records: list[DecisionRecord] = []
    mapping = PlattMapping(slope=0.5, intercept=0.0)  # 0.9 -> 0.75: uncertain in the 0.2/0.8 band
    options = ExecutionOptions(mode=Mode.ENFORCE, observer=lambda ctx, record: records.append(record))
    selector = CandidateSelector(CalibratedJudge(ScriptedJudge(marked_answer), mapping), options)
    decision = selector.select("q", RELEVANCE_QUESTION, [Candidate("n0", marked(0.9, "a"))])
    assert decision.selection is not None
    assert decision.selection.uncertain == ("n0",)
    assert records[0].scores["n0"] == pytest.approx(0.75)
    assert records[0].model == "scripted+platt"


def test_calibrated_judge_refuses_what_is_not_a_judge_or_mapping() -> None:
    with pytest.raises(TypeError, match="Judge protocol"):
        CalibratedJudge(object(), PlattMapping(slope=1.0, intercept=0.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ProbabilityMapping"):
        CalibratedJudge(ScriptedJudge(marked_answer), {"slope": 1.0})  # type: ignore[arg-type]
