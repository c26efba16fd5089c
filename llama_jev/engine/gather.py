"""Sending a judgement's requests within its budget: the only step where sync and async differ.

:func:`gather` runs each batch on another thread (the process's shared pool, bounded), so the
budget holds for a judge that ignores its timeout; :func:`agather` runs them as asyncio tasks.
Both report each request's admission wait into the plan's meter (``DecisionRecord.queue_ms``)
and leave no batch running behind the decision.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from functools import partial

from llama_jev.core.records import Budget
from llama_jev.engine.plan import Plan
from llama_jev.systemone.judge import Judge
from llama_jev.systemone.queue_wait import reporting_queue_wait
from llama_jev.systemone.threads import BoundedCalls, call_within
from llama_jev.systemone.wire import SystemOneRequest, SystemOneResult

__all__ = ["agather", "gather"]

BUDGET_RAN_OUT = "the judgement budget ran out before every batch was answered"


def gather(judge: Judge, plan: Plan, budget: Budget, max_concurrency: int) -> list[SystemOneResult]:
    """The results of ``plan``'s requests, in order, each asked of ``judge`` with what is left of ``budget``.

    Raises:
        TimeoutError: the budget ran out before every batch was answered.
        Exception: the first error a batch raised (the others are cancelled).
    """
    # Batches run on other threads, even a single one, so the budget holds for a judge that
    # ignores its timeout; one batch (the usual retrieval) takes the lighter hand-off.
    with reporting_queue_wait(plan.queue):  # each batch's copied context reports its waits here
        runs = [partial(contextvars.copy_context().run, _call_sync, judge, each, budget) for each in plan.requests]
    if len(runs) == 1:
        return [call_within(runs[0], budget.remaining(), expired=BUDGET_RAN_OUT)]
    calls: BoundedCalls[SystemOneResult] = BoundedCalls(max_concurrency)  # the shared pool, bounded
    futures = [calls.submit(run) for run in runs]
    try:
        done, pending = concurrent.futures.wait(
            futures, timeout=budget.remaining(), return_when=concurrent.futures.FIRST_EXCEPTION
        )
    finally:
        calls.cancel()
    for future in futures:
        if future in done and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    if pending:
        raise TimeoutError(BUDGET_RAN_OUT)
    return [future.result() for future in futures]


def _call_sync(judge: Judge, request: SystemOneRequest, budget: Budget) -> SystemOneResult:
    left = budget.remaining()
    if left <= 0:
        raise TimeoutError("the judgement budget ran out before this batch was sent")
    return judge.system_one(request, timeout=left)


async def agather(judge: Judge, plan: Plan, budget: Budget, max_concurrency: int) -> list[SystemOneResult]:
    """The async :func:`gather`: at most ``max_concurrency`` requests in flight, as tasks on this loop."""
    limit = asyncio.Semaphore(max_concurrency)

    async def call(request: SystemOneRequest) -> SystemOneResult:
        async with limit:
            left = budget.remaining()
            if left <= 0:
                raise TimeoutError("the judgement budget ran out before this batch was sent")
            return await judge.asystem_one(request, timeout=left)

    with reporting_queue_wait(plan.queue):  # each task's copied context reports its waits here
        tasks = [asyncio.ensure_future(call(request)) for request in plan.requests]
    try:
        done, pending = await asyncio.wait(tasks, timeout=budget.remaining(), return_when=asyncio.FIRST_EXCEPTION)
    finally:
        # Whatever ends the wait (an error, the budget, the caller's cancellation), no batch
        # is left running behind the decision.
        for task in tasks:
            if not task.done():
                task.cancel()
    if any(task not in done for task in tasks):
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if task in done and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    if pending:
        raise TimeoutError(BUDGET_RAN_OUT)
    return [task.result() for task in tasks]
