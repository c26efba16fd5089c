"""The statistics of calibration, in the standard library: pure functions over (p, relevant) pairs.

Conventions (the selector's): a candidate is *selected* at ``p >= accept``, *rejected* at
``p <= reject`` and *uncertain* in between. The recommended thresholds are *observed*
probabilities of the labelled pairs rounded to 3 decimals toward caution (``accept`` up,
``reject`` down; :func:`choose_thresholds`): a threshold further into a gap between two observed
values would reach into a range no label speaks for (with levels 0.55 and 0.65 only, an accept of
0.56 accepts a future 0.6 on no evidence). Every figure of a choice is computed at the rounded
value. The sweeps shown to people run on a grid of 0.01.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llama_jev.core.records import Status

__all__ = [
    "GRID",
    "Z_ONE_SIDED_95",
    "AcceptRow",
    "BandMetrics",
    "EnforceOutcomes",
    "RejectRow",
    "ThresholdChoice",
    "ReliabilityBin",
    "band_metrics",
    "brier_score",
    "choose_accept",
    "choose_reject",
    "choose_thresholds",
    "cohen_kappa",
    "enforce_outcomes",
    "expected_calibration_error",
    "format_below",
    "format_threshold",
    "observed_thresholds",
    "reliability_table",
    "round_accept",
    "round_reject",
    "split_by_group",
    "sweep_accept",
    "sweep_reject",
    "wilson_lower_bound",
]

Z_ONE_SIDED_95 = 1.6448536269514722
"""The standard normal quantile at 0.95: a one-sided 95% bound."""

GRID: tuple[float, ...] = tuple(round(i / 100, 2) for i in range(101))
"""Thresholds of the displayed sweeps: 0.00, 0.01, ..., 1.00."""

Pair = tuple[float, bool]
"""``(p, relevant)``."""


def wilson_lower_bound(successes: int, n: int, *, z: float = Z_ONE_SIDED_95) -> float:
    """The Wilson score lower bound of a proportion (one-sided 95% by default); 0.0 when ``n == 0``.

    Unlike ``successes / n`` it accounts for how few observations there are: 9 of 9 is not
    evidence of 100%.

    Example:
        >>> round(wilson_lower_bound(9, 10), 4)
        0.6523
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0
    share = successes / n
    z2 = z * z
    centre = share + z2 / (2 * n)
    spread = z * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z2 / n))


@dataclass(frozen=True)
class AcceptRow:
    """What ``accept`` = ``threshold`` does on labelled pairs."""

    accept: float
    selected: int
    precision: float
    precision_lower: float
    recall: float
    coverage: float


@dataclass(frozen=True)
class RejectRow:
    """What ``reject`` = ``threshold`` does on labelled pairs (npv: share irrelevant of rejected)."""

    reject: float
    rejected: int
    npv: float
    npv_lower: float
    coverage: float


def sweep_accept(pairs: Sequence[Pair], grid: Iterable[float] = GRID) -> list[AcceptRow]:
    """One row per threshold that selects at least one pair (precision is undefined otherwise).

    Example:
        >>> rows = sweep_accept([(0.9, True), (0.7, False), (0.3, False)], grid=[0.5, 0.8])
        >>> [(r.accept, r.selected, r.precision) for r in rows]
        [(0.5, 2, 0.5), (0.8, 1, 1.0)]
    """
    ps, hits_below = _sorted_counts(pairs)
    relevant_total = hits_below[-1]
    rows = []
    for threshold in grid:
        first = bisect.bisect_left(ps, threshold)  # p >= threshold from here on
        selected = len(ps) - first
        if not selected:
            continue
        hits = relevant_total - hits_below[first]
        rows.append(
            AcceptRow(
                accept=threshold,
                selected=selected,
                precision=hits / selected,
                precision_lower=wilson_lower_bound(hits, selected),
                recall=hits / relevant_total if relevant_total else 0.0,
                coverage=selected / len(ps),
            )
        )
    return rows


def _sorted_counts(pairs: Sequence[Pair]) -> tuple[list[float], list[int]]:
    """Probabilities ascending, and how many of the first ``i`` are relevant (for every ``i``):
    each threshold then costs one binary search instead of a pass over the pairs."""
    ordered = sorted(pairs, key=lambda pair: pair[0])
    hits_below = [0]
    for _, relevant in ordered:
        hits_below.append(hits_below[-1] + (1 if relevant else 0))
    return [p for p, _ in ordered], hits_below


