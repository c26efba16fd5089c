"""The judge server as users run it: real processes on 127.0.0.1, hostile input, overload, slow
clients, the drain. ``python -m llama_jev.serve --judge local`` is the real thing; the slow
judge (tests/serve_support.py, the same runner and app) makes timing-dependent behaviour
deterministic."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llama_jev.systemone.judge import RELEVANCE_QUESTION
from tests.serve_support import (
    ServerProcess,
    metric,
    raw_exchange,
    serve_local,
    serve_slow,
    server_process,
)

# Every test here runs the server as a subprocess (most with the local model): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow

KEY = "sk-serve-test-key"
QUERY = "How long does shipping take?"
ANSWER = "Standard shipping takes three to five business days."


def relevance_body(count: int = 1, *, query: str = QUERY, passage: str = ANSWER) -> dict[str, Any]:
    question = {"question": RELEVANCE_QUESTION, "candidate": passage}
    return {
        "state": query,
        "questions": {f"item_{index}": {"type": "noul", "instructions": question} for index in range(count)},
    }


def keyed(**headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", **headers}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``python -m llama_jev.serve --judge local`` with a key from a file, for the routes and bad input."""
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    command = serve_local("--api-key-file", str(key_file), "--header-timeout", "1", "--body-timeout", "1")
    with server_process(command) as server:
        yield server


# -- routes ------------------------------------------------------------------------------------


def test_health_ready_and_metrics_answer_without_the_key(local: ServerProcess) -> None:
    with httpx.Client(base_url=local.base_url) as client:
        health, ready, metrics = client.get("/healthz"), client.get("/readyz"), client.get("/metrics")

    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in (
        "llama_jev_requests_total",
        "llama_jev_candidates_judged_total",
        "llama_jev_request_duration_seconds_bucket",
        "llama_jev_requests_in_flight",
        "llama_jev_requests_queued",
        "llama_jev_batch_candidates_bucket",
    ):
        assert name in metrics.text


def test_a_keyed_request_is_judged_and_counted_in_the_metrics(local: ServerProcess) -> None:
    before = metric(local.base_url, "llama_jev_candidates_judged_total")

    response = httpx.post(local.base_url + "/v1/systemone", json=relevance_body(3), headers=keyed(), timeout=60)

    assert response.status_code == 200
    assert set(response.json()["answers"]) == {"item_0", "item_1", "item_2"}
    assert response.json()["answers"]["item_0"]["noul"] > 0.5
    assert metric(local.base_url, "llama_jev_candidates_judged_total") == before + 3
    assert QUERY not in httpx.get(local.base_url + "/metrics").text


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nowhere", 404),
        ("GET", "/v1/systemone", 405),
        ("OPTIONS", "/v1/systemone", 405),
        ("DELETE", "/v1/models", 405),
        ("POST", "/healthz", 405),
    ],
)
def test_unknown_routes_and_methods_get_json_errors(local: ServerProcess, method: str, path: str, status: int) -> None:
    response = httpx.request(method, local.base_url + path, headers=keyed())

    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert "error" in response.json()


# -- bad input -----------------------------------------------------------------------------------


def test_a_wrong_key_gets_401_before_the_body_is_read(local: ServerProcess) -> None:
    # A Content-Length of 10^9 and no body: the answer cannot wait for the body.
    head = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer sk-wrong\r\nContent-Length: 1000000000\r\n\r\n"
    )
    reply = raw_exchange(local.base_url, head)

    assert reply.startswith(b"HTTP/1.1 401 ")
    assert reply.endswith(b'{"error": "invalid API key"}')


def test_a_missing_key_gets_401(local: ServerProcess) -> None:
    response = httpx.post(local.base_url + "/v1/systemone", json=relevance_body())

    assert (response.status_code, response.json()) == (401, {"error": "invalid API key"})


def test_a_declared_length_over_the_limit_gets_413_before_the_body_is_read(local: ServerProcess) -> None:
    head = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: 1000000000\r\n\r\n".encode()
    )
    reply = raw_exchange(local.base_url, head)

    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in reply.lower()


def test_a_chunked_body_over_the_limit_gets_413(local: ServerProcess) -> None:
    chunk = b"[" + b" " * (1024 * 1024)

    response = httpx.post(
        local.base_url + "/v1/systemone",
        content=iter([chunk] * 5),  # 5 MiB, no Content-Length
        headers=keyed(**{"Content-Type": "application/json"}),
        timeout=30,
    )

    assert response.status_code == 413
    assert "4194304 bytes" in response.json()["error"]


