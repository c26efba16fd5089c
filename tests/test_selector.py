"""CandidateSelector and the execution contract: classification, batching, budget, records."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    JsonlObserver,
    Mode,
    RetryPolicy,
    ScriptedJudge,
    Status,
)
from llama_jev.core import Reason
from llama_jev.engine import RELEVANCE_QUESTION, Candidate
from llama_jev.errors import CandidateTooLargeError
from llama_jev.systemone import NoulAnswer, SystemOneRequest, SystemOneResult
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .support import marked, marked_answer

QUERY = "What are the refund conditions?"
SECRET = "TOP-SECRET-compensation-rule-4711"


class Records:
    """An observer collecting records (and the contexts they came with)."""

    def __init__(self) -> None:
        self.records: list[DecisionRecord] = []

    def __call__(self, ctx: object, record: DecisionRecord) -> None:
        self.records.append(record)


def candidates(*probabilities: float, prefix: str = "n") -> list[Candidate]:
    return [Candidate(f"{prefix}{i}", marked(p, f"passage {i}")) for i, p in enumerate(probabilities)]


def selector(judge: object = None, mode: Mode = Mode.ENFORCE, records: Records | None = None, **kwargs: object):
    options = ExecutionOptions(mode=mode, budget=kwargs.pop("budget", 2.0), observer=records)  # type: ignore[arg-type]
    return CandidateSelector(judge or ScriptedJudge(marked_answer), options, **kwargs)  # type: ignore[arg-type]


def http_judge(server: SystemOneTestServer, **kwargs: object) -> JevClient:
    retry = kwargs.pop("retry", RetryPolicy(initial_backoff=0.01, max_backoff=0.02))
    return JevClient(api_key=API_KEY, base_url=server.base_url, retry=retry, **kwargs)  # type: ignore[arg-type]


# --- classification -------------------------------------------------------------------------


def test_boundaries_are_inclusive() -> None:
    decision = selector().select(QUERY, RELEVANCE_QUESTION, candidates(0.8, 0.2, 0.5, 0.81, 0.19))
    assert decision.status is Status.DECIDED
    assert decision.selection is not None
    assert decision.selection.selected == ("n3", "n0")
    assert decision.selection.uncertain == ("n2",)
    assert decision.selection.rejected == ("n1", "n4")


def test_ties_are_ordered_by_id() -> None:
    cands = [Candidate(node_id, marked(0.9, node_id)) for node_id in ("c", "a", "b")]
    decision = selector().select(QUERY, RELEVANCE_QUESTION, cands)
    assert decision.selection is not None
    assert decision.selection.selected == ("a", "b", "c")


def test_all_rejected_is_decided_with_nothing_selected() -> None:
    decision = selector().select(QUERY, RELEVANCE_QUESTION, candidates(0.1, 0.2))
    assert decision.status is Status.DECIDED
    assert decision.selection is not None
    assert decision.selection.selected == ()


def test_nothing_selected_and_one_uncertain_is_inconclusive() -> None:
    decision = selector().select(QUERY, RELEVANCE_QUESTION, candidates(0.1, 0.5))
    assert decision.status is Status.INCONCLUSIVE


@pytest.mark.parametrize(("reject", "accept"), [(0.8, 0.2), (0.5, 0.5), (-0.1, 0.8), (0.2, 1.1), (float("nan"), 0.8)])
def test_thresholds_must_be_ordered_within_unit_interval(reject: float, accept: float) -> None:
    with pytest.raises(ValueError, match="reject"):
        selector(reject=reject, accept=accept)


def test_thresholds_at_the_extremes_are_allowed() -> None:
    decision = selector(reject=0.0, accept=1.0).select(QUERY, RELEVANCE_QUESTION, candidates(1.0, 0.0, 0.5))
    assert decision.selection is not None
    assert (decision.selection.selected, decision.selection.rejected) == (("n0",), ("n1",))


# --- input validation -----------------------------------------------------------------------


def test_zero_candidates_send_no_request(jev_server: SystemOneTestServer) -> None:
    records = Records()
    decision = selector(http_judge(jev_server), records=records).select(QUERY, RELEVANCE_QUESTION, [])
    assert decision.status is Status.SKIPPED
    assert decision.reason is Reason.NO_CANDIDATES
    assert jev_server.request_count == 0
    assert len(records.records) == 1


def test_more_than_1024_candidates_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="1024"):
        selector().select(QUERY, RELEVANCE_QUESTION, candidates(*([0.9] * 1025)))


def test_1024_candidates_are_accepted() -> None:
    decision = selector().select(QUERY, RELEVANCE_QUESTION, candidates(*([0.9] * 1024)))
    assert decision.selection is not None
    assert len(decision.selection.selected) == 1024


@pytest.mark.parametrize(
    ("cands", "message"),
    [
        ([Candidate("a", "x"), Candidate("a", "y")], "duplicate"),
        ([Candidate(" ", "x")], "ids"),
        ([Candidate("", "x")], "ids"),
    ],
)
def test_bad_candidate_ids_are_value_errors(cands: list[Candidate], message: str) -> None:
    judge = ScriptedJudge(marked_answer)
    with pytest.raises(ValueError, match=message):
        selector(judge).select(QUERY, RELEVANCE_QUESTION, cands)
    assert judge.requests == []


@pytest.mark.parametrize("question", ["", "   "])
def test_blank_question_is_a_value_error(question: str) -> None:
    with pytest.raises(ValueError, match="question"):
        selector().select(QUERY, question, candidates(0.9))


def test_off_mode_asks_nothing_and_records_nothing() -> None:
    judge, records = ScriptedJudge(marked_answer), Records()
    decision = selector(judge, mode=Mode.OFF, records=records).select(QUERY, RELEVANCE_QUESTION, candidates(0.9))
    assert decision.status is Status.SKIPPED
    assert decision.reason is Reason.MODE_OFF
    assert judge.requests == []
    assert records.records == []


def test_a_scripted_judge_that_keeps_no_requests_answers_the_same_and_says_it_has_none() -> None:
    """``keep_requests=False`` (a demo server, a benchmark): no history growing the heap, the same answers."""
    kept, unkept = ScriptedJudge(marked_answer), ScriptedJudge(marked_answer, keep_requests=False)
    decisions = [selector(judge).select(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.1)) for judge in (kept, unkept)]

    assert decisions[0].selection == decisions[1].selection
    assert len(kept.requests) == 1
    with pytest.raises(RuntimeError, match="keep_requests=False"):
        unkept.requests  # noqa: B018 -- the property is what is tested


# --- batching -------------------------------------------------------------------------------


def test_130_candidates_at_64_per_request_take_three_even_requests_mapped_back_to_their_ids(
    jev_server: SystemOneTestServer,
) -> None:
    probabilities = [round(0.001 * i, 3) for i in range(130)]
    cands = [Candidate(f"doc-{i:03d}", marked(p, f"passage {i}")) for i, p in enumerate(probabilities)]
    decision = selector(http_judge(jev_server), batch_size=64).select(QUERY, RELEVANCE_QUESTION, cands)
    assert decision.status is Status.DECIDED
    sizes = sorted(len(r.json["questions"]) for r in jev_server.requests)  # type: ignore[index]
    assert sizes == [43, 43, 44]  # packed 64 + 64 + 2, then evened out
    assert all(
        set(r.json["questions"]) == {f"item_{i}" for i in range(len(r.json["questions"]))}  # type: ignore[index]
        for r in jev_server.requests
    )
    assert decision.selection is not None
    assert dict(decision.selection.scores) == {c.id: p for c, p in zip(cands, probabilities, strict=True)}


def test_requests_are_packed_by_size() -> None:
    judge = ScriptedJudge(marked_answer)
    big = "refund policy text " * 500  # about 3,200 estimated tokens each
    cands = [Candidate(f"n{i}", marked(0.9, big)) for i in range(10)]
    selector(judge, max_request_tokens=8_000).select(QUERY, RELEVANCE_QUESTION, cands)
    assert [len(r.questions) for r in judge.requests] == [2, 2, 2, 2, 2]


def test_a_candidate_too_large_for_one_request_is_an_error_decision_before_any_request() -> None:
    judge, records = ScriptedJudge(marked_answer), Records()
    cands = [Candidate("small", "x"), Candidate("huge", "word " * 10_000)]
    decision = selector(judge, records=records, max_request_tokens=4_000).select(QUERY, RELEVANCE_QUESTION, cands)
    assert decision.status is Status.ERROR
    assert decision.reason is Reason.CANDIDATE_TOO_LARGE
    assert isinstance(decision.error, CandidateTooLargeError)
    assert "'huge'" in str(decision.error)
    assert judge.requests == []
    assert [r.reason for r in records.records] == [Reason.CANDIDATE_TOO_LARGE]


def test_sync_batches_are_sent_concurrently(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.2)
    decision = selector(http_judge(jev_server), batch_size=1).select(QUERY, RELEVANCE_QUESTION, candidates(*[0.9] * 8))
    assert decision.status is Status.DECIDED
    assert jev_server.request_count == 8
    assert jev_server.max_in_flight >= 2


async def test_async_batches_are_sent_concurrently_within_the_limit(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.2)
    chosen = selector(http_judge(jev_server), batch_size=1, max_concurrency=4)
    decision = await chosen.aselect(QUERY, RELEVANCE_QUESTION, candidates(*[0.9] * 8))
    assert decision.status is Status.DECIDED
    assert 2 <= jev_server.max_in_flight <= 4


@pytest.mark.parametrize("use_async", [False, True])
async def test_one_bad_batch_makes_the_whole_decision_an_error(
    jev_server: SystemOneTestServer, use_async: bool
) -> None:
    jev_server.inject(Fault.probability(float("nan")))
    records = Records()
    chosen = selector(http_judge(jev_server), batch_size=2, records=records)
    cands = candidates(*[0.9] * 6)
    if use_async:
        decision = await chosen.aselect(QUERY, RELEVANCE_QUESTION, cands)
    else:
        decision = chosen.select(QUERY, RELEVANCE_QUESTION, cands)
    assert decision.status is Status.ERROR
    assert decision.reason is Reason.CALL_OR_RESPONSE_ERROR
    assert decision.selection is None
    assert [r.status for r in records.records] == [Status.ERROR]
    assert records.records[0].selected == ()
    assert records.records[0].scores == {}


# --- budget, cancellation, observer ---------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
async def test_budget_shorter_than_the_retry_wait_is_one_timeout_record(
    jev_server: SystemOneTestServer, use_async: bool
) -> None:
    jev_server.inject_always(Fault.rate_limited(retry_after=1.0))
    records = Records()
    chosen = selector(http_judge(jev_server), records=records, budget=0.3)
    if use_async:
        decision = await chosen.aselect(QUERY, RELEVANCE_QUESTION, candidates(0.9))
    else:
        decision = chosen.select(QUERY, RELEVANCE_QUESTION, candidates(0.9))
    assert decision.status is Status.ERROR
    assert decision.reason is Reason.TIMEOUT
    assert [(r.status, r.reason) for r in records.records] == [(Status.ERROR, Reason.TIMEOUT)]
    assert jev_server.request_count == 1


@pytest.mark.parametrize("use_async", [False, True])
async def test_budget_bounds_a_slow_server(jev_server: SystemOneTestServer, use_async: bool) -> None:
    jev_server.set_latency(1.0)
    records = Records()
    chosen = selector(http_judge(jev_server, timeout=5.0), records=records, budget=0.2, batch_size=1)
    if use_async:
        decision = await chosen.aselect(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.9, 0.9))
    else:
        decision = chosen.select(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.9, 0.9))
    assert decision.reason is Reason.TIMEOUT
    assert len(records.records) == 1


class BlockedJudge(ScriptedJudge):
    """A judge that ignores its timeout and answers only once released: the selector's budget must still hold."""

    def __init__(self) -> None:
        super().__init__(marked_answer)
        self.release = threading.Event()
        self.started = 0
        self.finished = 0

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        self.started += 1
        self.release.wait(60.0)
        self.finished += 1
        return super().system_one(request)

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        self.started += 1
        await asyncio.to_thread(self.release.wait, 60.0)
        self.finished += 1
        return super().system_one(request)


