# ruff: noqa: E402
"""What the wrapper adds to a retrieval: Qdrant local mode, top-20 over 2,000 nodes.

    python benchmarks/bench_overhead.py [--nodes 2000] [--top-k 20] [--dimensions 384] [--sentences 8]
    python benchmarks/bench_overhead.py --profile ENFORCE   # cProfile's top entries instead
    python benchmarks/bench_overhead.py --against /tmp/old  # this version beside another, in one run

Times, interleaved in one run so machine noise hits every variant alike: the plain Qdrant
retriever, ``JevRetriever`` in OFF (the ACL only) and in ENFORCE with a zero-latency judge
(``ScriptedJudge``: no I/O, so what is left is the wrapper's own work: ACL, planning, checking,
classifying, copying the nodes, the record, the telemetry). The ACL is a ``MetadataAcl`` on the
tenant; every node belongs to the caller's tenant so all three variants return the same 20 nodes.

Three settings, one after the other in the same run (a meter provider, once set, stays):
``none`` (nobody listens: no tracer or meter provider, no LlamaIndex handler); ``exporter``
(OpenTelemetry's SDK with an in-memory span exporter and metric reader, each call inside an app's
span, as a web framework's instrumentation opens one: llama_jev's metrics are recorded and its
attributes written); ``openinference`` (the same, and LlamaIndex traced by OpenInference's
instrumentor as Phoenix users run it: every variant, the plain one too, exports its LlamaIndex
spans with their documents). Each round times every variant once, in an order rotated per round;
the overhead is the median over rounds of each round's ratio to the plain retrieval of the same
round (a paired ratio), beside the ratio of the medians and the paired ratio's quartiles. Each
call's process CPU time (every thread's, so the judge's pool thread too) is timed beside its wall
time: on a machine whose cores are busy with other work, the wall time of a call that hands work
to another thread includes waiting for the scheduler, its CPU time does not. The
last two settings need the ``test`` extra (opentelemetry-sdk, openinference-instrumentation-llama-index).

``--against DIR`` compares two versions of llama_jev side by side: DIR holds the other version's
``llama_jev`` package (for example ``git archive main llama_jev | tar -x -C /tmp/old``). Each
version runs in its own worker process over the same corpus (one process cannot import two
versions of a package); every round asks both workers for one round each, in an order that
alternates, so both see the same machine. Each worker's paired ratio is to its own plain
retrieval of the same round.

The corpus: 384-dimensional vectors (the size of all-MiniLM-L6-v2, the ``local`` extra's
embedding; the toy ``HashEmbedding`` fills them) and passages of 8 sentences (~700 characters,
smaller than LlamaIndex's default 1,024-token chunks) with three metadata fields. Smaller
vectors and texts make the plain retrieval cheaper and the same overhead a larger share:
``--dimensions 64 --sentences 1`` shows that case.
"""

from __future__ import annotations

import os

# One BLAS thread: on a shared machine numpy's thread pool for the vector search makes the plain
# retrieval swing by several milliseconds from run to run, drowning what is being measured. Set
# before the imports below: numpy reads it when it is first imported.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import QdrantClient

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.testing import HashEmbedding

QUERY = "What are the refund conditions for opened items?"
TOPICS = ("refund", "shipping", "warranty", "invoice", "account", "holiday", "voucher", "delivery")
CTX = RuntimeContext(user_id="bench", tenant_id="acme")


