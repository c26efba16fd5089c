"""The judge server before and after, side by side in one run, and the governor soak.

    python benchmarks/bench_serve.py [--quick] [--skip-soak]

"old" is ``python -m llama_jev.serve --judge local`` as of commit ``OLD_COMMIT`` (the test
server's ``http.server`` loop), extracted with ``git archive`` into a temporary folder and run
from there (so this needs the git history); "new" is this checkout's server (``create_app`` on
uvicorn) with ``--max-in-flight 16 --queue 64``, so that no request of the table is refused.
Both serve the same local judge on 127.0.0.1 and run for the whole table; each cell is measured
on one and then on the other (alternating which goes first). The client (httpx, asyncio) runs in
this process. For 1- and 20-candidate requests at concurrency 1, 4, 16 and 64: requests/s,
candidates/s, p50 and p95 latency. Every request has its own query ("distinct": merging cannot
help); the "one query" rows send concurrent requests with the same query, as ``JevClient`` does
when it splits one judgement, where the new server judges them together.

The soak: 200 sessions, each one judgement of 5 candidates through ``JevClient`` (one client
shared by all, 200 threads released at once), against the new server with ``--max-in-flight 2
--queue 2``: the server pushes back with 429 and ``Retry-After``, the client honours it. Target:
0 failed judgements; the 429s are counted from the server's ``/metrics``. Between the two, one
line: the new server with its default admission (4 in flight, 16 waiting) under 64 clients, where
the excess is refused at once instead of waiting behind the model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import httpx

from llama_jev import JevClient
from llama_jev.engine import RELEVANCE_QUESTION
from llama_jev.systemone.wire import NoulQuestion, SystemOneRequest

ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "15516fd9e7c87b79bd1ca6267939401b0670b8e7"  # main before the judge server (issue 26)
PASSAGE = (
    "Standard shipping takes three to five business days within the country; express orders placed "
    "before noon arrive the next business day, and international parcels take up to two weeks."
)


def _old_tree() -> Iterator[Path]:
    commit = subprocess.run(
        ["git", "rev-parse", OLD_COMMIT], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "llama_jev"], cwd=ROOT, capture_output=True, check=True)
    with tempfile.TemporaryDirectory(prefix="bench_serve_old_") as folder:
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(folder, filter="data")
        yield Path(folder)


@contextlib.contextmanager
def server(flags: list[str], pythonpath: Path | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    command = [sys.executable, "-m", "llama_jev.serve", "--judge", "local", "--port", "0", "--quiet", *flags]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=pythonpath or ROOT
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        base_url = banner.split(" at ")[-1].strip().removesuffix("/v1/systemone")
        _warm(base_url)
        yield base_url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _warm(base_url: str) -> None:
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if client.post(base_url + "/v1/systemone", json=_body("warm", 2)).status_code == 200:
                    return
            time.sleep(0.1)
    raise RuntimeError("the server did not answer")


def _body(query: str, candidates: int) -> dict[str, object]:
    question = {"question": RELEVANCE_QUESTION, "candidate": PASSAGE}
    return {
        "state": query,
        "questions": {f"item_{i}": {"type": "noul", "instructions": question} for i in range(candidates)},
    }


async def _cell(base_url: str, concurrency: int, candidates: int, requests: int, one_query: bool) -> dict[str, float]:
    latencies: list[float] = []
    refused = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:

        async def worker() -> None:
            nonlocal refused
            while not queue.empty():
                index = queue.get_nowait()
                query = "How long does shipping take?" + ("" if one_query else f" (order {index})")
                began = time.perf_counter()
                response = await client.post("/v1/systemone", json=_body(query, candidates))
                if response.status_code == 429:
                    refused += 1
                    continue
                response.raise_for_status()
                latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "cps": len(latencies) * candidates / elapsed,
        "p50": statistics.median(latencies),
        "p95": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "429": refused,
    }


def table(quick: bool) -> None:
    concurrencies = [1, 4, 16] if quick else [1, 4, 16, 64]
    cells = [(size, c, False) for size in (1, 20) for c in concurrencies] + [(20, 4, True), (20, 16, True)]

    def requests_for(size: int, concurrency: int) -> int:
        return max(8, concurrency * 2) if size == 1 else concurrency + 4

    results: dict[str, dict[tuple[int, int, bool], dict[str, float]]] = {"old": {}, "new": {}}
    with contextlib.ExitStack() as stack:
        old_tree = stack.enter_context(contextlib.contextmanager(_old_tree)())
        # Both servers run for the whole table, and each cell is measured on one, then at once on
        # the other: a busy moment of the machine falls on both, not on one column.
        urls = {
            "old": stack.enter_context(server([], old_tree))[0],
            "new": stack.enter_context(server(["--max-in-flight", "16", "--queue", "64"]))[0],
        }
        for index, cell in enumerate(cells):
            order = ("old", "new") if index % 2 == 0 else ("new", "old")
            for name in order:
                count = requests_for(cell[0], cell[1])
                results[name][cell] = asyncio.run(_cell(urls[name], cell[1], cell[0], count, cell[2]))
    print(
        "| candidates/request | concurrency | queries | old req/s | new req/s | old cand/s | new cand/s | "
        "ratio | old p50 s | new p50 s | old p95 s | new p95 s |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cell in cells:
        old, new = results["old"][cell], results["new"][cell]
        print(
            f"| {cell[0]} | {cell[1]} | {'one' if cell[2] else 'distinct'} | {old['rps']:.1f} | {new['rps']:.1f} | "
            f"{old['cps']:.0f} | {new['cps']:.0f} | {new['cps'] / old['cps']:.2f} | {old['p50']:.2f} | "
            f"{new['p50']:.2f} | {old['p95']:.2f} | {new['p95']:.2f} |"
        )


def admission(concurrency: int) -> None:
    """20-candidate requests at ``concurrency`` against the new server with its default admission."""
    with server([]) as (base_url, _):
        result = asyncio.run(_cell(base_url, concurrency, 20, concurrency + 4, False))
    print(
        f"new server, default --max-in-flight 4 --queue 16, {concurrency} clients of 20 candidates: "
        f"{result['cps']:.0f} candidates/s answered, p50 {result['p50']:.2f} s, p95 {result['p95']:.2f} s of the "
        f"answered, {int(result['429'])} of {concurrency + 4} requests refused at once with 429"
    )


def _metric(base_url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def soak(sessions: int) -> None:
    with server(["--max-in-flight", "2", "--queue", "2"]) as (base_url, _):
        client = JevClient(api_key="bench", base_url=base_url, timeout=60.0)
        failures: list[str] = []
        durations: list[float] = []
        lock = threading.Lock()
        start = threading.Barrier(sessions)

        def session(index: int) -> None:
            question = {"question": RELEVANCE_QUESTION, "candidate": PASSAGE}
            request = SystemOneRequest(
                state=f"How long does shipping take? (session {index})",
                questions={f"c{i}": NoulQuestion(instructions=question) for i in range(5)},
            )
            start.wait()
            began = time.perf_counter()
            try:
                client.system_one(request)
            except Exception as error:  # a failed judgement is what the soak counts
                with lock:
                    failures.append(type(error).__name__)
                return
            with lock:
                durations.append(time.perf_counter() - began)

        began = time.perf_counter()
        threads = [threading.Thread(target=session, args=(index,)) for index in range(sessions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
        client.close()
        refused = _metric(base_url, 'llama_jev_requests_total{route="/v1/systemone",status="429"}')
        answered = _metric(base_url, 'llama_jev_requests_total{route="/v1/systemone",status="200"}')
    durations.sort()
    print(
        f"soak: {sessions} sessions x 5 candidates, --max-in-flight 2 --queue 2: {len(failures)} failed judgements "
        f"{sorted(set(failures))}, {int(answered)} requests answered 200, {int(refused)} answered 429 "
        f"({refused / max(1.0, refused + answered):.0%} of requests), {elapsed:.1f} s in all, "
        f"session p50 {statistics.median(durations):.2f} s, p95 {durations[int(0.95 * len(durations))]:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="concurrency 1, 4, 16 only")
    parser.add_argument("--skip-soak", action="store_true")
    parser.add_argument("--sessions", type=int, default=200)
    args = parser.parse_args()
    table(args.quick)
    admission(16 if args.quick else 64)
    if not args.skip_soak:
        soak(args.sessions)


if __name__ == "__main__":
    main()
