"""The judge server before and after, side by side in one run, and the governor soak.

    python benchmarks/bench_serve.py [--quick] [--only keepalive,soak,batching,table]

Sections (all by default):

``keepalive``: "before" is ``python -m llama_jev.serve --judge local`` as of ``BEFORE_COMMIT``
(main before issue 37: Nagle's algorithm on), "after" this checkout's; both run at once, and
on one kept-alive connection to each (httpx, as ``JevClient`` uses) the benchmark alternates a
request the server rejects (422), a cheap one (``GET /healthz``) and a 1-candidate judgement:
the median of each, and cheap requests per second at concurrency 1.

``soak``: 100 sessions at once, each one judgement of 20 candidates (a retrieval's default
``candidate_limit``) through one ``JevClient`` with its defaults (5 s per attempt, 2 retries,
16 in flight), against ``--judge local --max-in-flight 2 --queue 4``; before (client and
server of ``BEFORE_COMMIT``) and after, one after the other. Failed judgements, requests the
server answered, refused and dropped, and the server's work wasted on abandoned requests:
candidates it judged (``llama_jev_batch_candidates_sum``) that no client received.

``batching``: what micro-batching buys. At concurrency 1, 4 and 16, every request of 20
candidates with one query, a fresh server with ``--max-batch-tokens 8192`` (the default) and one
with ``0`` (never merge), run at once and measured cell by cell: the server process's CPU
seconds per candidate (``/proc``) and its peak resident memory (``VmHWM``).

``table``: "old" is ``python -m llama_jev.serve --judge local`` as of commit ``OLD_COMMIT`` (the
test server's ``http.server`` loop); "new" is this checkout's server with ``--max-in-flight 16
--queue 64``, so that no request of the table is refused. For 1- and 20-candidate requests at
concurrency 1, 4, 16 and 64: requests/s, candidates/s, p50 and p95 latency. Every request has
its own query ("distinct": merging cannot help); the "one query" rows send concurrent requests
with the same query, as ``JevClient`` does when it splits one judgement, where the new server
judges them together. Then one line: the new server with its default admission (4 in flight, 16
waiting) under 64 clients, where the excess is refused at once instead of waiting behind the model.

Both trees of a comparison are extracted with ``git archive`` into a temporary folder (so this
needs the git history) and run from there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path

import httpx

from llama_jev import JevClient
from llama_jev.engine import RELEVANCE_QUESTION
from llama_jev.systemone.wire import NoulQuestion, SystemOneRequest

ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "15516fd9e7c87b79bd1ca6267939401b0670b8e7"  # main before the judge server (issue 26)
BEFORE_COMMIT = "918a2275cba1a6889217a149aa65da7b679c2cf8"  # main before issue 37 (Nagle, the drain, the governor)
PASSAGE = (
    "Standard shipping takes three to five business days within the country; express orders placed "
    "before noon arrive the next business day, and international parcels take up to two weeks."
)


@contextlib.contextmanager
def tree(commit: str) -> Iterator[Path]:
    """``llama_jev`` as of ``commit``, in a temporary folder (to run it with ``PYTHONPATH`` there)."""
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
        old_tree = stack.enter_context(tree(OLD_COMMIT))
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


# -- keep-alive latency ------------------------------------------------------------------------------


def keepalive(rounds: int) -> None:
    """Median latency on one kept-alive connection: before (Nagle on) and after, alternating."""
    kinds: dict[str, Callable[[httpx.Client], httpx.Response]] = {
        "rejected (422)": lambda client: client.post("/v1/systemone", json={"state": "q", "questions": {}}),
        "cheap (GET /healthz)": lambda client: client.get("/healthz"),
        "1-candidate judgement": lambda client: client.post("/v1/systemone", json=_body("keep-alive", 1)),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        old = stack.enter_context(tree(BEFORE_COMMIT))
        urls = {"before": stack.enter_context(server([], old))[0], "after": stack.enter_context(server([]))[0]}
        clients = {name: stack.enter_context(httpx.Client(base_url=url, timeout=60)) for name, url in urls.items()}
        for index in range(rounds):
            for name in ("before", "after") if index % 2 == 0 else ("after", "before"):
                for kind, call in kinds.items():
                    began = time.perf_counter()
                    response = call(clients[name])
                    samples.setdefault((name, kind), []).append(time.perf_counter() - began)
                    assert response.status_code in (200, 422), response.text
    print(f"keep-alive: {rounds} of each request on one kept-alive connection per server, interleaved")
    print("| request | before p50 ms | after p50 ms | before req/s | after req/s |")
    print("|---|---:|---:|---:|---:|")
    for kind in kinds:
        before, after = samples[("before", kind)], samples[("after", kind)]
        print(
            f"| {kind} | {statistics.median(before) * 1000:.1f} | {statistics.median(after) * 1000:.1f} | "
            f"{len(before) / sum(before):.0f} | {len(after) / sum(after):.0f} |"
        )


# -- the governor soak -------------------------------------------------------------------------------

SOAK_CANDIDATES = 20


def soak_child(base_url: str, sessions: int) -> None:
    """The client side of the soak (run with the tree under test first on the path): one JSON line."""
    client = JevClient(base_url=base_url)  # every default: 5 s per attempt, 2 retries, 16 in flight
    failures: list[str] = []
    durations: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(sessions)

    def session(index: int) -> None:
        question = {"question": RELEVANCE_QUESTION, "candidate": PASSAGE}
        request = SystemOneRequest(
            state=f"How long does shipping take? (session {index})",
            questions={f"c{i}": NoulQuestion(instructions=question) for i in range(SOAK_CANDIDATES)},
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
    stats = client.stats
    client.close()
    durations.sort()
    result = {
        "failed": len(failures),
        "errors": sorted(set(failures)),
        "succeeded": len(durations),
        "elapsed": elapsed,
        "p50": statistics.median(durations) if durations else 0.0,
        "p95": durations[int(0.95 * len(durations))] if durations else 0.0,
        "limit": stats.limit,
    }
    print(json.dumps(result), flush=True)


@contextlib.contextmanager
def _soak_side(sessions: int, pythonpath: Path | None) -> Iterator[Callable[[], str]]:
    """A soak server and its client process, started; yields what reads the row once the client ends."""
    with server(["--max-in-flight", "2", "--queue", "4"], pythonpath) as (base_url, _):
        judged_before = _metric(base_url, "llama_jev_batch_candidates_sum")  # the warm request's
        env = dict(os.environ)
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        command = [sys.executable, str(Path(__file__).resolve()), "--soak-child", base_url, "--sessions", str(sessions)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=pythonpath or ROOT)

        def row() -> str:
            out, _ = child.communicate(timeout=1800)
            result = json.loads(out.strip().splitlines()[-1])
            judged = _metric(base_url, "llama_jev_batch_candidates_sum") - judged_before
            status = 'llama_jev_requests_total{route="/v1/systemone",status="%s"}'
            answered, refused, dropped = (_metric(base_url, status % code) for code in ("200", "429", "none"))
            delivered = result["succeeded"] * SOAK_CANDIDATES
            wasted = max(0.0, judged - delivered) / judged if judged else 0.0
            return (
                f"{result['failed']} {' '.join(result['errors'])} | {int(answered)} | {int(refused)} | "
                f"{int(dropped)} | {wasted:.0%} | {result['elapsed']:.0f} | {result['p50']:.1f} | "
                f"{result['p95']:.1f} | {result['limit']} |"
            )

        yield row


def soak(sessions: int, runs: int, sides: list[str], apart: bool) -> None:
    """Before and after at the same time (a busy moment of the machine falls on both), or ``apart``
    (one after the other, each with the machine to itself), ``runs`` times."""
    print(
        f"soak: {sessions} sessions x {SOAK_CANDIDATES} candidates through one JevClient (defaults), "
        f"--judge local --max-in-flight 2 --queue 4, {' and '.join(sides)} {'apart' if apart else 'at once'}"
    )
    print(
        "| run | | failed judgements | answered 200 | refused 429 | dropped | server work wasted | s in all | "
        "session p50 s | p95 s | client limit at the end |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tree(BEFORE_COMMIT) as old:
        paths = {"before": old, "after": None}
        for run in range(1, runs + 1):
            rows: dict[str, str] = {}
            if apart:
                for name in sides:
                    with _soak_side(sessions, paths[name]) as side:
                        rows[name] = side()
            else:
                with contextlib.ExitStack() as stack:
                    started = {name: stack.enter_context(_soak_side(sessions, paths[name])) for name in sides}
                    rows = {name: side() for name, side in started.items()}
            for name, row in rows.items():
                print(f"| {run} | {name} | {row}", flush=True)


# -- micro-batching ----------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def batching(concurrencies: list[int]) -> None:
    """CPU per candidate and peak memory, with micro-batching on (default) and off, one query."""
    print("batching: 20-candidate requests, one query, --max-in-flight 16 --queue 64, fresh servers per row")
    print(
        "| concurrency | candidates per call on | CPU ms/candidate on | off | change | peak RSS MB on | off | "
        "cand/s on | off |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    admission = ["--max-in-flight", "16", "--queue", "64"]
    for concurrency in concurrencies:
        requests = max(8, 2 * concurrency)
        measured: dict[str, dict[str, float]] = {}
        with server(admission) as (on_url, on), server([*admission, "--max-batch-tokens", "0"]) as (off_url, off):
            runs = {"on": (on_url, on), "off": (off_url, off)}
            for name in ("on", "off") if concurrency % 2 == 0 else ("off", "on"):
                url, process = runs[name]
                calls_before = _metric(url, "llama_jev_batch_candidates_count")
                cpu_before = _cpu_seconds(process.pid)
                result = asyncio.run(_cell(url, concurrency, 20, requests, True))
                cpu = _cpu_seconds(process.pid) - cpu_before
                calls = _metric(url, "llama_jev_batch_candidates_count") - calls_before
                measured[name] = {
                    "cpu_ms": cpu * 1000 / (requests * 20),
                    "per_call": requests * 20 / max(1.0, calls),
                    "rss": _peak_rss_mb(process.pid),
                    "cps": result["cps"],
                }
        on_cell, off_cell = measured["on"], measured["off"]
        print(
            f"| {concurrency} | {on_cell['per_call']:.0f} | {on_cell['cpu_ms']:.1f} | {off_cell['cpu_ms']:.1f} | "
            f"{on_cell['cpu_ms'] / off_cell['cpu_ms'] - 1:+.0%} | {on_cell['rss']:.0f} | {off_cell['rss']:.0f} | "
            f"{on_cell['cps']:.0f} | {off_cell['cps']:.0f} |"
        )


SECTIONS = ("keepalive", "soak", "batching", "table")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="concurrency 1, 4, 16 only (table)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1, help="soak runs")
    parser.add_argument("--sides", default="before,after", help="soak: before, after or both")
    parser.add_argument("--apart", action="store_true", help="soak: one side after the other, not at once")
    parser.add_argument("--rounds", type=int, default=100, help="requests of each kind (keepalive)")
    parser.add_argument("--soak-child", metavar="BASE_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.soak_child:
        soak_child(args.soak_child, args.sessions)
        return
    chosen = args.only.split(",")
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    if "keepalive" in chosen:
        keepalive(args.rounds)
    if "soak" in chosen:
        soak(args.sessions, args.runs, args.sides.split(","), args.apart)
    if "batching" in chosen:
        batching([1, 4, 16])
    if "table" in chosen:
        table(args.quick)
        admission(16 if args.quick else 64)


if __name__ == "__main__":
    main()
