"""A System One server on a real socket, for testing clients, selectors and whole pipelines.

``SystemOneTestServer`` speaks the ``POST /v1/systemone`` protocol over HTTP/1.1 on
``127.0.0.1`` (an ephemeral port), answers from a function, records every request and injects
faults programmed per test: error statuses, dropped connections, slow answers, malformed or
wrong answers. It uses only the standard library and the package's wire models, so importing it
needs neither pytest nor a web framework.

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

import contextlib
import dataclasses
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from llama_jev.core.errors import JevBadRequestError, JevTimeoutError
from llama_jev.systemone.judge import AnswerFunction, Judge, answer_request
from llama_jev.systemone.wire import SystemOneRequest, SystemOneResult
from llama_jev.testing.faults import (
    _MODELS,
    _POLL_SECONDS,
    _STOP_JOIN_SECONDS,
    MODELS_PATH,
    SYSTEM_ONE_PATH,
    Fault,
    RecordedRequest,
    _corrupt,
    _json_response,
    _known_fields,
    _non_negative,
    _Response,
    _uniform_answers,
    _validation_detail,
)
from llama_jev.testing.http import _NOT_JSON, _HTTPServer, _strings

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
        latency: seconds every request waits before it is answered.
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

    Routes: ``POST /v1/systemone``, ``GET /v1/models``; anything else gets a JSON 404 (or 405).
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
        self._connection_ordinals: dict[socket.socket, int] = {}
        self._handler_threads: set[threading.Thread] = set()
        self._httpd: _HTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> SystemOneTestServer:
        """Bind the port (by default an ephemeral one on 127.0.0.1) and serve in a daemon thread.

        A no-op if running. A server stopped and started again gets a new ephemeral port.
        """
        with self._lock:
            if self._httpd is not None:
                return self
            self._stopping = threading.Event()
            httpd = _HTTPServer(self)
            self._httpd = httpd
            self._port = httpd.server_address[1]
            self._serve_thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": _POLL_SECONDS},
                name=f"SystemOneTestServer:{self._port}",
                daemon=True,
            )
            self._serve_thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; idempotent.

        Open keep-alive connections are closed and requests still waiting (latency, delay
        faults) are abandoned without a response, so stopping takes milliseconds, not the
        length of the slowest delay.
        """
        with self._lock:
            httpd, serve_thread = self._httpd, self._serve_thread
            self._httpd, self._serve_thread = None, None
            if httpd is None:
                return
            self._stopping.set()
        httpd.shutdown()  # returns once serve_forever has left its loop: no more accepts
        httpd.server_close()
        with self._lock:
            connections = list(self._connection_ordinals)
            threads = list(self._handler_threads)
        for connection in connections:
            # shutdown, not close: it wakes a handler thread blocked reading the next request
            # on an idle keep-alive connection, and lets that thread close its own socket.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + _STOP_JOIN_SECONDS
        for thread in [serve_thread, *threads]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

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
            return self._httpd is not None

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
        """Make every request from now on wait ``seconds`` before it is answered."""
        with self._lock:
            self._latency = _non_negative(seconds)

    @property
    def latency(self) -> float:
        """Seconds every request waits before it is answered."""
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

    # -- used by the request handler -------------------------------------------------------

    def _accepted(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections_opened += 1
            self._connection_ordinals[connection] = self._connections_opened

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connection_ordinals.pop(connection, None)

    def _connection_ordinal(self, connection: socket.socket) -> int:
        with self._lock:
            return self._connection_ordinals.get(connection, 0)

    def _handler_started(self) -> threading.Event:
        with self._lock:
            self._handler_threads.add(threading.current_thread())
            return self._stopping

    def _handler_finished(self) -> None:
        with self._lock:
            self._handler_threads.discard(threading.current_thread())

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

    def _route(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, parsed: Any, fault: Fault | None
    ) -> _Response:
        if path not in (SYSTEM_ONE_PATH, MODELS_PATH):
            return _json_response(404, {"error": f"no route {path}"}, error="unknown path")
        allowed = "POST" if path == SYSTEM_ONE_PATH else "GET"
        if method != allowed:
            response = _json_response(405, {"error": f"use {allowed} {path}"}, error="wrong method")
            return dataclasses.replace(response, headers=(("Allow", allowed),))
        if fault is not None and fault.kind in ("status", "respond", "malformed_json"):
            return _Response(status=fault.status_code, body=fault.body, headers=fault.headers)
        if fault is not None and fault.kind == "drop":
            return _Response(status=0, drop=True)
        if not self._authorized(headers.get("authorization", "")):
            return _json_response(401, {"error": "invalid API key"}, error="missing or wrong API key")
        if path == MODELS_PATH:
            return _json_response(200, _MODELS if self._judge is None else self._judge_models())
        return self._answer_body(body, parsed, fault)

    def _authorized(self, authorization: str) -> bool:
        if self._api_key is None:
            return True
        scheme, _, token = authorization.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), self._api_key.encode())

    def _answer_body(self, body: bytes, parsed: Any, fault: Fault | None) -> _Response:
        if parsed is _NOT_JSON:
            return _json_response(
                422,
                {"detail": [{"loc": ["body"], "msg": "the body is not JSON", "type": "json_invalid"}]},
                error="invalid JSON body",
            )
        try:
            request = SystemOneRequest.model_validate(_known_fields(parsed))
        except ValidationError as error:
            return _json_response(422, {"detail": _validation_detail(error)}, error="invalid request body")
        if self._judge is not None:
            return self._judge_answer(request, fault)
        with self._lock:
            answer = self._answer
        try:
            result = answer_request(request, answer or _uniform_answers(request), model=self.model)
        except Exception as error:  # any failure of the test's own function is the server's 500
            message = f"the answer function failed: {type(error).__name__}: {error}"
            return _json_response(500, {"error": message}, error=message)
        payload = result.model_dump(mode="json")
        payload["usage"] = {"input_tokens": len(body) // 4, "output_tokens": 0}
        if fault is not None:
            _corrupt(payload["answers"], fault, request)
        return _json_response(200, payload)

    def _judge_models(self) -> dict[str, Any]:
        name = str(getattr(self._judge, "model", self.model))
        return {"models": [{"name": name, "description": f"{type(self._judge).__name__} served by llama_jev"}]}

    def _judge_answer(self, request: SystemOneRequest, fault: Fault | None) -> _Response:
        assert self._judge is not None
        try:
            result: SystemOneResult = self._judge.system_one(request)
        except JevBadRequestError as error:
            detail = [{"loc": ["body", "questions"], "msg": str(error), "type": "value_error"}]
            return _json_response(422, {"detail": detail}, error="the judge refused the request")
        except JevTimeoutError:
            return _json_response(504, {"error": "the judge timed out"}, error="judge timeout")
        except Exception as error:  # any other failure of the judge is the server's 500
            message = f"the judge failed: {type(error).__name__}"
            return _json_response(500, {"error": message}, error=message)
        payload = result.model_dump(mode="json")
        if fault is not None:
            _corrupt(payload["answers"], fault, request)
        return _json_response(200, payload)