def corpus(n: int, sentences: int) -> list[TextNode]:
    def sentence(i: int, k: int) -> str:
        first, second = TOPICS[(i + k) % len(TOPICS)], TOPICS[(i * 7 + k) % len(TOPICS)]
        return f"Policy note {i}.{k} about {first} and {second}: conditions, dates and exceptions for case {i}."

    return [
        TextNode(
            id_=str(uuid.UUID(int=i + 1)),  # Qdrant wants UUIDs or integers
            text=" ".join(sentence(i, k) for k in range(sentences)),
            metadata={"tenant": "acme", "section": TOPICS[i % len(TOPICS)], "file_name": f"policy-{i % 97}.pdf"},
        )
        for i in range(n)
    ]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--dimensions", type=int, default=384, help="embedding size")
    parser.add_argument("--sentences", type=int, default=8, help="sentences per passage (~90 characters each)")
    parser.add_argument("--repeat", type=int, default=300, help="timed rounds per setting (each times every variant)")
    parser.add_argument(
        "--settings",
        default="none,exporter,openinference",
        help="comma-separated, in order: none, exporter, openinference",
    )
    parser.add_argument("--profile", choices=["plain", "OFF", "ENFORCE"], help="profile one variant (setting none)")
    parser.add_argument("--against", metavar="DIR", help="another version's llama_jev package lives in DIR")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one side of --against
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if args.against:
        compare(args)
        return
    with tempfile.TemporaryDirectory() as folder:
        bench = Bench(args, folder)
        with runtime_context(CTX):
            if args.profile:
                profile(bench.variants[args.profile], args.repeat)
                bench.close()
                return
            results = {}
            for setting in args.settings.split(","):
                variants = bench.enter(setting)
                if variants is None:
                    print(f"setting {setting} skipped: install the test extra (opentelemetry-sdk, openinference)")
                    continue
                results[setting] = measure(variants, args.repeat, bench.flush)
        bench.close()
    print(header(args))
    print(
        f"{'setting':>13} {'variant':>8} {'nodes':>5} {'wall ms':>8} {'p10 ms':>7} {'paired':>8} "
        f"{'of medians':>10} {'p25..p75 paired':>16} {'cpu ms':>7} {'cpu paired':>10}"
    )
    for setting, (counts, samples, cpu) in results.items():
        for name in samples:
            row = summary(samples, cpu, name)
            print(
                f"{setting:>13} {name:>8} {counts[name]:>5} {row['wall']:>8.3f} {row['p10']:>7.3f} "
                f"{row['paired']:>8} {row['of_medians']:>10} {row['spread']:>16} {row['cpu']:>7.3f} "
                f"{row['cpu_paired']:>10}"
            )


def header(args: argparse.Namespace) -> str:
    return (
        f"Qdrant local, {args.nodes} nodes ({args.dimensions}-d, {args.sentences} sentences each), "
        f"top-{args.top_k}, {args.repeat} interleaved rounds per setting; load average before/after "
        f"{LOAD_BEFORE} / {os.getloadavg()[0]:.2f}\n"
        "overhead: median of the per-round ratio to plain (paired); beside it the ratio of the medians"
    )


def summary(samples: dict[str, list[float]], cpu: dict[str, list[float]], name: str) -> dict[str, Any]:
    """One variant's medians (ms) and, unless it is the plain retrieval, its overheads (text)."""
    row: dict[str, Any] = {
        "wall": statistics.median(samples[name]) * 1000,
        "p10": _p10(samples[name]) * 1000,
        "cpu": statistics.median(cpu[name]) * 1000,
        "paired": "",
        "of_medians": "",
        "spread": "",
        "cpu_paired": "",
    }
    if name != "plain":
        ratios = sorted(v / p for v, p in zip(samples[name], samples["plain"], strict=True))
        row["paired"] = f"{(statistics.median(ratios) - 1) * 100:+.1f}%"
        of_medians = statistics.median(samples[name]) / statistics.median(samples["plain"])
        row["of_medians"] = f"{(of_medians - 1) * 100:+.1f}%"
        q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
        row["spread"] = f"{(q1 - 1) * 100:+.1f}..{(q3 - 1) * 100:+.1f}%"
        cpu_ratio = statistics.median(v / p for v, p in zip(cpu[name], cpu["plain"], strict=True) if p > 0)
        row["cpu_paired"] = f"{(cpu_ratio - 1) * 100:+.1f}%"
    return row


def zero_latency_judge() -> ScriptedJudge:
    """A judge answering 0.9 to everything, keeping no requests.

    Kept requests would grow the heap each call, and the garbage collector's passes over it
    (~0.2 ms per call on average here) would be billed to the wrapper. Version 0.2.0 and older
    (``--against``) cannot drop them.
    """
    try:
        return ScriptedJudge(lambda state, qid, ins: 0.9, keep_requests=False)
    except TypeError:
        return ScriptedJudge(lambda state, qid, ins: 0.9)