def sweep_reject(pairs: Sequence[Pair], grid: Iterable[float] = GRID) -> list[RejectRow]:
    """One row per threshold that rejects at least one pair."""
    ps, hits_below = _sorted_counts(pairs)
    rows = []
    for threshold in grid:
        rejected = bisect.bisect_right(ps, threshold)  # p <= threshold up to here
        if not rejected:
            continue
        negatives = rejected - hits_below[rejected]
        rows.append(
            RejectRow(
                reject=threshold,
                rejected=rejected,
                npv=negatives / rejected,
                npv_lower=wilson_lower_bound(negatives, rejected),
                coverage=rejected / len(ps),
            )
        )
    return rows


def observed_thresholds(pairs: Sequence[Pair]) -> list[float]:
    """The distinct probabilities of ``pairs``, ascending: the only thresholds labels speak for.

    Example:
        >>> observed_thresholds([(0.65, True), (0.05, False), (0.65, False)])
        [0.05, 0.65]
    """
    return sorted({p for p, _ in pairs})


def round_accept(value: float) -> float:
    """``value`` rounded up to 3 decimals: an accept threshold rounded toward caution.

    Example:
        >>> round_accept(0.6665153279428729), round_accept(0.667), round_accept(0.9996)
        (0.667, 0.667, 1.0)
    """
    rounded = round(value, 3)
    if rounded < value:
        rounded = round(rounded + 0.001, 3)
    return min(rounded, 1.0)


def round_reject(value: float) -> float:
    """``value`` rounded down to 3 decimals: a reject threshold rounded toward caution.

    Example:
        >>> round_reject(0.6229149568954854), round_reject(0.05)
        (0.622, 0.05)
    """
    rounded = round(value, 3)
    if rounded > value:
        rounded = round(rounded - 0.001, 3)
    return max(rounded, 0.0)


def choose_accept(rows: Sequence[AcceptRow], target_precision: float) -> AcceptRow | None:
    """The lowest threshold whose precision lower bound meets ``target_precision``, if any."""
    meeting = [row for row in rows if row.precision_lower >= target_precision]
    return min(meeting, key=lambda row: row.accept) if meeting else None


def choose_reject(rows: Sequence[RejectRow], min_npv: float, *, below: float) -> RejectRow | None:
    """The highest threshold under ``below`` whose NPV lower bound meets ``min_npv``, if any."""
    meeting = [row for row in rows if row.npv_lower >= min_npv and row.reject < below]
    return max(meeting, key=lambda row: row.reject) if meeting else None


@dataclass(frozen=True)
class ThresholdChoice:
    """What :func:`choose_thresholds` found: ``accept`` / ``reject`` rows (``None``: not met) and
    ``best``, the accept with the highest precision lower bound (to say how far off a miss is)."""

    accept: AcceptRow | None
    reject: RejectRow | None
    best: AcceptRow | None


def choose_thresholds(pairs: Sequence[Pair], target_precision: float, min_npv: float) -> ThresholdChoice:
    """Recommend thresholds at observed probabilities of ``pairs``, rounded to 3 decimals.

    ``accept`` is the lowest observed p (rounded up) whose one-sided 95% Wilson lower bound on the precision of
    ``p >= accept`` meets ``target_precision``; ``reject`` the highest observed p (rounded down)
    *below accept* whose lower bound on the NPV of ``p <= reject`` meets ``min_npv``. Precision is what ENFORCE
    promises, so accept is chosen first: when the NPV would be met at or above it, reject stays at
    the highest qualifying observed p under accept (the band of uncertain values may then hold no
    labelled pair, never a negative width). No accept: ``reject`` is ``None`` too.

    Example:
        >>> pairs = [(0.05, False)] * 60 + [(0.55, True), (0.55, False)] * 3 + [(0.95, True)] * 40
        >>> choice = choose_thresholds(pairs, 0.9, 0.95)
        >>> choice.reject.reject, choice.accept.accept
        (0.05, 0.95)
    """
    observed = observed_thresholds(pairs)
    accept_rows = sweep_accept(pairs, observed)
    accept = None
    for row in accept_rows:  # ascending: the lowest observed p that meets the target ...
        if row.precision_lower < target_precision:
            continue
        # ... rounded up (a future p just above the observed one is not let in on no evidence),
        # and measured again there: the rounded value must meet the target by itself
        rounded = sweep_accept(pairs, [round_accept(row.accept)])
        if rounded and rounded[0].precision_lower >= target_precision:
            accept = rounded[0]
            break
    reject = None
    if accept is not None:
        for reject_row in reversed(sweep_reject(pairs, observed)):  # descending: the highest ...
            threshold = round_reject(reject_row.reject)
            if reject_row.npv_lower < min_npv or threshold >= accept.accept:
                continue
            rounded_reject = sweep_reject(pairs, [threshold])  # ... rounded down, measured there
            if rounded_reject and rounded_reject[0].npv_lower >= min_npv:
                reject = rounded_reject[0]
                break
    best = max(accept_rows, key=lambda row: row.precision_lower, default=None)
    return ThresholdChoice(accept=accept, reject=reject, best=best)