def test_more_than_1024_candidates_get_413(local: ServerProcess) -> None:
    response = httpx.post(
        local.base_url + "/v1/systemone", json=relevance_body(1025, passage="x"), headers=keyed(), timeout=30
    )

    assert response.status_code == 413
    assert "1025 candidates" in response.json()["error"]


def test_a_content_type_that_is_not_json_gets_415(local: ServerProcess) -> None:
    response = httpx.post(
        local.base_url + "/v1/systemone",
        content=json.dumps(relevance_body()),
        headers=keyed(**{"Content-Type": "text/plain"}),
    )

    assert response.status_code == 415
    assert "application/json" in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"{not json", "json_invalid"),
        (b"", "json_invalid"),
        (b"[" * 100_000, "json_too_deep"),
        (b"[" * 65 + b"]" * 65, "json_too_deep"),
        (b'{"state": "q", "questions": {"a": ' + b'{"b": ' * 70 + b"1" + b"}" * 70 + b"}}", "json_too_deep"),
    ],
)
def test_malformed_or_too_deep_json_gets_400_and_leaks_no_slot(local: ServerProcess, body: bytes, kind: str) -> None:
    response = httpx.post(
        local.base_url + "/v1/systemone", content=body, headers=keyed(**{"Content-Type": "application/json"})
    )

    assert response.status_code == 400
    assert response.json()["detail"][0]["type"] == kind
    assert metric(local.base_url, "llama_jev_requests_in_flight") == 0
    assert metric(local.base_url, "llama_jev_requests_queued") == 0


def test_nesting_of_64_levels_is_read(local: ServerProcess) -> None:
    # 64 levels in all: the body, "questions", one question, "instructions", then 60 nested lists.
    body = relevance_body()
    body["questions"]["item_0"]["instructions"] = json.loads("[" * 60 + "]" * 60)

    response = httpx.post(local.base_url + "/v1/systemone", json=body, headers=keyed(), timeout=30)

    assert response.status_code == 200  # answered (uncertain: not a relevance question)


def test_a_body_that_is_json_but_not_a_request_gets_422(local: ServerProcess) -> None:
    response = httpx.post(local.base_url + "/v1/systemone", json={"state": "q", "questions": {}}, headers=keyed())

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "questions"]


@pytest.mark.parametrize("candidate", [12345, None, {"text": "a passage"}], ids=["number", "null", "object"])
def test_a_candidate_that_is_not_text_gets_422_naming_the_field(local: ServerProcess, candidate: Any) -> None:
    body = relevance_body(2)
    body["questions"]["item_1"]["instructions"] = {"question": RELEVANCE_QUESTION, "candidate": candidate}

    response = httpx.post(local.base_url + "/v1/systemone", json=body, headers=keyed(), timeout=60)

    assert response.status_code == 422
    (problem,) = response.json()["detail"]
    assert problem["loc"] == ["body", "questions", "item_1", "instructions", "candidate"]
    assert "text" in problem["msg"]


def test_a_request_that_is_not_http_gets_a_json_400(local: ServerProcess) -> None:
    reply = raw_exchange(local.base_url, b"HELLO THERE\r\n\r\n")

    assert reply.startswith(b"HTTP/1.1 400 ")
    assert b"application/json" in reply


# -- slow clients ------------------------------------------------------------------------------


def test_a_slow_request_head_times_out_with_408(local: ServerProcess) -> None:
    started = time.monotonic()
    reply = raw_exchange(local.base_url, b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n", wait=30)

    assert reply.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < 30  # closed by the server, not by this test's guard


def test_a_slow_body_times_out_with_408(local: ServerProcess) -> None:
    head = (
        b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n".encode()
    )
    reply = raw_exchange(local.base_url, head, then_send=b'{"state": ', wait=30)

    assert reply.startswith(b"HTTP/1.1 408 ")


def test_two_hundred_slow_clients_do_not_hold_up_a_request(local: ServerProcess) -> None:
    host, port = local.base_url.removeprefix("http://").split(":")
    sockets = []
    try:
        for _ in range(200):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"POST /v1/systemone HTTP/1.1\r\n")
            sockets.append(sock)
        response = httpx.post(local.base_url + "/v1/systemone", json=relevance_body(), headers=keyed(), timeout=60)
        assert response.status_code == 200
        # Each slow client is cut off by the head deadline (1 s here).
        for sock in sockets:
            sock.settimeout(30)
            assert sock.recv(65536).startswith(b"HTTP/1.1 408 ")
    finally:
        for sock in sockets:
            sock.close()


