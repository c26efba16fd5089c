"""``calibrate``: records + labels -> thresholds chosen on one split, measured on the other."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from llama_jev.calibration.mapping import fit_platt
from llama_jev.calibration.records import (
    InsufficientLabelsError,
    JoinedLabels,
    LabelsInput,
    LoggedDecision,
    RecordsInput,
    join_labels,
    load_labels,
    load_records,
    select_records,
)
from llama_jev.calibration.report import (
    AcceptThreshold,
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
    band_metrics,
    brier_score,
    choose_thresholds,
    enforce_outcomes,
    expected_calibration_error,
    format_threshold,
    reliability_table,
    split_by_group,
    sweep_accept,
    sweep_reject,
)
from llama_jev.core.records import Status

__all__ = ["MIN_LABELS", "MIN_PER_CLASS", "calibrate"]

MIN_LABELS = 50
MIN_PER_CLASS = 10
_DEFAULT_REJECT, _DEFAULT_ACCEPT = 0.2, 0.8


def _check_target(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1 (exclusive), got {value!r}")
    return float(value)


def _replay(decisions: Sequence[LoggedDecision], reject: float, accept: float) -> EnforceReplay:
    outcomes = enforce_outcomes(((d.status, d.scores.values()) for d in decisions), reject, accept)
    return EnforceReplay(
        reject=reject,
        accept=accept,
        retrievals=outcomes.retrievals,
        answered=outcomes.share(outcomes.answered),
        empty=outcomes.share(outcomes.empty),
        inconclusive=outcomes.share(outcomes.inconclusive),
        unavailable=outcomes.share(outcomes.unavailable),
    )


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
    """Recommend ``reject`` / ``accept`` thresholds from decision records and labels.

    ``records`` and ``labels`` are JSONL paths (as the CLI takes them) or in-memory records /
    label dicts. Joined pairs are split by query (or decision, when records carry no query key)
    into a calibration and a held-out part with ``seed``. On the calibration part, ``accept`` is
    the lowest *observed* p whose one-sided 95% Wilson lower bound on the precision of
    ``p >= accept`` reaches ``target_precision``, and ``reject`` the highest observed p below it
    whose lower bound on the negative predictive value of ``p <= reject`` reaches ``min_npv``
    (never a value between two observed ones, where no label says anything); the held-out part
    then says what that choice does on data it was not chosen on. Thresholds are on the scale of
    the records' ``p``.

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
    decisions = select_records(load_records(records), purpose=purpose, version=version)
    label_list, unlabelled = load_labels(labels, query_key_secret=query_key_secret)
    joined = join_labels(decisions, label_list, unlabelled=unlabelled)
    _check_enough(joined)

    pairs = joined.pairs
    held_out_groups = split_by_group((pair.group for pair in pairs), holdout, seed)
    calibration = [(pair.p, pair.relevant) for pair in pairs if pair.group not in held_out_groups]
    held_out = [(pair.p, pair.relevant) for pair in pairs if pair.group in held_out_groups]
    everything = [(pair.p, pair.relevant) for pair in pairs]

    choice = choose_thresholds(calibration, target_precision, min_npv)
    accept_row, reject_row = choice.accept, choice.reject
    # the sweeps are for reading (every 0.01); the chosen rows join them so each choice is a row
    accept_rows = _with_row(sweep_accept(calibration), accept_row, lambda row: row.accept)
    reject_rows = _with_row(sweep_reject(calibration), reject_row, lambda row: row.reject)
    recommended = None
    reason = None
    if accept_row is None:
        best = choice.best
        # rounded down: a best of 0.8996 must not read as meeting a target of 0.9
        best_text = (
            f"; the best is {math.floor(best.precision_lower * 1000) / 1000:.3f} "
            f"at accept={format_threshold(best.accept)}"
            if best
            else ""
        )
        reason = (
            f"no accept threshold reaches a 95% lower bound on precision of {target_precision:g} on the "
            f"calibration split ({len(calibration)} labels)"
            + best_text
            + ": label more data, lower the precision target, or use a better-separating judge"
        )
    elif reject_row is None:
        reason = (
            f"accept={format_threshold(accept_row.accept)} meets the precision target, but no reject threshold "
            f"below it reaches a 95% lower bound on NPV of {min_npv:g} on the calibration split: label more "
            "irrelevant examples or lower the NPV target"
        )
    else:
        recommended = RecommendedThresholds(reject=reject_row.reject, accept=accept_row.accept)

    held_out_decisions = {pair.decision_id for pair in pairs if pair.group in held_out_groups}
    holdout_result = None
    if recommended is not None:
        band = band_metrics(held_out, recommended.reject, recommended.accept)
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
                [d for d in decisions if d.decision_id in held_out_decisions], recommended.reject, recommended.accept
            ),
        )

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

    errors = sum(1 for d in decisions if d.status is Status.ERROR)
    relevant = sum(1 for _, y in everything if y)
    return CalibrationReport(
        labels=len(pairs),
        relevant=relevant,
        irrelevant=len(pairs) - relevant,
        recommended=recommended,
        reason=reason,
        targets={"precision": target_precision, "npv": min_npv},
        holdout=holdout_result,
        ece=expected_calibration_error(everything),
        brier=brier_score(everything),
        reliability=[ReliabilityRow(**vars(row)) for row in reliability_table(everything)],
        thresholds=[AcceptThreshold(**vars(row)) for row in accept_rows],
        reject_thresholds=[RejectThreshold(**vars(row)) for row in reject_rows],
        enforce=_replay(decisions, recommended.reject, recommended.accept) if recommended else None,
        enforce_default=_replay(decisions, _DEFAULT_REJECT, _DEFAULT_ACCEPT),
        split=SplitSummary(
            unit="query" if any(pair.group != pair.decision_id for pair in pairs) else "decision",
            seed=seed,
            holdout_share=holdout,
            calibration_labels=len(calibration),
            holdout_labels=len(held_out),
            calibration_groups=len({p.group for p in pairs}) - len(held_out_groups),
            holdout_groups=len(held_out_groups),
        ),
        log=LogSummary(
            purpose=decisions[0].purpose,
            version=decisions[0].version,
            models=sorted({d.model for d in decisions if d.model}),
            records=len(decisions),
            errors=errors,
            error_rate=errors / len(decisions),
            skipped=sum(1 for d in decisions if d.status in (Status.SKIPPED, Status.CANCELLED)),
        ),
        unjoined=ProblemSummary(count=joined.unjoined, examples=list(joined.unjoined_examples)),
        conflicts=ProblemSummary(count=joined.conflicts, examples=list(joined.conflict_examples)),
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


def _check_enough(joined: JoinedLabels) -> None:
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
        problems.append(f"{n} joined labels (need at least {MIN_LABELS})")
    if relevant < MIN_PER_CLASS:
        problems.append(f"{relevant} relevant (need at least {MIN_PER_CLASS})")
    if irrelevant < MIN_PER_CLASS:
        problems.append(f"{irrelevant} irrelevant (need at least {MIN_PER_CLASS})")
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
    message += ". Label more decisions (python -m llama_jev.label_sheet) or run a golden set (collect)."
    raise InsufficientLabelsError(message, labels=n, relevant=relevant, irrelevant=irrelevant)
