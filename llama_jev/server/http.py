"""The socket side: uvicorn's HTTP/1.1 protocol with the guards the judge server needs, and the
two ways to run an application on it (in a thread, for tests; in the foreground, with a drain).

uvicorn waits for a request's head without a limit and answers a malformed request in plain text;
:func:`protocol_class` adds a deadline for the head (a slow client is cut off, holding no worker)
and answers such errors in JSON. It also puts the connection's transport and ordinal in each
request's scope (``TRANSPORT_KEY``, ``CONNECTION_KEY``), for dropping a connection on purpose
and for counting connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import Server

from llama_jev.server.exchange import CONNECTION_KEY, TRANSPORT_KEY
from llama_jev.server.protocol import error_payload, json_bytes, reason

DEFAULT_HEADER_TIMEOUT = 10.0
"""Seconds a client may take to send a request's head (line and headers)."""
_STOP_SECONDS = 1.0


@dataclass
class ConnectionLedger:
    """What the protocol instances of one server share: the head deadline and a connection count."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    opened: int = 0
    on_open: Callable[[], int] | None = None
    """Called for each new connection; what it returns is the connection's ordinal."""

    def open(self) -> int:
        """Count a new connection; its ordinal."""
        self.opened += 1
        return self.on_open() if self.on_open is not None else self.opened


def protocol_class(ledger: ConnectionLedger) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's head, JSON errors, and the scope keys."""

    class _JudgeProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            _no_delay(transport)
            self._ordinal = ledger.open()
            self._head_timer: asyncio.TimerHandle | None = None
            self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(ledger.header_timeout, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:
                self._arm_head_timer()  # the first bytes of a new request: its head has a deadline
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm_head_timer()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before and self.scope is not None:
                # The request's task is scheduled, not started: the keys are there when it runs.
                extensions = self.scope.setdefault("extensions", {})
                extensions[TRANSPORT_KEY] = self.transport
                extensions[CONNECTION_KEY] = self._ordinal

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._disarm_head_timer()  # idle now: uvicorn's keep-alive timeout applies

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0] or self.cycle is None:
                _write_error(self.transport, 408, "the request head did not arrive in time")
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            _write_error(self.transport, 400, "the request is not valid HTTP/1.1")
            self.transport.close()

    return _JudgeProtocol


def _no_delay(transport: asyncio.BaseTransport) -> None:
    # Nagle's algorithm holds a response's second write (uvicorn sends the head and the body
    # apart) until the client ACKs the first, and clients delay that ACK by up to 40 ms: every
    # answer on a kept-alive connection waited for it. asyncio sets TCP_NODELAY itself only on
    # sockets whose protocol says TCP (see bind()); a socket handed in from elsewhere gets it here.
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _write_error(transport: asyncio.Transport, status: int, message: str) -> None:
    # Written raw: h11 cannot send a response to a request whose head it never had.
    body = json_bytes(error_payload(message))
    head = (
        f"HTTP/1.1 {status} {reason(status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    transport.write(head.encode("ascii") + body)


def _config(app: Any, ledger: ConnectionLedger, *, lifespan: str, keep_alive: int = 5) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=protocol_class(ledger),
        lifespan=lifespan,  # type: ignore[arg-type]
        log_config=None,
        access_log=False,
        timeout_keep_alive=keep_alive,
        ws="none",
        server_header=False,
        date_header=True,
    )


def bind(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: any free port).

    Created with ``IPPROTO_TCP`` so that the sockets it accepts say TCP too, and asyncio sets
    ``TCP_NODELAY`` on each (with protocol 0 it does not).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ThreadedServer:
    """An application served on uvicorn in a daemon thread (the test server's way): starts in
    milliseconds, and :meth:`stop` cuts every connection at once instead of draining."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        ledger: ConnectionLedger,
        *,
        on_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._on_stop = on_stop
        self._server = Server(_config(app, ledger, lifespan="off"))
        self._sock = sock
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"llama_jev-server:{sock.getsockname()[1]}", daemon=True)

    def start(self) -> None:
        """Serve in the thread; returns once the socket accepts connections."""
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        config = self._server.config
        try:
            config.load()
            self._server.lifespan = config.lifespan_class(config)
            await self._server.startup(sockets=[self._sock])
        except BaseException as error:  # handed to the starting thread
            self._failure = error
            self._started.set()
            return
        self._started.set()
        await self._stop.wait()
        for listener in self._server.servers:
            listener.close()
        for connection in list(self._server.server_state.connections):
            connection.transport.abort()
        tasks = list(self._server.server_state.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_SECONDS)
        if self._on_stop is not None:
            await self._on_stop()
        # What else the application left running (a mounted app's batcher): cancelled, not destroyed pending.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=_STOP_SECONDS)

    def stop(self) -> None:
        """Close the listening socket and every connection; requests still waiting get no response."""
        if self._stop is None or not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(_STOP_SECONDS + 1.0)
        self._sock.close()

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the server's event loop (from any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing left to wake
            self._loop.call_soon_threadsafe(callback)


class _DrainingServer(Server):
    """uvicorn's server, whose SIGTERM / SIGINT starts a drain and exits 0 once it is done.

    uvicorn re-raises a caught signal after its shutdown (the process would die by it); the
    drain is the orderly end here, so the signal is only noted.
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
            return
        self._on_signal()
        self.should_exit = True


def run_draining(
    app: Any,
    sock: socket.socket,
    *,
    drain_seconds: float,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    on_signal: Callable[[], None],
) -> None:
    """Serve ``app`` on ``sock`` in this thread until SIGTERM or SIGINT, then drain.

    On the signal ``on_signal`` runs (the app stops being ready and shortens its judge's
    timeout), the socket stops accepting, and uvicorn waits up to ``drain_seconds`` (plus a
    second's margin for the responses to be written) for the requests received.
    """
    ledger = ConnectionLedger(header_timeout=header_timeout)
    config = _config(app, ledger, lifespan="on")
    config.timeout_graceful_shutdown = int(drain_seconds) + 1
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    server = _DrainingServer(config, on_signal)
    server.run(sockets=[sock])