def format_threshold(value: float) -> str:
    """A threshold as text to copy into a setting: 3 decimals (recommended thresholds are
    rounded to 3 decimals toward caution, so this is exact for them).

    Example:
        >>> format_threshold(0.8), format_threshold(0.653)
        ('0.800', '0.653')
    """
    return f"{value:.3f}"


def format_below(value: float, target: float) -> str:
    """A share under ``target`` as text: rounded as every other figure (0.7636 reads 0.764, as in the
    held-out line), but rounded down where rounding would reach the target (0.6999 never reads 0.700
    next to a target of 0.7)."""
    shown = round(value, 3)
    if shown >= target:
        shown = math.floor(value * 1000 + 1e-9) / 1000
    return f"{shown:.3f}"


def cohen_kappa(answers: Sequence[tuple[bool, bool]]) -> float:
    """Cohen's kappa of two labellers' answers on the same pairs: 1 when they always agree, 0
    when they agree no more than chance would (negative: less). 1.0 when both gave one and the
    same answer throughout (chance agreement is then total, and so is theirs).

    Example:
        >>> cohen_kappa([(True, True), (False, False), (True, False), (False, False)])
        0.5
    """
    if not answers:
        raise ValueError("kappa needs at least one pair labelled by both")
    n = len(answers)
    observed = sum(1 for a, b in answers if a == b) / n
    first = sum(1 for a, _ in answers if a) / n
    second = sum(1 for _, b in answers if b) / n
    chance = first * second + (1 - first) * (1 - second)
    if chance >= 1.0:
        return 1.0 if observed >= 1.0 else 0.0
    return (observed - chance) / (1 - chance)


@dataclass(frozen=True)
class BandMetrics:
    """What a (reject, accept) band does on labelled pairs; ``None`` where a share is undefined."""

    labels: int
    selected: int
    rejected: int
    uncertain_count: int
    precision: float | None
    precision_lower: float | None
    npv: float | None
    npv_lower: float | None
    coverage: float
    uncertain: float
    recall: float | None


def band_metrics(pairs: Sequence[Pair], reject: float, accept: float) -> BandMetrics:
    """Precision of the selected, NPV of the rejected, and the shares selected / uncertain."""
    selected = [y for p, y in pairs if p >= accept]
    rejected = [y for p, y in pairs if p <= reject]
    uncertain = len(pairs) - len(selected) - len(rejected)
    hits = sum(selected)
    negatives = len(rejected) - sum(rejected)
    relevant_total = sum(1 for _, y in pairs if y)
    n = len(pairs)
    return BandMetrics(
        labels=n,
        selected=len(selected),
        rejected=len(rejected),
        uncertain_count=uncertain,
        precision=hits / len(selected) if selected else None,
        precision_lower=wilson_lower_bound(hits, len(selected)) if selected else None,
        npv=negatives / len(rejected) if rejected else None,
        npv_lower=wilson_lower_bound(negatives, len(rejected)) if rejected else None,
        coverage=len(selected) / n if n else 0.0,
        uncertain=uncertain / n if n else 0.0,
        recall=hits / relevant_total if relevant_total else None,
    )


@dataclass(frozen=True)
class ReliabilityBin:
    """One of 10 equal-width bins of ``p``: how many pairs, their mean p and the observed rate."""

    lower: float
    upper: float
    count: int
    mean_p: float | None
    rate: float | None