# -- what the judge cannot read -----------------------------------------------------------------


def test_a_structured_state_is_judged_by_its_query_field(local: ServerProcess) -> None:
    # The shape the Java JevKnowledge adapter sends: the query in the state's "query" field.
    as_text = httpx.post(local.base_url + "/v1/systemone", json=relevance_body(), headers=keyed(), timeout=60)
    body = relevance_body()
    body["state"] = {"query": QUERY, "tool": "search_knowledge"}
    structured = httpx.post(local.base_url + "/v1/systemone", json=body, headers=keyed(), timeout=60)

    assert structured.status_code == 200
    assert structured.json()["answers"] == as_text.json()["answers"]
    assert structured.json()["answers"]["item_0"]["noul"] > 0.5
    assert "llama-jev-uncertain" not in structured.headers


def test_a_request_the_judge_cannot_read_is_seen_in_the_header_the_metrics_and_the_log(local: ServerProcess) -> None:
    before = metric(local.base_url, 'llama_jev_uncertain_candidates_total{cause="state"}')
    body = relevance_body(3)
    body["state"] = {"tool": "search_knowledge", "text": QUERY}  # no "query" field

    response = httpx.post(local.base_url + "/v1/systemone", json=body, headers=keyed(), timeout=60)
    deadline = time.monotonic() + 10
    while "3 uncertain" not in local.stdout() and time.monotonic() < deadline:
        time.sleep(0.05)

    assert response.status_code == 200
    assert {answer["noul"] for answer in response.json()["answers"].values()} == {0.5}
    assert response.headers["llama-jev-uncertain"] == "state=3"
    assert metric(local.base_url, 'llama_jev_uncertain_candidates_total{cause="state"}') == before + 3
    line = next(line for line in local.stdout().splitlines() if "3 uncertain" in line)
    assert "POST /v1/systemone 200 3 candidates" in line
    assert '(3 uncertain: the state is neither the query text nor an object with a "query" text)' in line
    assert QUERY not in local.stdout()


def test_models_names_the_judge_and_its_version(local: ServerProcess) -> None:
    from llama_jev import __version__

    response = httpx.get(local.base_url + "/v1/models", headers=keyed())

    (model,) = response.json()["models"]
    assert model["name"] == "local-relevance-v2"
    assert model["description"].startswith(f"LocalRelevanceJudge local-relevance-v2 (llama_jev {__version__})")
    assert "UncertainElsewhere" not in model["description"]


def test_serve_help_shows_no_markup() -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "llama_jev.serve", "--help"], capture_output=True, text=True, check=True
    ).stdout

    assert "python -m llama_jev.serve --judge local --port 8000: a System One server" in help_text
    assert "`" not in help_text


# -- the log -------------------------------------------------------------------------------------


def test_the_log_has_one_line_per_request_and_never_text_or_the_key(local: ServerProcess) -> None:
    secret_query = "the confidential merger of Acme"
    httpx.post(
        local.base_url + "/v1/systemone", json=relevance_body(2, query=secret_query), headers=keyed(), timeout=60
    )
    deadline = time.monotonic() + 10
    while "POST /v1/systemone 200 2 candidates" not in local.stdout() and time.monotonic() < deadline:
        time.sleep(0.05)

    out = local.stdout()
    assert "POST /v1/systemone 200 2 candidates" in out
    assert re.search(r"POST /v1/systemone 401 0 candidates \d+ ms \(invalid API key\)", out)
    for text in (secret_query, ANSWER, KEY):
        assert text not in out + local.stderr()


