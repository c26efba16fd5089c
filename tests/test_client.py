"""JevClient over real HTTP against the System One test server: retries, errors, validation."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from llama_jev import JevAPIError, JevClient, RetryPolicy
from llama_jev.errors import (
    JevAuthenticationError,
    JevBadRequestError,
    JevConnectionError,
    JevInvalidResponseError,
    JevNotFoundError,
    JevOverloadedError,
    JevPermissionDeniedError,
    JevRateLimitError,
    JevServerError,
    JevTimeoutError,
)
from llama_jev.systemone import NoulQuestion, SystemOneRequest
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .support import eventually, marked

FAST = RetryPolicy(max_retries=2, initial_backoff=0.01, max_backoff=0.02)


def request(*probabilities: float) -> SystemOneRequest:
    return SystemOneRequest(
        state="What are the refund conditions?",
        questions={
            f"item_{i}": NoulQuestion(instructions={"question": "Relevant?", "candidate": marked(p, "text")})
            for i, p in enumerate(probabilities)
        },
    )


def client_for(server: SystemOneTestServer, **kwargs: object) -> JevClient:
    options: dict[str, object] = {"api_key": API_KEY, "base_url": server.base_url, "timeout": 1.0, "retry": FAST}
    options.update(kwargs)
    return JevClient(**options)  # type: ignore[arg-type]


def test_answers_map_to_question_ids(jev_server: SystemOneTestServer) -> None:
    with client_for(jev_server) as client:
        result = client.system_one(request(0.9, 0.1))
    assert result.noul("item_0") == 0.9
    assert result.noul("item_1") == 0.1


def test_request_carries_bearer_key_model_and_path(jev_server: SystemOneTestServer) -> None:
    with client_for(jev_server) as client:
        client.system_one(request(0.5))
    sent = jev_server.requests[0]
    assert sent.path == "/v1/systemone"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.json is not None
    assert sent.json["model"] == "jev-latest"


def test_configured_model_is_sent(jev_server: SystemOneTestServer) -> None:
    with client_for(jev_server, model="jev-1.13.0") as client:
        client.system_one(request(0.5))
    assert jev_server.requests[0].json["model"] == "jev-1.13.0"  # type: ignore[index]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "/v1/systemone", "/v1/systemone/"])
def test_base_url_forms_reach_the_endpoint(jev_server: SystemOneTestServer, suffix: str) -> None:
    with client_for(jev_server, base_url=jev_server.base_url + suffix) as client:
        assert client.system_one(request(0.7)).noul("item_0") == 0.7
    assert jev_server.requests[0].path == "/v1/systemone"


def test_key_from_typesafe_then_jev_environment(
    monkeypatch: pytest.MonkeyPatch, jev_server: SystemOneTestServer
) -> None:
    monkeypatch.delenv("TYPESAFE_API_KEY", raising=False)
    monkeypatch.setenv("JEV_API_KEY", API_KEY)
    with JevClient(base_url=jev_server.base_url) as client:
        client.system_one(request(0.5))
    monkeypatch.setenv("TYPESAFE_API_KEY", "sk-other")
    with JevClient(base_url=jev_server.base_url, retry=FAST) as client, pytest.raises(JevAuthenticationError):
        client.system_one(request(0.5))


def test_missing_key_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TYPESAFE_API_KEY", raising=False)
    monkeypatch.delenv("JEV_API_KEY", raising=False)
    with pytest.raises(JevAuthenticationError, match="TYPESAFE_API_KEY"):
        JevClient()


def test_base_url_from_environment(monkeypatch: pytest.MonkeyPatch, jev_server: SystemOneTestServer) -> None:
    monkeypatch.setenv("TYPESAFE_BASE_URL", jev_server.base_url + "/v1")
    with JevClient(api_key=API_KEY) as client:
        assert client.endpoint == jev_server.url
        client.system_one(request(0.5))


def test_repr_hides_the_key(jev_server: SystemOneTestServer) -> None:
    assert API_KEY not in repr(client_for(jev_server))


@pytest.mark.parametrize(
    "fault",
    [
        Fault.rate_limited(retry_after=0.01),
        Fault.overloaded(),
        Fault.status(500),
        Fault.status(502),
        Fault.status(503),
        Fault.status(408),
        Fault.drop(),
    ],
)
def test_retryable_failure_then_success_returns_the_answers(jev_server: SystemOneTestServer, fault: Fault) -> None:
    jev_server.inject(fault, fault)
    with client_for(jev_server) as client:
        result = client.system_one(request(0.9, 0.2))
    assert jev_server.request_count == 3
    assert (result.noul("item_0"), result.noul("item_1")) == (0.9, 0.2)


@pytest.mark.parametrize(
    ("fault", "error_type"),
    [
        (Fault.rate_limited(retry_after=0.01), JevRateLimitError),
        (Fault.overloaded(), JevOverloadedError),
        (Fault.status(500), JevServerError),
        (Fault.drop(), JevConnectionError),
    ],
)
def test_retries_exhausted_raise_the_typed_error(
    jev_server: SystemOneTestServer, fault: Fault, error_type: type[JevAPIError]
) -> None:
    jev_server.inject_always(fault)
    with client_for(jev_server) as client, pytest.raises(error_type) as caught:
        client.system_one(request(0.9))
    assert jev_server.request_count == FAST.max_retries + 1
    assert caught.value.retryable


def test_per_attempt_timeout_is_retried_then_raised(jev_server: SystemOneTestServer) -> None:
    jev_server.inject_always(Fault.delay(0.5))
    with client_for(jev_server, timeout=0.1) as client, pytest.raises(JevTimeoutError) as caught:
        client.system_one(request(0.9))
    # The server logs a delayed request when it answers, after the client gave up on it.
    assert eventually(lambda: jev_server.request_count == 3)
    assert caught.value.status_code is None


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, JevBadRequestError),
        (401, JevAuthenticationError),
        (403, JevPermissionDeniedError),
        (404, JevNotFoundError),
        (422, JevBadRequestError),
    ],
)
def test_client_errors_are_not_retried(
    jev_server: SystemOneTestServer, status: int, error_type: type[JevAPIError]
) -> None:
    jev_server.inject_always(Fault.status(status))
    with client_for(jev_server) as client, pytest.raises(error_type) as caught:
        client.system_one(request(0.9))
    assert jev_server.request_count == 1
    assert caught.value.status_code == status
    assert not caught.value.retryable


def test_wrong_key_is_an_authentication_error(jev_server: SystemOneTestServer) -> None:
    with client_for(jev_server, api_key="sk-wrong") as client, pytest.raises(JevAuthenticationError) as caught:
        client.system_one(request(0.9))
    assert caught.value.status_code == 401
    assert "invalid API key" in str(caught.value)


@pytest.mark.parametrize(
    "fault",
    [
        Fault.malformed_json(),
        Fault.missing_answer(),
        Fault.extra_answer(),
        Fault.wrong_type(),
        Fault.wrong_type(as_string=True),
        Fault.probability(1.5),
        Fault.probability(-0.1),
        Fault.probability(float("nan")),
        Fault.probability(float("inf")),
    ],
)
def test_invalid_responses_are_rejected_without_retry(jev_server: SystemOneTestServer, fault: Fault) -> None:
    jev_server.inject_always(fault)
    with client_for(jev_server) as client, pytest.raises(JevInvalidResponseError) as caught:
        client.system_one(request(0.9, 0.1))
    assert jev_server.request_count == 1
    assert not caught.value.retryable


@pytest.mark.parametrize(
    "body",
    [
        {"error": "quota exceeded"},
        {"message": "quota exceeded"},
        {"detail": "quota exceeded"},
        {"error": {"message": "quota exceeded"}},
        {"detail": [{"loc": ["body", "state"], "msg": "quota exceeded"}]},
    ],
)
def test_error_message_comes_from_the_body(jev_server: SystemOneTestServer, body: dict[str, object]) -> None:
    jev_server.inject(Fault.status(400, body=body))
    with client_for(jev_server) as client, pytest.raises(JevBadRequestError, match="quota exceeded"):
        client.system_one(request(0.9))


def test_server_echoing_the_key_is_redacted(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.status(401, body={"error": f"key {API_KEY} revoked"}))
    with client_for(jev_server) as client, pytest.raises(JevAuthenticationError) as caught:
        client.system_one(request(0.9))
    assert API_KEY not in str(caught.value)
    assert API_KEY not in repr(caught.value)
    assert "revoked" in str(caught.value)


@pytest.mark.parametrize(
    "echo",
    [
        "What are the refund conditions?",  # the query (the request's state)
        "[p=0.9] text that only this candidate holds, word for word",  # a candidate
    ],
)
def test_a_server_message_quoting_the_request_is_withheld(jev_server: SystemOneTestServer, echo: str) -> None:
    candidate = "[p=0.9] text that only this candidate holds, word for word"
    sent = SystemOneRequest(
        state="What are the refund conditions?",
        questions={"item_0": NoulQuestion(instructions={"question": "Relevant?", "candidate": candidate})},
    )
    jev_server.inject(Fault.status(422, body={"error": f"cannot read {echo!r} here"}))
    with client_for(jev_server) as client, pytest.raises(JevBadRequestError) as caught:
        client.system_one(sent)
    assert echo not in str(caught.value)
    assert "quoted the request" in str(caught.value)
    assert caught.value.status_code == 422


@pytest.mark.parametrize("status", [408, 429, 503, 529])
def test_retry_after_is_honoured(jev_server: SystemOneTestServer, status: int) -> None:
    jev_server.inject(Fault.status(status, headers={"Retry-After": "0.3"}))
    with client_for(jev_server) as client:
        client.system_one(request(0.9))
    first, second = jev_server.requests
    assert second.started - first.finished >= 0.29


def test_retry_after_beyond_the_cap_is_not_waited_for(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.rate_limited(retry_after=60))
    client = client_for(jev_server, retry=RetryPolicy(max_retry_after=1.0))
    with client, pytest.raises(JevRateLimitError) as caught:
        client.system_one(request(0.9))
    assert caught.value.retry_after == 60
    assert jev_server.request_count == 1


def test_call_timeout_covers_the_retry_wait(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.rate_limited(retry_after=1.0))
    # Gave up at the decision to wait (the message names the refused wait) instead of sleeping it.
    with client_for(jev_server) as client, pytest.raises(JevTimeoutError, match=r"does not allow the 1\.00 s wait"):
        client.system_one(request(0.9), timeout=0.3)
    assert jev_server.request_count == 1


def test_call_timeout_covers_a_slow_answer(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.delay(30.0))
    with client_for(jev_server, timeout=60.0) as client, pytest.raises(JevTimeoutError):
        client.system_one(request(0.9), timeout=0.3)
    # The server counts a request once it has answered it: the client gave up before the answer.
    assert jev_server.request_count == 0


def test_threads_share_one_connection_pool(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.05)
    with client_for(jev_server) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: client.system_one(request(0.5)), range(16)))
        assert client._sync is not None
    assert jev_server.connections_opened <= 8


def test_one_client_reuses_its_connection(jev_server: SystemOneTestServer) -> None:
    with client_for(jev_server) as client:
        for _ in range(5):
            client.system_one(request(0.5))
    assert jev_server.connections_opened == 1


def test_retry_policy_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError, match="initial_backoff"):
        RetryPolicy(initial_backoff=float("nan"))


async def test_async_answers_and_retries(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.overloaded(), Fault.drop())
    async with client_for(jev_server) as client:
        result = await client.asystem_one(request(0.9, 0.1))
    assert (result.noul("item_0"), result.noul("item_1")) == (0.9, 0.1)
    assert jev_server.request_count == 3


async def test_async_invalid_response_raises(jev_server: SystemOneTestServer) -> None:
    jev_server.inject(Fault.probability(float("nan")))
    async with client_for(jev_server) as client:
        with pytest.raises(JevInvalidResponseError):
            await client.asystem_one(request(0.9))


async def test_async_requests_share_one_pool_and_overlap(jev_server: SystemOneTestServer) -> None:
    jev_server.set_latency(0.2)
    async with client_for(jev_server) as client:
        results = await asyncio.gather(*(client.asystem_one(request(0.9)) for _ in range(4)))
    assert [result.noul("item_0") for result in results] == [0.9] * 4
    assert 2 <= jev_server.max_in_flight <= 4


def test_async_client_survives_a_second_event_loop(jev_server: SystemOneTestServer) -> None:
    client = client_for(jev_server)
    for _ in range(2):
        assert asyncio.run(client.asystem_one(request(0.6))).noul("item_0") == 0.6
