"""Step 3: calibrate before you enforce. ``python -m examples.refund_policy.calibrate``.

1. SHADOW: a small golden set shipped with the example (``golden.json``: questions and the
   documents a person marked relevant) is asked by every user through a SHADOW retriever;
   ``collect`` turns that into decision records and labels (ids and probabilities only), and
   writes the labelling sample (``samples.jsonl``: each question and the passages that user may
   read, mode 0600) from which a blind, shuffled sheet is drawn (``sheet.csv``).
2. Label: in production a person labels the sheet in the browser
   (``python -m llama_jev.label sheet.csv --out my-labels.jsonl``); here the shipped golden
   labels stand in for that person (the tests drive the page in a real browser with them).
3. Calibrate: ``calibrate`` chooses ``reject`` / ``accept`` on one part of the questions and
   proves them on the rest; the HTML report is written next to the records.
4. ENFORCE with the recommended thresholds, or, when the labels do not prove any, stay in
   SHADOW and say why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from llama_index.core import VectorStoreIndex

from examples.plain_text import plain
from examples.refund_policy import kb, store
from examples.refund_policy.failures import EXIT_EVERY_JUDGEMENT_FAILED, watching_failures
from examples.refund_policy.ingest import ensure_collection
from examples.refund_policy.models import choose_embedding, choose_judge
from examples.refund_policy.query import BUDGET_SECONDS, CANDIDATE_LIMIT, TOP_K, CollectionMissingError, open_index
from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    Judge,
    Mode,
    RetrievalInconclusiveError,
    RetrievalUnavailableError,
    runtime_context,
)
from llama_jev.calibration import (
    CalibrationReport,
    CliFiles,
    Collected,
    GoldenQuery,
    calibrate,
    collect,
    format_threshold,
    write_sample_sheet,
)

GOLDEN = Path(__file__).resolve().parent / "golden.json"
VERSION = "refund-policy-example-v1"
# The records' query_key lets the split keep each question whole (all users' decisions on one
# side). A real deployment keeps this secret out of the code (LLAMA_JEV_QUERY_KEY_SECRET).
QUERY_KEY_SECRET = "refund-policy-example-not-a-real-secret"
# A small labelled set cannot prove 0.9 at a 95% lower bound (even 22 of 22 correct only shows
# 0.89), so the example asks for what ~150 labels can support; say so when you copy it.
TARGET_PRECISION = 0.8
MIN_NPV = 0.9


def load_golden(path: Path = GOLDEN) -> list[tuple[str, frozenset[str]]]:
    """The golden questions and the node ids of the documents labelled relevant to each."""
    entries = json.loads(path.read_text(encoding="utf-8"))
    return [(entry["query"], frozenset(kb.BY_KEY[key].node_id for key in entry["relevant"])) for entry in entries]


def retriever_for(
    index: VectorStoreIndex, judge: Judge, mode: Mode, *, reject: float = 0.2, accept: float = 0.8, top_k: int = TOP_K
) -> JevRetriever:
    """The example's retriever (ACL pre-filtered in Qdrant, then judged) with explicit thresholds."""
    options = ExecutionOptions(mode=mode, budget=BUDGET_SECONDS, version=VERSION, query_key_secret=QUERY_KEY_SECRET)
    selector = CandidateSelector(judge, options, reject=reject, accept=accept)
    return JevRetriever.from_index(
        index, selector, kb.ACL, candidate_limit=CANDIDATE_LIMIT, top_k=top_k, prefilter=True
    )


def run_golden(
    index: VectorStoreIndex, judge: Judge, *, samples: Path | None = None, show_progress: bool = False
) -> Collected:
    """Every user asks every golden question in SHADOW; every passage they may read is judged.

    ``top_k`` = the candidate limit, so the judge sees every readable passage, as ENFORCE would.
    With ``samples``, each question and its readable passages go there too, for labelling.
    """
    retriever = retriever_for(index, judge, Mode.SHADOW, top_k=CANDIDATE_LIMIT)
    golden = [GoldenQuery(query, relevant, ctx=user.context) for query, relevant in load_golden() for user in kb.USERS]
    return collect(retriever, golden, samples=samples, show_progress=show_progress)


def enforce_line(index: VectorStoreIndex, judge: Judge, user: kb.User, reject: float, accept: float) -> str:
    """What ``user`` gets for the example's question under ENFORCE with the given thresholds."""
    retriever = retriever_for(index, judge, Mode.ENFORCE, reject=reject, accept=accept)
    with runtime_context(user.context):
        try:
            nodes = retriever.retrieve(kb.QUESTION)
        except RetrievalInconclusiveError:
            return f"  {user.name:<6} INCONCLUSIVE: something was uncertain, nothing clearly relevant"
        except RetrievalUnavailableError as error:
            return f"  {user.name:<6} UNAVAILABLE: {error}"
    keys = [kb.BY_ID[node.node.node_id].key for node in nodes]
    return f"  {user.name:<6} receives {keys or 'nothing (no evidence)'}"


