"""``python -m llama_jev.label``: a one-page labelling app on 127.0.0.1.

    python -m llama_jev.label sheet.csv --out labels.jsonl [--labeller NAME] [--port 0]
        [--records decisions.jsonl]

One question and one passage at a time; keys ``y`` relevant, ``n`` not relevant, ``s`` skip,
``b`` back; a progress bar. Each answer is appended to ``--out`` and flushed before the next pair
shows; started again on the same files it resumes where it stopped. The judge's p is never
shown. The page is one HTML file with a little plain JavaScript, served by the standard library
to this machine only (127.0.0.1), with nothing fetched from anywhere else.
Exit status: 0 stopped (Ctrl-C), 2 unusable sheet or labels file.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from llama_jev.calibration.labelling import LabellingSession, StalePageError, read_sheet
from llama_jev.calibration.records import CalibrationInputError

__all__ = ["main", "serve"]

_MAX_BODY = 64 * 1024
_SECURITY_HEADERS = {
    # the page needs nothing from anywhere else; a passage's text can never load or run anything
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _page() -> bytes:
    return resources.files("llama_jev").joinpath("assets/label_page.html").read_bytes()


def _handler(session: LabellingSession, page: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "llama_jev.label"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the terminal shows the URL and the progress, not every request."""

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in _SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data: Any) -> None:
            self._send(status, json.dumps(data, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8")

        def _local(self) -> bool:
            # DNS rebinding: a web page whose name points at 127.0.0.1 must not read the passages
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            if host in ("127.0.0.1", "localhost"):
                return True
            self._json(HTTPStatus.FORBIDDEN, {"error": "only http://127.0.0.1 may use this page"})
            return False

        def do_GET(self) -> None:
            if not self._local():
                return
            if self.path == "/":
                self._send(HTTPStatus.OK, page, "text/html; charset=utf-8")
            elif self.path == "/api/state":
                self._json(HTTPStatus.OK, session.state())
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})

        def do_POST(self) -> None:
            if not self._local():
                return
            # a page from another origin cannot post here: only same-origin JSON is accepted
            if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
                self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send application/json"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > _MAX_BODY:
                self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "body too large"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/api/answer":
                    state = session.answer(int(body["position"]), str(body["id"]), body["relevant"])
                elif self.path == "/api/back":
                    state = session.back(int(body["position"]))
                else:
                    self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})
                    return
            except StalePageError as error:
                self._json(HTTPStatus.CONFLICT, {"error": str(error)})
                return
            except (ValueError, KeyError, TypeError) as error:
                self._json(HTTPStatus.BAD_REQUEST, {"error": f"bad request: {error}"})
                return
            self._json(HTTPStatus.OK, state)
            if state["pair"] is None:
                print(f"all {state['total']} pairs answered; next: {state['next_command']}", flush=True)

    return Handler


def serve(session: LabellingSession, *, port: int = 0) -> ThreadingHTTPServer:
    """A server for ``session`` on 127.0.0.1 (``port`` 0: a free one); call ``serve_forever()``."""
    return ThreadingHTTPServer(("127.0.0.1", port), _handler(session, _page()))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llama_jev.label",
        description="Label a sheet in the browser, one question and passage at a time (y / n / s / b).",
        epilog="Exit status: 0 stopped with Ctrl-C, 2 unusable sheet or labels file.",
    )
    parser.add_argument("sheet", help="the sheet from python -m llama_jev.label_sheet --samples (.csv or JSONL)")
    parser.add_argument("--out", required=True, help="the labels file (JSONL) answers are appended to")
    parser.add_argument("--labeller", help="your name, written on every label (default: your login name)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default 0: any free port)")
    parser.add_argument("--records", help="the decision records the sheet came from (named in the next command)")
    return parser


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in this environment (some containers)
        return "labeller"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); serves until interrupted."""
    args = _parser().parse_args(argv)
    labeller = args.labeller or _login_name()
    try:
        session = LabellingSession(read_sheet(args.sheet), args.out, labeller, records=args.records)
    except (CalibrationInputError, OSError, ValueError) as error:
        print(f"llama_jev.label: {error}", file=sys.stderr)
        return 2
    try:
        server = serve(session, port=args.port)
    except OSError as error:
        print(f"llama_jev.label: cannot listen on 127.0.0.1:{args.port}: {error.strerror}", file=sys.stderr)
        return 2
    state = session.state()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(
        f"labelling {args.sheet} as {labeller}: {state['labelled']} of {state['total']} pairs done; "
        f"answers go to {args.out}",
        flush=True,
    )
    print(f"open {url}  (Ctrl-C to stop; run the same command again to resume)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
