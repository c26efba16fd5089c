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
import http
import json
import secrets
import socket
import socketserver
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ValidationError

from llama_jev.errors import JevBadRequestError, JevTimeoutError
from llama_jev.judge import AnswerFunction, Judge, ScriptedValue, answer_request
from llama_jev.toy_embedding import HashEmbedding
from llama_jev.wire import ChoiceQuestion, Instructions, ScoreQuestion, SystemOneRequest, SystemOneResult

__all__ = ["Fault", "HashEmbedding", "RecordedRequest", "SystemOneTestServer"]

SYSTEM_ONE_PATH = "/v1/systemone"
MODELS_PATH = "/v1/models"

_MODELS = {
    "models": [
        {
            "name": "jev-latest",
            "description": "The latest Jev System One model (as served by llama_jev.testing).",
            "release_date": "2026-09-15",
        }
    ]
}
# Statuses the System One API uses that http.HTTPStatus does not know.
_EXTRA_REASONS = {529: "Overloaded"}
_JSON = "application/json"
# A response cut off mid-object: what a proxy that drops the connection half-way delivers.
_MALFORMED_BODY = b'{"model": "jev-test-1", "answers": {"item_0": {"type": "noul", "noul": 0.'
_STOP_JOIN_SECONDS = 1.0
# How often serve_forever checks for stop(): the bound on how long stop() waits for it.
_POLL_SECONDS = 0.02

FaultKind = Literal[
    "delay",
    "status",
    "respond",
    "drop",
    "malformed_json",
    "missing_answer",
    "extra_answer",
    "wrong_type",
    "probability",
]
Header = tuple[str, str]


def _reason(status: int) -> str:
    if status in _EXTRA_REASONS:
        return _EXTRA_REASONS[status]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _json_bytes(payload: object) -> bytes:
    # allow_nan stays on on purpose: a NaN probability must reach the client as the literal
    # token NaN, as a careless server would send it, so the client's validation is what stops it.
    return json.dumps(payload, allow_nan=True).encode("utf-8")


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


