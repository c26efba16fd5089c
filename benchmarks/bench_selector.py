"""Judgement wall time vs. one round trip, against the System One test server at fixed latency.

    python benchmarks/bench_selector.py [--latency 0.1] [--repeat 9] [--peer-repeat 1] [--no-peer]

For 8 / 64 / 256 / 1024 candidates, with default settings, prints the median wall time of a
sync ``select`` / async ``aselect`` and of the ``JevNodePostprocessor`` (nodes in, copies with
``jev_probability`` out), each as a ratio to one round trip (one candidate, same client, same
run). When ``llama-index-postprocessor-jev`` is installed, its ``JevRerank`` (one request per
node, its default 8 in flight, noul mode) is timed against the same server in the same run.

The server runs in a child process, so its CPU does not compete with the client's for the GIL.
Ratios, not seconds, are what to compare across machines: these are shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _server import ServerProcess  # type: ignore[import-not-found]
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevClient,
    JevNodePostprocessor,
    Mode,
    RuntimeContext,
    runtime_context,
)
from llama_jev.engine import RELEVANCE_QUESTION, Candidate

QUERY = "What are the refund conditions?"
SIZES = (8, 64, 256, 1024)
TEXT = "Refunds are available for unused items returned within seven days of delivery. " * 3
CTX = RuntimeContext(user_id="bench", tenant_id="acme")


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


def candidates(n: int) -> list[Candidate]:
    return [Candidate(f"node-{i:04d}", TEXT) for i in range(n)]


def nodes(n: int) -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(id_=f"node-{i:04d}", text=TEXT, metadata={"tenant": "acme"}), score=0.5)
        for i in range(n)
    ]


def peer_reranker(base_url: str, top_n: int) -> Any | None:
    """The peer package's reranker pointed at the test server, or None when not installed."""
    try:
        from llama_index.postprocessor.jev import JevRerank  # type: ignore[import-not-found]
    except ImportError:
        return None
    os.environ["TYPESAFE_BASE_URL"] = base_url
    return JevRerank(api_key="bench", mode="noul", top_n=top_n, timeout_s=10.0, raise_on_error=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.1, help="server latency per request, seconds")
    parser.add_argument("--repeat", type=int, default=9, help="runs per cell (median)")
    parser.add_argument("--peer-repeat", type=int, default=1, help="runs per peer cell (it is slow)")
    parser.add_argument("--no-peer", action="store_true", help="skip the peer package even when installed")
    args = parser.parse_args()

    server = ServerProcess(args.latency)
    client = JevClient(api_key="bench", base_url=server.base_url, timeout=10.0)
    selector = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=60.0))
    postprocessor = JevNodePostprocessor(selector, lambda ctx, node: True)
    bundle = QueryBundle(QUERY)
    one = candidates(1)
    rows: dict[int, dict[str, float]] = {size: {} for size in SIZES}
    requests: dict[int, int] = {}

    def postprocess(n: list[NodeWithScore]) -> object:
        with runtime_context(CTX):
            return postprocessor.postprocess_nodes(n, bundle)

    selector.select(QUERY, RELEVANCE_QUESTION, one)  # warm the connection pool
    round_trip = median_seconds(lambda: selector.select(QUERY, RELEVANCE_QUESTION, one), args.repeat * 3)
    for size in SIZES:
        batch, inputs = candidates(size), nodes(size)
        decision = selector.select(QUERY, RELEVANCE_QUESTION, batch)
        requests[size] = decision.record.requests if decision.record is not None else 0
        rows[size]["sync"] = median_seconds(lambda b=batch: selector.select(QUERY, RELEVANCE_QUESTION, b), args.repeat)
        postprocess(inputs)
        rows[size]["pp sync"] = median_seconds(lambda n=inputs: postprocess(n), args.repeat)

    async def async_cells() -> None:
        await selector.aselect(QUERY, RELEVANCE_QUESTION, one)  # warm this loop's pool
        for size in SIZES:
            batch, inputs = candidates(size), nodes(size)

            async def apostprocess(n: list[NodeWithScore] = inputs) -> object:
                with runtime_context(CTX):
                    return await postprocessor.apostprocess_nodes(n, bundle)

            rows[size]["async"] = await amedian_seconds(
                lambda b=batch: selector.aselect(QUERY, RELEVANCE_QUESTION, b), args.repeat
            )
            await apostprocess()
            rows[size]["pp async"] = await amedian_seconds(apostprocess, args.repeat)

    asyncio.run(async_cells())

    peer_columns: tuple[str, ...] = ()
    if not args.no_peer and peer_reranker(server.base_url, 1) is not None:
        peer_columns = ("peer sync", "peer async")
        for size in SIZES:
            reranker, inputs = peer_reranker(server.base_url, size), nodes(size)
            reranker.postprocess_nodes(nodes(1), bundle)  # warm its pool
            rows[size]["peer sync"] = median_seconds(
                lambda r=reranker, n=inputs: r.postprocess_nodes(n, bundle), args.peer_repeat
            )

        async def peer_async() -> None:
            for size in SIZES:
                reranker, inputs = peer_reranker(server.base_url, size), nodes(size)
                await reranker.apostprocess_nodes(nodes(1), bundle)
                rows[size]["peer async"] = await amedian_seconds(
                    lambda r=reranker, n=inputs: r.apostprocess_nodes(n, bundle), args.peer_repeat
                )

        asyncio.run(peer_async())
    client.close()
    server.stop()

    columns = ("sync", "async", "pp sync", "pp async", *peer_columns)
    print(f"server latency {args.latency * 1000:.0f} ms (child process); one round trip: {round_trip * 1000:.1f} ms")
    print("xRT = wall time / one round trip; select/aselect = CandidateSelector; pp = JevNodePostprocessor")
    if not peer_columns:
        print("(llama-index-postprocessor-jev not installed: no peer columns)")
    header = f"{'candidates':>10} {'requests':>8} " + " ".join(f"{name + ' xRT':>14}" for name in columns)
    print(header)
    for size in SIZES:
        cells = " ".join(f"{rows[size][name] / round_trip:>14.3f}" for name in columns)
        print(f"{size:>10} {requests[size]:>8} {cells}")
    print("milliseconds:")
    for size in SIZES:
        cells = " ".join(f"{rows[size][name] * 1000:>14.1f}" for name in columns)
        print(f"{size:>10} {requests[size]:>8} {cells}")


if __name__ == "__main__":
    main()