def test_a_request_whose_client_left_while_it_was_judged_is_logged_as_dropped_not_200(local: ServerProcess) -> None:
    before = metric(local.base_url, 'llama_jev_requests_total{route="/v1/systemone",status="200"}')
    body = relevance_body(400, passage=ANSWER * 20)  # a few seconds of the local model
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(local.base_url + "/v1/systemone", json=body, headers=keyed(), timeout=0.5)
    deadline = time.monotonic() + 120
    while "400 candidates" not in local.stdout() and time.monotonic() < deadline:
        time.sleep(0.1)

    line = next(line for line in local.stdout().splitlines() if "400 candidates" in line)
    assert re.search(r"POST /v1/systemone dropped 400 candidates \d+ ms \(the client left while it was judged\)", line)
    assert metric(local.base_url, 'llama_jev_requests_total{route="/v1/systemone",status="200"}') == before


# -- the socket --------------------------------------------------------------------------------------


def test_accepted_connections_have_nagle_off() -> None:
    # With Nagle on, a response's body waits for the client's delayed ACK of its head: ~40 ms
    # per answer on a kept-alive connection (benchmarks/bench_serve.py measures it).
    from starlette.responses import JSONResponse

    from llama_jev.server.exchange import TRANSPORT_KEY
    from llama_jev.server.http import ConnectionLedger, ThreadedServer, bind

    async def app(scope: Any, receive: Any, send: Any) -> None:
        sock = scope["extensions"][TRANSPORT_KEY].get_extra_info("socket")
        await JSONResponse({"nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)})(scope, receive, send)

    sock = bind("127.0.0.1", 0)
    runner = ThreadedServer(app, sock, ConnectionLedger())
    runner.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as client:
            answers = [client.get("/").json()["nodelay"] for _ in range(2)]  # a new connection, then kept alive
    finally:
        runner.stop()
        sock.close()

    assert all(answers)


# -- admission, batching, disconnects (the slow judge) ---------------------------------------------


async def _post_all(base_url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        return list(await asyncio.gather(*(client.post("/v1/systemone", json=body) for body in bodies)))


def test_beyond_in_flight_and_queue_requests_get_429_with_retry_after() -> None:
    with server_process(serve_slow(0.5, "--max-in-flight", "1", "--queue", "1", "--max-batch-tokens", "0")) as server:
        responses = asyncio.run(_post_all(server.base_url, [relevance_body(query=f"q{i}") for i in range(6)]))
        statuses = sorted(response.status_code for response in responses)
        refused = [response for response in responses if response.status_code == 429]

        assert statuses == [200, 200, 429, 429, 429, 429]
        assert all(response.headers["retry-after"] == "1" for response in refused)
        assert all("retry" in response.json()["error"] for response in refused)
        assert metric(server.base_url, 'llama_jev_requests_total{route="/v1/systemone",status="429"}') == 4


def test_clients_still_sending_their_body_hold_no_admission_place() -> None:
    # One in flight and one queued in all: two clients that send half a body and stall must not
    # take both places, or every ready client would get 429 until their body timeout (30 s).
    flags = ("--max-in-flight", "1", "--queue", "1", "--max-batch-tokens", "0")
    with server_process(serve_slow(0.05, *flags)) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        head = (
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        stalled = []
        try:
            for _ in range(2):
                sock = socket.create_connection((host, int(port)), timeout=10)
                sock.sendall(head + b'{"st')
                stalled.append(sock)
            time.sleep(0.3)  # both heads and half bodies are in
            response = httpx.post(server.base_url + "/v1/systemone", json=relevance_body(), timeout=30)
            queued = metric(server.base_url, "llama_jev_requests_queued")
        finally:
            for sock in stalled:
                sock.close()

    assert response.status_code == 200, response.text
    assert queued == 0


def test_concurrent_requests_with_one_query_are_judged_in_one_call() -> None:
    with server_process(serve_slow(0.5, "--max-in-flight", "8")) as server:
        # The first request occupies the judge; the next five wait together and go in one call.
        first = threading.Thread(
            target=httpx.post,
            args=(server.base_url + "/v1/systemone",),
            kwargs={"json": relevance_body(query="other"), "timeout": 60},
        )
        first.start()
        time.sleep(0.2)
        responses = asyncio.run(_post_all(server.base_url, [relevance_body(2) for _ in range(5)]))
        first.join(60)

    assert [response.status_code for response in responses] == [200] * 5
    # The slow judge answers the number of candidates in its call / 1000: all ten together.
    assert {response.json()["answers"]["item_0"]["noul"] for response in responses} == {0.01}


def test_without_batching_each_request_is_its_own_call() -> None:
    with server_process(serve_slow(0.2, "--max-in-flight", "8", "--max-batch-tokens", "0")) as server:
        responses = asyncio.run(_post_all(server.base_url, [relevance_body(2) for _ in range(3)]))

    assert {response.json()["answers"]["item_0"]["noul"] for response in responses} == {0.002}


def test_a_request_whose_client_left_is_not_judged() -> None:
    with server_process(serve_slow(1.0, "--max-in-flight", "1", "--max-batch-tokens", "0")) as server:
        busy = threading.Thread(
            target=httpx.post,
            args=(server.base_url + "/v1/systemone",),
            kwargs={"json": relevance_body(query="busy"), "timeout": 60},
        )
        busy.start()
        time.sleep(0.3)
        with pytest.raises(httpx.ReadTimeout):  # waits behind the busy one; the client gives up
            httpx.post(server.base_url + "/v1/systemone", json=relevance_body(7), timeout=0.3)
        busy.join(60)
        time.sleep(1.5)

        # Only the busy request's one candidate (and the warm-up's) were judged, not the seven.
        assert metric(server.base_url, "llama_jev_candidates_judged_total") == 1
        assert metric(server.base_url, "llama_jev_batch_candidates_count") == 1


def test_readiness_is_503_until_the_judge_has_answered_its_warm_up() -> None:
    # The slow judge takes 3 s for its warm-up question; the process serves (healthz) meanwhile.
    with server_process(serve_slow(3.0), ready=False) as server:
        health = httpx.get(server.base_url + "/healthz", timeout=10)
        before = httpx.get(server.base_url + "/readyz", timeout=10)
        deadline = time.monotonic() + 60
        after = before
        while after.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            after = httpx.get(server.base_url + "/readyz", timeout=10)

    assert health.status_code == 200
    assert (before.status_code, before.json()["status"]) == (503, "not ready")
    assert (after.status_code, after.json()) == (200, {"status": "ready", "model": "slow-test"})


# -- the drain -------------------------------------------------------------------------------------


def _until_received(server: ServerProcess, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        metric(server.base_url, "llama_jev_requests_in_flight") + metric(server.base_url, "llama_jev_requests_queued")
        < count
    ):
        time.sleep(0.02)


def _drain_with_requests_in_flight(server: ServerProcess, sig: int, body: Any, count: int) -> list[Any]:
    """Send ``count`` requests at once, signal the server while they are in flight; their outcomes."""
    results: list[Any] = []

    def call() -> None:
        try:
            results.append(httpx.post(server.base_url + "/v1/systemone", json=body, timeout=60))
        except httpx.HTTPError as error:
            results.append(error)

    callers = [threading.Thread(target=call) for _ in range(count)]
    for caller in callers:
        caller.start()
    _until_received(server, count)
    assert server.stop(sig) == 0, server.stderr()
    for caller in callers:
        caller.join(60)
    return [getattr(result, "status_code", result) for result in results]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_every_request_received_and_exits_0(sig: int) -> None:
    with server_process(serve_slow(0.4, "--max-in-flight", "2", "--queue", "8", "--max-batch-tokens", "0")) as server:
        statuses = _drain_with_requests_in_flight(server, sig, relevance_body(), 6)

    assert statuses == [200] * 6
    assert server.stdout().count("POST 200") == 6
    assert server.stdout().strip().endswith("stopped")
    assert server.stderr() == ""


@pytest.mark.slow
def test_sigterm_drains_the_local_judge_with_nine_requests_in_flight() -> None:
    # The case: 9 requests of 20 candidates in flight were cut and the process aborted.
    with server_process(serve_local("--max-in-flight", "4", "--queue", "16")) as server:
        statuses = _drain_with_requests_in_flight(server, signal.SIGTERM, relevance_body(20), 9)

    assert statuses == [200] * 9
    assert server.stdout().count("POST /v1/systemone 200 20 candidates") == 9
    assert server.stdout().strip().endswith("llama_jev.serve: stopped")
    assert server.stderr() == ""


def test_requests_still_waiting_when_the_drain_runs_out_get_503() -> None:
    flags = ("--max-in-flight", "1", "--queue", "8", "--max-batch-tokens", "0", "--drain-seconds", "2")
    with server_process(serve_slow(1.0, *flags)) as server:
        results: list[httpx.Response] = []

        def call(index: int) -> None:
            results.append(
                httpx.post(server.base_url + "/v1/systemone", json=relevance_body(query=str(index)), timeout=60)
            )

        callers = [threading.Thread(target=call, args=(index,)) for index in range(5)]
        for caller in callers:
            caller.start()
        time.sleep(0.5)
        started = time.monotonic()
        code = server.stop(signal.SIGTERM)
        for caller in callers:
            caller.join(60)

        assert code == 0
        statuses = sorted(response.status_code for response in results)
        assert statuses[0] == 200
        assert set(statuses) == {200, 503}
        assert all(r.headers.get("retry-after") == "1" for r in results if r.status_code == 503)
        assert time.monotonic() - started < 10  # guard: the drain ended on its own


def test_more_work_than_the_drain_allows_is_answered_in_json_within_the_drain() -> None:
    # 6 in flight and 6 queued, a second each, one call at a time, 3 s to drain: most cannot be
    # judged in time, and each of those gets a JSON 503 before the drain ends, not uvicorn's
    # plain-text 500 after it.
    flags = ("--max-in-flight", "6", "--queue", "6", "--max-batch-tokens", "0", "--drain-seconds", "3")
    with server_process(serve_slow(1.0, *flags)) as server:
        answered: list[tuple[float, httpx.Response]] = []
        signalled = [0.0]

        def call(index: int) -> None:
            response = httpx.post(server.base_url + "/v1/systemone", json=relevance_body(query=str(index)), timeout=60)
            answered.append((time.monotonic() - signalled[0], response))

        callers = [threading.Thread(target=call, args=(index,)) for index in range(12)]
        for caller in callers:
            caller.start()
        _until_received(server, 12)
        signalled[0] = time.monotonic()
        code = server.stop(signal.SIGTERM)
        for caller in callers:
            caller.join(60)

    assert code == 0
    assert len(answered) == 12
    for _, response in answered:
        assert response.headers["content-type"] == "application/json", response.text
        assert response.status_code in (200, 503), response.text
    refused = [response for _, response in answered if response.status_code == 503]
    assert len(refused) >= 6  # a second each, one at a time: at most ~3 fit in the drain
    assert all(response.headers["retry-after"] == "1" for response in refused)
    assert all("shutting down" in response.json()["error"] for response in refused)
    # All JSON means all before uvicorn's cut at drain + 1 s; this only guards against a hang.
    assert max(seconds for seconds, _ in answered) < 10


# -- the key, the host -----------------------------------------------------------------------------


def test_an_empty_key_file_is_refused_at_start(tmp_path: Path) -> None:
    empty = tmp_path / "key"
    empty.write_text("\n")

    run = subprocess.run(
        [sys.executable, "-m", "llama_jev.serve", "--port", "0", "--api-key-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert run.returncode == 2
    assert "is empty" in run.stderr


def test_listening_beyond_loopback_without_a_key_is_warned_about() -> None:
    from llama_jev.serve import beyond_loopback_warning

    assert beyond_loopback_warning("0.0.0.0", keyed=False) is not None
    assert "no API key" in str(beyond_loopback_warning("10.1.2.3", keyed=False))
    assert beyond_loopback_warning("0.0.0.0", keyed=True) is None
    assert beyond_loopback_warning("127.0.0.1", keyed=False) is None
    assert beyond_loopback_warning("::1", keyed=False) is None
    assert beyond_loopback_warning("localhost", keyed=False) is None


def test_the_key_from_the_environment_and_json_logs_without_text() -> None:
    with server_process(serve_local("--log-format", "json"), env={"LLAMA_JEV_SERVE_API_KEY": KEY}) as server:
        refused = httpx.post(server.base_url + "/v1/systemone", json=relevance_body())
        answered = httpx.post(server.base_url + "/v1/systemone", json=relevance_body(2), headers=keyed(), timeout=60)
        assert server.stop() == 0

    assert (refused.status_code, answered.status_code) == (401, 200)
    records = [json.loads(line) for line in server.out if line.startswith("{")]
    judged = [record for record in records if record["route"] == "/v1/systemone"]
    assert [(r["method"], r["status"], r["candidates"]) for r in judged] == [("POST", 401, 0), ("POST", 200, 2)]
    assert judged[0]["error"] == "invalid API key"
    assert set(judged[1]) == {"time", "method", "route", "status", "candidates", "ms"}
    for text in (QUERY, ANSWER, KEY):
        assert text not in server.stdout() + server.stderr()


# -- the application in a user's app -----------------------------------------------------------------


@pytest.fixture
def mounted() -> Iterator[tuple[str, Any]]:
    """create_app mounted at /judge in a user's Starlette app, on uvicorn, 127.0.0.1."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from llama_jev.server import create_app
    from llama_jev.server.http import ConnectionLedger, ThreadedServer, bind
    from llama_jev.systemone.judge import ScriptedJudge

    judge_app = create_app(ScriptedJudge(lambda state, qid, instructions: 0.8, model="mounted"), api_key=KEY)

    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("the user's own route")

    app = Starlette(routes=[Route("/", home), Mount("/judge", app=judge_app)])
    sock = bind("127.0.0.1", 0)
    runner = ThreadedServer(app, sock, ConnectionLedger())
    runner.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", judge_app.state.judge_server
    finally:
        runner.stop()
        sock.close()


def _until_ready(url: str) -> httpx.Response:
    deadline = time.monotonic() + 30
    response = httpx.get(url)
    while response.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.02)
        response = httpx.get(url)
    return response


def test_the_app_mounted_in_a_starlette_app_serves_the_protocol_under_its_prefix(mounted: tuple[str, Any]) -> None:
    base_url, _ = mounted

    own = httpx.get(base_url + "/")
    # Mounted, it gets no lifespan events: the first request starts the warm-up.
    ready = _until_ready(base_url + "/judge/readyz")
    judged = httpx.post(base_url + "/judge/v1/systemone", json=relevance_body(2), headers=keyed())
    refused = httpx.post(base_url + "/judge/v1/systemone", json=relevance_body(2))
    missing = httpx.get(base_url + "/judge/v1/nothing")

    assert own.text == "the user's own route"
    assert ready.json() == {"status": "ready", "model": "mounted"}
    assert judged.json()["answers"]["item_1"] == {"type": "noul", "noul": 0.8}
    assert refused.status_code == 401
    assert (missing.status_code, missing.json()) == (404, {"error": "no route /v1/nothing"})


def test_readiness_turns_503_while_draining(mounted: tuple[str, Any]) -> None:
    base_url, judge_server = mounted
    assert _until_ready(base_url + "/judge/readyz").status_code == 200

    judge_server.drain(5.0)
    ready = httpx.get(base_url + "/judge/readyz")
    health = httpx.get(base_url + "/judge/healthz")
    late = httpx.post(base_url + "/judge/v1/systemone", json=relevance_body(), headers=keyed())

    assert (ready.status_code, ready.json()["status"]) == (503, "draining")
    assert health.status_code == 200  # alive, only not taking new work
    assert (late.status_code, late.headers["retry-after"]) == (503, "1")


def test_jev_client_rides_out_the_back_pressure_with_no_failed_judgement() -> None:
    from llama_jev import JevClient
    from llama_jev.systemone.wire import SystemOneRequest

    # Room for 3 (1 judged, 2 waiting): the first wave of 6 is half refused, the client waits as
    # told and sends the rest again.
    with server_process(serve_slow(0.2, "--max-in-flight", "1", "--queue", "2", "--max-batch-tokens", "0")) as server:
        failures: list[BaseException] = []
        with JevClient(base_url=server.base_url, timeout=30.0) as client:

            def judge(index: int) -> None:
                try:
                    client.system_one(SystemOneRequest.model_validate(relevance_body(query=f"session {index}")))
                except Exception as error:
                    failures.append(error)

            sessions = [threading.Thread(target=judge, args=(index,)) for index in range(6)]
            for session in sessions:
                session.start()
            for session in sessions:
                session.join(120)
        refused = metric(server.base_url, 'llama_jev_requests_total{route="/v1/systemone",status="429"}')
        answered = metric(server.base_url, 'llama_jev_requests_total{route="/v1/systemone",status="200"}')

    assert failures == []
    assert answered == 6
    assert refused >= 1  # the server did push back


def test_create_app_has_the_limits_serve_has_by_default() -> None:
    from llama_jev.serve import _parser
    from llama_jev.server import create_app

    flags = _parser().parse_args([])
    defaults = {name: value.default for name, value in inspect.signature(create_app).parameters.items()}

    for name in ("max_in_flight", "queue", "max_batch_tokens", "max_body_bytes", "body_timeout"):
        assert defaults[name] == getattr(flags, name), name