class Bench:
    """The index, the three variants, and the telemetry settings they are timed under."""

    def __init__(self, args: argparse.Namespace, folder: str) -> None:
        self.client = QdrantClient(path=folder)
        store = QdrantVectorStore(collection_name="kb", client=self.client)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # local mode: payload indexes have no effect
            index = VectorStoreIndex(
                corpus(args.nodes, args.sentences),
                storage_context=StorageContext.from_defaults(vector_store=store),
                embed_model=HashEmbedding(dimensions=args.dimensions),
            )
        acl = MetadataAcl(tenant_key="tenant")
        plain = index.as_retriever(similarity_top_k=args.top_k)
        judge = zero_latency_judge()

        def wrapped(mode: Mode) -> JevRetriever:
            selector = CandidateSelector(judge, ExecutionOptions(mode=mode, budget=5.0))
            return JevRetriever(
                index.as_retriever(similarity_top_k=args.top_k),
                selector,
                acl,
                candidate_limit=args.top_k,
                top_k=args.top_k,
                prefilter=False,
            )

        off, enforce = wrapped(Mode.OFF), wrapped(Mode.ENFORCE)
        self.variants: dict[str, Callable[[], Sequence[object]]] = {
            "plain": lambda: plain.retrieve(QUERY),
            "OFF": lambda: off.retrieve(QUERY),
            "ENFORCE": lambda: enforce.retrieve(QUERY),
        }
        self.telemetry: Telemetry | None = None
        self.flush: Callable[[], None] = lambda: None

    def enter(self, setting: str) -> dict[str, Callable[[], Sequence[object]]] | None:
        """The variants as timed under ``setting``, or ``None`` when the test extra is missing."""
        if setting == "none":
            self.flush = lambda: None
            return self.variants
        self.telemetry = self.telemetry or listen()
        if self.telemetry is None:
            return None
        self.flush = self.telemetry.flush
        if setting == "openinference":
            self.telemetry.trace_llamaindex()
            return self.variants
        return {name: self.telemetry.in_app_span(run) for name, run in self.variants.items()}

    def close(self) -> None:
        self.client.close()


