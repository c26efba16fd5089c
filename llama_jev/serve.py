"""``python -m llama_jev.serve --judge local --port 8000``: a System One server backed by a local judge.

It speaks ``POST /v1/systemone`` (and ``GET /v1/models``) with the same protocol and request
validation as :class:`llama_jev.testing.SystemOneTestServer`, which it is, backed by a
:class:`~llama_jev.Judge` instead of an answer function. So the real :class:`~llama_jev.JevClient`
path, or an app in another language, runs end to end offline:

    python -m llama_jev.serve --judge local --port 8000
    TYPESAFE_BASE_URL=http://127.0.0.1:8000 python -m examples.refund_policy

The ``local`` judge is :class:`~llama_jev.local.LocalRelevanceJudge` (``pip install
"llama-jev[local]"``). It answers relevance questions shaped like the selector's (state = the
query text, a noul question with instructions ``{"question": RELEVANCE_QUESTION, "candidate":
passage}``); **any other question gets the maximally uncertain answer** (0.5, or a uniform
distribution), which the selector's thresholds treat as "uncertain", never as a verdict. It
listens on 127.0.0.1 unless ``--host`` says otherwise; ``--api-key`` makes it require
``Authorization: Bearer <key>``.

It prints one line per request: the time (UTC), method and route, status, how many candidates
(questions) the request held, and how long the server took, e.g.
``16:50:02Z POST /v1/systemone 200 3 candidates 41 ms``; never a query, a passage or a key.
``--quiet`` turns that log off.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from llama_jev.core.errors import JevBadRequestError
from llama_jev.systemone.client import is_loopback
from llama_jev.systemone.judge import Judge, answer_request
from llama_jev.systemone.wire import Answer, SystemOneRequest, SystemOneResult, Usage, check_result

# The test server's own default answers: one rule for "maximally uncertain" in the package.
from llama_jev.testing import RecordedRequest, SystemOneTestServer
from llama_jev.testing.faults import MODELS_PATH, SYSTEM_ONE_PATH, _uniform_answers

__all__ = ["UncertainElsewhere", "main", "request_line"]


class UncertainElsewhere:
    """A :class:`~llama_jev.Judge` that asks ``judge`` the questions it can answer, and is uncertain on the rest.

    ``judge`` must have ``candidate(question_id, question)`` raising
    :class:`~llama_jev.errors.JevBadRequestError` for a question it cannot answer (as
    :class:`~llama_jev.local.LocalRelevanceJudge` has). The other questions get 0.5 (noul) or a
    uniform distribution (choice, score): "don't know", not a guess. A request whose state is
    not text gets only such answers.

    Example:
        >>> from llama_jev.local import LocalRelevanceJudge
        >>> served = UncertainElsewhere(LocalRelevanceJudge())  # doctest: +SKIP
    """

    def __init__(self, judge: Judge) -> None:
        if not callable(getattr(judge, "candidate", None)):
            raise TypeError("the judge must say which questions it answers (a candidate() method)")
        self.judge = judge
        self.model = str(getattr(judge, "model", "local"))

    def __repr__(self) -> str:
        return f"UncertainElsewhere({self.judge!r})"

    def _answerable(self, request: SystemOneRequest) -> set[str]:
        if not isinstance(request.state, str):
            return set()
        answerable = set()
        for question_id, question in request.questions.items():
            try:
                self.judge.candidate(question_id, question)  # type: ignore[attr-defined]
            except JevBadRequestError:
                continue
            answerable.add(question_id)
        return answerable

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer ``request``: the judge's questions by the judge, the others uncertain."""
        answerable = self._answerable(request)
        answers: dict[str, Answer] = {}
        if answerable:
            asked = SystemOneRequest(state=request.state, questions={qid: request.questions[qid] for qid in answerable})
            answers.update(self.judge.system_one(asked, timeout=timeout).answers)
        rest = {qid: question for qid, question in request.questions.items() if qid not in answerable}
        if rest:
            uncertain = SystemOneRequest(state=request.state, questions=rest)
            answers.update(answer_request(uncertain, _uniform_answers(uncertain), model=self.model).answers)
        result = SystemOneResult(model=self.model, answers=answers, usage=Usage(input_tokens=0, output_tokens=0))
        return check_result(request, result)

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`, in a worker thread."""
        return await asyncio.to_thread(self.system_one, request, timeout=timeout)


def request_line(request: RecordedRequest) -> str:
    """The log line of one served request: time, route, status, candidates, milliseconds; never text.

    The route is printed only when it is one the server knows (a mistyped path could hold
    anything), the candidates are counted, never shown, and the server's own reason for an
    error status (``missing or wrong API key``) is added, since a 401 alone does not say which.

    Example:
        >>> request_line(RecordedRequest("POST", "/v1/systemone", {}, b"", {"questions": {"item_0": {}}},
        ...     started=0.0, finished=0.012, fault=None, status=200, error=None, connection=1))[9:]
        ' POST /v1/systemone 200 1 candidate 12 ms'
    """
    route = urlsplit(request.path).path
    if route not in (SYSTEM_ONE_PATH, MODELS_PATH):
        route = "(unknown path)"
    questions: Any = request.json.get("questions") if isinstance(request.json, dict) else None
    count = len(questions) if isinstance(questions, dict) else 0
    status = str(request.status) if request.status is not None else "dropped"
    milliseconds = (request.finished - request.started) * 1000
    clock = datetime.now(timezone.utc).strftime("%H:%M:%SZ")
    line = (
        f"{clock} {request.method} {route} {status} {count} candidate{'' if count == 1 else 's'} {milliseconds:.0f} ms"
    )
    return f"{line} ({request.error})" if request.error and request.status not in (200, 404) else line


def _print_request(request: RecordedRequest) -> None:
    print(request_line(request), flush=True)


def _local_judge() -> Judge:
    from llama_jev.local import LocalRelevanceJudge

    judge = LocalRelevanceJudge()
    judge.load()
    return judge


JUDGES = {"local": _local_judge}


def _how_to_call(base_url: str, keyed: bool) -> str:
    """The banner's second line: which settings a JevClient needs for this server."""
    if keyed:
        return f"use it with TYPESAFE_BASE_URL={base_url} and TYPESAFE_API_KEY=the key given with --api-key"
    if is_loopback(base_url):
        # JevClient sends no key to a loopback address, so the URL alone is enough.
        return f"use it with TYPESAFE_BASE_URL={base_url} (no TYPESAFE_API_KEY needed for a loopback address)"
    return (
        f"use it with TYPESAFE_BASE_URL={base_url} and any TYPESAFE_API_KEY (no key is checked; JevClient "
        "needs one for an address that is not loopback)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until Ctrl-C (or SIGTERM); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m llama_jev.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--judge", choices=sorted(JUDGES), default="local", help="the judge to serve (default local)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 = any free)")
    parser.add_argument("--api-key", default=None, help="require Authorization: Bearer <key> (default: no key)")
    parser.add_argument(
        "--quiet", action="store_true", help="no line per request (by default: time, status, candidates, ms)"
    )
    args = parser.parse_args(argv)
    try:
        judge = JUDGES[args.judge]()
    except ImportError as error:
        print(f"llama_jev.serve: {error}", file=sys.stderr)
        return 2
    served = UncertainElsewhere(judge)
    # keep_requests=False: a server that runs for days must not hold every request's text and key.
    server = SystemOneTestServer(
        judge=served,
        api_key=args.api_key,
        host=args.host,
        port=args.port,
        keep_requests=False,
        on_request=None if args.quiet else _print_request,
    )
    try:
        server.start()
    except OSError as error:
        print(f"llama_jev.serve: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 2
    print(f"llama_jev.serve: {served.model} ({type(judge).__name__}, not Jev) at {server.url}", flush=True)
    print(f"  {_how_to_call(server.base_url, args.api_key is not None)}; Ctrl-C stops", flush=True)
    stop = threading.Event()
    # Ctrl-C (SIGINT) and SIGTERM both stop the server, also when the shell started it in the
    # background with SIGINT ignored.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda signum, frame: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    print("llama_jev.serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
