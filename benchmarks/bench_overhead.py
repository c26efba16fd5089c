# ruff: noqa: E402
"""What the wrapper adds to a retrieval: Qdrant local mode, top-20 over 2,000 nodes.

    python benchmarks/bench_overhead.py [--nodes 2000] [--top-k 20] [--dimensions 384] [--sentences 8]
    python benchmarks/bench_overhead.py --profile ENFORCE   # cProfile's top entries instead

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
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable

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


def main() -> None:
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
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        client = QdrantClient(path=folder)
        store = QdrantVectorStore(collection_name="kb", client=client)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # local mode: payload indexes have no effect
            index = VectorStoreIndex(
                corpus(args.nodes, args.sentences),
                storage_context=StorageContext.from_defaults(vector_store=store),
                embed_model=HashEmbedding(dimensions=args.dimensions),
            )
        acl = MetadataAcl(tenant_key="tenant")
        plain = index.as_retriever(similarity_top_k=args.top_k)
        judge = ScriptedJudge(lambda state, qid, ins: 0.9)

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
        variants: dict[str, Callable[[], list[object]]] = {
            "plain": lambda: plain.retrieve(QUERY),  # type: ignore[dict-item]
            "OFF": lambda: off.retrieve(QUERY),  # type: ignore[dict-item]
            "ENFORCE": lambda: enforce.retrieve(QUERY),  # type: ignore[dict-item]
        }
        with runtime_context(CTX):
            if args.profile:
                profile(variants[args.profile], args.repeat)
                client.close()
                return
            results = {}
            telemetry = None
            for setting in args.settings.split(","):
                if setting == "none":
                    results[setting] = measure(variants, args.repeat, lambda: None)
                    continue
                telemetry = telemetry or listen()
                if telemetry is None:
                    print(f"setting {setting} skipped: install the test extra (opentelemetry-sdk, openinference)")
                    continue
                if setting == "openinference":
                    telemetry.trace_llamaindex()
                    results[setting] = measure(variants, args.repeat, telemetry.flush)
                else:
                    in_span = {name: telemetry.in_app_span(run) for name, run in variants.items()}
                    results[setting] = measure(in_span, args.repeat, telemetry.flush)
        client.close()

    print(
        f"Qdrant local, {args.nodes} nodes ({args.dimensions}-d, {args.sentences} sentences each), "
        f"top-{args.top_k}, {args.repeat} interleaved rounds per setting; load average before/after "
        f"{LOAD_BEFORE} / {os.getloadavg()[0]:.2f}"
    )
    print("overhead: median of the per-round ratio to plain (paired); beside it the ratio of the medians")
    print(
        f"{'setting':>13} {'variant':>8} {'nodes':>5} {'wall ms':>8} {'p10 ms':>7} {'paired':>8} "
        f"{'of medians':>10} {'p25..p75 paired':>16} {'cpu ms':>7} {'cpu paired':>10}"
    )
    for setting, (counts, samples, cpu) in results.items():
        base = statistics.median(samples["plain"])
        for name in variants:
            median = statistics.median(samples[name])
            if name == "plain":
                paired = of_medians = spread = cpu_paired = ""
            else:
                ratios = sorted(v / p for v, p in zip(samples[name], samples["plain"], strict=True))
                paired = f"{(statistics.median(ratios) - 1) * 100:+.1f}%"
                of_medians = f"{(median / base - 1) * 100:+.1f}%"
                q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
                spread = f"{(q1 - 1) * 100:+.1f}..{(q3 - 1) * 100:+.1f}%"
                cpu_ratio = statistics.median(v / p for v, p in zip(cpu[name], cpu["plain"], strict=True) if p > 0)
                cpu_paired = f"{(cpu_ratio - 1) * 100:+.1f}%"
            cpu_ms = statistics.median(cpu[name]) * 1000
            print(
                f"{setting:>13} {name:>8} {counts[name]:>5} {median * 1000:>8.3f} {_p10(samples[name]) * 1000:>7.3f} "
                f"{paired:>8} {of_medians:>10} {spread:>16} {cpu_ms:>7.3f} {cpu_paired:>10}"
            )


LOAD_BEFORE = f"{os.getloadavg()[0]:.2f}"


def measure(
    variants: dict[str, Callable[[], list[object]]], repeat: int, flush: Callable[[], None]
) -> tuple[dict[str, int], dict[str, list[float]], dict[str, list[float]]]:
    """Warm up, then ``repeat`` rounds timing every variant once, the order rotated each round."""
    counts = {name: len(run()) for name, run in variants.items()}
    names = list(variants)
    for _ in range(20):  # warm-up
        for run in variants.values():
            run()
        flush()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            run = variants[name]
            started, cpu_started = time.perf_counter(), time.process_time()
            run()
            samples[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
        flush()  # outside the timed calls: the exported spans are dropped, not accumulated
    return counts, samples, cpu


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

    def in_app_span(self, run: Callable[[], list[object]]) -> Callable[[], list[object]]:
        def traced() -> list[object]:
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
    main()
