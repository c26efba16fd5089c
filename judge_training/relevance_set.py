"""The labelled relevance set the offline judge is fitted and measured on, and the measures.

``data/relevance/pairs.jsonl`` holds 432 query/passage pairs written by this project across 11
domains (shop policies, HR, IT help, medicine leaflets, travel, software docs, finance,
insurance, housing law, education, public services). For each of 72 queries: a direct answer,
a paraphrased answer with little word overlap (label 1), two same-topic passages that do not
answer (``hard_negative``, label 0) and two answers to other domains' queries
(``easy_negative``, label 0). ``split`` is ``heldout`` for every pair of a query whose
sha256(query_id) has a first byte divisible by 3 (25 queries, 150 pairs), ``train`` otherwise:
split by query, never by pair.

``data/relevance/generic_extra.jsonl`` (same fields, same ``split`` per query, not used by the fit)
holds 144 harder pairs for the same 72 queries: a generic on-topic statement that does not answer
(``hard_negative``: "X is important / popular", a definition, a marketing line) and one more
low-overlap paraphrase of the answer. Read it with ``load_pairs(PAIRS.parent / "generic_extra.jsonl")``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PAIRS = Path(__file__).resolve().parent.parent / "data" / "relevance" / "pairs.jsonl"


@dataclass(frozen=True)
class Pair:
    id: str
    query_id: str
    domain: str
    split: str
    kind: str
    label: bool
    query: str
    passage: str


def load_pairs(path: Path = PAIRS) -> list[Pair]:
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        row = json.loads(line)
        if row["split"] not in ("train", "heldout") or row["label"] not in (0, 1):
            raise ValueError(f"{path}:{number}: split must be train/heldout and label 0/1")
        pairs.append(Pair(**{**row, "label": bool(row["label"])}))
    return pairs


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The probability that a random positive outscores a random negative (ties count half)."""
    positives = [s for s, y in zip(scores, labels, strict=True) if y]
    negatives = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@dataclass(frozen=True)
class Band:
    """What the selector does with these probabilities at ``reject`` / ``accept``."""

    selected: int
    precision: float  # share of selected that are relevant (nan when nothing is selected)
    rejected: int
    npv: float  # share of rejected that are irrelevant
    uncertain: float  # share of all pairs between the thresholds


def band(probabilities: Sequence[float], labels: Sequence[bool], reject: float = 0.2, accept: float = 0.8) -> Band:
    selected = [y for p, y in zip(probabilities, labels, strict=True) if p >= accept]
    rejected = [y for p, y in zip(probabilities, labels, strict=True) if p <= reject]
    return Band(
        selected=len(selected),
        precision=sum(selected) / len(selected) if selected else math.nan,
        rejected=len(rejected),
        npv=1 - sum(rejected) / len(rejected) if rejected else math.nan,
        uncertain=1 - (len(selected) + len(rejected)) / len(labels),
    )


def expected_calibration_error(probabilities: Sequence[float], labels: Sequence[bool], bins: int = 10) -> float:
    """ECE over ``bins`` equal-width bins, weighted by the share of pairs in each."""
    total = 0.0
    for index in range(bins):
        low, high = index / bins, (index + 1) / bins
        members = [
            (p, y)
            for p, y in zip(probabilities, labels, strict=True)
            if low <= p < high or (index == bins - 1 and p == 1.0)
        ]
        if members:
            confidence = sum(p for p, _ in members) / len(members)
            accuracy = sum(y for _, y in members) / len(members)
            total += len(members) / len(labels) * abs(confidence - accuracy)
    return total


def brier(probabilities: Sequence[float], labels: Sequence[bool]) -> float:
    return sum((p - y) ** 2 for p, y in zip(probabilities, labels, strict=True)) / len(labels)
