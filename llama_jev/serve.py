"""``python -m llama_jev.serve --judge local --port 8000``: a System One server backed by a local judge.

It runs :func:`llama_jev.server.create_app` on uvicorn (``pip install -e ".[serve,local]"`` in a clone):
``POST /v1/systemone`` and ``GET /v1/models`` with the protocol and validation of
:class:`llama_jev.testing.SystemOneTestServer` (the same application), plus ``GET /healthz``,
``GET /readyz`` and ``GET /metrics``. So the real :class:`~llama_jev.JevClient` path, or an app in
another language, runs end to end offline:

    python -m llama_jev.serve --judge local --port 8000
    TYPESAFE_BASE_URL=http://127.0.0.1:8000 python -m examples.refund_policy

The ``local`` judge is :class:`~llama_jev.local.LocalRelevanceJudge` (``pip install -e
".[local]"`` in a clone). It answers relevance questions shaped like the selector's (state = the
query text, a noul question with instructions ``{"question": RELEVANCE_QUESTION, "candidate":
passage}``); **any other question gets the maximally uncertain answer** (0.5, or a uniform
distribution), which the selector's thresholds treat as "uncertain", never as a verdict. It
listens on 127.0.0.1 unless ``--host`` says otherwise; a key (``--api-key-file``, the
``LLAMA_JEV_SERVE_API_KEY`` environment variable, or ``--api-key``) makes it require
``Authorization: Bearer <key>``.

At most ``--max-in-flight`` requests are judged at once and ``--queue`` more wait; beyond that a
request gets 429 with ``Retry-After`` at once. SIGTERM or Ctrl-C drains: ``/readyz`` turns 503, no
new connection is taken, every request received is answered within ``--drain-seconds``, exit 0.

It prints one line per request: the time (UTC), method and route, status, how many candidates
(questions) the request held, and how long the server took, e.g.
``16:50:02Z POST /v1/systemone 200 3 candidates 41 ms``; never a query, a passage or a key.
``--log-format json`` prints each as a JSON object; ``--quiet`` turns the log off.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llama_jev.server.protocol import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_QUEUE,
)
from llama_jev.systemone.client import is_loopback
from llama_jev.systemone.judge import Judge

if TYPE_CHECKING:
    from llama_jev.server.log import request_line
    from llama_jev.server.uncertain import UncertainElsewhere

__all__ = ["API_KEY_ENV", "UncertainElsewhere", "beyond_loopback_warning", "main", "request_line"]

API_KEY_ENV = "LLAMA_JEV_SERVE_API_KEY"
"""The environment variable ``serve`` reads the key from (not visible in ``ps`` as argv is)."""


def __getattr__(name: str) -> object:
    # Kept importable from here (they moved to llama_jev.server); loaded on use, so --help needs no extra.
    if name == "UncertainElsewhere":
        from llama_jev.server.uncertain import UncertainElsewhere

        return UncertainElsewhere
    if name == "request_line":
        from llama_jev.server.log import request_line

        return request_line
    raise AttributeError(f"module 'llama_jev.serve' has no attribute {name!r}")


def _local_judge() -> Judge:
    from llama_jev.local import LocalRelevanceJudge

    judge = LocalRelevanceJudge()
    judge.load()
    return judge


JUDGES: dict[str, Callable[[], Judge]] = {"local": _local_judge}


def _how_to_call(base_url: str, keyed: bool) -> str:
    """The banner's second line: which settings a JevClient needs for this server."""
    if keyed:
        return f"use it with TYPESAFE_BASE_URL={base_url} and TYPESAFE_API_KEY=the server's key"
    if is_loopback(base_url):
        # JevClient sends no key to a loopback address, so the URL alone is enough.
        return f"use it with TYPESAFE_BASE_URL={base_url} (no TYPESAFE_API_KEY needed for a loopback address)"
    return (
        f"use it with TYPESAFE_BASE_URL={base_url} and any TYPESAFE_API_KEY (no key is checked; JevClient "
        "needs one for an address that is not loopback)"
    )