def _bin(p: float, bins: int) -> int:
    return min(int(p * bins), bins - 1)  # p == 1.0 belongs to the last bin


def reliability_table(pairs: Sequence[Pair], bins: int = 10) -> list[ReliabilityBin]:
    """Pairs grouped in ``bins`` equal-width bins over [0, 1] (the last one closed at 1.0)."""
    members: list[list[Pair]] = [[] for _ in range(bins)]
    for p, y in pairs:
        members[_bin(p, bins)].append((p, y))
    return [
        ReliabilityBin(
            lower=round(i / bins, 10),
            upper=round((i + 1) / bins, 10),
            count=len(group),
            mean_p=math.fsum(p for p, _ in group) / len(group) if group else None,
            rate=sum(1 for _, y in group if y) / len(group) if group else None,
        )
        for i, group in enumerate(members)
    ]


def expected_calibration_error(pairs: Sequence[Pair], bins: int = 10) -> float:
    """ECE: the pair-weighted mean of |mean p - observed rate| over equal-width bins.

    Example:
        >>> round(expected_calibration_error([(0.9, True), (0.9, False), (0.1, False), (0.1, False)]), 6)
        0.25
    """
    if not pairs:
        raise ValueError("ECE needs at least one pair")
    total = 0.0
    for row in reliability_table(pairs, bins):
        if row.count and row.mean_p is not None and row.rate is not None:
            total += row.count * abs(row.mean_p - row.rate)
    return total / len(pairs)


def brier_score(pairs: Sequence[Pair]) -> float:
    """The mean squared difference between p and the outcome (0 or 1); lower is better.

    Example:
        >>> round(brier_score([(0.9, True), (0.2, False)]), 6)
        0.025
    """
    if not pairs:
        raise ValueError("the Brier score needs at least one pair")
    return math.fsum((p - (1.0 if y else 0.0)) ** 2 for p, y in pairs) / len(pairs)


@dataclass(frozen=True)
class EnforceOutcomes:
    """What ENFORCE would have answered, per logged retrieval, at given thresholds.

    ``answered``: something selected; ``empty``: every candidate rejected (or none at all);
    ``inconclusive``: nothing selected, something uncertain (``RetrievalInconclusiveError``);
    ``unavailable``: the judge failed (``RetrievalUnavailableError``).
    """

    retrievals: int
    answered: int
    empty: int
    inconclusive: int
    unavailable: int

    def share(self, count: int) -> float:
        """``count`` as a share of all retrievals (0.0 when there are none)."""
        return count / self.retrievals if self.retrievals else 0.0


def enforce_outcomes(
    decisions: Iterable[tuple[Status, Iterable[float]]], reject: float, accept: float
) -> EnforceOutcomes:
    """Replay logged decisions (status, probabilities) under ENFORCE with ``reject`` / ``accept``.

    SKIPPED and CANCELLED decisions are not retrievals that ENFORCE would have answered
    differently, so they are left out.
    """
    answered = empty = inconclusive = unavailable = 0
    for status, probabilities in decisions:
        if status is Status.ERROR:
            unavailable += 1
            continue
        if status not in (Status.DECIDED, Status.INCONCLUSIVE):
            continue
        ps = list(probabilities)
        if any(p >= accept for p in ps):
            answered += 1
        elif any(p > reject for p in ps):
            inconclusive += 1
        else:
            empty += 1
    return EnforceOutcomes(answered + empty + inconclusive + unavailable, answered, empty, inconclusive, unavailable)


def split_by_group(groups: Iterable[str], holdout: float, seed: int) -> frozenset[str]:
    """The groups (queries or decisions) that form the held-out split, chosen with ``seed``.

    Whole groups go to one side so no query's candidates are both chosen on and reported on.
    At least one group is held out and at least one kept whenever there are two or more.

    Example:
        >>> sorted(split_by_group(["a", "b", "c", "d"], 0.5, seed=0)) == sorted(
        ...     split_by_group(["d", "c", "b", "a"], 0.5, seed=0))
        True
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be between 0 and 1 (exclusive), got {holdout!r}")
    ordered = sorted(set(groups))
    random.Random(seed).shuffle(ordered)  # noqa: S311 - a reproducible split, not a secret
    if len(ordered) < 2:
        return frozenset()
    count = min(max(1, round(holdout * len(ordered))), len(ordered) - 1)
    return frozenset(ordered[:count])
