"""``calibrate``: records + labels -> thresholds chosen on one split, proven on the other."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from llama_jev.calibration.join import JoinedLabels, join_labels
from llama_jev.calibration.labels import LabelsInput, load_labels
from llama_jev.calibration.mapping import fit_platt
from llama_jev.calibration.records import (
    CODE_STATUS,
    InsufficientLabelsError,
    RecordsInput,
    ScannedRecords,
    scan_records,
)
from llama_jev.calibration.report import (
    AcceptThreshold,
    AgreementSummary,
    CalibrationReport,
    EnforceReplay,
    HoldoutResult,
    LogSummary,
    ProblemSummary,
    RecommendedThresholds,
    RejectThreshold,
    ReliabilityRow,
    SplitSummary,
)
from llama_jev.calibration.statistics import (
    BandMetrics,
    ThresholdChoice,
    band_metrics,
    brier_score,
    choose_thresholds,
    enforce_outcomes,
    expected_calibration_error,
    format_below,
    format_threshold,
    reliability_table,
    split_by_group,
    sweep_accept,
    sweep_reject,
)
from llama_jev.core.records import DEFAULT_ACCEPT, DEFAULT_REJECT

__all__ = ["MIN_HELD_OUT", "MIN_LABELS", "MIN_PER_CLASS", "calibrate"]

MIN_LABELS = 50
MIN_PER_CLASS = 10
MIN_HELD_OUT = 10
"""Held-out selections (and rejections) below which a recommendation is unproven: label more."""


def _check_target(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1 (exclusive), got {value!r}")
    return float(value)


def _replay(scanned: ScannedRecords, reject: float, accept: float, rows: Sequence[int] | None = None) -> EnforceReplay:
    """ENFORCE replayed over every record (or the ``rows`` given) from each one's highest p:
    something is selected iff the highest p reaches accept, uncertain iff it lies above reject."""
    statuses, top = scanned.statuses, scanned.top
    indices = range(len(statuses)) if rows is None else rows
    outcomes = enforce_outcomes(
        ((CODE_STATUS[statuses[i]], (top[i],) if top[i] >= 0.0 else ()) for i in indices), reject, accept
    )
    return EnforceReplay(
        reject=reject,
        accept=accept,
        retrievals=outcomes.retrievals,
        answered=outcomes.share(outcomes.answered),
        empty=outcomes.share(outcomes.empty),
        inconclusive=outcomes.share(outcomes.inconclusive),
        unavailable=outcomes.share(outcomes.unavailable),
    )


def _misses(band: BandMetrics, target_precision: float, min_npv: float, reject: float, accept: float) -> list[str]:
    """What keeps a candidate from being proven on the held-out split (empty: proven)."""
    misses = []
    if band.selected < MIN_HELD_OUT:
        misses.append(
            f"only {band.selected} held-out selections at accept={format_threshold(accept)} "
            f"(at least {MIN_HELD_OUT} are needed to prove the precision)"
        )
    elif band.precision is not None and band.precision < target_precision:
        misses.append(
            f"held-out precision {format_below(band.precision, target_precision)} < target {target_precision:g}"
        )
    if band.rejected < MIN_HELD_OUT:
        misses.append(
            f"only {band.rejected} held-out rejections at reject={format_threshold(reject)} "
            f"(at least {MIN_HELD_OUT} are needed to prove the NPV)"
        )
    elif band.npv is not None and band.npv < min_npv:
        misses.append(f"held-out NPV {format_below(band.npv, min_npv)} < target {min_npv:g}")
    return misses


def _labels_needed(band: BandMetrics, calibration_share: float, total: int, held_share: float) -> int | None:
    """About how many more labels would give the held-out split enough selections and rejections
    (at the rates seen so far); ``None`` when more labels are not what is missing."""
    shortfalls = []
    for count, fallback in ((band.selected, calibration_share), (band.rejected, None)):
        if count >= MIN_HELD_OUT:
            continue
        rate = count / band.labels if band.labels and count else fallback
        if not rate:
            return None
        shortfalls.append(math.ceil(MIN_HELD_OUT / rate / held_share))
    if not shortfalls:
        return None
    return max(0, max(shortfalls) - total)


def calibrate(
    records: RecordsInput,
    labels: LabelsInput,
    *,
    target_precision: float = 0.9,
    min_npv: float = 0.95,
    holdout: float = 0.3,
    seed: int = 0,
    purpose: str | None = None,
    version: str | None = None,
    query_key_secret: str | bytes | None = None,
) -> CalibrationReport:
    """Recommend ``reject`` / ``accept`` thresholds from decision records and labels, proven on
    data they were not chosen on.

    ``records`` and ``labels`` are paths (as the CLI takes them: JSONL, or a CSV sheet of labels)
    or in-memory records / label dicts. Records are streamed: memory grows with the labels, not
    the log. Joined pairs are split by query (or decision, when records carry no query key) into
    a calibration and a held-out part with ``seed``. On the calibration part, ``accept`` is the
    lowest observed p, rounded up to 3 decimals, whose one-sided 95% Wilson lower bound on the
    precision of ``p >= accept`` reaches ``target_precision``, and ``reject`` the highest observed
    p below it, rounded down, whose lower bound on the negative predictive value reaches
    ``min_npv``. That candidate is then **proven** on the held-out part: its precision there must
    reach ``target_precision`` and its NPV ``min_npv``, each on at least 10 held-out selections /
    rejections. Only then is it ``recommended``; otherwise ``recommended`` is ``None``,
    ``candidate`` holds it, and ``reason`` names the miss. Every figure is computed at the
    rounded thresholds, which are on the scale of the records' ``p``.

    Example:
        >>> report = calibrate("decisions.jsonl", "labels.jsonl", target_precision=0.9)  # doctest: +SKIP
        >>> report.recommended, report.holdout.precision  # doctest: +SKIP
        (RecommendedThresholds(reject=0.12, accept=0.86), 0.93)

    Raises:
        CalibrationInputError: unreadable records or labels (file and line named), labels by
            ``query`` without the secret.
        MixedRecordsError: several purposes or versions and none chosen.
        InsufficientLabelsError: fewer than 50 joined labels or fewer than 10 in a class.
        ValueError: a target or ``holdout`` outside (0, 1).
        TypeError: a ``seed`` that is not an int.
    """
    target_precision = _check_target("target_precision", target_precision)
    min_npv = _check_target("min_npv", min_npv)
    holdout = _check_target("holdout", holdout)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    loaded = load_labels(labels, query_key_secret=query_key_secret)
    scanned = scan_records(
        records,
        decision_ids=frozenset(label.decision_id for label in loaded.labels if label.decision_id is not None),
        query_keys=frozenset(label.query_key for label in loaded.labels if label.query_key is not None),
        purpose=purpose,
        version=version,
    )
    joined = join_labels(scanned.kept, loaded.labels, unlabelled=loaded.unlabelled)
    _check_enough(joined, labels if isinstance(labels, (str, os.PathLike)) else None)
    split = _Split.of(joined, holdout, seed)
    choice = choose_thresholds(split.calibration, target_precision, min_npv)
    verdict = _choose(choice, split, target_precision, min_npv)
    if verdict.candidate is not None and choice.accept is not None:
        verdict = _prove(verdict.candidate, choice.accept.coverage, split, scanned, target_precision, min_npv)
    return _report(choice, verdict, split, scanned, joined, target_precision, min_npv)


@dataclass(frozen=True)
class _Split:
    """Joined pairs, split by query (or decision) into the part that chooses and the part that proves."""

    joined: JoinedLabels
    held_out_groups: frozenset[str]
    holdout: float
    seed: int
    calibration: list[tuple[float, bool]]
    held_out: list[tuple[float, bool]]

    @classmethod
    def of(cls, joined: JoinedLabels, holdout: float, seed: int) -> _Split:
        groups = split_by_group((pair.group for pair in joined.pairs), holdout, seed)
        return cls(
            joined,
            groups,
            holdout,
            seed,
            calibration=[(pair.p, pair.relevant) for pair in joined.pairs if pair.group not in groups],
            held_out=[(pair.p, pair.relevant) for pair in joined.pairs if pair.group in groups],
        )

    @property
    def everything(self) -> list[tuple[float, bool]]:
        return [(pair.p, pair.relevant) for pair in self.joined.pairs]

    @property
    def held_out_decisions(self) -> list[str]:
        return sorted({pair.decision_id for pair in self.joined.pairs if pair.group in self.held_out_groups})


@dataclass(frozen=True)
class _Verdict:
    """What choosing (and, for a candidate, proving) concluded."""

    candidate: RecommendedThresholds | None = None
    recommended: RecommendedThresholds | None = None
    reason: str | None = None
    labels_needed: int | None = None
    holdout: HoldoutResult | None = None


def _choose(choice: ThresholdChoice, split: _Split, target_precision: float, min_npv: float) -> _Verdict:
    """The candidate chosen on the calibration split, or why there is none."""
    accept_row, reject_row = choice.accept, choice.reject
    if accept_row is None:
        best = choice.best
        best_text = (
            f"; the best is {format_below(best.precision_lower, target_precision)} "
            f"at accept={format_threshold(best.accept)}"
            if best
            else ""
        )
        return _Verdict(
            reason=(
                f"no accept threshold reaches a 95% lower bound on precision of {target_precision:g} on the "
                f"calibration split ({len(split.calibration)} labels)"
                + best_text
                + ": label more data, lower the precision target, or use a better-separating judge"
            )
        )
    if reject_row is None:
        return _Verdict(
            reason=(
                f"accept={format_threshold(accept_row.accept)} meets the precision target, but no reject threshold "
                f"below it reaches a 95% lower bound on NPV of {min_npv:g} on the calibration split: label more "
                "irrelevant examples or lower the NPV target"
            )
        )
    return _Verdict(candidate=RecommendedThresholds(reject=reject_row.reject, accept=accept_row.accept))


def _prove(
    candidate: RecommendedThresholds,
    coverage: float,
    split: _Split,
    scanned: ScannedRecords,
    target_precision: float,
    min_npv: float,
) -> _Verdict:
    """``candidate`` measured on the held-out split: recommended when it holds there, else why not.

    ``coverage`` is the candidate's share selected on the calibration split (to size the labels needed).
    """
    held_out, pairs = split.held_out, split.joined.pairs
    band = band_metrics(held_out, candidate.reject, candidate.accept)
    holdout_result = HoldoutResult(
        labels=band.labels,
        selected=band.selected,
        rejected=band.rejected,
        precision=band.precision,
        precision_lower=band.precision_lower,
        npv=band.npv,
        npv_lower=band.npv_lower,
        coverage=band.coverage,
        uncertain=band.uncertain,
        recall=band.recall,
        enforce=_replay(
            scanned, candidate.reject, candidate.accept, [scanned.kept_rows[d] for d in split.held_out_decisions]
        ),
    )
    misses = _misses(band, target_precision, min_npv, candidate.reject, candidate.accept)
    if not misses:
        return _Verdict(candidate=candidate, recommended=candidate, holdout=holdout_result)
    labels_needed = _labels_needed(band, coverage, len(pairs), len(held_out) / len(pairs) if pairs else split.holdout)
    more = f"; about {labels_needed} more labels would give the held-out split enough" if labels_needed else ""
    reason = (
        f"unproven on the held-out split ({band.labels} labels the thresholds were not chosen on): "
        + "; ".join(misses)
        + more
        + ". Stay in SHADOW."
    )
    return _Verdict(candidate=candidate, reason=reason, labels_needed=labels_needed, holdout=holdout_result)


def _report(
    choice: ThresholdChoice,
    verdict: _Verdict,
    split: _Split,
    scanned: ScannedRecords,
    joined: JoinedLabels,
    target_precision: float,
    min_npv: float,
) -> CalibrationReport:
    """Everything the CLI, the JSON and the HTML report show, from the steps' results."""
    pairs, calibration, held_out, everything = joined.pairs, split.calibration, split.held_out, split.everything
    # the sweeps are for reading (every 0.01); the chosen rows join them so each choice is a row
    accept_rows = _with_row(sweep_accept(calibration), choice.accept, lambda row: row.accept)
    accept_rows = _with_row(accept_rows, choice.best, lambda row: row.accept)
    reject_rows = _with_row(sweep_reject(calibration), choice.reject, lambda row: row.reject)
    mapping = fit_platt([p for p, _ in calibration], [y for _, y in calibration]) if _both(calibration) else None
    mapping_holdout: dict[str, float] = {}
    if mapping is not None and held_out:
        mapped = [(mapping(p), y) for p, y in held_out]
        mapping_holdout = {
            "ece_raw": expected_calibration_error(held_out),
            "ece_mapped": expected_calibration_error(mapped),
            "brier_raw": brier_score(held_out),
            "brier_mapped": brier_score(mapped),
        }
    candidate = verdict.candidate
    relevant = sum(1 for _, y in everything if y)
    agreement = joined.agreement
    return CalibrationReport(
        labels=len(pairs),
        relevant=relevant,
        irrelevant=len(pairs) - relevant,
        recommended=verdict.recommended,
        candidate=candidate,
        reason=verdict.reason,
        labels_needed=verdict.labels_needed,
        best_accept=choice.best.accept if choice.best is not None else None,
        targets={"precision": target_precision, "npv": min_npv},
        holdout=verdict.holdout,
        ece=expected_calibration_error(everything),
        brier=brier_score(everything),
        reliability=[ReliabilityRow(**vars(row)) for row in reliability_table(everything)],
        thresholds=[AcceptThreshold(**vars(row)) for row in accept_rows],
        reject_thresholds=[RejectThreshold(**vars(row)) for row in reject_rows],
        enforce=_replay(scanned, candidate.reject, candidate.accept) if candidate else None,
        enforce_default=_replay(scanned, DEFAULT_REJECT, DEFAULT_ACCEPT),
        split=SplitSummary(
            unit="query" if any(pair.group != pair.decision_id for pair in pairs) else "decision",
            seed=split.seed,
            holdout_share=split.holdout,
            calibration_labels=len(calibration),
            holdout_labels=len(held_out),
            calibration_groups=len({p.group for p in pairs}) - len(split.held_out_groups),
            holdout_groups=len(split.held_out_groups),
        ),
        log=LogSummary(
            purpose=scanned.purpose,
            version=scanned.version,
            models=scanned.models,
            records=scanned.records,
            errors=scanned.errors,
            error_rate=scanned.errors / scanned.records if scanned.records else 0.0,
            skipped=scanned.skipped,
        ),
        unjoined=ProblemSummary(count=joined.unjoined, examples=list(joined.unjoined_examples)),
        conflicts=ProblemSummary(count=joined.conflicts, examples=list(joined.conflict_examples)),
        agreement=(
            AgreementSummary(
                kappa=agreement.kappa,
                pairs=agreement.pairs,
                disagreements=agreement.disagreements,
                labellers=list(agreement.labellers),
            )
            if agreement is not None
            else None
        ),
        labels_on_error_records=joined.on_error_records,
        unlabelled=joined.unlabelled,
        duplicate_labels=joined.duplicates,
        mapping=mapping.to_dict() if mapping is not None else {},
        mapping_holdout=mapping_holdout,
    )