def beyond_loopback_warning(host: str, *, keyed: bool) -> str | None:
    """The warning printed when the server listens beyond loopback with no key; ``None`` when it does not.

    Example:
        >>> beyond_loopback_warning("127.0.0.1", keyed=False) is None
        True
    """
    if keyed or host == "localhost" or is_loopback(f"http://[{host}]" if ":" in host else f"http://{host}"):
        return None
    return (
        f"warning: listening on {host or 'every address'} beyond loopback with no API key: anyone who reaches "
        f"this port can use the judge (set --api-key-file or {API_KEY_ENV})"
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    # The docstring's first line, without its reStructuredText markup (a terminal shows it literally).
    description = (__doc__ or "").splitlines()[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="python -m llama_jev.serve", description=description)
    add = parser.add_argument
    add("--judge", choices=sorted(JUDGES), default="local", help="the judge to serve (default local)")
    add("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, default=8000, help="port to listen on (default 8000; 0 = any free)")
    add("--api-key-file", type=Path, default=None, help="require Authorization: Bearer <the file's first line>")
    add("--api-key", default=None, help=f"the key itself (visible in ps: prefer --api-key-file or {API_KEY_ENV})")
    add(
        "--max-in-flight",
        type=_positive_int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help=f"requests judged at once (default {DEFAULT_MAX_IN_FLIGHT})",
    )
    add(
        "--queue",
        type=_non_negative_int,
        default=DEFAULT_QUEUE,
        help=f"more requests admitted to wait (default {DEFAULT_QUEUE}); then 429",
    )
    add(
        "--max-batch-tokens",
        type=_non_negative_int,
        default=DEFAULT_MAX_BATCH_TOKENS,
        help=f"concurrent requests with the same query are judged together up to this many tokens "
        f"(default {DEFAULT_MAX_BATCH_TOKENS})",
    )
    add(
        "--max-body-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger bodies get 413 (default 4 MiB)",
    )
    add("--drain-seconds", type=_positive_seconds, default=10.0, help="on SIGTERM/Ctrl-C, answer within (default 10)")
    add("--header-timeout", type=_positive_seconds, default=10.0, help="seconds for a request's head (default 10)")
    add(
        "--body-timeout",
        type=_positive_seconds,
        default=DEFAULT_BODY_TIMEOUT,
        help=f"seconds for a request's body (default {DEFAULT_BODY_TIMEOUT:g})",
    )
    add("--log-format", choices=("text", "json"), default="text", help="one line per request: text or json")
    add("--quiet", action="store_true", help="no line per request (by default: time, status, candidates, ms)")
    return parser


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key-file, --api-key or the environment; ``ValueError`` saying what is wrong."""
    if args.api_key_file is not None:
        try:
            lines = args.api_key_file.read_text(encoding="utf-8").splitlines()
        except OSError as error:
            raise ValueError(f"cannot read --api-key-file {args.api_key_file}: {error.strerror}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty: put the key on its first line")
        return key
    if args.api_key is not None:
        return str(args.api_key)
    from_env = os.environ.get(API_KEY_ENV, "").strip()
    return from_env or None


def _exit_cleanly(signum: int, frame: object) -> None:
    print("llama_jev.serve: stopped before serving", flush=True)
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C, then drain; returns the exit status."""
    args = _parser().parse_args(argv)
    # Stopped while the judge loads (before there is anything to drain): a clean exit, no traceback.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, _exit_cleanly)
    try:
        api_key = _api_key(args)
    except ValueError as error:
        print(f"llama_jev.serve: {error}", file=sys.stderr)
        return 2
    try:
        from llama_jev.server import UncertainElsewhere, create_app
        from llama_jev.server.http import bind, run_draining
        from llama_jev.server.log import request_json, request_line
    except ImportError as error:
        print(f'llama_jev.serve: {error} (in a clone of llama_jev: pip install -e ".[serve,local]")', file=sys.stderr)
        return 2
    try:
        judge = JUDGES[args.judge]()
    except ImportError as error:
        print(f"llama_jev.serve: {error}", file=sys.stderr)
        return 2
    served = UncertainElsewhere(judge)
    line = request_json if args.log_format == "json" else request_line
    app = create_app(
        served,
        api_key=api_key,
        max_in_flight=args.max_in_flight,
        queue=args.queue,
        max_batch_tokens=args.max_batch_tokens,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        on_request=None if args.quiet else lambda exchange: print(line(exchange), flush=True),
    )
    try:
        sock = bind(args.host, args.port)
    except OSError as error:
        print(f"llama_jev.serve: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    host = "127.0.0.1" if args.host in ("", "0.0.0.0") else args.host  # noqa: S104 - every address: loopback reaches it
    base_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"llama_jev.serve: {served.model} ({type(judge).__name__}, not Jev) at {base_url}/v1/systemone", flush=True)
    print(f"  {_how_to_call(base_url, api_key is not None)}; Ctrl-C stops", flush=True)
    warning = beyond_loopback_warning(args.host, keyed=api_key is not None)
    if warning is not None:
        print(f"llama_jev.serve: {warning}", file=sys.stderr, flush=True)
    server = app.state.judge_server
    run_draining(
        app,
        sock,
        drain_seconds=args.drain_seconds,
        header_timeout=args.header_timeout,
        on_signal=lambda: server.drain(args.drain_seconds),
    )
    print("llama_jev.serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