@dataclass(frozen=True)
class Fault:
    """One misbehaviour of the server, applied to one System One request.

    Build faults with the constructors, not the fields: ``Fault.status(500)``,
    ``Fault.rate_limited()``, ``Fault.overloaded()``, ``Fault.delay(2.0)``, ``Fault.drop()``,
    ``Fault.malformed_json()``, ``Fault.missing_answer()``, ``Fault.extra_answer()``,
    ``Fault.wrong_type()``, ``Fault.probability(float("nan"))`` and ``Fault.respond(...)``.
    Any fault can be slowed down with :meth:`after`.

    Faults that replace the response (``status``, ``respond``, ``drop``, ``malformed_json``)
    apply before authentication and validation. Faults that corrupt the answers
    (``missing_answer``, ``extra_answer``, ``wrong_type``, ``probability``) corrupt the answers
    the server would have given; a request that fails authentication or validation still gets
    its 401 or 422.

    Example:
        >>> server.inject(Fault.status(500), Fault.drop(), Fault.delay(1.5))  # doctest: +SKIP
    """

    kind: FaultKind
    status_code: int = 200
    body: bytes = b""
    headers: tuple[Header, ...] = ()
    delay_seconds: float = 0.0
    value: float = 0.0
    as_string: bool = False

    @classmethod
    def status(cls, code: int, body: object = None, headers: Mapping[str, str] | None = None) -> Fault:
        """Answer with HTTP ``code`` and a JSON ``body`` (default ``{"error": "<reason>"}``).

        Example:
            >>> Fault.status(503, {"message": "maintenance"}, headers={"Retry-After": "2"})
            Fault.status(503, headers={'Retry-After': '2'})
        """
        payload = {"error": _reason(code)} if body is None else body
        return cls(kind="status", status_code=code, body=_json_bytes(payload), headers=_header_tuple(headers))

    @classmethod
    def rate_limited(cls, retry_after: float | None = 0.1) -> Fault:
        """429 with a ``Retry-After`` header (seconds; ``None`` sends no header).

        Fractional values are written as they are (``"0.1"``) so tests need not wait a whole
        second; real servers send whole seconds.
        """
        headers = {} if retry_after is None else {"Retry-After": _format_seconds(retry_after)}
        return cls.status(429, {"error": "rate limited"}, headers=headers)

    @classmethod
    def overloaded(cls) -> Fault:
        """529, the System One API's "overloaded" status."""
        return cls.status(529, {"error": "overloaded"})

    @classmethod
    def respond(cls, status: int, raw_body: bytes, headers: Mapping[str, str] | None = None) -> Fault:
        """Answer with ``status`` and exactly ``raw_body`` (``Content-Type: application/json``
        unless ``headers`` say otherwise).

        A ``Content-Length`` in ``headers`` is sent instead of the true length (to simulate a
        truncated body); the connection is then closed after the response.
        """
        return cls(kind="respond", status_code=status, body=bytes(raw_body), headers=_header_tuple(headers))

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Answer normally, ``seconds`` later (on top of the server's latency): for timeouts."""
        return cls(kind="delay", delay_seconds=_non_negative(seconds))

    @classmethod
    def drop(cls) -> Fault:
        """Close the connection without sending any response."""
        return cls(kind="drop")

    @classmethod
    def malformed_json(cls) -> Fault:
        """200 with a body that is not valid JSON (a response cut off half-way)."""
        return cls(kind="malformed_json", status_code=200, body=_MALFORMED_BODY)

    @classmethod
    def missing_answer(cls) -> Fault:
        """Leave out the answer to the last question asked."""
        return cls(kind="missing_answer")

    @classmethod
    def extra_answer(cls) -> Fault:
        """Add a noul answer under a question id that was not asked."""
        return cls(kind="extra_answer")

    @classmethod
    def wrong_type(cls, *, as_string: bool = False) -> Fault:
        """Answer the first question with the wrong answer type.

        A noul question gets a choice answer; a choice or score question gets a noul answer.
        With ``as_string=True`` the types stay right but every ``noul`` and ``confidence`` is
        written as a JSON string (``"0.5"`` instead of ``0.5``).
        """
        return cls(kind="wrong_type", as_string=as_string)

    @classmethod
    def probability(cls, value: float) -> Fault:
        """Set every ``noul`` answer to ``value``, valid or not: ``1.5``, ``-0.1``, ``float("nan")``.

        NaN and infinities are written as the literal tokens ``NaN`` / ``Infinity``, which
        Python's ``json`` accepts and a strict client must reject.
        """
        return cls(kind="probability", value=float(value))

    def after(self, seconds: float) -> Fault:
        """The same fault, ``seconds`` later: ``Fault.status(500).after(1.0)`` is a slow 500."""
        return dataclasses.replace(self, delay_seconds=self.delay_seconds + _non_negative(seconds))

    def __repr__(self) -> str:
        if self.kind == "delay":
            return f"Fault.delay({self.delay_seconds!r})"
        if self.kind == "status":
            arguments = [str(self.status_code)]
        elif self.kind == "respond":
            arguments = [str(self.status_code), repr(self.body)]
        elif self.kind == "wrong_type":
            arguments = ["as_string=True"] if self.as_string else []
        elif self.kind == "probability":
            arguments = [repr(self.value)]
        else:
            arguments = []
        if self.headers and self.kind in ("status", "respond"):
            arguments.append(f"headers={dict(self.headers)!r}")
        text = f"Fault.{self.kind}({', '.join(arguments)})"
        return f"{text}.after({self.delay_seconds!r})" if self.delay_seconds else text


def _header_tuple(headers: Mapping[str, str] | None) -> tuple[Header, ...]:
    return tuple((str(name), str(value)) for name, value in (headers or {}).items())


def _non_negative(seconds: float) -> float:
    if not seconds >= 0:  # also rejects NaN
        raise ValueError(f"a delay must be a non-negative number of seconds, got {seconds!r}")
    return float(seconds)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it.

    Attributes:
        method: ``"POST"``, ``"GET"``, ...
        path: the request target as sent (path and query string).
        headers: header names in lower case; repeated headers joined with ``", "``.
        body: the body bytes (de-chunked).
        json: the parsed body, or ``None`` when it is empty or not JSON.
        started: ``time.monotonic()`` when the request head was read.
        finished: ``time.monotonic()`` when the server began sending the response (or dropped
            the connection). Recorded before the response is written, so a client that has its
            response always finds the request here.
        fault: the fault applied, if any.
        status: the status sent, ``None`` when no response was sent.
        error: why the server answered with an error status of its own (bad key, invalid body,
            failing answer function), for debugging a test; ``None`` otherwise.
        connection: the ordinal (1, 2, ...) of the TCP connection the request came on.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    started: float
    finished: float
    fault: Fault | None
    status: int | None
    error: str | None
    connection: int

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes = b""
    headers: tuple[Header, ...] = ()
    error: str | None = None
    drop: bool = False


def _json_response(status: int, payload: object, *, error: str | None = None) -> _Response:
    return _Response(status=status, body=_json_bytes(payload), error=error)


def _uniform_answers(request: SystemOneRequest) -> AnswerFunction:
    """The default answers: 0.5 for yes/no, uniform over options and levels otherwise."""

    def answer(state: Instructions, question_id: str, instructions: Instructions | None) -> ScriptedValue:
        question = request.questions[question_id]
        if isinstance(question, ChoiceQuestion):
            return {option: 1.0 / len(question.criteria) for option in question.criteria}
        if isinstance(question, ScoreQuestion):
            return [1.0 / len(question.criteria)] * len(question.criteria)
        return 0.5

    return answer


def _known_fields(body: Any) -> Any:
    # Unknown top-level fields (a client's trace id, a future option) are ignored, as TypeSafe does.
    if isinstance(body, dict):
        return {key: value for key, value in body.items() if key in SystemOneRequest.model_fields}
    return body


def _validation_detail(error: ValidationError) -> list[dict[str, Any]]:
    # FastAPI's shape; "input" is left out so a 422 never echoes request text back.
    return [
        {"loc": ["body", *item["loc"]], "msg": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False)
    ]


def _corrupt(answers: dict[str, Any], fault: Fault, request: SystemOneRequest) -> None:
    if fault.kind == "missing_answer":
        del answers[list(answers)[-1]]
    elif fault.kind == "extra_answer":
        extra = "unexpected_item"
        while extra in answers:
            extra += "_"
        answers[extra] = {"type": "noul", "noul": 0.5}
    elif fault.kind == "wrong_type" and fault.as_string:
        for answer in answers.values():
            for key in ("noul", "confidence"):
                if key in answer:
                    answer[key] = repr(answer[key])
    elif fault.kind == "wrong_type":
        first = next(iter(request.questions))
        if request.questions[first].type == "noul":
            probabilities = {"yes": 0.9, "no": 0.1}
            answers[first] = {"type": "choice", "choice": "yes", "confidence": 0.9, "probabilities": probabilities}
        else:
            answers[first] = {"type": "noul", "noul": 0.5}
    elif fault.kind == "probability":
        for answer in answers.values():
            if "noul" in answer:
                answer["noul"] = fault.value


class SystemOneTestServer:
    """A System One server on ``127.0.0.1`` for tests: real HTTP, programmable faults, a request log.

    Args:
        answer: ``(state, question_id, instructions) -> value``, the same
            :data:`~llama_jev.judge.AnswerFunction` that ``ScriptedJudge`` takes: a
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
            :class:`~llama_jev.JevBadRequestError` it raises is a 422, a timeout a 504, any other
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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # stop() closes connections and joins handler threads itself, with a deadline; the default
    # joins every handler thread without one and would hang on an idle keep-alive connection.
    block_on_close = False
    # Concurrency benchmarks open many connections at once; the default backlog of 5 makes the
    # kernel drop SYNs and clients stall for a retransmission second.
    request_queue_size = 128

    def __init__(self, owner: SystemOneTestServer) -> None:
        self.owner = owner
        super().__init__(owner._address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can take seconds without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner._accepted(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.owner._closed(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-response is routine in fault tests, not worth a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are written separately; with Nagle on, a keep-alive client's delayed ACK
    # would add ~40 ms to every response and distort latency measurements.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self._stopping = self._owner._handler_started()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._owner._handler_finished()

    @property
    def _owner(self) -> SystemOneTestServer:
        server = self.server
        assert isinstance(server, _HTTPServer)
        return server.owner

    def log_message(self, format: str, *args: Any) -> None:
        # Test output stays clean; the request log is server.requests.
        return

    def do_GET(self) -> None:  # http.server dispatches on do_<METHOD>
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        owner = self._owner
        started = time.monotonic()
        path = urlsplit(self.path).path
        try:
            body = self._read_body()
        except ValueError:
            self.close_connection = True
            self._write(_json_response(400, {"error": "unreadable request body"}))
            return
        if body is None:  # the client hung up mid-body: nobody to answer
            self.close_connection = True
            return
        fault, latency, counted = owner._begin(faultable=self.command == "POST" and path == SYSTEM_ONE_PATH)
        headers = self._header_dict()
        # Parsed once, for the answer and for the request log (bodies of 1,000 passages are large).
        parsed = _parse_json(body)
        response: _Response | None = None
        try:
            wait = latency + (fault.delay_seconds if fault is not None else 0.0)
            if wait > 0 and self._stopping.wait(wait):
                response = _Response(status=0, drop=True, error="server stopped")
            else:
                response = owner._route(self.command, path, headers, body, parsed, fault)
        finally:
            # Recorded before the response is written: a client holding its response must find
            # the request in the log, and in-flight must not count a request already answered.
            owner._end(
                RecordedRequest(
                    method=self.command,
                    path=self.path,
                    headers=headers,
                    body=body,
                    json=None if parsed is _NOT_JSON else parsed,
                    started=started,
                    finished=time.monotonic(),
                    fault=fault,
                    status=None if response is None or response.drop else response.status,
                    error=None if response is None else response.error,
                    connection=owner._connection_ordinal(self.connection),
                ),
                counted=counted,
            )
        self._write(response)

    def _write(self, response: _Response) -> None:
        if response.drop:
            self.close_connection = True
            return
        names = {name.lower() for name, _ in response.headers}
        self.send_response(response.status, _reason(response.status))
        if "content-type" not in names:
            self.send_header("Content-Type", _JSON)
        if "content-length" not in names:
            self.send_header("Content-Length", str(len(response.body)))
        else:
            # A deliberately wrong length would desynchronise the next request on this connection.
            self.close_connection = True
        for name, value in response.headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(response.body)

    def _header_dict(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return headers

    def _read_body(self) -> bytes | None:
        """The request body, ``None`` if the client hung up before sending all of it."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0:
            raise ValueError("negative Content-Length")
        body = self.rfile.read(length) if length else b""
        return body if len(body) == length else None

    def _read_chunked(self) -> bytes | None:
        chunks: list[bytes] = []
        while True:
            size_line = self.rfile.readline(65537)
            if not size_line:
                return None
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers carry nothing the server uses
                return b"".join(chunks)
            chunk = self.rfile.read(size)
            if len(chunk) < size:
                return None
            chunks.append(chunk)
            self.rfile.readline()


_NOT_JSON: Any = object()


def _parse_json(body: bytes) -> Any:
    """The parsed body, or ``_NOT_JSON`` when it is empty or not JSON."""
    if not body:
        return _NOT_JSON
    try:
        return json.loads(body)
    except ValueError:
        return _NOT_JSON
