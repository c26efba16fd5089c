"""DraftReviewer over HTTP to the System One test server: modes, statuses, revisions, withheld answers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage

from llama_jev import (
    DecisionRecord,
    DraftReviewer,
    ExecutionOptions,
    JevError,
    Mode,
    ResponseWithheldError,
    ReviewOutcome,
    ReviewStatus,
    ScriptedJudge,
    Status,
)
from llama_jev.core import Reason
from llama_jev.errors import CandidateTooLargeError, EvidenceTooLargeError
from llama_jev.review import GROUNDED_QUESTION, WithheldReason
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .review_support import (
    DRAFT,
    POLICY,
    QUERY,
    REVISION,
    Reviser,
    empty_revision,
    evidence,
    records_json,
    review_answer,
    reviewer,
    still_unconditional,
    tool_call_revision,
)
from .support import eventually, marked


@pytest.fixture
def server(jev_server: SystemOneTestServer) -> SystemOneTestServer:
    jev_server.set_answer(review_answer)
    return jev_server


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest) -> Any:
    """``run(reviewer, query, draft, evidence, **kw)``: ``review`` or ``areview``, same assertions."""

    def sync(rv: DraftReviewer, *args: Any, **kwargs: Any) -> ReviewOutcome:
        return rv.review(*args, **kwargs)

    def via_async(rv: DraftReviewer, *args: Any, **kwargs: Any) -> ReviewOutcome:
        return asyncio.run(rv.areview(*args, **kwargs))

    return sync if request.param == "sync" else via_async


# --- modes x statuses --------------------------------------------------------------------------

VERDICTS = {
    "pass": (marked(0.9, DRAFT), None),
    "fail": (marked(0.05, DRAFT), WithheldReason.UNSUPPORTED),
    "uncertain": (marked(0.5, DRAFT), WithheldReason.UNCERTAIN),
}


def test_off_returns_the_draft_without_asking_or_recording(server: SystemOneTestServer, run: Any) -> None:
    records: list[DecisionRecord] = []
    outcome = run(reviewer(server, Mode.OFF, records), QUERY, DRAFT, evidence(POLICY), llm=Reviser().llm)
    assert outcome == ReviewOutcome(ReviewStatus.SKIPPED, DRAFT)
    assert server.request_count == 0
    assert records == []


@pytest.mark.parametrize("verdict", VERDICTS)
def test_shadow_returns_the_draft_and_records_the_verdict(server: SystemOneTestServer, run: Any, verdict: str) -> None:
    draft, reason = VERDICTS[verdict]
    records: list[DecisionRecord] = []
    reviser = Reviser()
    outcome = run(reviewer(server, Mode.SHADOW, records), QUERY, draft, evidence(POLICY), llm=reviser.llm)
    assert outcome.text == draft
    assert outcome.status is (ReviewStatus.PASSED if reason is None else ReviewStatus.WITHHELD)
    assert outcome.reason is reason
    assert outcome.revisions == 0
    assert reviser.calls == []  # SHADOW never asks for a revision
    (record,) = records
    assert outcome.record == record
    assert record.purpose == "draft_review"
    assert record.mode is Mode.SHADOW
    assert record.scores == {"draft": outcome.probability}
    assert server.request_count == 1


def test_shadow_keeps_the_draft_when_the_judge_fails_and_logs_it_once(
    server: SystemOneTestServer, run: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server.inject_always(Fault.status(500))
    records: list[DecisionRecord] = []
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        outcome = run(reviewer(server, Mode.SHADOW, records), QUERY, DRAFT, evidence(POLICY))
    assert outcome.text == DRAFT
    assert outcome.status is ReviewStatus.WITHHELD
    assert outcome.reason is WithheldReason.CALL_OR_RESPONSE_ERROR
    (record,) = records
    assert record.status is Status.ERROR
    warnings = [r for r in caplog.records if r.name == "llama_jev"]
    assert len(warnings) == 1
    assert "JevServerError" in warnings[0].getMessage()
    assert "HTTP 500" in warnings[0].getMessage()
    assert DRAFT not in caplog.text
    assert POLICY not in caplog.text


def test_enforce_publishes_a_draft_that_passes(server: SystemOneTestServer, run: Any) -> None:
    draft = marked(0.9, DRAFT)
    outcome = run(reviewer(server, Mode.ENFORCE), QUERY, draft, evidence(POLICY), llm=Reviser().llm)
    assert outcome.status is ReviewStatus.PASSED
    assert outcome.text == draft
    assert outcome.probability == 0.9
    assert outcome.revisions == 0


@pytest.mark.parametrize("verdict", ["fail", "uncertain"])
def test_enforce_withholds_a_draft_that_fails_or_is_uncertain(
    server: SystemOneTestServer, run: Any, verdict: str
) -> None:
    draft, reason = VERDICTS[verdict]
    with pytest.raises(ResponseWithheldError) as caught:
        run(reviewer(server, Mode.ENFORCE), QUERY, draft, evidence(POLICY))
    error = caught.value
    assert isinstance(error, JevError)
    assert error.reason == reason
    assert error.revisions == 0
    assert error.retryable is False
    assert error.record is not None
    assert error.probability == error.record.scores["draft"]
    assert DRAFT not in str(error)
    assert POLICY not in str(error)
    assert QUERY not in str(error)


@pytest.mark.parametrize(
    ("fault", "reason", "retryable", "status_code"),
    [
        (Fault.status(500), WithheldReason.CALL_OR_RESPONSE_ERROR, True, 500),
        (Fault.status(401), WithheldReason.CALL_OR_RESPONSE_ERROR, False, 401),
        (Fault.probability(1.5), WithheldReason.CALL_OR_RESPONSE_ERROR, False, 200),
    ],
    ids=["http-500", "http-401", "invalid-answer"],
)
def test_enforce_withholds_when_the_judge_fails_and_says_whether_a_retry_helps(
    server: SystemOneTestServer, run: Any, fault: Fault, reason: WithheldReason, retryable: bool, status_code: int
) -> None:
    server.inject_always(fault)
    reviser = Reviser()
    with pytest.raises(ResponseWithheldError) as caught:
        run(reviewer(server, Mode.ENFORCE), QUERY, DRAFT, evidence(POLICY), llm=reviser.llm)
    error = caught.value
    assert error.reason == reason
    assert error.status is Status.ERROR
    assert error.retryable is retryable
    assert error.status_code == status_code
    assert reviser.calls == []  # a judge failure is no verdict on the text: nothing to revise
    assert API_KEY not in str(error)
    assert DRAFT not in str(error)


def test_enforce_withholds_on_a_judge_timeout_as_retryable(server: SystemOneTestServer, run: Any) -> None:
    server.inject_always(Fault.delay(1.0))
    with pytest.raises(ResponseWithheldError) as caught:
        run(reviewer(server, Mode.ENFORCE, budget=0.2), QUERY, DRAFT, evidence(POLICY))
    assert caught.value.reason == WithheldReason.TIMEOUT
    assert caught.value.retryable is True
    assert caught.value.record is not None
    assert caught.value.record.reason is Reason.TIMEOUT


@pytest.mark.parametrize(("p", "status"), [(0.8, ReviewStatus.PASSED), (0.2, ReviewStatus.WITHHELD)])
def test_thresholds_are_inclusive(server: SystemOneTestServer, p: float, status: ReviewStatus) -> None:
    outcome = reviewer(server, Mode.SHADOW).review(QUERY, marked(p, DRAFT), evidence(POLICY))
    assert outcome.status is status
    if status is ReviewStatus.WITHHELD:
        assert outcome.reason is WithheldReason.UNSUPPORTED  # p == reject is a "no", not "uncertain"


# --- the seeds' flow: revise and pass ------------------------------------------------------------


def test_an_unconditional_promise_is_revised_to_keep_the_conditions_and_passes(
    server: SystemOneTestServer, run: Any
) -> None:
    records: list[DecisionRecord] = []
    reviser = Reviser()
    outcome = run(reviewer(server, Mode.ENFORCE, records), QUERY, DRAFT, evidence(POLICY), llm=reviser.llm)

    assert outcome.status is ReviewStatus.REVISED
    assert outcome.text == REVISION
    assert "unused" in outcome.text
    assert "seven days" in outcome.text
    assert outcome.revisions == 1
    assert outcome.probability == 0.95
    # Two requests, and the server saw the evidence both times: once with the draft, once with the revision.
    first, second = (request.json for request in server.requests)
    assert first["state"] == {"query": QUERY, "answer": DRAFT, "evidence": [{"id": "passage-0", "text": POLICY}]}
    assert second["state"] == {"query": QUERY, "answer": REVISION, "evidence": [{"id": "passage-0", "text": POLICY}]}
    assert first["questions"] == {
        "item_0": {"type": "noul", "instructions": {"question": GROUNDED_QUESTION, "candidate": DRAFT}}
    }
    assert second["questions"]["item_0"]["instructions"]["candidate"] == REVISION
    # One record per judgement: the draft rejected, the revision selected.
    assert [(r.rejected, r.selected) for r in records] == [(("draft",), ()), ((), ("revision_1",))]
    assert outcome.records == tuple(records)
    assert outcome.record == records[-1]
    # The reviser was asked once, with no tools, and its prompt carried the draft and the evidence.
    ((messages, kwargs),) = reviser.calls
    assert "tools" not in kwargs
    prompt = "\n".join(message.content or "" for message in messages)
    assert DRAFT in prompt
    assert POLICY in prompt
    assert QUERY in prompt


def test_a_revision_that_still_fails_is_withheld(server: SystemOneTestServer, run: Any) -> None:
    records: list[DecisionRecord] = []
    with pytest.raises(ResponseWithheldError) as caught:
        run(
            reviewer(server, Mode.ENFORCE, records),
            QUERY,
            DRAFT,
            evidence(POLICY),
            llm=Reviser(still_unconditional).llm,
        )
    assert caught.value.reason == WithheldReason.UNSUPPORTED
    assert caught.value.revisions == 1
    assert server.request_count == 2
    assert "always possible" not in str(caught.value)
    assert [r.scores for r in records] == [{"draft": 0.05}, {"revision_1": 0.05}]


def test_max_revisions_bounds_the_revisions(server: SystemOneTestServer) -> None:
    reviser = Reviser(still_unconditional)
    rv = DraftReviewer(
        reviewer(server, Mode.ENFORCE).selector.judge, ExecutionOptions(mode=Mode.ENFORCE), max_revisions=2
    )
    with pytest.raises(ResponseWithheldError) as caught:
        rv.review(QUERY, DRAFT, evidence(POLICY), llm=reviser.llm)
    assert caught.value.revisions == 2
    assert len(reviser.calls) == 2
    assert server.request_count == 3
    zero = DraftReviewer(rv.selector.judge, ExecutionOptions(mode=Mode.ENFORCE), max_revisions=0)
    with pytest.raises(ResponseWithheldError):
        zero.review(QUERY, DRAFT, evidence(POLICY), llm=reviser.llm)
    assert len(reviser.calls) == 2  # max_revisions=0: never asked


@pytest.mark.parametrize(
    ("reply", "reason"),
    [(empty_revision, WithheldReason.REVISION_EMPTY), (tool_call_revision, WithheldReason.REVISION_HAS_TOOL_CALLS)],
    ids=["empty", "tool-calls"],
)
def test_an_empty_revision_or_one_with_tool_calls_is_a_failure_not_a_pass(
    server: SystemOneTestServer, run: Any, reply: Any, reason: WithheldReason
) -> None:
    with pytest.raises(ResponseWithheldError) as caught:
        run(reviewer(server, Mode.ENFORCE), QUERY, DRAFT, evidence(POLICY), llm=Reviser(reply).llm)
    assert caught.value.reason == reason
    assert caught.value.revisions == 1
    assert server.request_count == 1  # it was not even judged


def test_an_llm_that_raises_withholds_the_answer_with_the_cause(server: SystemOneTestServer, run: Any) -> None:
    def explode(messages: Any) -> ChatMessage:
        raise RuntimeError(f"provider said: cannot process {DRAFT!r}")

    with pytest.raises(ResponseWithheldError) as caught:
        run(reviewer(server, Mode.ENFORCE), QUERY, DRAFT, evidence(POLICY), llm=Reviser(explode).llm)
    error = caught.value
    assert error.reason == WithheldReason.REVISION_FAILED
    assert isinstance(error.__cause__, RuntimeError)
    assert "RuntimeError" in str(error)
    assert DRAFT not in str(error)  # the cause's type, never its text
    assert "provider said" not in str(error)


def test_shadow_never_asks_the_llm_so_a_broken_llm_changes_nothing(server: SystemOneTestServer) -> None:
    def explode(messages: Any) -> ChatMessage:
        raise RuntimeError("boom")

    reviser = Reviser(explode)
    outcome = reviewer(server, Mode.SHADOW).review(QUERY, DRAFT, evidence(POLICY), llm=reviser.llm)
    assert outcome.text == DRAFT
    assert outcome.status is ReviewStatus.WITHHELD
    assert reviser.calls == []


# --- bad input and edge cases ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
def test_empty_evidence_fails_without_a_judge_call(server: SystemOneTestServer, run: Any, mode: Mode) -> None:
    records: list[DecisionRecord] = []
    reviser = Reviser()
    rv = reviewer(server, mode, records, query_key_secret="k")
    if mode is Mode.ENFORCE:
        with pytest.raises(ResponseWithheldError) as caught:
            run(rv, QUERY, DRAFT, [], llm=reviser.llm)
        assert caught.value.reason == WithheldReason.NO_EVIDENCE
    else:
        outcome = run(rv, QUERY, DRAFT, [], llm=reviser.llm)
        assert (outcome.status, outcome.text, outcome.reason) == (
            ReviewStatus.WITHHELD,
            DRAFT,
            WithheldReason.NO_EVIDENCE,
        )
    assert server.request_count == 0
    assert reviser.calls == []
    (record,) = records
    assert (record.status, record.reason, record.rejected, record.requests) == (
        Status.SKIPPED,
        Reason.NO_EVIDENCE,
        ("draft",),
        0,
    )
    assert record.query_key is not None


@pytest.mark.parametrize("draft", ["", "   \n"])
@pytest.mark.parametrize("mode", list(Mode))
def test_an_empty_draft_is_a_value_error(server: SystemOneTestServer, run: Any, draft: str, mode: Mode) -> None:
    with pytest.raises(ValueError, match="draft is empty"):
        run(reviewer(server, mode), QUERY, draft, evidence(POLICY))
    assert server.request_count == 0


def test_evidence_larger_than_one_request_is_a_typed_error_never_truncated(
    server: SystemOneTestServer, run: Any
) -> None:
    records: list[DecisionRecord] = []
    huge = evidence(*(POLICY * 300 for _ in range(8)))
    with pytest.raises(EvidenceTooLargeError) as caught:
        run(reviewer(server, Mode.ENFORCE, records), QUERY, DRAFT, huge)
    error = caught.value
    assert isinstance(error, ResponseWithheldError)
    assert isinstance(error, CandidateTooLargeError)
    assert "the evidence (8 passages" in str(error)
    assert "nothing was truncated" in str(error)
    assert POLICY not in str(error)
    assert server.request_count == 0
    (record,) = records
    assert (record.status, record.reason) == (Status.ERROR, Reason.QUERY_TOO_LARGE)


def test_shadow_keeps_the_draft_when_the_evidence_is_too_large(
    server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        outcome = reviewer(server, Mode.SHADOW).review(QUERY, DRAFT, evidence(POLICY * 3000))
    assert outcome.text == DRAFT
    assert outcome.reason is WithheldReason.EVIDENCE_TOO_LARGE
    assert "the evidence (1 passages" in caplog.text
    assert POLICY not in caplog.text


def test_the_judge_sees_node_content_only_never_metadata(server: SystemOneTestServer) -> None:
    nodes = evidence(POLICY, metadata={"acl_users": "ACL-SECRET-FIELD"})
    reviewer(server, Mode.SHADOW).review(QUERY, DRAFT, nodes)
    assert POLICY in server.received_text()
    assert "ACL-SECRET-FIELD" not in server.received_text()


def test_the_same_passage_twice_is_sent_once(server: SystemOneTestServer) -> None:
    nodes = evidence(POLICY)
    reviewer(server, Mode.SHADOW).review(QUERY, DRAFT, nodes + nodes)
    (request,) = server.requests
    assert request.json is not None
    assert len(request.json["state"]["evidence"]) == 1


async def test_a_cancelled_review_is_recorded_and_re_raised(server: SystemOneTestServer) -> None:
    server.inject_always(Fault.delay(5.0))
    records: list[DecisionRecord] = []
    task = asyncio.ensure_future(
        reviewer(server, Mode.ENFORCE, records, budget=10.0).areview(QUERY, DRAFT, evidence(POLICY))
    )
    assert await asyncio.to_thread(eventually, lambda: server.max_in_flight > 0)  # the request is on the wire
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = records
    assert (record.status, record.reason) == (Status.CANCELLED, Reason.CANCELLED)


def test_records_and_errors_hold_no_draft_revision_evidence_query_or_key(server: SystemOneTestServer) -> None:
    records: list[DecisionRecord] = []
    outcome = reviewer(server, Mode.ENFORCE, records, query_key_secret="s3cret").review(
        QUERY, DRAFT, evidence(POLICY), llm=Reviser().llm
    )
    assert outcome.status is ReviewStatus.REVISED
    with pytest.raises(ResponseWithheldError) as caught:
        reviewer(server, Mode.ENFORCE, records, query_key_secret="s3cret").review(
            QUERY, DRAFT, evidence(POLICY), llm=Reviser(still_unconditional).llm
        )
    logged = records_json(records) + repr(caught.value) + str(caught.value)
    assert len(records) == 4
    for text in (DRAFT, REVISION, "always possible", POLICY, QUERY, "s3cret", API_KEY, "seven days"):
        assert text not in logged
    assert all(record.query_key and len(record.query_key) == 64 for record in records)


def test_an_observer_that_raises_never_changes_the_outcome(server: SystemOneTestServer) -> None:
    def broken(ctx: Any, record: DecisionRecord) -> None:
        raise RuntimeError("observer down")

    rv = DraftReviewer(
        reviewer(server, Mode.ENFORCE).selector.judge, ExecutionOptions(mode=Mode.ENFORCE, observer=broken)
    )
    assert rv.review(QUERY, DRAFT, evidence(POLICY), llm=Reviser().llm).status is ReviewStatus.REVISED
    with pytest.raises(ResponseWithheldError):
        rv.review(QUERY, DRAFT, [])


@pytest.mark.parametrize(
    "kwargs",
    [{"reject": 0.8, "accept": 0.2}, {"max_revisions": -1}, {"max_revisions": 1.5}, {"question": "  "}],
    ids=["thresholds", "negative-revisions", "float-revisions", "blank-question"],
)
def test_bad_configuration_is_refused_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        DraftReviewer(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.ENFORCE), **kwargs)


def test_bad_arguments_are_type_errors() -> None:
    rv = DraftReviewer(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.ENFORCE))
    with pytest.raises(TypeError, match="NodeWithScore"):
        rv.review(QUERY, DRAFT, [POLICY])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="LLM"):
        rv.review(QUERY, DRAFT, evidence(POLICY), llm="gpt")  # type: ignore[arg-type]