def worker(args: argparse.Namespace) -> None:
    """One side of ``--against``: answers ``setting NAME`` and ``round SHIFT`` lines on stdin with JSON."""
    import llama_jev

    print(json.dumps({"package": os.path.dirname(llama_jev.__file__)}), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        bench = Bench(args, folder)
        variants: dict[str, Callable[[], Sequence[object]]] | None = None
        with runtime_context(CTX):
            for line in sys.stdin:
                command, value = line.split()
                if command == "setting":
                    variants = bench.enter(value)
                    counts = {} if variants is None else warm_up(variants, bench.flush)
                    print(json.dumps({"counts": counts}), flush=True)
                    continue
                assert variants is not None
                print(json.dumps(one_round(variants, int(value), bench.flush)), flush=True)
        bench.close()


def compare(args: argparse.Namespace) -> None:
    """This version and the one in ``args.against``, each in a worker, their rounds interleaved."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"before": os.path.abspath(args.against), "after": here}
    command = [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]]
    workers: dict[str, subprocess.Popen[str]] = {}
    for side, path in sides.items():
        env = {**os.environ, "PYTHONPATH": path}
        workers[side] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(side: str, line: str) -> Any:
        process = workers[side]
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(line + "\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())

    def read(side: str) -> Any:
        assert workers[side].stdout is not None
        return json.loads(workers[side].stdout.readline())  # type: ignore[union-attr]

    packages = {side: read(side)["package"] for side in sides}
    results: dict[str, dict[str, tuple[dict[str, int], dict[str, list[float]], dict[str, list[float]]]]] = {}
    try:
        for setting in args.settings.split(","):
            counts = {side: ask(side, f"setting {setting}")["counts"] for side in sides}
            if not all(counts.values()):
                print(f"setting {setting} skipped: install the test extra (opentelemetry-sdk, openinference)")
                continue
            samples: dict[str, dict[str, list[float]]] = {side: {name: [] for name in VARIANTS} for side in sides}
            cpu: dict[str, dict[str, list[float]]] = {side: {name: [] for name in VARIANTS} for side in sides}
            order = list(sides)
            for round_ in range(args.repeat):
                for side in order if round_ % 2 == 0 else order[::-1]:
                    timed = ask(side, f"round {round_ % len(VARIANTS)}")
                    for name, (wall, process_cpu) in timed.items():
                        samples[side][name].append(wall)
                        cpu[side][name].append(process_cpu)
            results[setting] = {side: (counts[side], samples[side], cpu[side]) for side in sides}
    finally:
        for process in workers.values():
            assert process.stdin is not None
            process.stdin.close()
            process.wait()
    print(header(args))
    for side, path in packages.items():
        print(f"{side}: {path}")
    print(
        f"{'setting':>13} {'variant':>8} | {'before ms':>9} {'paired':>8} {'cpu ms':>7} {'cpu paired':>10} | "
        f"{'after ms':>9} {'paired':>8} {'p25..p75':>14} {'cpu ms':>7} {'cpu paired':>10}"
    )
    for setting, by_side in results.items():
        for name in VARIANTS:
            before = summary(by_side["before"][1], by_side["before"][2], name)
            after = summary(by_side["after"][1], by_side["after"][2], name)
            print(
                f"{setting:>13} {name:>8} | {before['wall']:>9.3f} {before['paired']:>8} {before['cpu']:>7.3f} "
                f"{before['cpu_paired']:>10} | {after['wall']:>9.3f} {after['paired']:>8} {after['spread']:>14} "
                f"{after['cpu']:>7.3f} {after['cpu_paired']:>10}"
            )


VARIANTS = ("plain", "OFF", "ENFORCE")


LOAD_BEFORE = f"{os.getloadavg()[0]:.2f}"


def measure(
    variants: dict[str, Callable[[], Sequence[object]]], repeat: int, flush: Callable[[], None]
) -> tuple[dict[str, int], dict[str, list[float]], dict[str, list[float]]]:
    """Warm up, then ``repeat`` rounds timing every variant once, the order rotated each round."""
    counts = warm_up(variants, flush)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(repeat):
        for name, (wall, process_cpu) in one_round(variants, round_ % len(variants), flush).items():
            samples[name].append(wall)
            cpu[name].append(process_cpu)
    return counts, samples, cpu


def warm_up(variants: dict[str, Callable[[], Sequence[object]]], flush: Callable[[], None]) -> dict[str, int]:
    """Run every variant 20 times; how many nodes each returns."""
    counts = {name: len(run()) for name, run in variants.items()}
    for _ in range(20):
        for run in variants.values():
            run()
        flush()
    return counts


def one_round(
    variants: dict[str, Callable[[], Sequence[object]]], shift: int, flush: Callable[[], None]
) -> dict[str, tuple[float, float]]:
    """Each variant's wall and process CPU time, once, starting from the ``shift``-th."""
    names = list(variants)
    timed = {}
    for name in names[shift:] + names[:shift]:
        run = variants[name]
        started, cpu_started = time.perf_counter(), time.process_time()
        run()
        timed[name] = (time.perf_counter() - started, time.process_time() - cpu_started)
    flush()  # outside the timed calls: the exported spans are dropped, not accumulated
    return timed


class Telemetry:
    """OpenTelemetry's SDK, exporting to memory; LlamaIndex traced by OpenInference on demand."""

    def __init__(self) -> None:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.tracer_provider.get_tracer("bench")
        self.reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))

    def in_app_span(self, run: Callable[[], Sequence[object]]) -> Callable[[], Sequence[object]]:
        def traced() -> Sequence[object]:
            with self.tracer.start_as_current_span("request"):
                return run()

        return traced

    def trace_llamaindex(self) -> None:
        from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

        LlamaIndexInstrumentor().instrument(tracer_provider=self.tracer_provider)

    def flush(self) -> None:
        """Drop what was exported (outside the timed calls), so memory does not grow."""
        self.exporter.clear()
        self.reader.get_metrics_data()


def listen() -> Telemetry | None:
    try:
        import openinference.instrumentation.llama_index  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
    except ImportError:
        return None
    return Telemetry()


def profile(run: Callable[[], object], repeat: int) -> None:
    import cProfile
    import pstats

    for _ in range(50):
        run()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        run()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats("llama_jev", 25)


def _p10(values: list[float]) -> float:
    return sorted(values)[len(values) // 10]


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(arguments())
    else:
        main()
