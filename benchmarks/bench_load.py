"""Many sessions, one judge: 200 concurrent judgements through one ``JevClient``.

    python benchmarks/bench_load.py [--judgements 200] [--candidates 20] [--latency 0.1]

Half the judgements are threads calling ``select``, half are asyncio tasks calling ``aselect``
on one event loop, all released at once, all through one client, against a test server (in a
child process) that handles at most 16 requests at a time and answers any request beyond that
with 429 and ``Retry-After`` (``SystemOneTestServer(in_flight_limit=16)``), as a rate-limited
production server does. Default ``ExecutionOptions`` (budget 2 s) and default selector settings.

Rows: the client at its default bound (16 in flight), and a client configured above the
server's limit (32), which only the adaptation (halving on 429, Retry-After pausing the whole
client) keeps from failing. Target: zero failed judgements, 429s under 10% of requests.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from _server import ServerProcess  # type: ignore[import-not-found]

from llama_jev import CandidateSelector, ExecutionOptions, JevClient, Mode, Status
from llama_jev.core import Decision
from llama_jev.engine import RELEVANCE_QUESTION, Candidate

QUERY = "What are the refund conditions?"
TEXT = "Refunds are available for unused items returned within seven days of delivery. " * 3


def run_round(base_url: str, judgements: int, size: int, max_in_flight: int) -> dict[str, float]:
    client = JevClient(api_key="bench", base_url=base_url, timeout=5.0, max_in_flight=max_in_flight)
    selector = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE))
    candidates = [Candidate(f"node-{i:04d}", TEXT) for i in range(size)]
    threads_count = judgements // 2
    tasks_count = judgements - threads_count
    start = threading.Barrier(threads_count + 1)
    decisions: list[tuple[Decision, float]] = []
    lock = threading.Lock()

    def one_thread() -> None:
        start.wait()
        began = time.perf_counter()
        decision = selector.select(QUERY, RELEVANCE_QUESTION, candidates)
        with lock:
            decisions.append((decision, time.perf_counter() - began))

    async def one_task() -> None:
        began = time.perf_counter()
        decision = await selector.aselect(QUERY, RELEVANCE_QUESTION, candidates)
        with lock:
            decisions.append((decision, time.perf_counter() - began))

    async def tasks() -> None:
        await asyncio.to_thread(start.wait)
        await asyncio.gather(*(one_task() for _ in range(tasks_count)))

    # Warm the pools so connection set-up is not what is measured.
    selector.select(QUERY, RELEVANCE_QUESTION, candidates[:1])
    threads = [threading.Thread(target=one_thread) for _ in range(threads_count)]
    loop_thread = threading.Thread(target=asyncio.run, args=(tasks(),))
    for thread in [*threads, loop_thread]:
        thread.start()
    for thread in [*threads, loop_thread]:
        thread.join()
    stats = client.stats
    client.close()
    walls = sorted(wall for _, wall in decisions)
    failed = sum(1 for decision, _ in decisions if decision.status is Status.ERROR)
    queue = [d.record.queue_ms for d, _ in decisions if d.record is not None]
    return {
        "judgements": len(decisions),
        "failed": failed,
        "limit": stats.limit,
        "client 429": stats.rate_limited,
        "p50 ms": statistics.median(walls) * 1000,
        "p95 ms": walls[int(len(walls) * 0.95) - 1] * 1000,
        "max ms": walls[-1] * 1000,
        "max queue ms": max(queue),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judgements", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=20, help="candidates per judgement")
    parser.add_argument("--latency", type=float, default=0.1, help="server latency per request, seconds")
    parser.add_argument("--server-limit", type=int, default=16, help="requests the server handles at once")
    args = parser.parse_args()

    server = ServerProcess(args.latency, in_flight_limit=args.server_limit, limit_retry_after=0.1)
    rows = []
    for bound in (16, 32):
        server.reset()
        row = run_round(server.base_url, args.judgements, args.candidates, bound)
        seen = server.stats()
        row.update(
            {
                "bound": bound,
                "requests": seen["requests"],
                "429": seen["rate_limited"],
                "server max in flight": seen["max_in_flight"],
            }
        )
        rows.append(row)
    server.stop()

    print(
        f"{args.judgements} concurrent judgements ({args.judgements // 2} threads + "
        f"{args.judgements - args.judgements // 2} asyncio tasks), {args.candidates} candidates each, one client; "
        f"server: {args.latency * 1000:.0f} ms latency, {args.server_limit} in flight, 429 + Retry-After beyond"
    )
    columns = [
        "bound",
        "judgements",
        "failed",
        "requests",
        "429",
        "429 %",
        "limit",
        "server max in flight",
        "p50 ms",
        "p95 ms",
        "max ms",
        "max queue ms",
    ]
    print(" ".join(f"{name:>10}" if len(name) <= 10 else f"{name:>20}" for name in columns))
    for row in rows:
        row["429 %"] = row["429"] / row["requests"] * 100 if row["requests"] else 0.0
        cells = []
        for name in columns:
            value = row[name]
            text = f"{value:.1f}" if isinstance(value, float) else str(value)
            cells.append(f"{text:>10}" if len(name) <= 10 else f"{text:>20}")
        print(" ".join(cells))
    print("(requests and 429 are counted by the server, warm-up request included; limit: the client's at the end)")


if __name__ == "__main__":
    main()