@pytest.mark.parametrize("batches", [1, 3])
@pytest.mark.parametrize("use_async", [False, True])
async def test_budget_holds_for_a_judge_that_ignores_its_timeout(use_async: bool, batches: int) -> None:
    judge, records = BlockedJudge(), Records()
    chosen = selector(judge, records=records, budget=0.2, batch_size=1)
    try:
        if use_async:
            decision = await chosen.aselect(QUERY, RELEVANCE_QUESTION, candidates(*[0.9] * batches))
        else:
            decision = chosen.select(QUERY, RELEVANCE_QUESTION, candidates(*[0.9] * batches))
        assert judge.started >= 1
        assert judge.finished == 0  # returned at the budget while the judge was still held, not when it answered
    finally:
        judge.release.set()
    assert decision.reason is Reason.TIMEOUT
    assert len(records.records) == 1
    if use_async:
        await asyncio.sleep(0)
        assert judge.finished == 0  # the pending batches were cancelled, not left running


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda result: result.model_construct(model="x", answers={}, usage=result.usage),
        lambda result: result.model_construct(
            model="x",
            answers={k: NoulAnswer.model_construct(type="noul", noul=math.nan) for k in result.answers},
            usage=result.usage,
        ),
        lambda result: result.model_construct(
            model="x",
            answers={k: NoulAnswer.model_construct(type="noul", noul=1.5) for k in result.answers},
            usage=result.usage,
        ),
    ],
    ids=["missing-answers", "nan", "above-one"],
)
@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
def test_a_custom_judge_returning_bad_results_is_a_judge_failure(corrupt: Any, mode: Mode) -> None:
    class BadJudge(ScriptedJudge):
        def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
            return corrupt(super().system_one(request))  # type: ignore[no-any-return]

    decision = selector(BadJudge(marked_answer), mode=mode).select(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.1))
    assert decision.status is Status.ERROR
    assert decision.reason is Reason.CALL_OR_RESPONSE_ERROR
    assert decision.selection is None


