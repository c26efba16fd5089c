"""Probability mappings fitted on labelled data, and ``CalibratedJudge`` that applies one.

A judge whose raw probabilities are not calibrated (a local model, another vendor's server) is
wrapped so that every yes/no probability it answers goes through a fitted mapping; the default
0.2 / 0.8 band then means what it says. Everything here is the standard library: the fits are
small (one feature), deterministic and exact enough for thresholds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

from llama_jev.systemone.judge import Judge
from llama_jev.systemone.wire import Answer, NoulAnswer, SystemOneRequest, SystemOneResult, check_result

__all__ = [
    "CalibratedJudge",
    "IsotonicMapping",
    "PlattMapping",
    "ProbabilityMapping",
    "fit_isotonic",
    "fit_platt",
    "mapping_from_dict",
]

# logit(0) and logit(1) are infinite; probabilities are kept this far from the ends before the
# logit so a judge answering exactly 0.0 or 1.0 still maps to a finite, ordered value.
_EPSILON = 1e-9
# Ridge on (slope, intercept): keeps the Newton fit finite on separable data (every positive
# above every negative), where the unregularised maximum-likelihood slope is infinite.
_RIDGE = 1e-6
_MAX_ITERATIONS = 100
_TOLERANCE = 1e-10


def _clip(p: float) -> float:
    return min(max(p, _EPSILON), 1.0 - _EPSILON)


def _logit(p: float) -> float:
    p = _clip(p)
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    # Two branches so neither exp() overflows for large |z|.
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _check_probability(p: float, what: str) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{what} must be a finite probability in [0, 1], got {p!r}")
    return float(p)


@runtime_checkable
class ProbabilityMapping(Protocol):
    """A monotone map from a judge's raw probability to a calibrated one."""

    @property
    def name(self) -> str:
        """Short name of the kind of mapping (``platt``, ``isotonic``); results carry it."""
        ...

    def __call__(self, p: float) -> float:
        """The calibrated probability for raw probability ``p``."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form; :func:`mapping_from_dict` reads it back."""
        ...


