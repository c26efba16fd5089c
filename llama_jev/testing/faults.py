"""The faults a test programs into ``SystemOneTestServer``, the requests it records, and the
responses it builds from them (pure functions, no sockets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llama_jev.server.protocol import MODELS_PATH, SYSTEM_ONE_PATH, json_bytes, reason, uniform_answers
from llama_jev.systemone.wire import SystemOneRequest

__all__ = ["MODELS_PATH", "SYSTEM_ONE_PATH", "Fault", "RecordedRequest"]

# A response cut off mid-object: what a proxy that drops the connection half-way delivers.
_MALFORMED_BODY = b'{"model": "jev-test-1", "answers": {"item_0": {"type": "noul", "noul": 0.'
# The default answers (0.5, uniform) are the server's "maximally uncertain": one rule in the package.
_uniform_answers = uniform_answers
_reason = reason
_json_bytes = json_bytes

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
