"""The calibration CLI, ``python -m llama_jev.calibrate``: thresholds from SHADOW records and labels.

    python -m llama_jev.calibrate --records decisions.jsonl --labels labels.jsonl \\
        [--target-precision 0.9] [--min-npv 0.95] [--holdout 0.3] [--seed 0] \\
        [--report report.html] [--json] [--purpose P] [--version V] [--query-key-secret S]

Exit status: 0 thresholds recommended (chosen on the calibration split and proven on the
held-out split); 1 no threshold meets the targets on the data, or the candidate did not hold on
the held-out split (``candidate`` and ``reason`` say which and why); 2 too little data (fewer
than 50 joined labels, or fewer than 10 in a class) or unusable input (the message names the file
and line of every bad label).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from llama_jev.calibration.analysis import calibrate
from llama_jev.calibration.html import CliFiles
from llama_jev.calibration.records import CalibrationInputError, InsufficientLabelsError
from llama_jev.calibration.report import CalibrationReport
from llama_jev.calibration.statistics import format_threshold
from llama_jev.core.records import QUERY_KEY_SECRET_ENVIRONMENT

__all__ = ["main"]

EXIT_RECOMMENDED, EXIT_TARGETS_NOT_MET, EXIT_INPUT = 0, 1, 2


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llama_jev.calibrate",
        description=(
            "Recommend reject/accept thresholds from decision records (JSONL from JsonlObserver) and labels "
            '(JSONL: {"node_id", "relevant", and "decision_id" or "query"}). Chosen on a calibration split, '
            "measured on a held-out split."
        ),
        epilog="Exit status: 0 recommended, 1 targets not met, 2 too little data or unusable input.",
    )
    parser.add_argument("--records", required=True, help="decision records, one JSON object per line")
    parser.add_argument("--labels", required=True, help="labels, one JSON object per line (or a filled .csv sheet)")
    parser.add_argument(
        "--target-precision",
        type=_share,
        default=0.9,
        help="precision the accept threshold must reach at a 95%% lower bound (default 0.9)",
    )
    parser.add_argument(
        "--min-npv",
        type=_share,
        default=0.95,
        help="negative predictive value the reject threshold must reach at a 95%% lower bound (default 0.95)",
    )
    parser.add_argument(
        "--holdout",
        type=_share,
        default=0.3,
        help="share of queries/decisions held out to measure the choice (default 0.3)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration/held-out split (default 0)")
    parser.add_argument("--report", metavar="PATH", help="write the HTML report (self-contained) to PATH")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--purpose", help="use only records of this purpose (needed when the log mixes several)")
    parser.add_argument("--version", help="use only records of this version (needed when the log mixes several)")
    parser.add_argument(
        "--query-key-secret",
        help=(
            "secret the records' query_key was written with, needed for labels by query "
            f"(default: ${QUERY_KEY_SECRET_ENVIRONMENT})"
        ),
    )
    return parser


def _summary(report: CalibrationReport) -> str:
    lines = [
        f"labels: {report.labels} joined ({report.relevant} relevant, {report.irrelevant} irrelevant); "
        f"{report.split.calibration_labels} for choosing, {report.split.holdout_labels} held out "
        f"(split by {report.split.unit})",
        f"records: {report.log.records} ({report.log.errors} judge errors, never used as scores); "
        f"unjoined labels: {report.unjoined.count}; disagreeing duplicates: {report.conflicts.count}"
        + (f"; rows with no relevant value yet: {report.unlabelled}" if report.unlabelled else ""),
        f"judge: ECE {report.ece:.3f} (gap between p and the observed share relevant; 0 is perfect), "
        f"Brier {report.brier:.3f} (mean squared error of p; lower is better)",
    ]
    if report.agreement is not None:
        agreement = report.agreement
        lines.append(
            f"labellers: Cohen's kappa {agreement.kappa:.2f} on {agreement.pairs} pairs labelled by both "
            f"({', '.join(agreement.labellers)}); {agreement.disagreements} disagreements left out"
        )
    if report.recommended is not None:
        lines.append(
            f"recommended: reject={format_threshold(report.recommended.reject)} "
            f"accept={format_threshold(report.recommended.accept)} (proven on the held-out split)"
        )
    elif report.candidate is not None:
        lines.append(
            f"NOT recommended: candidate reject={format_threshold(report.candidate.reject)} "
            f"accept={format_threshold(report.candidate.accept)} is {report.reason}"
        )
    else:
        lines.append(f"no recommendation: {report.reason}")
    held = report.holdout
    if held is not None:
        prefix = "held out" if report.recommended is not None else "held out, at the candidate"

        def show(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.3f}"

        lines.append(
            f"{prefix}: precision {show(held.precision)} (95% lower {show(held.precision_lower)}), "
            f"NPV {show(held.npv)}, coverage {held.coverage:.3f}, uncertain {held.uncertain:.3f} "
            f"({held.selected} selected, {held.rejected} rejected of {held.labels})"
        )
    if report.enforce is not None:
        at = "at the recommendation" if report.recommended is not None else "at the candidate"
        lines.append(
            f"ENFORCE {at}, on the whole log: answered {report.enforce.answered:.1%}, "
            f"empty {report.enforce.empty:.1%}, "
            f"inconclusive {report.enforce.inconclusive:.1%}, unavailable {report.enforce.unavailable:.1%}"
        )
    return "\n".join(lines)


def _failure(message: str, labels: int, labels_needed: int | None = None) -> dict[str, Any]:
    # every key of a successful run, so a consumer reads one shape; nothing was measured
    return {
        "labels": labels,
        "labels_needed": labels_needed,
        "recommended": None,
        "candidate": None,
        "reason": message,
        "holdout": None,
        "ece": None,
        "brier": None,
        "thresholds": [],
        "agreement": None,
        "error": message,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit status."""
    args = _parser().parse_args(argv)
    try:
        report = calibrate(
            args.records,
            args.labels,
            target_precision=args.target_precision,
            min_npv=args.min_npv,
            holdout=args.holdout,
            seed=args.seed,
            purpose=args.purpose,
            version=args.version,
            query_key_secret=args.query_key_secret,
        )
    except CalibrationInputError as error:
        short = error if isinstance(error, InsufficientLabelsError) else None
        print(f"llama_jev.calibrate: {error}", file=sys.stderr)
        if args.json:
            print(
                json.dumps(_failure(str(error), short.labels if short else 0, short.labels_needed if short else None))
            )
        return EXIT_INPUT
    if args.report:
        try:
            files = CliFiles(args.records, args.labels, args.report, purpose=args.purpose, version=args.version)
            report.write_html(args.report, cli=True, files=files)
        except OSError as error:
            message = f"cannot write the report {args.report}: {error.strerror}"
            print(f"llama_jev.calibrate: {message}", file=sys.stderr)
            if args.json:
                print(json.dumps(_failure(message, report.labels)))
            return EXIT_INPUT
    if args.json:
        print(report.to_json())
    else:
        print(_summary(report))
        if args.report:
            print(f"report: {args.report}")
    return report.exit_code
