"""Reading what comes back: transport errors and server messages turned into the typed error tree,
with any echo of the request's own text withheld, and ``Retry-After`` parsed."""

from __future__ import annotations

import ipaddress
import math
import time
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import ValidationError

from llama_jev.core.errors import (
    JevAPIError,
    JevConnectionError,
    JevTimeoutError,
)
from llama_jev.systemone.wire import SystemOneRequest

_MAX_MESSAGE = 500
_REDACTED = "[redacted]"


def is_loopback(base_url: str) -> bool:
    """Whether ``base_url`` names this machine: ``localhost``, ``127.0.0.0/8`` or ``::1``.

    Example:
        >>> is_loopback("http://127.0.0.1:8000"), is_loopback("https://api.typesafe.ai")
        (True, False)
    """
    host = httpx.URL(base_url).host.casefold().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin(base_url: str) -> str:
    """``scheme://host:port`` of ``base_url``: what a message may name of a server.

    Never its path (it can hold a tenant or a token) nor userinfo (a password).

    Example:
        >>> origin("https://user:pw@judge.example/tenant-7/v1")
        'https://judge.example:443'
    """
    url = httpx.URL(base_url)
    host = f"[{url.host}]" if ":" in url.host else url.host
    port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{host}:{port}"


def _transport_error(error: httpx.HTTPError, server: str) -> JevAPIError:
    """The typed error for a failure below HTTP, naming ``server`` (an :func:`origin`)."""
    kind = type(error).__name__
    if isinstance(error, httpx.TimeoutException):
        return JevTimeoutError(f"the System One attempt to {server} timed out ({kind})", retryable=True)
    if isinstance(error, httpx.ConnectError):
        return JevConnectionError(
            f"could not connect to the System One server at {server} ({kind}): is it running there, "
            "and are base_url / TYPESAFE_BASE_URL right?",
            retryable=True,
        )
    if isinstance(error, httpx.TransportError):
        return JevConnectionError(
            f"could not reach the System One server at {server} or read its answer ({kind})", retryable=True
        )
    return JevConnectionError(f"the HTTP exchange with {server} failed ({kind})", retryable=True)


# A server message sharing this many consecutive characters with the request's texts is taken to
# quote them. Short enough to catch an echoed phrase, long enough not to fire on field names.
_QUOTE_WINDOW = 24


def _request_texts(value: Any) -> list[str]:
    """Every string in a request's state or instructions (the texts that must not come back)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _request_texts(item)]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _request_texts(item)]
    return []


def _quotes_request(message: str, request: SystemOneRequest) -> bool:
    """Whether ``message`` repeats a run of :data:`_QUOTE_WINDOW` characters of the request's texts."""
    if len(message) < _QUOTE_WINDOW:
        return False
    sent = [request.state, *(question.instructions for question in request.questions.values())]
    corpus = "\n".join(text for text in _request_texts(sent) if len(text) >= _QUOTE_WINDOW)
    if not corpus:
        return False
    return any(message[start : start + _QUOTE_WINDOW] in corpus for start in range(len(message) - _QUOTE_WINDOW + 1))


def _server_message(response: httpx.Response) -> str:
    """The human part of an error body: ``error``, ``message`` or ``detail`` (FastAPI's list too)."""
    # Only the structured message fields: a raw body (an HTML error page, a proxy echoing the
    # request) could carry candidate text into exceptions, and from there to an LLM.
    try:
        body: Any = response.json()
    except ValueError:
        return f"a non-JSON body of {len(response.content)} bytes"
    if not isinstance(body, dict):
        return "a JSON body without an error message"
    for key in ("error", "message", "detail"):
        value = body.get(key)
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            return _clip(value["message"])
        if isinstance(value, str):
            return _clip(value)
        if isinstance(value, list):
            parts = [_validation_item(item) for item in value if isinstance(item, dict)]
            return _clip("; ".join(part for part in parts if part))
    return ""


def _validation_item(item: dict[str, Any]) -> str:
    location = ".".join(str(part) for part in item.get("loc", []) if part != "body")
    message = item.get("msg")
    if not isinstance(message, str):
        return ""
    return f"{location}: {message}" if location else message


def _clip(text: str) -> str:
    if len(text) <= _MAX_MESSAGE:
        return text
    return text[:_MAX_MESSAGE] + f"... [{len(text) - _MAX_MESSAGE} more characters]"


def _describe(error: ValidationError) -> str:
    # Locations and messages only: the offending input values are left out of the message.
    problems = [f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}" for item in error.errors()]
    return _clip("; ".join(problems))


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if usable."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            value = float(milliseconds) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(raw).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
        return max(0.0, seconds)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
