"""The System One test server itself, exercised with plain httpx over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from llama_jev.systemone.wire import ChoiceQuestion, NoulQuestion, SystemOneRequest, SystemOneResult, check_result
from llama_jev.testing import Fault, SystemOneTestServer


@pytest.fixture
def system_one_server() -> Iterator[SystemOneTestServer]:
    with SystemOneTestServer() as server:
        yield server


def _request(*instructions: str, state: str = "What are the refund conditions?") -> SystemOneRequest:
    return SystemOneRequest(
        state=state,
        questions={f"item_{index}": NoulQuestion(instructions=text) for index, text in enumerate(instructions)},
    )


def _body(*instructions: str) -> dict[str, Any]:
    return _request(*(instructions or ("a passage",))).wire()


def _client(**options: Any) -> httpx.Client:
    # Plain HTTP to 127.0.0.1: not loading the CA bundle saves ~0.1 s per client.
    return httpx.Client(verify=False, **options)


def _post(url: str, **options: Any) -> httpx.Response:
    """A one-off request on a fresh client (so on a fresh connection), like ``httpx.post``."""
    timeout = options.pop("timeout", 5.0)
    with _client(timeout=timeout) as client:
        return client.post(url, **options)


def _get(url: str) -> httpx.Response:
    with _client() as client:
        return client.get(url)


def _refund_answer(state: object, question_id: str, instructions: object) -> float:
    return 0.9 if "refund" in str(instructions).lower() else 0.1


# -- answers ---------------------------------------------------------------------------------


def test_answers_come_from_the_answer_function() -> None:
    with SystemOneTestServer(_refund_answer) as server:
        response = _post(server.url, json=_body("Refunds within 30 days.", "Shipping takes a week."))

    assert response.status_code == 200
    assert response.json()["answers"] == {
        "item_0": {"type": "noul", "noul": 0.9},
        "item_1": {"type": "noul", "noul": 0.1},
    }


def test_answer_is_a_valid_system_one_result_for_the_request(system_one_server: SystemOneTestServer) -> None:
    request = _request("one", "two", "three")

    response = _post(system_one_server.url, json=request.wire())

    result = check_result(request, SystemOneResult.model_validate_json(response.content))
    assert result.model == "jev-test-1"
    assert result.usage.input_tokens > 0
    assert result.usage.output_tokens == 0


def test_default_answer_is_one_half_for_noul_and_uniform_for_choice(system_one_server: SystemOneTestServer) -> None:
    request = SystemOneRequest(
        state="s",
        questions={
            "yes_no": NoulQuestion(instructions="x"),
            "pick": ChoiceQuestion(instructions="x", criteria={"a": None, "b": None}),
        },
    )

    answers = _post(system_one_server.url, json=request.wire()).json()["answers"]

    assert answers["yes_no"] == {"type": "noul", "noul": 0.5}
    assert answers["pick"]["probabilities"] == {"a": 0.5, "b": 0.5}


def test_model_name_is_reported_in_every_answer() -> None:
    with SystemOneTestServer(model="jev-1.13.0") as server:
        response = _post(server.url, json=_body())

    assert response.json()["model"] == "jev-1.13.0"


def test_set_answer_changes_the_answers_from_then_on(system_one_server: SystemOneTestServer) -> None:
    system_one_server.set_answer(lambda state, question_id, instructions: 0.75)

    response = _post(system_one_server.url, json=_body())

    assert response.json()["answers"]["item_0"]["noul"] == 0.75


def test_failing_answer_function_gets_500_naming_the_failure() -> None:
    def broken(state: object, question_id: str, instructions: object) -> float:
        raise ZeroDivisionError("boom")

    with SystemOneTestServer(broken) as server:
        response = _post(server.url, json=_body())

    assert response.status_code == 500
    assert "ZeroDivisionError" in response.json()["error"]
    assert server.requests[0].error is not None


def test_empty_questions_get_422_with_fastapi_detail(system_one_server: SystemOneTestServer) -> None:
    response = _post(system_one_server.url, json={"state": "s", "questions": {}})

    assert response.status_code == 422
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "questions"]
    assert set(detail) == {"loc", "msg", "type"}


def test_body_that_is_not_json_gets_400(system_one_server: SystemOneTestServer) -> None:
    # DESIGN Part 4: malformed JSON is a 400 (a body that is JSON but not a request is a 422).
    response = _post(system_one_server.url, content=b"not json", headers={"Content-Type": "application/json"})

    assert response.status_code == 400
    assert response.json()["detail"][0]["type"] == "json_invalid"


def test_request_without_the_api_key_gets_401() -> None:
    with SystemOneTestServer(api_key="sk-test") as server:
        response = _post(server.url, json=_body(), headers={"Authorization": "Bearer sk-wrong"})

    assert response.status_code == 401
    assert response.json() == {"error": "invalid API key"}


def test_request_with_the_api_key_is_answered() -> None:
    with SystemOneTestServer(api_key="sk-test") as server:
        response = _post(server.url, json=_body(), headers={"Authorization": "Bearer sk-test"})

    assert response.status_code == 200


def test_unknown_path_gets_json_404(system_one_server: SystemOneTestServer) -> None:
    response = _post(system_one_server.base_url + "/v1/elsewhere", json=_body())

    assert response.status_code == 404
    assert "error" in response.json()


def test_wrong_method_gets_json_405(system_one_server: SystemOneTestServer) -> None:
    response = _get(system_one_server.url)

    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


def test_models_route_lists_jev_latest(system_one_server: SystemOneTestServer) -> None:
    response = _get(system_one_server.base_url + "/v1/models")

    assert response.json()["models"][0]["name"] == "jev-latest"


def test_chunked_request_body_is_read(system_one_server: SystemOneTestServer) -> None:
    encoded = json.dumps(_body()).encode()

    response = _post(system_one_server.url, content=iter([encoded[:10], encoded[10:]]))

    assert response.status_code == 200
    assert system_one_server.requests[0].headers["transfer-encoding"] == "chunked"


# -- faults ----------------------------------------------------------------------------------


def test_rate_limited_fault_sends_429_with_retry_after(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.rate_limited(retry_after=1))

    response = _post(system_one_server.url, json=_body())

    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"


def test_status_fault_default_body_names_the_reason(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(529))

    response = _post(system_one_server.url, json=_body())

    assert response.status_code == 529
    assert response.json() == {"error": "Overloaded"}


def test_status_fault_sends_the_given_body_and_headers(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(503, {"message": "maintenance"}, headers={"Retry-After": "2"}))

    response = _post(system_one_server.url, json=_body())

    assert (response.status_code, response.json(), response.headers["retry-after"]) == (
        503,
        {"message": "maintenance"},
        "2",
    )


def test_status_fault_applies_before_authentication() -> None:
    with SystemOneTestServer(api_key="sk-test") as server:
        server.inject(Fault.status(500))
        response = _post(server.url, json=_body())

    assert response.status_code == 500


def test_respond_fault_sends_the_raw_body(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.respond(502, b"<html>bad gateway</html>", headers={"Content-Type": "text/html"}))

    response = _post(system_one_server.url, json=_body())

    assert (response.status_code, response.content) == (502, b"<html>bad gateway</html>")
    assert response.headers["content-type"] == "text/html"


def test_drop_fault_closes_the_connection_without_a_response(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.drop())

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        _post(system_one_server.url, json=_body())
    assert system_one_server.requests[0].status is None


def test_malformed_json_fault_sends_200_that_is_not_json(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.malformed_json())

    response = _post(system_one_server.url, json=_body())

    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_missing_answer_fault_leaves_out_one_answer(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.missing_answer())

    response = _post(system_one_server.url, json=_body("a", "b", "c"))

    assert set(response.json()["answers"]) == {"item_0", "item_1"}


def test_extra_answer_fault_adds_an_id_not_asked(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.extra_answer())

    response = _post(system_one_server.url, json=_body("a"))

    answers = response.json()["answers"]
    assert len(answers) == 2
    assert "item_0" in answers


def test_wrong_type_fault_answers_a_noul_question_with_a_choice(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.wrong_type())

    response = _post(system_one_server.url, json=_body("a", "b"))

    answers = response.json()["answers"]
    assert answers["item_0"]["type"] == "choice"
    assert answers["item_1"] == {"type": "noul", "noul": 0.5}


def test_wrong_type_as_string_writes_the_probability_as_a_string(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.wrong_type(as_string=True))

    response = _post(system_one_server.url, json=_body("a"))

    assert response.json()["answers"]["item_0"] == {"type": "noul", "noul": "0.5"}


def test_probability_fault_writes_nan_as_a_literal_token(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.probability(float("nan")))

    response = _post(system_one_server.url, json=_body("a"))

    assert b'"noul": NaN' in response.content
    assert math.isnan(response.json()["answers"]["item_0"]["noul"])


def test_probability_fault_sets_every_noul_to_the_value(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.probability(1.5))

    response = _post(system_one_server.url, json=_body("a", "b"))

    assert [answer["noul"] for answer in response.json()["answers"].values()] == [1.5, 1.5]


def test_delay_fault_answers_normally_after_the_delay(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.delay(0.2))

    started = time.monotonic()
    response = _post(system_one_server.url, json=_body())

    assert time.monotonic() - started >= 0.2
    assert response.status_code == 200


def test_delay_fault_makes_a_short_client_timeout_expire(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.delay(0.5))

    with pytest.raises(httpx.ReadTimeout):
        _post(system_one_server.url, json=_body(), timeout=0.05)


def test_after_slows_down_any_fault(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(500).after(0.2))

    started = time.monotonic()
    response = _post(system_one_server.url, json=_body())

    assert time.monotonic() - started >= 0.2
    assert response.status_code == 500


def test_faults_apply_in_order_then_requests_are_answered_normally(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(500), Fault.rate_limited(), Fault.overloaded())

    with _client() as client:
        statuses = [client.post(system_one_server.url, json=_body()).status_code for _ in range(5)]

    assert statuses == [500, 429, 529, 200, 200]
    assert system_one_server.pending_faults == []


def test_inject_always_applies_to_every_request_until_cleared(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject_always(Fault.overloaded())

    with _client() as client:
        while_injected = [client.post(system_one_server.url, json=_body()).status_code for _ in range(3)]
        system_one_server.clear_faults()
        after_clearing = client.post(system_one_server.url, json=_body()).status_code

    assert (while_injected, after_clearing) == ([529, 529, 529], 200)


def test_faults_are_not_consumed_by_other_routes(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(500))

    with _client() as client:
        models = client.get(system_one_server.base_url + "/v1/models")
        judged = client.post(system_one_server.url, json=_body())

    assert (models.status_code, judged.status_code) == (200, 500)


def test_recorded_request_names_the_fault_applied(system_one_server: SystemOneTestServer) -> None:
    fault = Fault.status(500)
    system_one_server.inject(fault)

    with _client() as client:
        client.post(system_one_server.url, json=_body())
        client.post(system_one_server.url, json=_body())

    assert [request.fault for request in system_one_server.requests] == [fault, None]


# -- recording and concurrency ---------------------------------------------------------------


def test_requests_are_recorded_with_headers_body_and_json(system_one_server: SystemOneTestServer) -> None:
    body = _body("a")

    _post(system_one_server.url, json=body, headers={"X-Trace": "t-1"})

    [recorded] = system_one_server.requests
    assert (recorded.method, recorded.path, recorded.status) == ("POST", "/v1/systemone", 200)
    assert recorded.headers["x-trace"] == "t-1"
    assert recorded.json == body
    assert json.loads(recorded.body) == body
    assert recorded.started <= recorded.finished


def test_received_text_holds_strings_a_client_escaped(system_one_server: SystemOneTestServer) -> None:
    escaped = json.dumps(_body('café "quoted" clause'), ensure_ascii=True)

    _post(system_one_server.url, content=escaped, headers={"Content-Type": "application/json"})

    assert 'café "quoted" clause' in system_one_server.received_text()
    assert "never sent" not in system_one_server.received_text()


def test_latency_delays_every_request(system_one_server: SystemOneTestServer) -> None:
    system_one_server.set_latency(0.1)

    started = time.monotonic()
    with _client() as client:
        for _ in range(2):
            client.post(system_one_server.url, json=_body())

    assert time.monotonic() - started >= 0.2


async def test_concurrent_requests_are_in_flight_together(system_one_server: SystemOneTestServer) -> None:
    system_one_server.set_latency(0.2)

    async with httpx.AsyncClient(verify=False) as client:
        responses = await asyncio.gather(*(client.post(system_one_server.url, json=_body()) for _ in range(4)))

    assert [response.status_code for response in responses] == [200] * 4
    assert system_one_server.max_in_flight >= 4


def test_sequential_requests_are_never_in_flight_together(system_one_server: SystemOneTestServer) -> None:
    with _client() as client:
        for _ in range(3):
            client.post(system_one_server.url, json=_body())

    assert system_one_server.max_in_flight == 1


def test_one_client_reuses_one_connection(system_one_server: SystemOneTestServer) -> None:
    with _client() as client:
        for _ in range(5):
            client.post(system_one_server.url, json=_body())

    assert system_one_server.connections_opened == 1
    assert {request.connection for request in system_one_server.requests} == {1}


def test_separate_clients_open_separate_connections(system_one_server: SystemOneTestServer) -> None:
    for _ in range(3):
        _post(system_one_server.url, json=_body())

    assert system_one_server.connections_opened == 3


def test_connection_is_reused_after_an_error_status(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(500), Fault.status(422))

    with _client() as client:
        for _ in range(3):
            client.post(system_one_server.url, json=_body())

    assert system_one_server.connections_opened == 1


def test_reset_clears_the_log_faults_and_counters(system_one_server: SystemOneTestServer) -> None:
    system_one_server.inject(Fault.status(500), Fault.status(500))
    _post(system_one_server.url, json=_body())

    system_one_server.reset()
    response = _post(system_one_server.url, json=_body())

    assert response.status_code == 200
    assert system_one_server.request_count == 1
    assert system_one_server.connections_opened == 1


# -- lifecycle -------------------------------------------------------------------------------


def test_stop_is_prompt_and_releases_the_port() -> None:
    server = SystemOneTestServer().start()
    idle = _client()
    idle.post(server.url, json=_body())  # leaves a keep-alive connection open
    server.inject(Fault.delay(60.0))
    pending = threading.Thread(target=_post_ignoring_errors, args=(server.url,))
    pending.start()
    deadline = time.monotonic() + 1.0
    while server.pending_faults and time.monotonic() < deadline:  # until the delayed request arrives
        time.sleep(0.005)

    server.stop()
    pending.join(30.0)
    idle.close()

    # The delayed request ended with the server, long before its 60 s answer was due.
    assert not pending.is_alive()
    with pytest.raises(httpx.ConnectError):
        _post(server.url, json=_body())
    with socket.socket() as rebind:
        rebind.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rebind.bind(("127.0.0.1", server.port))


def _post_ignoring_errors(url: str) -> None:
    with contextlib.suppress(httpx.TransportError):  # the server drops it when it stops
        _post(url, json=_body(), timeout=5.0)


def test_stop_is_idempotent() -> None:
    server = SystemOneTestServer().start()

    server.stop()
    server.stop()

    assert not server.running


def test_stopped_server_starts_again_on_a_new_socket() -> None:
    server = SystemOneTestServer()
    with server:
        pass

    with server:
        response = _post(server.url, json=_body())

    assert response.status_code == 200


def test_base_url_before_start_raises() -> None:
    with pytest.raises(RuntimeError):
        _ = SystemOneTestServer().base_url


def test_on_request_sees_every_answered_request_even_when_none_are_kept() -> None:
    from llama_jev.testing import RecordedRequest

    seen: list[RecordedRequest] = []
    body = {"state": "q", "questions": {"item_0": {"type": "noul", "instructions": "x"}}}
    with SystemOneTestServer(keep_requests=False, on_request=seen.append) as server, httpx.Client() as client:
        assert client.post(server.url, json=body).status_code == 200
        assert client.get(server.base_url + "/nowhere").status_code == 404
    assert [(request.method, request.status) for request in seen] == [("POST", 200), ("GET", 404)]
    assert server.requests == []


def test_an_on_request_hook_that_raises_never_fails_the_request() -> None:
    def broken(request: object) -> None:
        raise RuntimeError("a log line failed")

    body = {"state": "q", "questions": {"item_0": {"type": "noul", "instructions": "x"}}}
    with SystemOneTestServer(on_request=broken) as server, httpx.Client() as client:
        assert client.post(server.url, json=body).status_code == 200
