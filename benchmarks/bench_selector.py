"""Judgement wall time vs. one round trip, against the System One test server at fixed latency.

    python benchmarks/bench_selector.py [--latency 0.1] [--repeat 3]

For 8 / 64 / 256 / 1024 candidates (64 per request, at most 8 requests in flight), prints the
median wall time of a sync ``select`` and an async ``aselect`` and its ratio to one round trip
(one candidate, same client, measured in the same run). Ratios, not seconds, are what to compare
across machines: these are shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from llama_jev import RELEVANCE_QUESTION, Candidate, CandidateSelector, ExecutionOptions, JevClient, Mode
from llama_jev.testing import SystemOneTestServer

QUERY = "What are the refund conditions?"
SIZES = (8, 64, 256, 1024)
TEXT = "Refunds are available for unused items returned within seven days of delivery. " * 3


def median_seconds(run: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def amedian_seconds(run: Callable[[], Awaitable[object]], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.1, help="server latency per request, seconds")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median)")
    args = parser.parse_args()

    with SystemOneTestServer(lambda state, qid, ins: 0.9, latency=args.latency) as server:
        client = JevClient(api_key="bench", base_url=server.base_url, timeout=10.0)
        selector = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=60.0))

        def candidates(n: int) -> list[Candidate]:
            return [Candidate(f"node-{i:04d}", TEXT) for i in range(n)]

        one = candidates(1)
        selector.select(QUERY, RELEVANCE_QUESTION, one)  # warm the connection pool
        round_trip = median_seconds(lambda: selector.select(QUERY, RELEVANCE_QUESTION, one), args.repeat * 2)

        async def async_cells() -> dict[int, float]:
            await selector.aselect(QUERY, RELEVANCE_QUESTION, one)  # warm this loop's pool
            cells = {}
            for size in SIZES:
                batch = candidates(size)
                cells[size] = await amedian_seconds(
                    lambda b=batch: selector.aselect(QUERY, RELEVANCE_QUESTION, b), args.repeat
                )
            return cells

        asynchronous = asyncio.run(async_cells())
        print(f"server latency {args.latency * 1000:.0f} ms; one round trip (1 candidate): {round_trip * 1000:.0f} ms")
        print(
            f"{'candidates':>10} {'requests':>8} {'serial xRT':>10} {'sync ms':>9} {'sync xRT':>9} "
            f"{'async ms':>9} {'async xRT':>9}"
        )
        for size in SIZES:
            batch = candidates(size)
            server.reset()
            selector.select(QUERY, RELEVANCE_QUESTION, batch)
            requests = server.request_count
            sync = median_seconds(lambda b=batch: selector.select(QUERY, RELEVANCE_QUESTION, b), args.repeat)
            print(
                f"{size:>10} {requests:>8} {requests:>10.2f} {sync * 1000:>9.0f} {sync / round_trip:>9.2f} "
                f"{asynchronous[size] * 1000:>9.0f} {asynchronous[size] / round_trip:>9.2f}"
            )
        client.close()


if __name__ == "__main__":
    main()