def test_http_error_after_retries_is_call_or_response_error(jev_server: SystemOneTestServer) -> None:
    jev_server.inject_always(Fault.status(500))
    decision = selector(http_judge(jev_server)).select(QUERY, RELEVANCE_QUESTION, candidates(0.9))
    assert decision.status is Status.ERROR
    assert decision.reason is Reason.CALL_OR_RESPONSE_ERROR
    assert jev_server.request_count == 3


async def test_cancellation_is_recorded_and_reraised(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(2.0)
    records = Records()
    chosen = selector(http_judge(jev_server, timeout=5.0), records=records, budget=5.0, batch_size=1)
    task = asyncio.ensure_future(chosen.aselect(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.9)))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(r.status, r.reason) for r in records.records] == [(Status.CANCELLED, Reason.CANCELLED)]


def test_observer_that_raises_does_not_change_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    def broken(ctx: object, record: DecisionRecord) -> None:
        raise RuntimeError("observer is down")

    chosen = CandidateSelector(ScriptedJudge(marked_answer), ExecutionOptions(mode=Mode.ENFORCE, observer=broken))
    with caplog.at_level(logging.ERROR, logger="llama_jev.selector"):
        decision = chosen.select(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.1))
    assert decision.status is Status.DECIDED
    assert decision.selection is not None
    assert decision.selection.selected == ("n0",)
    assert "observer" in caplog.text