def summary(report: CalibrationReport) -> list[str]:
    """The numbers of the calibration run, as printed."""
    lines = [
        f"Labels       : {report.labels} joined ({report.relevant} relevant, {report.irrelevant} irrelevant); "
        f"{report.split.calibration_labels} to choose on, {report.split.holdout_labels} held out "
        f"({report.split.holdout_groups} of {report.split.holdout_groups + report.split.calibration_groups} questions)",
        f"Judge        : ECE {report.ece:.3f}, Brier {report.brier:.3f} (on all labels)",
        f"Targets      : precision >= {TARGET_PRECISION}, NPV >= {MIN_NPV} (one-sided 95% Wilson lower bounds)",
    ]
    if report.recommended is None:
        candidate = report.candidate
        if candidate is not None:
            lines.append(
                f"Candidate    : reject = {format_threshold(candidate.reject)}, accept = "
                f"{format_threshold(candidate.accept)} (chosen on the calibration split)"
            )
        lines.append(f"Recommended  : none. {report.reason}")
    else:
        reject, accept = format_threshold(report.recommended.reject), format_threshold(report.recommended.accept)
        lines.append(f"Recommended  : reject = {reject}, accept = {accept} (proven on the held-out questions)")
    held = report.holdout
    if held is not None:

        def show(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.3f}"

        lines.append(
            f"Held out     : precision {show(held.precision)} of {held.selected} selected, NPV {show(held.npv)} of "
            f"{held.rejected} rejected, coverage {held.coverage:.3f}, uncertain {held.uncertain:.3f} "
            f"({held.labels} labels)"
        )
    if report.enforce is not None:
        lines.append(
            f"Per question : ENFORCE would have answered {report.enforce.answered:.0%}, returned empty "
            f"{report.enforce.empty:.0%}, been inconclusive {report.enforce.inconclusive:.0%}"
        )
    return lines


class EveryJudgementFailedError(RuntimeError):
    """Every judgement of the golden run failed: there is nothing to calibrate (the message says why)."""


def steps(
    index: VectorStoreIndex,
    judge: Judge,
    out: Path,
    say: Callable[[str], object] = print,
    *,
    show_progress: bool = False,
) -> bool:
    """SHADOW on the golden set -> sheet -> calibrate -> ENFORCE, or stay in SHADOW; whether ENFORCE was earned.

    Raises:
        EveryJudgementFailedError: the judge failed on every golden question (a wrong key, no server).
    """
    say("\n1. SHADOW: the golden set, asked by every user")
    started = time.perf_counter()
    records, labels, samples = out / "records.jsonl", out / "labels.jsonl", out / "samples.jsonl"
    samples.unlink(missing_ok=True)  # a new run, a new sample
    with watching_failures() as failures:
        collected = run_golden(index, judge, samples=samples, show_progress=show_progress)
    failed = failures.every_judgement_failed(collected.records)
    if failed is not None:
        raise EveryJudgementFailedError(f"{failed} Nothing can be calibrated from failed judgements.")
    collected.write(records, labels)
    say(
        f"   {len(collected.records)} decisions, {len(collected.labels)} labelled passages in "
        f"{time.perf_counter() - started:.1f} s -> {records}, {labels}"
    )
    sheet = write_sample_sheet(samples, out / "sheet.csv", size=300)
    say(f"   labelling sample -> {samples}; a blind, shuffled sheet of {sheet.rows} pairs -> {sheet.path}")

    say("\n2. Label (here the shipped golden labels stand in for the person)")
    say(f"   yourself: python -m llama_jev.label {sheet.path} --out {out / 'my-labels.jsonl'} --records {records}")

    say("\n3. Calibrate")
    report = calibrate(records, labels, target_precision=TARGET_PRECISION, min_npv=MIN_NPV)
    # The report's commands name this run's files (no placeholders): the same check again with
    # python -m llama_jev.calibrate, a sheet of pairs not labelled yet from this sample.
    html_path = out / "report.html"
    files = CliFiles(records=str(records), labels=str(labels), report=str(html_path), samples=str(samples))
    html = report.write_html(html_path, cli=True, files=files)
    for line in summary(report):
        say(f"   {line}")
    say(f"   report: {html}")

    if report.recommended is None:
        say("\n4. Stay in SHADOW: the labels prove no thresholds for this judge (see the reason above)")
        return False
    reject, accept = report.recommended.reject, report.recommended.accept
    say(f"\n4. ENFORCE with reject={format_threshold(reject)}, accept={format_threshold(accept)}: {kb.QUESTION!r}")
    for user in kb.USERS:
        say(enforce_line(index, judge, user, reject, accept))
    return True


@store.reports_unreachable
def main(argv: list[str] | None = None) -> int:
    """Run the three steps with the example's judge and print them (0 either way: staying in SHADOW
    when the labels say so is the walkthrough working, not failing; 1 when every judgement failed)."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.refund_policy.calibrate",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--storage", help=store.STORAGE_HELP)
    parser.add_argument(
        "--out", help="where records, labels, the sheet and report.html go (default: <storage>/calibration)"
    )
    args = parser.parse_args(argv)
    embedding = choose_embedding()
    judge = choose_judge()
    options = store.client_options(args.storage)
    out = Path(args.out) if args.out else Path(options.get("path", store.DEFAULT_STORAGE)) / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    print(f"Judge        : {judge.label}")
    print(f"Vector store : {store.describe(options)}")

    with store.connect(args.storage) as client:
        ensure_collection(client, embedding.component)
    with ExitStack() as stack:
        close = getattr(judge.component, "close", None)
        if callable(close):
            stack.callback(close)
        client = stack.enter_context(store.connect(args.storage))
        try:
            index = open_index(client, embedding.component)
        except CollectionMissingError as error:
            print(error)
            return 2
        try:
            steps(index, judge.component, out, show_progress=True)
        except EveryJudgementFailedError as error:
            print(f"\n{error}", file=sys.stderr)
            return EXIT_EVERY_JUDGEMENT_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
