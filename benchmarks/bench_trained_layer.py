"""A trained exit layer costs no time: the shipped judge and the trained candidate, interleaved.

Run: ``python benchmarks/bench_trained_layer.py`` (needs ``pip install -e ".[local]"`` in the clone;
offline). The trained candidate (``judge_training/trained``, written by ``train_local_judge.py``)
merges its layer-9 delta into the weights at load; the graph it runs has the same shape as the
shipped judge's. Both judge the same workloads through ``CandidateSelector`` in alternating rounds
(shipped, trained, shipped, ...), so a machine shared with other work slows both alike; the table
gives each one's median and the ratio of the medians, against the bars of ``bench_local.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# hard_set (the trained candidate's loader) lives with the judge's training (judge_training/).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "judge_training"))

from bench_local import BARS, PASSAGES, QUERY
from hard_set import trained_candidate

from llama_jev.core.records import ExecutionOptions, Mode
from llama_jev.engine.selector import RELEVANCE_QUESTION, Candidate, CandidateSelector
from llama_jev.local.relevance import LocalRelevanceJudge


def call(judge: LocalRelevanceJudge, passages: list[str]) -> Callable[[], object]:
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE, budget=600.0))
    candidates = [Candidate(f"c{index}", passage) for index, passage in enumerate(passages)]
    return lambda: selector.select(QUERY, RELEVANCE_QUESTION, candidates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds per workload (default 9)")
    args = parser.parse_args()
    started = time.perf_counter()
    shipped = LocalRelevanceJudge()
    load_shipped = time.perf_counter() - started
    started = time.perf_counter()
    trained = LocalRelevanceJudge(parameters=trained_candidate())
    load_trained = time.perf_counter() - started
    chunk = " ".join(PASSAGES * 2)
    (chunk_tokens,) = shipped.count_tokens([chunk])
    workloads = {
        "short": ("20 short candidates (~25 tokens)", [PASSAGES[i % len(PASSAGES)] for i in range(20)]),
        "chunks": (f"20 candidates of {chunk_tokens} tokens", [chunk] * 20),
    }
    rows = [
        f"| load (the first one checks the model file's sha256) | {load_shipped:.2f} s | {load_trained:.2f} s | | |"
    ]
    for key, (label, passages) in workloads.items():
        actions = {"shipped": call(shipped, passages), "trained": call(trained, passages)}
        for action in actions.values():
            action()  # warm-up
        times: dict[str, list[float]] = {"shipped": [], "trained": []}
        for _ in range(args.rounds):
            for name, action in actions.items():
                begun = time.perf_counter()
                action()
                times[name].append(time.perf_counter() - begun)
        medians = {name: statistics.median(values) for name, values in times.items()}
        rows.append(
            f"| {label} | {medians['shipped']:.3f} s | {medians['trained']:.3f} s | "
            f"{medians['trained'] / medians['shipped']:.2f} | <= {BARS[key][0]:g} s |"
        )
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; median of {args.rounds} "
        "alternating rounds through CandidateSelector\n"
    )
    print("| measure | shipped (local-relevance-v2) | trained candidate (layer 9 + delta) | trained / shipped | bar |")
    print("|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