@pytest.mark.parametrize("fault", [None, Fault.status(500), Fault.probability(2.0), Fault.status(401)])
def test_records_and_errors_never_hold_secrets(jev_server: SystemOneTestServer, fault: Fault | None) -> None:
    if fault is not None:
        jev_server.inject_always(fault)
    records = Records()
    cands = [Candidate("private-1", marked(0.9, f"The rule is {SECRET}.")), Candidate("public-1", marked(0.5, "x"))]
    decision = selector(http_judge(jev_server), records=records).select(f"{QUERY} {SECRET}", RELEVANCE_QUESTION, cands)
    assert len(records.records) == 1
    dumped = records.records[0].to_json() + repr(decision)
    if decision.error is not None:
        dumped += str(decision.error) + repr(decision.error)
    assert SECRET not in dumped
    assert API_KEY not in dumped


def test_record_holds_ids_scores_and_configuration(jev_server: SystemOneTestServer) -> None:
    records = Records()
    options = ExecutionOptions(mode=Mode.SHADOW, version="thresholds-2026-12", observer=records)
    chosen = CandidateSelector(http_judge(jev_server), options)
    chosen.select(QUERY, RELEVANCE_QUESTION, candidates(0.9, 0.5, 0.1))
    record = json.loads(records.records[0].to_json())
    assert record["mode"] == "shadow"
    assert record["version"] == "thresholds-2026-12"
    assert record["status"] == "decided"
    assert record["reason"] == "CLASSIFIED"
    assert (record["selected"], record["uncertain"], record["rejected"]) == (["n0"], ["n1"], ["n2"])
    assert record["scores"] == {"n0": 0.9, "n1": 0.5, "n2": 0.1}
    assert record["model"] == "jev-test-1"
    assert record["candidates"] == 3
    assert record["requests"] == 1


@pytest.mark.parametrize("budget", [0, -1, float("inf"), float("nan")])
def test_budget_must_be_positive_and_finite(budget: float) -> None:
    with pytest.raises(ValueError, match="budget"):
        ExecutionOptions(mode=Mode.ENFORCE, budget=budget)


# --- JSONL calibration log ------------------------------------------------------------------


def _write_records(path: str, count: int) -> None:
    observer = JsonlObserver(path)
    chosen = CandidateSelector(ScriptedJudge(marked_answer), ExecutionOptions(mode=Mode.SHADOW, observer=observer))
    for _ in range(count):
        chosen.select(QUERY, RELEVANCE_QUESTION, candidates(*[0.9] * 30))


@pytest.mark.slow
def test_jsonl_observer_lines_survive_concurrent_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "decisions.jsonl")
    processes = [multiprocessing.get_context("spawn").Process(target=_write_records, args=(path, 25)) for _ in range(3)]
    for process in processes:
        process.start()
    _write_records(path, 25)
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    records = JsonlObserver(path).read()
    assert len(records) == 100
    assert all(len(record.scores) == 30 for record in records)
