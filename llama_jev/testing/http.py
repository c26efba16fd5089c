"""The socket side of ``_Owner``: a threading HTTP/1.1 server and its request handler,
which hand every request to the owning test server (``_Owner``) and write what it answers."""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from llama_jev.testing.faults import _JSON, SYSTEM_ONE_PATH, Fault, RecordedRequest, _json_response, _reason, _Response


class _Owner(Protocol):
    """What the socket side needs of its ``SystemOneTestServer`` (typed here so this module does
    not import the server that imports it)."""

    _address: tuple[str, int]

    def _accepted(self, connection: socket.socket) -> None: ...
    def _closed(self, connection: socket.socket) -> None: ...
    def _connection_ordinal(self, connection: socket.socket) -> int: ...
    def _handler_started(self) -> threading.Event: ...
    def _handler_finished(self) -> None: ...
    def _begin(self, *, faultable: bool) -> tuple[Fault | None, float, bool]: ...
    def _end(self, record: RecordedRequest, *, counted: bool = True) -> None: ...
    def _route(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, parsed: Any, fault: Fault | None
    ) -> _Response: ...


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

    def __init__(self, owner: _Owner) -> None:
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
    def _owner(self) -> _Owner:
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