@dataclass(frozen=True)
class PlattMapping:
    """Platt scaling on the logit: ``sigmoid(slope * logit(p) + intercept)``.

    ``slope`` < 1 pulls an over-confident judge's probabilities towards 0.5; ``intercept`` shifts
    them. ``p`` is clipped to ``[1e-9, 1 - 1e-9]`` first, so 0.0 and 1.0 map to finite logits.

    Example:
        >>> mapping = PlattMapping(slope=1.0, intercept=0.0)
        >>> round(mapping(0.8), 6)
        0.8
        >>> PlattMapping.from_dict(mapping.to_dict()) == mapping
        True
    """

    slope: float
    intercept: float

    def __post_init__(self) -> None:
        for name in ("slope", "intercept"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"PlattMapping.{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))

    @property
    def name(self) -> str:
        """``"platt"``."""
        return "platt"

    def __call__(self, p: float) -> float:
        """The calibrated probability for raw probability ``p`` (in [0, 1])."""
        return _sigmoid(self.slope * _logit(_check_probability(p, "p")) + self.intercept)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "platt", "slope": ..., "intercept": ...}``."""
        return {"kind": "platt", "slope": self.slope, "intercept": self.intercept}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlattMapping:
        """Read what :meth:`to_dict` wrote."""
        if data.get("kind", "platt") != "platt":
            raise ValueError(f"not a Platt mapping: kind {data.get('kind')!r}")
        try:
            return cls(slope=data["slope"], intercept=data["intercept"])
        except KeyError as missing:
            raise ValueError(f"a Platt mapping needs {missing.args[0]!r}") from None


@dataclass(frozen=True)
class IsotonicMapping:
    """A non-decreasing step function fitted by pool-adjacent-violators, linearly interpolated.

    ``points`` are the raw probabilities of the pooled blocks' centres (strictly increasing) and
    ``values`` the calibrated probabilities there (non-decreasing). Between points the value is
    interpolated; outside them it is the nearest end value.

    Example:
        >>> mapping = IsotonicMapping(points=(0.2, 0.8), values=(0.1, 0.6))
        >>> mapping(0.5), mapping(0.0), mapping(1.0)
        (0.35, 0.1, 0.6)
    """

    points: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        points = tuple(_check_probability(p, "IsotonicMapping.points") for p in self.points)
        values = tuple(_check_probability(v, "IsotonicMapping.values") for v in self.values)
        if not points or len(points) != len(values):
            raise ValueError("IsotonicMapping needs as many values as points, at least one")
        if any(b <= a for a, b in pairwise(points)):
            raise ValueError("IsotonicMapping.points must be strictly increasing")
        if any(b < a for a, b in pairwise(values)):
            raise ValueError("IsotonicMapping.values must be non-decreasing")
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "values", values)

    @property
    def name(self) -> str:
        """``"isotonic"``."""
        return "isotonic"

    def __call__(self, p: float) -> float:
        """The calibrated probability for raw probability ``p`` (in [0, 1])."""
        p = _check_probability(p, "p")
        points, values = self.points, self.values
        if p <= points[0]:
            return values[0]
        if p >= points[-1]:
            return values[-1]
        right = bisect.bisect_right(points, p)
        left = right - 1
        share = (p - points[left]) / (points[right] - points[left])
        return values[left] + share * (values[right] - values[left])

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "isotonic", "points": [...], "values": [...]}``."""
        return {"kind": "isotonic", "points": list(self.points), "values": list(self.values)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IsotonicMapping:
        """Read what :meth:`to_dict` wrote."""
        if data.get("kind", "isotonic") != "isotonic":
            raise ValueError(f"not an isotonic mapping: kind {data.get('kind')!r}")
        try:
            return cls(points=tuple(data["points"]), values=tuple(data["values"]))
        except KeyError as missing:
            raise ValueError(f"an isotonic mapping needs {missing.args[0]!r}") from None


def mapping_from_dict(data: Mapping[str, Any]) -> PlattMapping | IsotonicMapping:
    """Read any mapping's :meth:`to_dict` form, by its ``kind``.

    Example:
        >>> mapping_from_dict({"kind": "platt", "slope": 0.5, "intercept": 0.0})
        PlattMapping(slope=0.5, intercept=0.0)
    """
    kind = data.get("kind")
    if kind == "platt":
        return PlattMapping.from_dict(data)
    if kind == "isotonic":
        return IsotonicMapping.from_dict(data)
    raise ValueError(f"unknown mapping kind {kind!r}; expected 'platt' or 'isotonic'")


def _check_training(probabilities: Sequence[float], labels: Sequence[bool]) -> tuple[list[float], list[bool]]:
    if len(probabilities) != len(labels):
        raise ValueError(f"{len(probabilities)} probabilities but {len(labels)} labels")
    ps = [_check_probability(p, "every probability") for p in probabilities]
    ys = []
    for label in labels:
        if not isinstance(label, bool):
            raise ValueError(f"labels must be booleans, got {label!r}")
        ys.append(label)
    positives = sum(ys)
    if positives == 0 or positives == len(ys):
        raise ValueError("fitting needs at least one relevant and one irrelevant label")
    return ps, ys


def fit_platt(probabilities: Sequence[float], labels: Sequence[bool]) -> PlattMapping:
    """Fit :class:`PlattMapping` by maximum likelihood (Newton's method with a line search).

    Targets are Platt's smoothed ones, ``(N+ + 1) / (N+ + 2)`` for relevant and
    ``1 / (N- + 2)`` for irrelevant labels, so a small sample never yields probabilities of
    exactly 0 or 1; a tiny ridge keeps the slope finite on perfectly separable data. The result
    depends only on the data (no randomness).

    Example:
        >>> ps = [0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1]
        >>> ys = [True, True, True, False, False, False, False, True]
        >>> round(fit_platt(ps, ys)(0.9), 2)  # three in four relevant at 0.9, Platt-smoothed targets
        0.67

    Raises:
        ValueError: lengths differ, a probability is outside [0, 1], or one class is absent.
    """
    ps, ys = _check_training(probabilities, labels)
    positives = sum(ys)
    negatives = len(ys) - positives
    high, low = (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0)
    xs = [_logit(p) for p in ps]
    targets = [high if y else low for y in ys]

    def loss(slope: float, intercept: float) -> float:
        total = 0.5 * _RIDGE * (slope * slope + intercept * intercept)
        for x, t in zip(xs, targets, strict=True):
            z = slope * x + intercept
            # log(1 + e^z) - t z, written to avoid overflow for large |z|
            total += max(z, 0.0) + math.log1p(math.exp(-abs(z))) - t * z
        return total

    # Start where Platt does: slope 0, intercept at the smoothed prior's log-odds.
    slope, intercept = 0.0, math.log((positives + 1.0) / (negatives + 1.0))
    current = loss(slope, intercept)
    for _ in range(_MAX_ITERATIONS):
        g_slope = _RIDGE * slope
        g_intercept = _RIDGE * intercept
        h_ss = h_si = h_ii = _RIDGE
        for x, t in zip(xs, targets, strict=True):
            q = _sigmoid(slope * x + intercept)
            d = q - t
            w = q * (1.0 - q)
            g_slope += d * x
            g_intercept += d
            h_ss += w * x * x
            h_si += w * x
            h_ii += w
        # the gradient is a sum over the pairs: its rounding noise grows with their number, so the
        # tolerance does too (a fixed one is never met on 10^4 pairs and every step backtracks)
        if abs(g_slope) < _TOLERANCE * len(xs) and abs(g_intercept) < _TOLERANCE * len(xs):
            break
        determinant = h_ss * h_ii - h_si * h_si
        if determinant <= 0.0:
            break
        step_slope = -(h_ii * g_slope - h_si * g_intercept) / determinant
        step_intercept = -(h_ss * g_intercept - h_si * g_slope) / determinant
        # Backtracking: Newton's full step can overshoot where the Hessian is nearly flat.
        size = 1.0
        while size > 1e-10:
            candidate = loss(slope + size * step_slope, intercept + size * step_intercept)
            if candidate <= current + 1e-4 * size * (g_slope * step_slope + g_intercept * step_intercept):
                break
            size /= 2.0
        else:
            break
        slope, intercept = slope + size * step_slope, intercept + size * step_intercept
        improvement, current = current - candidate, candidate
        if improvement <= 1e-13 * abs(current):  # at the optimum to the precision of a float sum
            break
    return PlattMapping(slope=slope, intercept=intercept)


def fit_isotonic(probabilities: Sequence[float], labels: Sequence[bool]) -> IsotonicMapping:
    """Fit :class:`IsotonicMapping` by pool-adjacent-violators (non-decreasing, least squares).

    Example:
        >>> mapping = fit_isotonic([0.1, 0.4, 0.6, 0.9], [False, True, False, True])
        >>> mapping.values
        (0.0, 0.5, 1.0)

    Raises:
        ValueError: lengths differ, a probability is outside [0, 1], or one class is absent.
    """
    ps, ys = _check_training(probabilities, labels)
    # Equal raw probabilities must map to one value: merge them before pooling.
    merged: dict[float, list[float]] = {}
    for p, y in zip(ps, ys, strict=True):
        entry = merged.setdefault(p, [0.0, 0.0])
        entry[0] += 1.0 if y else 0.0
        entry[1] += 1.0
    # Each block: [sum of labels, weight, sum of weighted p] -> mean label and weighted centre.
    blocks: list[list[float]] = []
    for p in sorted(merged):
        relevant, weight = merged[p]
        blocks.append([relevant, weight, p * weight])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last, strict=True)]
    return IsotonicMapping(
        points=tuple(block[2] / block[1] for block in blocks),
        values=tuple(block[0] / block[1] for block in blocks),
    )


