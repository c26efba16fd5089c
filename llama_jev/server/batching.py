"""The candidates of concurrent requests, judged together.

Requests waiting for the judge are merged, up to ``max_batch_tokens`` (estimated as UTF-8 bytes
/ 4), when they share a state (the query): a judgement the client split into a wave of requests
becomes one call of the judge, so one forward pass reads the candidates of several requests. A
judge that runs in this process is called from a small pool of threads of the batcher's own, which
the server joins before it exits: no thread is left inside the model when the interpreter stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from llama_jev.core.errors import JevBadRequestError
from llama_jev.systemone.judge import Judge
from llama_jev.systemone.wire import Answer, Question, SystemOneRequest, SystemOneResult, Usage


class ClientGone(Exception):
    """The client of a request left before its turn: it is not judged."""


def estimated_tokens(request: SystemOneRequest) -> int:
    """A cheap upper estimate of the tokens of ``request``'s questions (UTF-8 bytes / 4, at least 1 each)."""
    return sum(max(1, len(question.model_dump_json().encode()) // 4) for question in request.questions.values())


@dataclass(eq=False)
class _Item:
    request: SystemOneRequest
    tokens: int
    gone: Callable[[], bool]
    timeout: float | None
    future: asyncio.Future[SystemOneResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Batcher:
    """Judges requests with ``judge``, merging those that wait together (see the module's doc).

    Args:
        judge: any :class:`~llama_jev.Judge`; its blocking ``system_one`` runs in the batcher's threads.
        max_batch_tokens: the most (estimated) tokens merged into one call; ``0`` never merges.
        workers: calls of the judge at once (1 for a model that runs one pass at a time anyway).
        observe_batch: called with the number of candidates of every call of the judge.
    """

    def __init__(
        self,
        judge: Judge,
        *,
        max_batch_tokens: int,
        workers: int = 1,
        observe_batch: Callable[[int], None] | None = None,
    ) -> None:
        if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int) or max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens must be an integer >= 0, got {max_batch_tokens!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        self.judge = judge
        self.max_batch_tokens = max_batch_tokens
        self.workers = workers
        self._observe = observe_batch
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llama_jev-judge")
        self._pending: deque[_Item] = deque()
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def run_blocking(self, call: Callable[[], SystemOneResult]) -> asyncio.Future[SystemOneResult]:
        """Run ``call`` (the warm-up) in the judge's threads."""
        return asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def judge_request(
        self, request: SystemOneRequest, *, gone: Callable[[], bool], timeout: float | None = None
    ) -> SystemOneResult:
        """The judge's answer to ``request``, possibly judged together with others.

        Raises:
            ClientGone: ``gone()`` was true when the request's turn came.
            Exception: what the judge raised for this request.
        """
        self._start()
        assert self._wake is not None
        item = _Item(request, estimated_tokens(request), gone, timeout)
        self._pending.append(item)
        self._wake.set()
        return await item.future

    def _start(self) -> None:
        if self._tasks and not all(task.done() for task in self._tasks):
            return
        self._wake = asyncio.Event()
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self.workers)]

    async def _work(self) -> None:
        assert self._wake is not None
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._take()
            if batch:
                await self._judge_batch(batch)

    def _take(self) -> list[_Item]:
        """The next batch: the oldest live request and the waiting ones with its state, within the token bound."""
        while self._pending:
            first = self._pending.popleft()
            if first.future.done():
                continue
            if first.gone():
                first.future.set_exception(ClientGone())
                continue
            batch, total = [first], first.tokens
            for item in list(self._pending):
                if total >= self.max_batch_tokens:
                    break
                if (
                    item.future.done()
                    or item.gone()
                    or item.request.state != first.request.state
                    or item.request.model != first.request.model
                ):
                    continue
                if total + item.tokens <= self.max_batch_tokens:
                    self._pending.remove(item)
                    batch.append(item)
                    total += item.tokens
            return batch
        return []

    async def _judge_batch(self, batch: list[_Item]) -> None:
        if len(batch) == 1:
            await self._judge_alone(batch[0])
            return
        questions: dict[str, Question] = {}
        owners: list[tuple[_Item, dict[str, str]]] = []
        for index, item in enumerate(batch):
            names = {f"r{index}_{question_id}": question_id for question_id in item.request.questions}
            questions.update({merged: item.request.questions[original] for merged, original in names.items()})
            owners.append((item, names))
        merged = SystemOneRequest(state=batch[0].request.state, questions=questions, model=batch[0].request.model)
        timeouts = [item.timeout for item in batch if item.timeout is not None]
        try:
            result = await self._call(merged, min(timeouts) if timeouts else None)
        except JevBadRequestError:
            # One request's question spoiled the call: judge each alone, so only its own fails.
            for item in batch:
                await self._judge_alone(item)
            return
        except Exception as error:
            for item in batch:
                _settle(item, error=error)
            return
        for item, names in owners:
            answers: dict[str, Answer] = {original: result.answers[merged_id] for merged_id, original in names.items()}
            share = SystemOneResult(model=result.model, answers=answers, usage=_share(result.usage, item, merged))
            _settle(item, result=share)

    async def _judge_alone(self, item: _Item) -> None:
        if item.future.done():
            return
        try:
            result = await self._call(item.request, item.timeout)
        except Exception as error:
            _settle(item, error=error)
            return
        _settle(item, result=result)

    async def _call(self, request: SystemOneRequest, timeout: float | None) -> SystemOneResult:
        if self._observe is not None:
            self._observe(len(request.questions))
        call = functools.partial(self.judge.system_one, request, timeout=timeout)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def aclose(self, *, wait: bool = True) -> None:
        """Stop the workers and (``wait``) wait for the judge's threads: a call in progress finishes first."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if wait:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        else:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Wait for the judge's threads from outside the event loop."""
        self._executor.shutdown(wait=True)


def _settle(item: _Item, *, result: SystemOneResult | None = None, error: BaseException | None = None) -> None:
    if item.future.done():
        return
    if error is not None:
        item.future.set_exception(error)
    else:
        assert result is not None
        item.future.set_result(result)


def _share(usage: Usage, item: _Item, merged: SystemOneRequest) -> Usage:
    # Usage is billed per request: each gets its part of the merged call's, by its questions.
    part = len(item.request.questions) / len(merged.questions)
    return Usage(input_tokens=round(usage.input_tokens * part), output_tokens=round(usage.output_tokens * part))
