"""The request log: one line per request, as text for people or JSON for machines; never a query,
a passage, an identity or a key (the route only when it is one the server knows)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Protocol
from urllib.parse import urlsplit

from llama_jev.server.protocol import ROUTES
from llama_jev.server.uncertain import UNCERTAIN_CAUSES


class Logged(Protocol):
    """What a log line reads of a request (an :class:`~llama_jev.server.Exchange` or a ``RecordedRequest``)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def json(self) -> Any: ...
    @property
    def status(self) -> int | None: ...
    @property
    def started(self) -> float: ...
    @property
    def finished(self) -> float: ...
    @property
    def error(self) -> str | None: ...


def _fields(request: Logged) -> dict[str, Any]:
    route = urlsplit(request.path).path
    questions = request.json.get("questions") if isinstance(request.json, dict) else None
    return {
        "time": datetime.now(timezone.utc),
        "method": request.method if request.method.isalpha() and len(request.method) <= 16 else "(other)",
        "route": route if route in ROUTES else "(unknown path)",
        "status": request.status,
        "candidates": len(questions) if isinstance(questions, dict) else 0,
        "ms": round((request.finished - request.started) * 1000, 1),
        # The server's own reason for an error status ("invalid API key"): a 401 alone does not say which.
        "error": request.error if request.error and request.status not in (200, 404) else None,
        # Candidates the judge could not read (answered 0.5), by cause: never a silent "uncertain".
        "uncertain": getattr(request, "extra", {}).get("uncertain") or None,
    }


def request_line(request: Logged) -> str:
    """The log line of one served request: time, route, status, candidates, milliseconds; never text.

    Example:
        >>> from llama_jev.server.exchange import Exchange
        >>> served = Exchange("POST", "/v1/systemone", {}, started=0.0, json={"questions": {"item_0": {}}},
        ...     status=200, finished=0.012)
        >>> request_line(served)[9:]
        ' POST /v1/systemone 200 1 candidate 12 ms'
    """
    fields = _fields(request)
    status = str(fields["status"]) if fields["status"] is not None else "dropped"
    count = fields["candidates"]
    line = (
        f"{fields['time'].strftime('%H:%M:%SZ')} {fields['method']} {fields['route']} {status} "
        f"{count} candidate{'' if count == 1 else 's'} {fields['ms']:.0f} ms"
    )
    notes = [fields["error"]] if fields["error"] else []
    for cause, counted in (fields["uncertain"] or {}).items():
        notes.append(f"{counted} uncertain: {UNCERTAIN_CAUSES.get(cause, cause)}")
    return f"{line} ({'; '.join(notes)})" if notes else line


def request_json(request: Logged) -> str:
    """The same as :func:`request_line`, as one JSON object (``--log-format json``)."""
    fields = _fields(request)
    fields["time"] = fields["time"].isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps({key: value for key, value in fields.items() if value is not None or key == "status"})