def map_result(result: SystemOneResult, mapping: ProbabilityMapping) -> SystemOneResult:
    """``result`` with every noul probability mapped and the model named ``<model>+<mapping>``.

    Choice and score answers pass through untouched: the mapping was fitted on yes/no relevance.
    """
    answers: dict[str, Answer] = {
        question_id: NoulAnswer(type="noul", noul=float(mapping(answer.noul)))
        if isinstance(answer, NoulAnswer)
        else answer
        for question_id, answer in result.answers.items()
    }
    return SystemOneResult(model=f"{result.model}+{mapping.name}", answers=answers, usage=result.usage)


class CalibratedJudge:
    """A :class:`~llama_jev.Judge` that maps every yes/no probability of another judge.

    Use it for a judge whose raw scores are not calibrated, so that thresholds (and the default
    0.2 / 0.8 band) mean what they say. Records written through it hold the mapped probabilities
    and the model ``<model>+platt`` (or ``+isotonic``), so calibration logs from before and after
    wrapping are never mixed by accident.

    Example:
        >>> from llama_jev import ScriptedJudge
        >>> from llama_jev.systemone import NoulQuestion, SystemOneRequest
        >>> raw = ScriptedJudge(lambda state, qid, ins: 0.9)
        >>> judge = CalibratedJudge(raw, PlattMapping(slope=0.5, intercept=0.0))
        >>> result = judge.system_one(SystemOneRequest(state="q", questions={"item_0": NoulQuestion()}))
        >>> round(result.noul("item_0"), 3), result.model
        (0.75, 'scripted+platt')
    """

    def __init__(self, judge: Judge, mapping: ProbabilityMapping) -> None:
        if not isinstance(judge, Judge):
            raise TypeError("judge must have system_one and asystem_one (the Judge protocol)")
        if not isinstance(mapping, ProbabilityMapping):
            raise TypeError("mapping must be a PlattMapping, an IsotonicMapping or another ProbabilityMapping")
        self.judge = judge
        self.mapping = mapping

    @property
    def model(self) -> str | None:
        """The model its results name, ``<model>+<mapping>`` (``None`` when the wrapped judge names none).

        What traces show as the reranker's model, the same name as the records'.
        """
        model = getattr(self.judge, "model", None)
        return f"{model}+{self.mapping.name}" if isinstance(model, str) and model else None

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Ask the wrapped judge, then map its yes/no probabilities."""
        result = self.judge.system_one(request, timeout=timeout)
        return check_result(request, map_result(result, self.mapping))

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`, awaiting the wrapped judge."""
        result = await self.judge.asystem_one(request, timeout=timeout)
        return check_result(request, map_result(result, self.mapping))

    def __repr__(self) -> str:
        return f"CalibratedJudge({self.judge!r}, {self.mapping!r})"
