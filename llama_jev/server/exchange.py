"""One request as the server sees it (:class:`Exchange`), the responses the protocol sends, and
the outermost layer of the application, which records each exchange, counts it in the metrics and
writes its log line once the response is sent (no line for a response no client received)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llama_jev.server.metrics import ServerMetrics
from llama_jev.server.protocol import JSON_TYPE, error_payload, json_bytes
from llama_jev.systemone.wire import SystemOneRequest

TRANSPORT_KEY = "llama_jev.transport"
"""The ASGI ``scope`` key under which llama_jev's uvicorn protocol puts the connection's transport."""
CONNECTION_KEY = "llama_jev.connection"
"""The ASGI ``scope`` key with the ordinal (1, 2, ...) of the request's TCP connection."""
EXCHANGE_KEY = "llama_jev.exchange"
ENDING_KEY = "llama_jev.ending"


@dataclass
class Exchange:
    """One request as the server saw it: what the request log, the metrics and the test server's record read.

    ``body`` and ``json`` are empty unless the body was read; ``status`` is ``None`` when no
    response was sent (the connection was dropped); ``error`` is the server's own reason for an
    error status; ``candidates`` counts the questions, never shows them.
    """

    method: str
    path: str
    headers: dict[str, str]
    started: float
    connection: int = 0
    body: bytes = b""
    json: Any = None
    fault: Any = None
    status: int | None = None
    error: str | None = None
    finished: float = 0.0
    candidates: int = 0
    counted: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class ServerHooks(Protocol):
    """What the test server plugs into the application (faults, latency, its request log)."""

    reads_body_first: bool

    def request_started(self, exchange: Exchange) -> Response | None: ...
    async def before_answer(self, exchange: Exchange) -> Response | None: ...
    def answered(self, exchange: Exchange, payload: dict[str, Any], request: SystemOneRequest) -> None: ...
    def request_finished(self, exchange: Exchange) -> None: ...


def json_response(
    status: int, payload: object, *, error: str | None = None, close: bool = False, headers: Mapping[str, str] = {}
) -> Response:
    """A JSON response; ``close`` ends the connection after it (the request's body was not read)."""
    response = Response(json_bytes(payload), status_code=status, media_type=JSON_TYPE, headers=dict(headers))
    if close:
        response.headers["connection"] = "close"
    if error is not None:
        response.llama_jev_error = error  # type: ignore[attr-defined]
    return response


def error_response(status: int, message: str, *, close: bool = False, headers: Mapping[str, str] = {}) -> Response:
    return json_response(status, error_payload(message), error=message, close=close, headers=headers)


class DropConnection(Response):
    """No response at all: the connection is cut (the test server's drop fault, a stop while waiting)."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__(b"", status_code=599)
        self.llama_jev_error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ending = scope.get(ENDING_KEY)
        if ending is not None:
            ending()  # recorded before the cut: a client that sees it finds the request in the log
        transport = scope.get("extensions", {}).get(TRANSPORT_KEY)
        if transport is not None:
            transport.abort()
        with contextlib.suppress(asyncio.TimeoutError):
            # The server sees the connection go before the application returns, so it sends nothing.
            await asyncio.wait_for(until_disconnect(receive), 1.0)


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Observed:
    """The outermost ASGI layer (see the module's doc)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: ServerMetrics,
        hooks: Callable[[], ServerHooks | None],
        on_request: Callable[[Exchange], None] | None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.hooks = hooks
        self.on_request = on_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hooks = self.hooks()
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        path = route_path(scope)
        query = scope.get("query_string", b"").decode("latin-1")
        exchange = Exchange(
            method=scope["method"],
            path=path + (f"?{query}" if query else ""),
            headers=headers,
            started=time.monotonic(),
            connection=int(scope.get("extensions", {}).get(CONNECTION_KEY, 0)),
        )
        scope[EXCHANGE_KEY] = exchange
        sent_start = ended = False

        def end(status: int | None) -> None:
            # The response is decided: recorded before it is written (the test server's log).
            nonlocal ended
            if ended:
                return
            ended = True
            exchange.status = status
            exchange.finished = time.monotonic()
            if hooks is not None:
                hooks.request_finished(exchange)

        scope[ENDING_KEY] = lambda: end(None)

        async def observed_send(message: Message) -> None:
            nonlocal sent_start
            if message["type"] == "http.response.start" and not sent_start:
                sent_start = True
                end(int(message["status"]))
            await send(message)

        try:
            early = hooks.request_started(exchange) if hooks is not None else None
            if early is not None:
                await early(scope, receive, observed_send)
            else:
                await self.app(scope, receive, observed_send)
        except Exception as error:  # never a traceback page: a JSON 500, and the error in the log
            exchange.error = f"the server failed: {type(error).__name__}"
            if not sent_start:
                await error_response(500, exchange.error, close=True)(scope, receive, observed_send)
        finally:
            end(exchange.status)  # dropped, or cut off by a stop: recorded with no status
            self.metrics.observe_request(path, exchange.status, time.monotonic() - exchange.started)
            if self.on_request is not None:
                with contextlib.suppress(Exception):  # a log line never fails a request
                    self.on_request(exchange)


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


async def http_error_as_json(request: Request, error: Exception) -> Response:
    """Starlette's 404 and 405 (and any other ``HTTPException``) as the protocol's JSON errors."""
    assert isinstance(error, HTTPException)
    path = route_path(request.scope)
    request.scope[EXCHANGE_KEY].error = {404: "unknown path", 405: "wrong method"}.get(error.status_code)
    if error.status_code == 404:
        return error_response(404, f"no route {path}" if path.isascii() and len(path) <= 200 else "no such route")
    if error.status_code == 405:
        allowed = (error.headers or {}).get("Allow", "")
        return error_response(405, f"use {allowed} {path}", headers={"Allow": allowed})
    return error_response(error.status_code, error.detail, headers=error.headers or {})


def with_error_note(response: Response, exchange: Exchange) -> Response:
    """``response``, with its error reason (if any) noted in ``exchange`` for the log line."""
    exchange.error = getattr(response, "llama_jev_error", None)
    return response
