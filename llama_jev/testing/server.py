"""A System One server on a real socket, for testing clients, selectors and whole pipelines.

``SystemOneTestServer`` speaks the ``POST /v1/systemone`` protocol over HTTP/1.1 on
``127.0.0.1`` (an ephemeral port), answers from a function, records every request and injects
faults programmed per test: error statuses, dropped connections, slow answers, malformed or
wrong answers. It is :func:`llama_jev.server.create_app`, the application ``python -m
llama_jev.serve`` runs, served by uvicorn in a thread with the faults plugged in: the routes,
validation and error bodies a test sees are the production server's (extra ``serve``).

Example:
    >>> import httpx
    >>> from llama_jev.testing import Fault, SystemOneTestServer
    >>> with SystemOneTestServer(lambda state, question_id, instructions: 0.9) as server:
    ...     server.inject(Fault.rate_limited(retry_after=1))
    ...     body = {"state": "q", "questions": {"item_0": {"type": "noul", "instructions": "x"}}}
    ...     first = httpx.post(server.url, json=body)
    ...     second = httpx.post(server.url, json=body)
    >>> first.status_code, first.headers["retry-after"], second.json()["answers"]["item_0"]["noul"]
    (429, '1', 0.9)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from starlette.responses import Response

from llama_jev.server.app import ServerSettings, create_app
from llama_jev.server.exchange import DropConnection, Exchange
from llama_jev.server.http import ConnectionLedger, ThreadedServer, bind
from llama_jev.server.protocol import JSON_TYPE, SYSTEM_ONE_PATH
from llama_jev.systemone.judge import AnswerFunction, Judge, answer_request
from llama_jev.systemone.wire import SystemOneRequest, SystemOneResult, Usage
from llama_jev.testing.faults import Fault, RecordedRequest, _corrupt, _non_negative, _uniform_answers

__all__ = ["Fault", "RecordedRequest", "SystemOneTestServer"]


class SystemOneTestServer:
    """A System One server on ``127.0.0.1`` for tests: real HTTP, programmable faults, a request log.

    Args:
        answer: ``(state, question_id, instructions) -> value``, the same
            :data:`~llama_jev.systemone.judge.AnswerFunction` that ``ScriptedJudge`` takes: a
            yes-probability for noul questions, option -> probability for choice questions,
            per-level probabilities for score questions. By default every noul is answered 0.5
            and choice and score questions get a uniform distribution: deterministic, and
            maximally uncertain (with the default thresholds every candidate is "uncertain").
            Values that break the protocol (1.5, NaN) make the server answer 500; to send such
            values on purpose use :meth:`Fault.probability`.
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get 401
            ``{"error": "invalid API key"}``.
        model: the ``model`` reported in every answer (with ``judge``: the judge's own).
        latency: seconds every System One request (``POST /v1/systemone``) waits before it is answered.
        judge: answer every valid request with this :class:`~llama_jev.Judge` instead of
            ``answer`` (``llama_jev.serve`` serves the offline judge this way). A
            :class:`~llama_jev.errors.JevBadRequestError` it raises is a 422, a timeout a 504, any other
            failure a 500.
        host, port: where to listen (default ``127.0.0.1`` and an ephemeral port).
        in_flight_limit: like a rate-limited production server, answer a System One request
            that arrives while this many are being handled with an immediate 429 and a
            ``Retry-After`` of ``limit_retry_after`` seconds (``None``: no limit). Refused
            requests are recorded (status 429, fault ``Fault.rate_limited``) but do not count in
            :attr:`max_in_flight`; :attr:`rate_limited_count` counts them.
        limit_retry_after: the ``Retry-After`` sent with those 429s (fractions allowed).
        keep_requests: keep every request (line, headers, body) for :attr:`requests` and
            :meth:`received_text` (default). ``False`` for a long-running server such as
            ``llama_jev.serve``: nothing is kept, so memory does not grow with traffic and no
            passage text or key stays in memory; the counters still count.
        on_request: called with each :class:`RecordedRequest` once it is answered (also with
            ``keep_requests=False``), in the thread that served it; ``llama_jev.serve`` prints its
            request log from it. What it raises is ignored: a log line never fails a request.

    Routes: ``POST /v1/systemone``, ``GET /v1/models``, and the judge server's ``/healthz``,
    ``/readyz`` and ``/metrics``; anything else gets a JSON 404 (or 405). Malformed JSON is a 400,
    a body that is JSON but not a request a 422, as ``python -m llama_jev.serve`` answers.
    Faults (:meth:`inject`, :meth:`inject_always`) apply only to ``POST /v1/systemone``
    requests, so "the next two calls fail" means the next two judgements.

    The server speaks HTTP/1.1 with keep-alive and counts the TCP connections it accepts, so a
    test can assert that a client pools connections. Every attribute is safe to read while
    requests are being served.

    Example:
        >>> import httpx
        >>> from llama_jev.testing import Fault, SystemOneTestServer
        >>> body = {"state": "q", "questions": {"item_0": {"type": "noul", "instructions": "x"}}}
        >>> with SystemOneTestServer(api_key="sk-test") as server:
        ...     with httpx.Client(headers={"Authorization": "Bearer sk-test"}) as client:
        ...         server.inject(Fault.status(500))
        ...         failed = client.post(server.url, json=body)
        ...         answered = client.post(server.url, json=body)
        >>> failed.status_code, answered.json()["answers"], server.connections_opened
        (500, {'item_0': {'type': 'noul', 'noul': 0.5}}, 1)
    """

    def __init__(
        self,
        answer: AnswerFunction | None = None,
        *,
        api_key: str | None = None,
        model: str = "jev-test-1",
        latency: float = 0.0,
        judge: Judge | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        in_flight_limit: int | None = None,
        limit_retry_after: float = 0.1,
        keep_requests: bool = True,
        on_request: Callable[[RecordedRequest], None] | None = None,
    ) -> None:
        if judge is not None and answer is not None:
            raise ValueError("pass an answer function or a judge, not both")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        if in_flight_limit is not None and (
            isinstance(in_flight_limit, bool) or not isinstance(in_flight_limit, int) or in_flight_limit < 1
        ):
            raise ValueError(f"in_flight_limit must be a positive integer or None, got {in_flight_limit!r}")
        self._in_flight_limit = in_flight_limit
        self._over_limit = Fault.rate_limited(retry_after=_non_negative(limit_retry_after))
        self._answer = answer
        self._judge = judge
        self._address = (host, port)
        self._api_key = api_key
        self.model = model
        self._latency = _non_negative(latency)
        self._lock = threading.Lock()
        self._faults: deque[Fault] = deque()
        self._always: Fault | None = None
        self._keep_requests = keep_requests
        self._on_request = on_request
        self._requests: list[RecordedRequest] = []
        self._request_count = 0
        self._rate_limited_count = 0
        self._in_flight = 0
        self._max_in_flight = 0
        self._connections_opened = 0
        self._runner: ThreadedServer | None = None
        self._port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> SystemOneTestServer:
        """Bind the port (by default an ephemeral one on 127.0.0.1) and serve in a daemon thread.

        A no-op if running. A server stopped and started again gets a new ephemeral port.
        """
        with self._lock:
            if self._runner is not None:
                return self
            sock = bind(*self._address, backlog=128)
            self._port = sock.getsockname()[1]
            settings = ServerSettings(
                api_key=self._api_key,
                # Admission is the test server's own in_flight_limit (recorded as a fault, as before).
                max_in_flight=1_000_000,
                queue=0,
                max_batch_tokens=0,
                judge_workers=_JUDGE_THREADS,
                warm_up=None,
                models=_MODELS if self._judge is None else None,
            )
            app = create_app(_TestJudge(self), _hooks=_Hooks(self), _settings=settings)
            # Not waiting for the answer threads: a test's blocked answer function must not hold up stop().
            server = app.state.judge_server
            runner = ThreadedServer(
                app, sock, ConnectionLedger(on_open=self._accepted), on_stop=lambda: server.aclose(wait=False)
            )
            try:
                runner.start()
            except BaseException:
                sock.close()
                raise
            self._runner = runner
        return self

    def stop(self) -> None:
        """Stop serving and release the port; idempotent.

        Open keep-alive connections are closed and requests still waiting (latency, delay
        faults) are abandoned without a response, so stopping takes milliseconds, not the
        length of the slowest delay.
        """
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop()

    def __enter__(self) -> SystemOneTestServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server is accepting connections."""
        with self._lock:
            return self._runner is not None

    @property
    def port(self) -> int:
        """The port bound by the last :meth:`start` (still known after :meth:`stop`)."""
        if self._port is None:
            raise RuntimeError("the server has not been started: use `with SystemOneTestServer() as server:`")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>``, what a client's ``base_url`` should be (``127.0.0.1`` by default)."""
        host = self._address[0]
        if host in ("", "0.0.0.0"):  # listening on every address: loopback reaches it  # noqa: S104
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The System One endpoint, ``<base_url>/v1/systemone``."""
        return self.base_url + SYSTEM_ONE_PATH

    # -- configuration ---------------------------------------------------------------------

    def inject(self, *faults: Fault) -> None:
        """Queue ``faults``: each applies to one System One request, in order (first in, first out).

        Once the queue is empty, requests are answered normally (or by :meth:`inject_always`).

        Example:
            >>> server.inject(Fault.overloaded(), Fault.rate_limited(retry_after=0))  # doctest: +SKIP
        """
        with self._lock:
            self._faults.extend(faults)

    def inject_always(self, fault: Fault) -> None:
        """Apply ``fault`` to every System One request the queue does not serve, until
        :meth:`clear_faults`."""
        with self._lock:
            self._always = fault

    def clear_faults(self) -> None:
        """Drop the queued faults and the :meth:`inject_always` fault."""
        with self._lock:
            self._faults.clear()
            self._always = None

    @property
    def pending_faults(self) -> list[Fault]:
        """The queued faults not yet applied, next first."""
        with self._lock:
            return list(self._faults)

    def set_latency(self, seconds: float) -> None:
        """Make every System One request from now on wait ``seconds`` before it is answered."""
        with self._lock:
            self._latency = _non_negative(seconds)

    @property
    def latency(self) -> float:
        """Seconds every System One request waits before it is answered."""
        with self._lock:
            return self._latency

    def set_answer(self, answer: AnswerFunction | None) -> None:
        """Answer from ``answer`` from now on (``None``: the default 0.5 / uniform answers)."""
        with self._lock:
            self._answer = answer

    def reset(self) -> None:
        """Forget recorded requests, faults and counters; keep the answer, key and latency.

        ``connections_opened`` counts from zero again, so connections a client keeps open across
        the reset are not counted.
        """
        with self._lock:
            self._requests.clear()
            self._request_count = 0
            self._rate_limited_count = 0
            self._faults.clear()
            self._always = None
            self._max_in_flight = self._in_flight
            self._connections_opened = 0

    # -- observation -----------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests received, in the order their responses were decided.

        Empty when the server was made with ``keep_requests=False``.
        """
        with self._lock:
            return list(self._requests)

    @property
    def request_count(self) -> int:
        """How many requests were received (every route, faulted or not)."""
        with self._lock:
            return self._request_count

    @property
    def max_in_flight(self) -> int:
        """The most requests that were being handled at the same time.

        A client that sends its batches concurrently to a server with some latency reaches the
        number of batches; one that sends them in turn stays at 1.
        """
        with self._lock:
            return self._max_in_flight

    @property
    def rate_limited_count(self) -> int:
        """How many requests got a 429, from ``in_flight_limit`` or from an injected fault."""
        with self._lock:
            return self._rate_limited_count

    @property
    def connections_opened(self) -> int:
        """How many TCP connections the server accepted; 1 for a client reusing one connection."""
        with self._lock:
            return self._connections_opened

    def received_text(self) -> str:
        """Everything clients sent, as one string, to assert that some text was never sent.

        Holds each request's line, headers and body, and also every string inside JSON bodies
        unescaped, so ``secret not in server.received_text()`` holds up even when a client
        escapes non-ASCII characters or quotes.

        Example:
            >>> assert "confidential clause" not in server.received_text()  # doctest: +SKIP
        """
        parts: list[str] = []
        for request in self.requests:
            parts.append(f"{request.method} {request.path}")
            parts.extend(f"{name}: {value}" for name, value in request.headers.items())
            parts.append(request.text)
            parts.extend(_strings(request.json))
        return "\n".join(parts)

    def __repr__(self) -> str:
        where = self.base_url if self._port is not None else "not started"
        return f"SystemOneTestServer({where}, model={self.model!r}, running={self.running})"

    # -- used by the application's hooks ---------------------------------------------------

    def _accepted(self) -> int:
        with self._lock:
            self._connections_opened += 1
            return self._connections_opened

    def _begin(self, *, faultable: bool) -> tuple[Fault | None, float, bool]:
        """The fault and latency for a new request, and whether it is handled (counted in flight)."""
        with self._lock:
            if faultable and self._in_flight_limit is not None and self._in_flight >= self._in_flight_limit:
                return self._over_limit, 0.0, False
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            fault: Fault | None = None
            if faultable:
                fault = self._faults.popleft() if self._faults else self._always
            return fault, self._latency, True

    def _end(self, record: RecordedRequest, *, counted: bool = True) -> None:
        with self._lock:
            if counted:
                self._in_flight -= 1
            self._request_count += 1
            if record.status == 429:
                self._rate_limited_count += 1
            if self._keep_requests:
                self._requests.append(record)
        if self._on_request is not None:
            with contextlib.suppress(Exception):
                self._on_request(record)


_MODELS = {
    "models": [
        {
            "name": "jev-latest",
            "description": "The latest Jev System One model (as served by llama_jev.testing).",
            "release_date": "2026-09-15",
        }
    ]
}
# Answer functions may block (a test's own sleep): they run in threads, many at once.
_JUDGE_THREADS = 32


class _TestJudge:
    """The test server's answers as a Judge: its judge, else its answer function (or the uncertain default)."""

    def __init__(self, owner: SystemOneTestServer) -> None:
        self._owner = owner

    @property
    def model(self) -> str:
        judge = self._owner._judge
        return str(getattr(judge, "model", self._owner.model)) if judge is not None else self._owner.model

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        owner = self._owner
        if owner._judge is not None:
            return owner._judge.system_one(request)
        with owner._lock:
            answer = owner._answer
        result = answer_request(request, answer or _uniform_answers(request), model=owner.model)
        return SystemOneResult(model=result.model, answers=result.answers, usage=Usage(input_tokens=0, output_tokens=0))

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        return await asyncio.to_thread(self.system_one, request, timeout=timeout)


class _Hooks:
    """Faults, latency and the request log, plugged into the production application."""

    reads_body_first = True  # a test asserts on every body, also of requests a fault answers

    def __init__(self, owner: SystemOneTestServer) -> None:
        self._owner = owner

    def request_started(self, exchange: Exchange) -> Response | None:
        faultable = exchange.method == "POST" and exchange.path.split("?")[0] == SYSTEM_ONE_PATH
        fault, latency, counted = self._owner._begin(faultable=faultable)
        exchange.fault, exchange.counted = fault, counted
        exchange.extra["latency"] = latency
        return None if counted else _fault_response(self._owner._over_limit)

    async def before_answer(self, exchange: Exchange) -> Response | None:
        fault: Fault | None = exchange.fault
        wait = exchange.extra["latency"] + (fault.delay_seconds if fault is not None else 0.0)
        if wait > 0:
            await asyncio.sleep(wait)  # stop() cancels it: the request is abandoned
        if fault is not None and fault.kind in ("status", "respond", "malformed_json"):
            return _fault_response(fault)
        if fault is not None and fault.kind == "drop":
            return DropConnection()
        return None

    def answered(self, exchange: Exchange, payload: dict[str, Any], request: SystemOneRequest) -> None:
        if self._owner._judge is None:
            payload["usage"] = {"input_tokens": len(exchange.body) // 4, "output_tokens": 0}
        if exchange.fault is not None:
            _corrupt(payload["answers"], exchange.fault, request)

    def request_finished(self, exchange: Exchange) -> None:
        self._owner._end(
            RecordedRequest(
                method=exchange.method,
                path=exchange.path,
                headers=exchange.headers,
                body=exchange.body,
                json=exchange.json,
                started=exchange.started,
                finished=exchange.finished,
                fault=exchange.fault,
                status=exchange.status,
                error=exchange.error,
                connection=exchange.connection,
            ),
            counted=exchange.counted,
        )


def _fault_response(fault: Fault) -> Response:
    names = {name.lower() for name, _ in fault.headers}
    headers = dict(fault.headers)
    if "content-type" not in names:
        headers["Content-Type"] = JSON_TYPE
    if "content-length" in names:
        # A deliberately wrong length would desynchronise the next request on this connection.
        headers["Connection"] = "close"
    return Response(fault.body, status_code=fault.status_code, headers=headers)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
