"""``JevClient``: the HTTP client for ``POST {base_url}/v1/systemone``.

The sync and async clients share one implementation: :meth:`JevClient._exchange` is a generator
that decides everything (attempt timeouts, parsing, which failures to retry, how long to wait) and
yields the three kinds of waiting it needs: "admit this attempt" (the client's
:class:`~llama_jev.systemone.governor.Governor`, shared by every thread and event loop), "send this body"
and "sleep this long". The sync and async methods only perform those steps. The httpx transport
is the seam for tests and proxies.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Generator
from dataclasses import dataclass
from types import TracebackType

import httpx
from pydantic import ValidationError

from llama_jev.core.errors import (
    JevAPIError,
    JevAuthenticationError,
    JevBadRequestError,
    JevInvalidResponseError,
    JevNotFoundError,
    JevOverloadedError,
    JevPermissionDeniedError,
    JevRateLimitError,
    JevServerError,
    JevTimeoutError,
)
from llama_jev.core.telemetry import count_rate_limited, count_retry
from llama_jev.systemone.governor import Governor, GovernorStats, Permit
from llama_jev.systemone.responses import (
    _REDACTED,
    _describe,
    _quotes_request,
    _retry_after,
    _server_message,
    _transport_error,
    is_loopback,
    origin,
)
from llama_jev.systemone.wire import DEFAULT_MODEL, SystemOneRequest, SystemOneResult, check_result

__all__ = ["DEFAULT_BASE_URL", "JevClient", "RetryPolicy", "is_loopback"]

DEFAULT_BASE_URL = "https://api.typesafe.ai"
API_KEY_ENVIRONMENT = ("TYPESAFE_API_KEY", "JEV_API_KEY")
BASE_URL_ENVIRONMENT = "TYPESAFE_BASE_URL"
_ENDPOINT = "/v1/systemone"

logger = logging.getLogger("llama_jev.client")


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long :class:`JevClient` waits before sending a failed request again.

    Retried: 408, 429, 529, other 5xx, connection failures and per-attempt timeouts. Never
    retried: 400, 401, 403, 404, 422 and invalid responses. The n-th retry waits
    ``min(max_backoff, initial_backoff * 2**(n-1))`` scaled by a random factor in [0.5, 1] (jitter,
    so clients that failed together do not retry together), or the server's ``Retry-After`` when
    it sends one. A ``Retry-After`` longer than ``max_retry_after`` is not waited for: the error is
    raised at once, since retrying earlier than asked would only be refused again.

    Example:
        >>> RetryPolicy(max_retries=0)  # fail on the first error
        RetryPolicy(max_retries=0, initial_backoff=0.5, max_backoff=5.0, max_retry_after=30.0)
    """

    max_retries: int = 2
    initial_backoff: float = 0.5
    max_backoff: float = 5.0
    max_retry_after: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        for name in ("initial_backoff", "max_backoff", "max_retry_after"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.initial_backoff > self.max_backoff:
            raise ValueError("initial_backoff must not exceed max_backoff")

    def delay(self, retry_number: int, error: JevAPIError, rng: random.Random) -> float | None:
        """Seconds to wait before retry ``retry_number`` (1-based) after ``error``; ``None``: don't."""
        if not error.retryable or retry_number > self.max_retries:
            return None
        if error.retry_after is not None:
            return float(error.retry_after) if error.retry_after <= self.max_retry_after else None
        exponential: float = min(self.max_backoff, self.initial_backoff * 2 ** (retry_number - 1))
        return exponential * (0.5 + 0.5 * rng.random())


@dataclass(frozen=True)
class _Admit:
    """Wait for the governor to admit one attempt, at most ``timeout`` seconds."""

    timeout: float | None


@dataclass(frozen=True)
class _Send:
    body: bytes
    timeout: float


@dataclass(frozen=True)
class _Sleep:
    seconds: float


_Step = _Admit | _Send | _Sleep
# What performing a step gives back to the exchange: a permit, a response, a failure, or nothing.
_Outcome = Permit | httpx.Response | JevAPIError | None


class JevClient:
    """Client for a System One server: TypeSafe's Jev, or any server speaking ``/v1/systemone``.

    Args:
        api_key: the key sent as ``Authorization: Bearer``; defaults to ``TYPESAFE_API_KEY``, then
            ``JEV_API_KEY``. A missing key fails here, not at the first call, unless ``base_url``
            is a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``, e.g.
            ``python -m llama_jev.serve``): then no ``Authorization`` header is sent.
        base_url: the server; a base already ending in ``/v1`` or ``/v1/systemone`` works too.
            Defaults to ``TYPESAFE_BASE_URL``, then ``https://api.typesafe.ai``.
        model: the model name sent with each request.
        timeout: seconds allowed for one attempt (connect, send, wait, read).
        retry: the :class:`RetryPolicy`.
        max_in_flight: the most requests this client has in flight at once, over every thread
            and event loop using it (default 16: TypeSafe answers 429 from about 24). The bound
            adapts: halved on 429/529 and on an attempt that timed out, raised again by successes
            but not past what the server was seen to take; a ``Retry-After`` pauses every
            request of the client. Waiting for a slot counts against each call's ``timeout``.
            See :attr:`stats` and :class:`~llama_jev.systemone.governor.Governor`.
        transport / async_transport: httpx transports, for tests, proxies or custom TLS.

    Example:
        >>> with JevClient(api_key="sk-...", base_url="http://127.0.0.1:8000") as client:  # doctest: +SKIP
        ...     result = client.system_one(request)

    One client reuses its connections across calls (sync and async pools are kept separately);
    close it, or use it as a (async) context manager. The key never appears in ``repr``, logs,
    records or exception messages: a server message that echoes it is redacted.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        model: str = DEFAULT_MODEL,
        timeout: float = 5.0,
        retry: RetryPolicy | None = None,
        *,
        max_in_flight: int = 16,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base = normalize_base_url(base_url or os.environ.get(BASE_URL_ENVIRONMENT) or DEFAULT_BASE_URL)
        key = api_key if api_key is not None else _key_from_environment()
        if key is not None and not key.strip():
            key = None
        if key is None and not is_loopback(base):
            raise JevAuthenticationError(
                f"no System One API key for {base}: pass api_key=... or set TYPESAFE_API_KEY (or JEV_API_KEY); "
                "only a server on this machine (a loopback base_url such as http://127.0.0.1:8000, "
                "python -m llama_jev.serve) is called without one"
            )
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not model.strip():
            raise ValueError("model must not be blank")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
        self._key = key
        self.base_url = base
        self.model = model
        self.timeout = float(timeout)
        self.retry = retry if retry is not None else RetryPolicy()
        self.governor = Governor(max_in_flight, max_pause=self.retry.max_retry_after)
        self._transport = transport
        self._async_transport = async_transport
        self._rng = random.Random()  # noqa: S311 - backoff jitter, not cryptography
        self._lock = threading.Lock()
        self._sync: httpx.Client | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        key = repr(_REDACTED) if self._key is not None else "None"
        return f"JevClient(base_url={self.base_url!r}, model={self.model!r}, api_key={key})"

    @property
    def stats(self) -> GovernorStats:
        """The governor's state: limit, in flight, queued, pause, 429/529 counts, queue wait."""
        return self.governor.stats

    @property
    def endpoint(self) -> str:
        """The full URL requests are posted to."""
        return self.base_url + _ENDPOINT

    # --- the shared core -------------------------------------------------------------------

    def _exchange(
        self, request: SystemOneRequest, timeout: float | None
    ) -> Generator[_Step, _Outcome, SystemOneResult]:
        """Everything about one call except the I/O itself (see the module docstring)."""
        if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
            raise JevTimeoutError("no time left for the System One call", retryable=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        body = self._with_model(request).wire_json()
        retry_number = 0
        while True:
            left = math.inf if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise JevTimeoutError("the time budget ran out before the next attempt", retryable=True)
            admitted = yield _Admit(None if deadline is None else left)
            if not isinstance(admitted, Permit):
                # Waiting for admission already used the whole budget: no retry could fit.
                raise admitted if isinstance(admitted, JevAPIError) else RuntimeError("admission without a permit")
            outcome: _Outcome = None
            attempt = math.inf
            sent = time.monotonic()
            try:
                left = math.inf if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise JevTimeoutError("the time budget ran out waiting for admission", retryable=True)
                attempt = min(self.timeout, left)
                outcome = yield _Send(body, attempt)
            finally:
                # Also on GeneratorExit (the caller was cancelled mid-request): the slot is given back.
                self._release(admitted, outcome, share=(time.monotonic() - sent) / attempt)
            if deadline is not None and time.monotonic() > deadline:
                # httpx times each phase, not the whole attempt: a server trickling its answer
                # could otherwise outlast the budget.
                raise JevTimeoutError("the time budget ran out while waiting for the answer", retryable=True)
            try:
                return self._result(outcome, request)
            except JevAPIError as error:
                retry_number += 1
                delay = self.retry.delay(retry_number, error, self._rng)
                if delay is None:
                    raise
                if deadline is not None and time.monotonic() + delay >= deadline:
                    raise JevTimeoutError(
                        f"the time budget does not allow the {delay:.2f} s wait before a retry; last error: {error}",
                        retryable=True,
                    ) from error
                logger.debug("System One attempt %d failed (%s); retrying in %.3f s", retry_number, error, delay)
                count_retry(type(error).__name__, error.status_code)
            yield _Sleep(delay)

    def _release(self, permit: Permit, outcome: _Outcome, *, share: float | None = None) -> None:
        """Tell the governor how the attempt went: the status decides the limit, Retry-After the pause."""
        if isinstance(outcome, httpx.Response):
            retry_after = _retry_after(outcome.headers) if outcome.status_code >= 400 else None
            if outcome.status_code in (429, 529):
                count_rate_limited(outcome.status_code)
            # How much of its time the answer took: a slow one does not raise the bound.
            self.governor.release(permit, status=outcome.status_code, retry_after=retry_after, share_of_timeout=share)
        else:
            # A timed-out attempt is congestion (the server could not answer in time): the governor
            # backs off as on a 429, instead of sending as many again into the same queue.
            self.governor.release(permit, timed_out=isinstance(outcome, JevTimeoutError))

    def _with_model(self, request: SystemOneRequest) -> SystemOneRequest:
        # The request model defaults to the alias; a client configured for another model sends its own.
        if "model" in request.model_fields_set:
            return request
        return request.model_copy(update={"model": self.model})

    def _result(self, outcome: _Outcome, request: SystemOneRequest) -> SystemOneResult:
        if isinstance(outcome, JevAPIError):
            raise outcome
        if not isinstance(outcome, httpx.Response):  # pragma: no cover - a driver bug, not a server behaviour
            raise RuntimeError("the exchange was resumed without a response")
        if not 200 <= outcome.status_code < 300:
            raise self._status_error(outcome, request)
        # Each error is raised after its `except` block, never inside it: a ValidationError kept
        # as __context__ holds the response's values, and a server may echo the key in them.
        problem: str | None = None
        try:
            result = SystemOneResult.model_validate_json(outcome.content)
        except ValidationError as error:
            problem = f"the response is not a valid System One result: {_describe(error)}"
        if problem is None:
            try:
                check_result(request, result)
            except JevInvalidResponseError as error:
                problem = error.message
        if problem is not None:
            raise JevInvalidResponseError(self._redact(problem), status_code=outcome.status_code)
        if self._key is not None and self._key in result.model:
            result = result.model_copy(update={"model": _REDACTED})
        return result

    def _status_error(self, response: httpx.Response, request: SystemOneRequest) -> JevAPIError:
        status = response.status_code
        message = self._redact(_server_message(response)) or response.reason_phrase or "no message"
        if _quotes_request(message, request):
            # A server echoing the query or a candidate would carry document text into exceptions,
            # and from there to logs and to an agent's LLM.
            message = "[the server's message quoted the request's text; withheld]"
        text = f"System One returned {status}: {message}"
        if status == 401:
            if self._key is None:
                text += " (no API key was sent: pass api_key=... or set TYPESAFE_API_KEY to the server's key)"
            return JevAuthenticationError(text, status_code=status)
        if status == 403:
            return JevPermissionDeniedError(text, status_code=status)
        if status in (400, 422):
            return JevBadRequestError(text, status_code=status)
        if status == 404:
            return JevNotFoundError(f"{text} (is {self.endpoint} the right endpoint?)", status_code=status)
        wait = _retry_after(response.headers)
        if status == 408:
            return JevTimeoutError(text, status_code=status, retryable=True, retry_after=wait)
        if status == 429:
            return JevRateLimitError(text, status_code=status, retryable=True, retry_after=wait)
        if status == 529:
            return JevOverloadedError(text, status_code=status, retryable=True, retry_after=wait)
        if status >= 500:
            return JevServerError(text, status_code=status, retryable=True, retry_after=wait)
        return JevAPIError(text, status_code=status)

    def _redact(self, text: str) -> str:
        return text.replace(self._key, _REDACTED) if self._key is not None else text

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    @property
    def origin(self) -> str:
        """``scheme://host:port`` of the server, for messages: never a path, query or credentials."""
        return origin(self.base_url)

    # --- sync I/O -------------------------------------------------------------------------

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Send ``request`` and return its validated result, retrying as :attr:`retry` says.

        ``timeout`` bounds the whole call (all attempts and waits); ``None``: attempts alone.

        Raises:
            JevAPIError: a subclass saying what failed (see :mod:`llama_jev.core.errors`).
        """
        steps = self._exchange(request, timeout)
        try:
            step = _advance(steps, None)
            while not isinstance(step, SystemOneResult):
                step = _advance(steps, self._perform(step))
            return step
        finally:
            steps.close()

    def _perform(self, step: _Step) -> _Outcome:
        if isinstance(step, _Sleep):
            time.sleep(step.seconds)
            return None
        if isinstance(step, _Admit):
            try:
                return self.governor.acquire(step.timeout)
            except JevTimeoutError as error:
                return error
        try:
            return self._sync_client().post(self.endpoint, content=step.body, timeout=step.timeout)
        except httpx.HTTPError as error:
            return _transport_error(error, self.origin)

    def _sync_client(self) -> httpx.Client:
        # The selector calls from several threads at once: one pool, created once.
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(headers=self._headers(), transport=self._transport)
            return self._sync

    def close(self) -> None:
        """Close the sync connection pool (the async ones are closed by :meth:`aclose`)."""
        with self._lock:
            client, self._sync = self._sync, None
        if client is not None:
            client.close()

    def __enter__(self) -> JevClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- async I/O ------------------------------------------------------------------------

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """The async twin of :meth:`system_one`: same rules, never blocks the event loop."""
        steps = self._exchange(request, timeout)
        try:
            step = _advance(steps, None)
            while not isinstance(step, SystemOneResult):
                step = _advance(steps, await self._aperform(step))
            return step
        finally:
            steps.close()

    async def _aperform(self, step: _Step) -> _Outcome:
        if isinstance(step, _Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, _Admit):
            try:
                return await self.governor.aacquire(step.timeout)
            except JevTimeoutError as error:
                return error
        client = self._async_client()
        try:
            return await client.post(self.endpoint, content=step.body, timeout=step.timeout)
        except httpx.HTTPError as error:
            return _transport_error(error, self.origin)

    def _async_client(self) -> httpx.AsyncClient:
        # An AsyncClient's pool belongs to the event loop that opened it: one per loop, so a
        # second asyncio.run() or a loop in another thread gets its own instead of a broken one.
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async.get(loop)
            if client is None:
                client = httpx.AsyncClient(headers=self._headers(), transport=self._async_transport)
                self._async[loop] = client
            return client

    async def aclose(self) -> None:
        """Close this event loop's connection pool and the sync one."""
        with self._lock:
            client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
        self.close()

    async def __aenter__(self) -> JevClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _advance(steps: Generator[_Step, _Outcome, SystemOneResult], outcome: _Outcome) -> _Step | SystemOneResult:
    """Resume the exchange with the outcome of its last step: its next step, or its result."""
    try:
        return steps.send(outcome)
    except StopIteration as finished:
        result: SystemOneResult = finished.value
        return result


def normalize_base_url(base_url: str) -> str:
    """``https://host/v1/systemone/`` -> ``https://host``: the endpoint path is added per request."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    for suffix in (_ENDPOINT, "/v1"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
            break
    return url.rstrip("/")


def _key_from_environment() -> str | None:
    for name in API_KEY_ENVIRONMENT:
        value = os.environ.get(name)
        if value and value.strip():
            return value
    return None
