"""``create_app``: the System One protocol once, as a Starlette (ASGI) application.

``python -m llama_jev.serve`` runs it on uvicorn, ``llama_jev.testing.SystemOneTestServer`` runs
it in a thread with its faults plugged in (:class:`ServerHooks`), and an application can mount it
in its own FastAPI or Starlette app. The order of the checks is the contract: route and method,
key (before the body is read), content type, declared length, room (a full server refuses before
the body), body (bounded in size and time), admission (a place is taken only once the body is
here), JSON, shape, candidates, then the judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive

from llama_jev.core.errors import JevBadRequestError, JevTimeoutError
from llama_jev.server.admission import Admission
from llama_jev.server.batching import Batcher, ClientGone
from llama_jev.server.exchange import (
    EXCHANGE_KEY,
    DropConnection,
    Exchange,
    Observed,
    ServerHooks,
    error_response,
    http_error_as_json,
    json_response,
    until_disconnect,
    with_error_note,
)
from llama_jev.server.metrics import CONTENT_TYPE, ServerMetrics
from llama_jev.server.protocol import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_QUEUE,
    HEALTH_PATH,
    JSON_TYPE,
    MAX_CANDIDATES,
    METRICS_PATH,
    MODELS_PATH,
    READY_PATH,
    SYSTEM_ONE_PATH,
    BodyError,
    candidate_errors,
    invalid_body_payload,
    is_json_content_type,
    known_fields,
    parse_body,
    validation_detail,
)
from llama_jev.server.uncertain import UncertainElsewhere, llama_jev_version
from llama_jev.systemone.judge import RELEVANCE_QUESTION, Judge
from llama_jev.systemone.wire import NoulQuestion, SystemOneRequest

# Seconds of a drain kept for the judge's last pass and the responses (at most a quarter of it).
_DRAIN_MARGIN = 1.5
_SHUTTING_DOWN = "the server is shutting down: retry after the Retry-After seconds, on another replica"
UNCERTAIN_HEADER = "Llama-Jev-Uncertain"
"""The response header that counts, by cause, the candidates the judge could not read (answered 0.5)."""
_WARM_UP = SystemOneRequest(
    state="warm-up",
    questions={"warm_up": NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": "warm-up"})},
)


@dataclass
class ServerSettings:
    """The limits of one application (the ``serve`` flags of the same names)."""

    api_key: str | None = None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    queue: int = DEFAULT_QUEUE
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_candidates: int = MAX_CANDIDATES
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    retry_after: int = 1
    judge_workers: int = 2
    warm_up: SystemOneRequest | None = _WARM_UP
    models: dict[str, Any] | None = None  # what GET /v1/models lists (default: the judge's model)


class JudgeServer:
    """The state behind one application: readiness, admission, the batcher, the metrics, the drain.

    Reached as ``app.state.judge_server`` of what :func:`create_app` returns.
    """

    def __init__(
        self,
        judge: Judge,
        settings: ServerSettings,
        *,
        hooks: ServerHooks | None = None,
        on_request: Callable[[Exchange], None] | None = None,
    ) -> None:
        self.judge = judge
        self.settings = settings
        self.hooks = hooks
        self.on_request = on_request
        self.metrics = ServerMetrics()
        self.admission = Admission(settings.max_in_flight, settings.queue)
        self.batcher = Batcher(
            judge,
            max_batch_tokens=settings.max_batch_tokens,
            workers=settings.judge_workers,
            observe_batch=self.metrics.batch.observe,
        )
        self.model = str(getattr(judge, "model", type(judge).__name__))
        self.ready = settings.warm_up is None
        self.warm_up_error: str | None = None
        self.draining = False
        self._drain_deadline: float | None = None
        self._warm_up: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_expired = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the warm-up (once; also called by the first request when the app is mounted without lifespan)."""
        self._loop = asyncio.get_running_loop()
        if self._warm_up is None and self.settings.warm_up is not None:
            self._warm_up = asyncio.get_running_loop().create_task(self._run_warm_up(self.settings.warm_up))

    async def _run_warm_up(self, request: SystemOneRequest) -> None:
        try:
            answered = await self.batcher.run_blocking(lambda: self.judge.system_one(request))
            self.model = answered.model  # the name the judge answers with, also when it has no `model`
        except JevBadRequestError:
            pass  # the judge answered (it refuses this question): it is loaded and serving
        except Exception as error:  # the judge cannot answer: not ready, and /readyz says why
            self.warm_up_error = f"the judge failed its warm-up: {type(error).__name__}"
            return
        self.ready = True

    def drain(self, seconds: float) -> None:
        """Stop being ready and answer every request received within ``seconds``.

        Safe to call from a signal handler. The judge's timeout shrinks to the time left (less a
        margin for its last pass and the response), and a request still waiting for a slot when
        that runs out gets 503 with ``Retry-After``: answered, not cut off.
        """
        self.draining = True
        margin = min(_DRAIN_MARGIN, seconds / 4)
        self._drain_deadline = time.monotonic() + max(0.0, seconds - margin)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._arm_drain_deadline)

    def _arm_drain_deadline(self) -> None:
        assert self._drain_deadline is not None
        delay = max(0.0, self._drain_deadline - time.monotonic())
        asyncio.get_running_loop().call_later(delay, self._drain_expired.set)

    def _judge_timeout(self) -> float | None:
        if self._drain_deadline is None:
            return None
        return max(0.0, self._drain_deadline - time.monotonic())

    async def aclose(self, *, wait: bool = True) -> None:
        """Stop the batcher and (``wait``) wait for the judge's threads (after the last request)."""
        if self._warm_up is not None:
            self._warm_up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warm_up
        await self.batcher.aclose(wait=wait)

    # -- the routes ----------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        self.start()
        if self.draining:
            return json_response(503, {"status": "draining"}, error="draining")
        if not self.ready:
            message = self.warm_up_error or "warming up"
            return json_response(503, {"status": "not ready", "error": message}, error=message)
        return json_response(200, {"status": "ready", "model": self.model})

    async def metrics_text(self, request: Request) -> Response:
        self.metrics.in_flight.set(self.admission.in_flight)
        self.metrics.queued.set(self.admission.queued)
        return Response(self.metrics.text(), media_type=CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        if not self._authorized(request.headers.get("authorization")):
            return error_response(401, "invalid API key")
        if self.settings.models is not None:
            return json_response(200, self.settings.models)
        description = getattr(self.judge, "description", None)
        if not isinstance(description, str):
            description = f"{type(self.judge).__name__} {self.model} (llama_jev {llama_jev_version()})"
        return json_response(200, {"models": [{"name": self.model, "description": description}]})

    def _authorized(self, authorization: str | None) -> bool:
        if self.settings.api_key is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        # compare_digest: how long the comparison takes says nothing about the key.
        return scheme.lower() == "bearer" and secrets.compare_digest(
            token.strip().encode(), self.settings.api_key.encode()
        )

    async def system_one(self, request: Request) -> Response:
        self.start()
        exchange: Exchange = request.scope[EXCHANGE_KEY]
        hooks = self.hooks
        if hooks is not None and hooks.reads_body_first:
            early = await self._read_body(request, exchange)
            if early is not None:
                return early
        if hooks is not None:
            replaced = await hooks.before_answer(exchange)
            if replaced is not None:
                return replaced
        body_read = hooks is not None and hooks.reads_body_first
        if not self._authorized(request.headers.get("authorization")):
            return error_response(401, "invalid API key", close=not body_read)
        if not is_json_content_type(request.headers.get("content-type")):
            return error_response(415, f"send the body as {JSON_TYPE}", close=not body_read)
        declared = request.headers.get("content-length")
        if declared is not None and not body_read:
            if not declared.strip().isdigit():
                return error_response(400, "Content-Length is not a number", close=True)
            if int(declared) > self.settings.max_body_bytes:
                return error_response(413, f"the body is over {self.settings.max_body_bytes} bytes", close=True)
        if self.draining:
            return self._shutting_down(close=True)
        # Full now: refused before its body is read. The place itself is taken only once the body
        # is here, so clients that send slowly never hold the places of those that are ready.
        if not self.admission.has_room():
            return self._too_many(close=not body_read)
        if not body_read:
            refused = await self._read_body(request, exchange)
            if refused is not None:
                return refused
        if not self.admission.reserve():
            return self._too_many(close=False)
        entered = False
        gone = asyncio.Event()
        watch: asyncio.Task[None] | None = None
        try:
            watch = asyncio.create_task(_watch_disconnect(request.receive, gone))
            entered = await self._enter(gone)
            if not entered and self._drain_expired.is_set():
                return self._shutting_down()
            if not entered or gone.is_set():
                return DropConnection("the client left before its turn")
            return await self._answer(exchange, gone)
        finally:
            if watch is not None:
                watch.cancel()
            if entered:
                self.admission.leave()
            else:
                self.admission.abandon()

    def _shutting_down(self, *, close: bool = False) -> Response:
        return error_response(503, _SHUTTING_DOWN, close=close, headers={"Retry-After": "1"})

    def _too_many(self, *, close: bool) -> Response:
        message = "too many requests in flight: retry after the Retry-After seconds"
        retry = {"Retry-After": str(self.settings.retry_after)}
        return error_response(429, message, close=close, headers=retry)

    async def _enter(self, gone: asyncio.Event) -> bool:
        """Wait for a slot in flight; ``False`` when the client left first."""
        enter = asyncio.ensure_future(self.admission.enter())
        left = asyncio.ensure_future(gone.wait())
        expired = asyncio.ensure_future(self._drain_expired.wait())
        try:
            await asyncio.wait({enter, left, expired}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            expired.cancel()
        if not enter.done():
            enter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await enter
            return True
        return False

    async def _read_body(self, request: Request, exchange: Exchange) -> Response | None:
        """Read the body into ``exchange`` within the size and time bounds; a response when refused."""
        limit, chunks, size = self.settings.max_body_bytes, [], 0
        deadline = time.monotonic() + self.settings.body_timeout
        while True:
            # A drain that began while the body trickles in bounds the wait too.
            remaining = min(deadline, self._drain_deadline or deadline) - time.monotonic()
            try:
                message = await asyncio.wait_for(request.receive(), max(remaining, 0.0))
            except asyncio.TimeoutError:
                if self._drain_deadline is not None and time.monotonic() < deadline:
                    return self._shutting_down(close=True)
                message_text = f"the body did not arrive within {self.settings.body_timeout:g} s"
                return error_response(408, message_text, close=True)
            if message["type"] == "http.disconnect":
                return DropConnection("the client left while sending its body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return error_response(413, f"the body is over {limit} bytes", close=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        exchange.body = b"".join(chunks)
        return None

    async def _answer(self, exchange: Exchange, gone: asyncio.Event) -> Response:
        try:
            parsed = parse_body(exchange.body)
        except BodyError as error:
            return json_response(error.status, invalid_body_payload(str(error), error.kind), error=str(error))
        exchange.json = parsed
        questions = parsed.get("questions") if isinstance(parsed, dict) else None
        exchange.candidates = len(questions) if isinstance(questions, dict) else 0
        if exchange.candidates > self.settings.max_candidates:
            message = f"{exchange.candidates} candidates in one request; at most {self.settings.max_candidates}"
            return error_response(413, message)
        try:
            wire = SystemOneRequest.model_validate(known_fields(parsed))
        except ValidationError as error:
            return json_response(422, {"detail": validation_detail(error)}, error="invalid request body")
        not_text = candidate_errors(wire)
        if not_text:
            return json_response(422, {"detail": not_text}, error="a candidate is not text")
        uncertain = self._uncertain(wire, exchange)
        judging = asyncio.ensure_future(
            self.batcher.judge_request(wire, gone=gone.is_set, timeout=self._judge_timeout())
        )
        expired = asyncio.ensure_future(self._drain_expired.wait())
        try:
            await asyncio.wait({judging, expired}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            expired.cancel()
            if not judging.done():
                # The drain ran out first (or this handler was cancelled): the request leaves the
                # batcher's queue, and a call already in the judge finishes unread.
                judging.cancel()
        if not judging.done() or judging.cancelled():  # cancelled, not yet unwound
            return self._shutting_down()
        try:
            result = judging.result()
        except ClientGone:
            return DropConnection("the client left before its turn")
        except JevBadRequestError as error:
            detail = [{"loc": ["body", "questions"], "msg": str(error), "type": "value_error"}]
            return json_response(422, {"detail": detail}, error="the judge refused the request")
        except JevTimeoutError:
            return self._shutting_down() if self.draining else error_response(504, "the judge timed out")
        except Exception as error:  # any other failure of the judge is the server's 500
            return error_response(500, f"the judge failed: {type(error).__name__}")
        if gone.is_set():
            # Judged for nobody: said so in the log and the metrics (status none), never a 200.
            return DropConnection("the client left while it was judged")
        payload = result.model_dump(mode="json")
        self.metrics.candidates.inc(len(wire.questions))
        if self.hooks is not None:
            self.hooks.answered(exchange, payload, wire)
        headers = {UNCERTAIN_HEADER: ", ".join(f"{cause}={count}" for cause, count in uncertain.items())}
        return json_response(200, payload, headers=headers if uncertain else {})

    def _uncertain(self, request: SystemOneRequest, exchange: Exchange) -> dict[str, int]:
        """The candidates the judge cannot read, by cause: counted in the metrics and noted for the log line."""
        if not isinstance(self.judge, UncertainElsewhere):
            return {}
        causes = self.judge.uncertain(request)
        for cause, count in causes.items():
            self.metrics.uncertain.labels(cause=cause).inc(count)
        if causes:
            exchange.extra["uncertain"] = causes
        return causes


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    await until_disconnect(receive)
    gone.set()


def create_app(
    judge: Judge,
    *,
    api_key: str | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    queue: int = DEFAULT_QUEUE,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    retry_after: int = 1,
    judge_threads: int = 2,
    warm_up: bool = True,
    on_request: Callable[[Exchange], None] | None = None,
    _hooks: ServerHooks | None = None,
    _settings: ServerSettings | None = None,
) -> Starlette:
    """The System One server for ``judge`` as an ASGI application.

    Routes: ``POST /v1/systemone`` (the protocol), ``GET /v1/models``, ``GET /healthz`` (200
    while the process serves), ``GET /readyz`` (200 once the judge has answered a warm-up, 503
    before and while draining), ``GET /metrics`` (Prometheus text). Only the first two need the key.

    Args:
        judge: any :class:`~llama_jev.Judge`; its ``system_one`` runs in the app's own threads.
        api_key: require ``Authorization: Bearer <api_key>`` (checked in constant time, before the
            body is read); ``None`` checks no key.
        max_in_flight: requests judged at once; ``queue``: more admitted to wait; beyond both a
            request gets 429 with ``Retry-After: retry_after`` at once.
        max_batch_tokens: the candidates of concurrent requests with the same query are judged
            in one call of up to this many (estimated) tokens; 0 never merges.
        judge_threads: calls of the judge at once (2: while one call is in the model, the next
            one's text is tokenized; the local judge runs one forward pass at a time anyway).
        max_body_bytes: a larger body gets 413, judged by its Content-Length before it is read.
        body_timeout: seconds the whole body may take to arrive (then 408).
        warm_up: judge one relevance question at start-up; ``/readyz`` is 503 until it is answered.
        on_request: called with each request's :class:`Exchange` once its response is sent.

    Mounted in another app (``app.mount("/judge", create_app(judge))``), the warm-up starts with
    the first request, since a mounted app gets no lifespan events.

    Example:
        >>> from llama_jev.systemone import ScriptedJudge  # doctest: +SKIP
        >>> app = create_app(ScriptedJudge(lambda state, qid, instructions: 0.9))  # doctest: +SKIP
    """
    settings = _settings or ServerSettings(
        api_key=api_key,
        max_in_flight=max_in_flight,
        queue=queue,
        max_batch_tokens=max_batch_tokens,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
        retry_after=retry_after,
        judge_workers=judge_threads,
        warm_up=_WARM_UP if warm_up else None,
    )
    server = JudgeServer(judge, settings, hooks=_hooks, on_request=on_request)

    def noted(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def call(request: Request) -> Response:
            return with_error_note(await endpoint(request), request.scope[EXCHANGE_KEY])

        return call

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.start()
        try:
            yield
        finally:
            await server.aclose()

    routes = [
        Route(SYSTEM_ONE_PATH, noted(server.system_one), methods=["POST"]),
        Route(MODELS_PATH, noted(server.models), methods=["GET"]),
        Route(HEALTH_PATH, noted(server.healthz), methods=["GET"]),
        Route(READY_PATH, noted(server.readyz), methods=["GET"]),
        Route(METRICS_PATH, noted(server.metrics_text), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Observed, metrics=server.metrics, hooks=lambda: server.hooks, on_request=on_request)],
        exception_handlers={HTTPException: http_error_as_json},
        lifespan=lifespan,
    )
    app.state.judge_server = server
    return app
