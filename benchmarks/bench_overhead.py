# ruff: noqa: E402
"""What the wrapper adds to a retrieval: Qdrant local mode, top-20 over 2,000 nodes.

    python benchmarks/bench_overhead.py [--nodes 2000] [--top-k 20] [--dimensions 384] [--sentences 8]

Times, interleaved in one run so machine noise hits every variant alike: the plain Qdrant
retriever, ``JevRetriever`` in OFF (the ACL only) and in ENFORCE with a zero-latency judge
(``ScriptedJudge``: no I/O, so what is left is the wrapper's own work: ACL, planning, checking,
classifying, copying the nodes, the record). Prints the median and the 10th percentile of each,
and the overhead as a percentage of the plain retrieval. The ACL is a ``MetadataAcl`` on the
tenant; every node belongs to the caller's tenant so all three variants return the same 20 nodes.

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
    parser.add_argument("--repeat", type=int, default=300, help="timed rounds (each times every variant once)")
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
        variants: dict[str, Callable[[], object]] = {
            "plain": lambda: plain.retrieve(QUERY),
            "OFF": lambda: off.retrieve(QUERY),
            "ENFORCE": lambda: enforce.retrieve(QUERY),
        }
        with runtime_context(CTX):
            counts = {name: len(run()) for name, run in variants.items()}  # type: ignore[arg-type]
            for _ in range(20):  # warm-up
                for run in variants.values():
                    run()
            samples: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.repeat):
                for name, run in variants.items():
                    started = time.perf_counter()
                    run()
                    samples[name].append(time.perf_counter() - started)
        client.close()

    print(
        f"Qdrant local, {args.nodes} nodes ({args.dimensions}-d, {args.sentences} sentences each), "
        f"top-{args.top_k}, {args.repeat} interleaved rounds"
    )
    print("median, and p10 (the fastest tenth: what is left when other processes do not interrupt)")
    print(f"{'variant':>8} {'nodes':>5} {'median ms':>10} {'overhead':>9} {'p10 ms':>8} {'overhead':>9}")
    base, base_fast = statistics.median(samples["plain"]), _p10(samples["plain"])
    for name in variants:
        median, fast = statistics.median(samples[name]), _p10(samples[name])
        share = "" if name == "plain" else f"{(median - base) / base * 100:+.1f}%"
        fast_share = "" if name == "plain" else f"{(fast - base_fast) / base_fast * 100:+.1f}%"
        print(f"{name:>8} {counts[name]:>5} {median * 1000:>10.3f} {share:>9} {fast * 1000:>8.3f} {fast_share:>9}")


def _p10(values: list[float]) -> float:
    return sorted(values)[len(values) // 10]


if __name__ == "__main__":
    main()
