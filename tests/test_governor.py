"""One client, one governor: the bound on requests in flight across threads and event loops, its
adaptation to 429/529, Retry-After pausing the whole client, the budget, and one wave per
judgement with default settings. Real HTTP against the System One test server."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    Mode,
    RetryPolicy,
    Status,
)
from llama_jev.core import Reason
from llama_jev.engine import RELEVANCE_QUESTION, Candidate
from llama_jev.errors import JevTimeoutError
from llama_jev.systemone import NoulQuestion, SystemOneRequest
from llama_jev.systemone.governor import Governor
from llama_jev.systemone.queue_wait import measure_queue_wait, report_queue_wait
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .support import eventually, marked

QUERY = "What are the refund conditions?"
FAST = RetryPolicy(max_retries=3, initial_backoff=0.01, max_backoff=0.02)
SHORT_PASSAGE = "Refunds are available for unused items returned within seven days of delivery. " * 3


def request(p: float = 0.9) -> SystemOneRequest:
    question = NoulQuestion(instructions={"question": "Relevant?", "candidate": marked(p, "text")})
    return SystemOneRequest(state=QUERY, questions={"item_0": question})


def client_for(server: SystemOneTestServer, **kwargs: object) -> JevClient:
    options: dict[str, object] = {"api_key": API_KEY, "base_url": server.base_url, "timeout": 5.0, "retry": FAST}
    options.update(kwargs)
    return JevClient(**options)  # type: ignore[arg-type]


class Records:
    def __init__(self) -> None:
        self.records: list[DecisionRecord] = []

    def __call__(self, ctx: object, record: DecisionRecord) -> None:
        self.records.append(record)


# --- one wave -------------------------------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
async def test_1024_short_candidates_go_out_in_one_wave_with_default_settings(
    jev_server: SystemOneTestServer, use_async: bool
) -> None:
    jev_server.set_latency(0.3)
    client = client_for(jev_server)
    selector = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=30.0))
    candidates = [Candidate(f"n{i:04d}", marked(0.9, SHORT_PASSAGE)) for i in range(1024)]
    if use_async:
        decision = await selector.aselect(QUERY, RELEVANCE_QUESTION, candidates)
    else:
        decision = selector.select(QUERY, RELEVANCE_QUESTION, candidates)
    assert decision.status is Status.DECIDED
    assert decision.selection is not None
    assert len(decision.selection.selected) == 1024
    requests = jev_server.requests
    assert 1 < len(requests) <= 16
    # One wave: every request was being handled while every other one was.
    assert jev_server.max_in_flight == len(requests)
    assert max(r.started for r in requests) < min(r.finished for r in requests)
    sizes = [len(r.json["questions"]) for r in requests]  # type: ignore[index]
    assert max(sizes) - min(sizes) <= 1  # evened out, not 308 + 308 + 308 + 100
    client.close()


# --- the bound ------------------------------------------------------------------------------


def test_the_bound_holds_across_threads_and_event_loops(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.1)
    client = client_for(jev_server, max_in_flight=3)
    failures: list[BaseException] = []

    def sync_caller() -> None:
        try:
            for _ in range(2):
                client.system_one(request())
        except BaseException as error:  # pragma: no cover - reported below
            failures.append(error)

    def loop_caller() -> None:
        async def burst() -> None:
            await asyncio.gather(*(client.asystem_one(request()) for _ in range(4)))

        try:
            asyncio.run(burst())
        except BaseException as error:  # pragma: no cover - reported below
            failures.append(error)

    threads = [threading.Thread(target=sync_caller) for _ in range(4)]
    threads += [threading.Thread(target=loop_caller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert jev_server.request_count == 4 * 2 + 2 * 4
    assert 2 <= jev_server.max_in_flight <= 3
    stats = client.stats
    assert (stats.in_flight, stats.queued, stats.admitted) == (0, 0, 16)
    assert stats.queue_wait_seconds > 0


def test_a_server_limit_equal_to_the_clients_bound_is_never_hit() -> None:
    with SystemOneTestServer(latency=0.05, in_flight_limit=4) as server:
        client = JevClient(api_key="k", base_url=server.base_url, max_in_flight=4, retry=FAST)

        def calls() -> None:
            for _ in range(3):
                client.system_one(request())

        threads = [threading.Thread(target=calls) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert server.request_count == 24
        assert server.rate_limited_count == 0
        client.close()


async def test_a_waiting_request_does_not_block_its_event_loop(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.3)
    client = client_for(jev_server, max_in_flight=1)
    first = asyncio.ensure_future(client.asystem_one(request()))
    assert await asyncio.to_thread(eventually, lambda: client.stats.in_flight == 1)
    second = asyncio.ensure_future(client.asystem_one(request()))
    await asyncio.sleep(0)  # let it reach the governor
    assert client.stats.queued == 1
    ticks = 0
    while client.stats.queued == 1:
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks >= 2  # the loop kept running while `second` waited for the slot
    await asyncio.gather(first, second)
    await client.aclose()


async def test_a_cancelled_call_gives_its_slot_back(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.5)
    client = client_for(jev_server, max_in_flight=1)
    sending = asyncio.ensure_future(client.asystem_one(request()))
    assert await asyncio.to_thread(eventually, lambda: client.stats.in_flight == 1)
    queued = asyncio.ensure_future(client.asystem_one(request()))
    assert await asyncio.to_thread(eventually, lambda: client.stats.queued == 1)
    for task in (sending, queued):
        task.cancel()
    await asyncio.gather(sending, queued, return_exceptions=True)
    assert (client.stats.in_flight, client.stats.queued) == (0, 0)
    jev_server.set_latency(0.0)
    assert (await client.asystem_one(request(0.7))).noul("item_0") == 0.7
    await client.aclose()


# --- adaptation -----------------------------------------------------------------------------


def test_the_limit_halves_once_per_generation_and_grows_back_on_success() -> None:
    governor = Governor(max_limit=8, min_limit=2)
    permits = [governor.acquire(timeout=1.0) for _ in range(8)]
    for permit in permits[:4]:  # four answers of one generation: one signal
        governor.release(permit, status=429)
    assert governor.limit == 4
    with pytest.raises(JevTimeoutError):  # 4 still in flight, limit 4: nothing admitted
        governor.acquire(timeout=0.0)
    for permit in permits[4:]:
        governor.release(permit, status=200)
    successes = 0
    while governor.limit < 8:
        governor.release(governor.acquire(timeout=1.0), status=200)
        successes += 1
    # The server refused with 5 of ours out: back to 4 is not enough to lift the ceiling it
    # taught, so the last four slots come back four times as slowly as a limit's worth each.
    assert 4 + 5 + 6 + 7 < successes <= 4 * (4 + 5 + 6 + 7) + 8
    for _ in range(5):  # overload from newer generations halves each time, down to min_limit
        governor.release(governor.acquire(timeout=1.0), status=529)
    assert governor.limit == 2
    stats = governor.stats
    assert (stats.rate_limited, stats.overloaded, stats.in_flight) == (4, 5, 0)


def test_a_timed_out_attempt_backs_off_as_a_429_does() -> None:
    governor = Governor(max_limit=8)
    permits = [governor.acquire(timeout=1.0) for _ in range(8)]
    governor.release(permits[0], timed_out=True)
    governor.release(permits[1], timed_out=True)  # the same generation: one signal

    stats = governor.stats
    assert (stats.limit, stats.timed_out, stats.rate_limited) == (4, 2, 0)
    for permit in permits[2:]:
        governor.release(permit)  # no answer and no timeout (a connection error): no signal
    assert governor.limit == 4


def test_the_limit_does_not_grow_back_past_what_the_server_took() -> None:
    # A server with room for 6 of ours: a wave of 16 meets 10 refusals, then a wave of 8 two.
    governor = Governor(max_limit=16)
    permits = [governor.acquire(timeout=1.0) for _ in range(16)]
    for permit in permits[6:]:
        governor.release(permit, status=429)
    for permit in permits[:6]:
        governor.release(permit, status=200)
    permits = [governor.acquire(timeout=1.0) for _ in range(8)]
    for permit in permits[6:]:
        governor.release(permit, status=429)
    for permit in permits[:6]:
        governor.release(permit, status=200)
    assert governor.stats.ceiling == 6

    limits = []
    for _ in range(40):  # a long run of successes, one at a time
        governor.release(governor.acquire(timeout=1.0), status=200)
        limits.append(governor.limit)

    assert max(limits[:10]) == 6  # back up to what the server took, and no further for a while
    assert limits[-1] <= 8  # then one slot more at a time, slowly


def test_answers_near_their_timeout_do_not_raise_the_limit() -> None:
    governor = Governor(max_limit=8)
    permits = [governor.acquire(timeout=1.0) for _ in range(8)]
    governor.release(permits[0], timed_out=True)
    for permit in permits[1:]:
        governor.release(permit, status=200, share_of_timeout=0.45)
    for _ in range(30):  # 45 % of the timeout with 4 out: 56 % with 5
        governor.release(governor.acquire(timeout=1.0), status=200, share_of_timeout=0.45)
    assert governor.limit == 4
    for _ in range(10):  # 35 %: 44 % with one more, room to grow
        governor.release(governor.acquire(timeout=1.0), status=200, share_of_timeout=0.35)
    assert governor.limit == 6


def test_a_client_whose_answers_come_near_its_timeout_holds_its_limit(jev_server: SystemOneTestServer) -> None:
    client = client_for(
        jev_server, max_in_flight=8, timeout=0.5, retry=RetryPolicy(max_retries=5, initial_backoff=0.01)
    )
    permits = [client.governor.acquire(timeout=1.0) for _ in range(8)]  # a wave of 8 met one 429: 4, ceiling 7
    client.governor.release(permits[0], status=429)
    for permit in permits[1:]:
        client.governor.release(permit)
    jev_server.set_latency(0.3)  # 60 % of each attempt's 0.5 s; 75 % with one more beside it
    for _ in range(10):  # were they quick, 9 would raise the limit to 6
        client.system_one(request(0.8))

    assert client.stats.limit <= 4  # (a timeout on a busy machine would only lower it)
    client.close()


def test_a_request_timing_out_at_the_server_halves_the_clients_limit(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.delay(1.0))  # the first attempt: slower than the client's timeout
    client = client_for(jev_server, max_in_flight=8, timeout=0.3)

    assert client.system_one(request(0.8)).noul("item_0") == 0.8  # the retry is answered
    stats = client.stats
    assert (stats.timed_out, stats.limit) == (1, 4)
    client.close()


def test_rate_limited_answers_shrink_the_clients_limit(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.rate_limited(retry_after=0.05))
    client = client_for(jev_server, max_in_flight=8)
    assert client.system_one(request(0.8)).noul("item_0") == 0.8
    stats = client.stats
    assert (stats.rate_limited, stats.limit) == (1, 4)
    client.close()


# --- Retry-After pauses the client ----------------------------------------------------------


def test_a_retry_after_pauses_every_request_of_the_client(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.rate_limited(retry_after=0.4))
    client = client_for(jev_server)
    first = threading.Thread(target=client.system_one, args=(request(),))
    first.start()
    assert eventually(lambda: client.stats.rate_limited == 1)
    assert client.stats.paused_for > 0
    client.system_one(request())  # another caller, another request, same client
    first.join()
    refused = jev_server.requests[0]
    later = jev_server.requests[1:]
    assert len(later) == 2
    # Neither the retry nor the other caller's request reached the server during the pause.
    assert all(r.started >= refused.finished + 0.35 for r in later)
    client.close()


def test_a_request_queued_before_a_pause_goes_when_the_pause_ends_not_at_its_deadline() -> None:
    governor = Governor(max_limit=1)
    holder = governor.acquire(timeout=1.0)
    admitted: list[float] = []

    def queued() -> None:
        permit = governor.acquire(timeout=60.0)  # at its deadline it would fail, not be admitted
        admitted.append(permit.waited)
        governor.release(permit, status=200)

    thread = threading.Thread(target=queued)
    thread.start()
    assert eventually(lambda: governor.stats.queued == 1)
    governor.release(holder, status=429, retry_after=0.3)  # the slot is free, but the client pauses
    assert governor.stats.queued == 1
    thread.join()
    (waited,) = admitted
    assert waited >= 0.25  # it sat out the pause, and was admitted: it went when the pause ended


def test_a_pause_ending_after_a_queued_deadline_fails_it_at_once() -> None:
    governor = Governor(max_limit=1, max_pause=300.0)
    holder = governor.acquire(timeout=1.0)
    failures: list[BaseException] = []

    def queued() -> None:
        try:
            governor.acquire(timeout=60.0)
        except JevTimeoutError as error:
            failures.append(error)

    thread = threading.Thread(target=queued)
    thread.start()
    assert eventually(lambda: governor.stats.queued == 1)
    governor.release(holder, status=529, retry_after=300.0)
    thread.join(30.0)
    assert not thread.is_alive()  # failed when the pause began, not at its 60 s deadline
    assert len(failures) == 1
    assert "Retry-After" in str(failures[0])


# --- the budget -----------------------------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_queued_judgement_times_out_at_its_budget_without_sending(
    jev_server: SystemOneTestServer, use_async: bool
) -> None:
    jev_server.set_latency(1.0)
    client = client_for(jev_server, max_in_flight=1)
    records = Records()
    patient = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=5.0))
    hurried = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=0.3, observer=records))
    holder = threading.Thread(target=patient.select, args=(QUERY, RELEVANCE_QUESTION, [Candidate("a", "x")]))
    holder.start()
    assert eventually(lambda: client.stats.in_flight == 1)
    if use_async:
        decision = await hurried.aselect(QUERY, RELEVANCE_QUESTION, [Candidate("b", "y")])
    else:
        decision = hurried.select(QUERY, RELEVANCE_QUESTION, [Candidate("b", "y")])
    answered_while_holder_in_flight = jev_server.request_count == 0
    holder.join()
    assert decision.status is Status.ERROR
    assert decision.reason is Reason.TIMEOUT
    assert answered_while_holder_in_flight  # it gave up at its budget, not when the slot freed
    assert jev_server.request_count == 1  # only the holder's request was ever sent
    assert records.records[0].queue_ms >= 250.0
    # Sync: the request gave up in the queue; async: the selector cancelled it. Either way, gone.
    assert eventually(lambda: (client.stats.queued, client.stats.in_flight) == (0, 0))
    client.close()


def test_a_pause_longer_than_the_budget_fails_at_once_without_sending(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.rate_limited(retry_after=2.0))
    client = client_for(jev_server, retry=RetryPolicy(max_retries=0, max_retry_after=5.0))
    with pytest.raises(Exception, match="rate limited"):
        client.system_one(request())
    assert client.stats.paused_for > 1.0
    with pytest.raises(JevTimeoutError, match="Retry-After"):
        client.system_one(request(), timeout=0.5)
    assert jev_server.request_count == 1
    client.close()


def test_queue_wait_reaches_the_record(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.2)
    client = client_for(jev_server, max_in_flight=1)
    records = Records()
    selector = CandidateSelector(client, ExecutionOptions(mode=Mode.SHADOW, budget=5.0, observer=records), batch_size=1)
    decision = selector.select(QUERY, RELEVANCE_QUESTION, [Candidate("a", "x"), Candidate("b", "y")])
    assert decision.status is Status.INCONCLUSIVE or decision.status is Status.DECIDED
    (record,) = records.records
    assert record.queue_ms >= 150.0  # the second batch waited for the first one's slot
    assert record.queue_ms <= record.elapsed_ms
    client.close()


def test_queue_wait_is_collected_per_block() -> None:
    with measure_queue_wait() as outer:
        report_queue_wait(0.1)
        with measure_queue_wait() as inner:
            report_queue_wait(0.3)
        report_queue_wait(0.2)
    report_queue_wait(5.0)  # outside any block: nowhere to go
    assert (outer.ms, inner.ms) == (pytest.approx(200.0), pytest.approx(300.0))


def test_governor_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="max_limit"):
        Governor(max_limit=0)
    with pytest.raises(ValueError, match="min_limit"):
        Governor(max_limit=2, min_limit=3)
    with pytest.raises(ValueError, match="max_in_flight"):
        JevClient(api_key="k", base_url="http://127.0.0.1:1", max_in_flight=0)


def test_stats_never_show_the_key(jev_server: SystemOneTestServer) -> None:
    client = client_for(jev_server)
    client.system_one(request())
    assert API_KEY not in repr(client.stats)
    assert API_KEY not in repr(client.governor)
    client.close()
