"""``python -m llama_jev.calibrate`` on large SHADOW logs: wall time and peak memory.

    python benchmarks/bench_calibrate.py [--records 10000 100000 1000000] [--labels 20000]
        [--candidates 10] [--folder /tmp/bench-calibrate]

Writes synthetic decision records (``--candidates`` scores each, as a ``JsonlObserver`` writes
them) and ``--labels`` labels on the first records, then runs the CLI as a user does, once per
log size, in a child process: wall time, and the child's peak resident memory (its own
``ru_maxrss``, read with ``os.wait4``). Then the wall time of ``--help`` (median of 5), the
cost of starting the command at all. Records are streamed, so memory should grow with the
labels, not the records (goal: 10^6 records under 60 s and 300 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_log(folder: Path, records: int, labels: int, candidates: int, seed: int = 0) -> tuple[Path, Path]:
    """Records and labels from a judge whose relevance rate at p is p ** 1.5 (a bit over-confident)."""
    rng = random.Random(seed)
    records_path, labels_path = folder / f"records-{records}.jsonl", folder / f"labels-{records}-{labels}.jsonl"
    labelled = -(-labels // candidates)  # decisions whose candidates carry the labels
    with records_path.open("w", encoding="utf-8") as out, labels_path.open("w", encoding="utf-8") as label_out:
        written = 0
        for d in range(records):
            decision_id = f"{d:08x}{rng.getrandbits(96):024x}"
            scores = {f"n{d}-{i}": round(rng.random(), 4) for i in range(candidates)}
            selected = sorted((n for n, p in scores.items() if p >= 0.8), key=lambda n: -scores[n])
            rejected = sorted((n for n, p in scores.items() if p <= 0.2), key=lambda n: -scores[n])
            uncertain = sorted((n for n in scores if n not in selected and n not in rejected), key=lambda n: -scores[n])
            status = "decided" if selected or not uncertain else "inconclusive"
            record = {
                "decision_id": decision_id,
                "purpose": "retrieval_relevance",
                "version": "v1",
                "mode": "shadow",
                "status": status,
                "reason": "CLASSIFIED",
                "elapsed_ms": round(rng.uniform(20, 200), 3),
                "candidates": candidates,
                "requests": 1,
                "model": "jev-bench",
                "selected": selected,
                "uncertain": uncertain,
                "rejected": rejected,
                "scores": scores,
                "retrieved": candidates,
                "denied": 0,
                "query_key": None,
                "queue_ms": 0.0,
                "created_at": "2026-12-03T12:00:00.000+00:00",
            }
            out.write(json.dumps(record) + "\n")
            if d < labelled:
                for node_id, p in scores.items():
                    if written < labels:
                        relevant = rng.random() < p**1.5
                        label_out.write(
                            json.dumps({"decision_id": decision_id, "node_id": node_id, "relevant": relevant}) + "\n"
                        )
                        written += 1
    return records_path, labels_path


def run(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak resident MB and exit status of ``python -m llama_jev.calibrate args``."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_jev.calibrate", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, process.returncode  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--labels", type=int, default=20_000)
    parser.add_argument("--candidates", type=int, default=10)
    parser.add_argument("--folder", default="/tmp/bench-calibrate")
    args = parser.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)

    print(f"calibrate: {args.labels} labels, {args.candidates} candidates per record (python {sys.version.split()[0]})")
    print(f"{'records':>10} {'file MB':>8} {'wall s':>8} {'peak MB':>8} {'exit':>5}")
    for count in args.records:
        records, labels = write_log(folder, count, args.labels, args.candidates)
        wall, peak, code = run(
            ["--records", str(records), "--labels", str(labels), "--target-precision", "0.6", "--min-npv", "0.8",
             "--json", "--report", str(folder / f"report-{count}.html")]
        )  # fmt: skip
        size = records.stat().st_size / 1e6
        print(f"{count:>10} {size:>8.0f} {wall:>8.1f} {peak:>8.0f} {code:>5}", flush=True)
        records.unlink()
        labels.unlink()

    times = []
    for _ in range(5):
        wall, _, _ = run(["--help"])
        times.append(wall)
    print(f"python -m llama_jev.calibrate --help: {statistics.median(times):.2f} s (median of 5)")


if __name__ == "__main__":
    main()