_Row = TypeVar("_Row")


def _with_row(rows: list[_Row], extra: _Row | None, threshold: Callable[[_Row], float]) -> list[_Row]:
    """``rows`` plus ``extra`` in threshold order, unless a row at its threshold is there already."""
    if extra is None or any(threshold(row) == threshold(extra) for row in rows):
        return rows
    return sorted([*rows, extra], key=threshold)


def _both(pairs: Sequence[tuple[float, bool]]) -> bool:
    return any(y for _, y in pairs) and not all(y for _, y in pairs)


def _check_enough(joined: JoinedLabels, labels_file: str | os.PathLike[str] | None = None) -> None:
    n = len(joined.pairs)
    relevant = sum(1 for pair in joined.pairs if pair.relevant)
    irrelevant = n - relevant
    groups = len({pair.group for pair in joined.pairs})
    if n >= MIN_LABELS and min(relevant, irrelevant) >= MIN_PER_CLASS and groups >= 2:
        return
    problems = []
    if n and groups < 2:  # the split is by query / decision: one of them leaves nothing to hold out
        problems.append("every label is for one query or decision (need at least 2, to hold one out)")
    if n < MIN_LABELS:
        problems.append(f"{n} joined labels (need at least {MIN_LABELS}: {MIN_LABELS - n} more)")
    if relevant < MIN_PER_CLASS:
        problems.append(f"{relevant} relevant (need at least {MIN_PER_CLASS}: {MIN_PER_CLASS - relevant} more)")
    if irrelevant < MIN_PER_CLASS:
        problems.append(f"{irrelevant} irrelevant (need at least {MIN_PER_CLASS}: {MIN_PER_CLASS - irrelevant} more)")
    hints = []
    if joined.unjoined:
        examples = ", ".join(f"{e['decision_id'] or '(query)'}/{e['node_id']}" for e in joined.unjoined_examples)
        hints.append(f"{joined.unjoined} labels joined nothing (e.g. {examples})")
        if any(not example["decision_id"] for example in joined.unjoined_examples):
            hints.append("labels by query join only under the secret the records were written with")
    if joined.conflicts:
        hints.append(f"{joined.conflicts} pairs had disagreeing labels and were left out")
    if joined.on_error_records:
        hints.append(f"{joined.on_error_records} labels point at ERROR records, which have no usable scores")
    message = "too little labelled data: " + ", ".join(problems)
    if hints:
        message += "; " + "; ".join(hints)
    # The labeller cannot pick a class: a short class needs at least its shortfall in new labels.
    needed = max(MIN_LABELS - n, MIN_PER_CLASS - relevant, MIN_PER_CLASS - irrelevant, 0)
    into = shlex.quote(os.fspath(labels_file)) if labels_file is not None else "your labels file"
    message += (
        f". Label at least {needed or 'a few'} more pairs{' (of another query or decision)' if groups < 2 else ''} "
        f"into {into}: python -m llama_jev.label_sheet --samples <your LabelSampler's file> --out more.csv "
        f"--exclude {into if labels_file is not None else 'labels.jsonl'} draws only pairs not labelled yet; "
        "or run a golden set (collect)."
    )
    raise InsufficientLabelsError(message, labels=n, relevant=relevant, irrelevant=irrelevant, labels_needed=needed)
