"""Joining labels to the judge's probabilities, and the agreement of two labellers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

from llama_jev.calibration.labels import Label
from llama_jev.calibration.records import LoggedDecision
from llama_jev.calibration.statistics import cohen_kappa
from llama_jev.core.records import Status

__all__ = ["Agreement", "JoinedLabels", "LabelledPair", "join_labels"]

_EXAMPLES = 5  # how many unjoined / conflicting labels a report lists by id


@dataclass(frozen=True)
class LabelledPair:
    """A joined label: the judge's ``p`` for ``node_id`` in ``decision_id`` and the truth."""

    decision_id: str
    node_id: str
    p: float
    relevant: bool
    group: str
    """The split unit: the query key when the record has one, else the decision id."""


@dataclass(frozen=True)
class Agreement:
    """How two labellers agree on the pairs both labelled: Cohen's kappa (1: always agree,
    0: no better than chance), over ``pairs`` pairs, ``disagreements`` of them left out.
    With more than two labellers, kappa is the mean over every two who share pairs."""

    kappa: float
    pairs: int
    disagreements: int
    labellers: tuple[str, ...] = ()


@dataclass(frozen=True)
class JoinedLabels:
    """The result of :func:`join_labels`: usable pairs and what could not be used, counted."""

    pairs: tuple[LabelledPair, ...]
    unjoined: int = 0
    unjoined_examples: tuple[dict[str, str], ...] = ()
    conflicts: int = 0
    conflict_examples: tuple[dict[str, str], ...] = ()
    on_error_records: int = 0
    unlabelled: int = 0
    duplicates: int = 0
    by: tuple[str, ...] = field(default=())
    agreement: Agreement | None = None


def join_labels(decisions: Sequence[LoggedDecision], labels: Sequence[Label], *, unlabelled: int = 0) -> JoinedLabels:
    """Join labels to the judge's probabilities, by ``decision_id`` or through ``query_key``.

    A label by ``query`` joins every decision with that query key that judged the node (the same
    question asked twice gives two pairs). Labels on ERROR decisions are counted, never used. Two
    labels that reach the same (decision, node) and disagree are both dropped and reported (for
    two named labellers, also in ``agreement``); equal duplicates count once.
    """
    by_id = {d.decision_id: d for d in decisions}
    by_key: dict[str, list[LoggedDecision]] = {}
    for decision in decisions:
        if decision.query_key is not None:
            by_key.setdefault(decision.query_key, []).append(decision)

    truth: dict[tuple[str, str], tuple[bool, str]] = {}
    named: dict[tuple[str, str], dict[str, bool]] = {}  # pair -> labeller -> answer
    conflicting: set[tuple[str, str]] = set()
    conflict_examples: list[dict[str, str]] = []
    unjoined_examples: list[dict[str, str]] = []
    unjoined = on_error = duplicates = 0
    ways: set[str] = set()

    for label in labels:
        if label.decision_id is not None:
            targets = [by_id[label.decision_id]] if label.decision_id in by_id else []
            ways.add("decision_id")
        else:
            targets = list(by_key.get(label.query_key or "", []))
            ways.add("query")
        judged = [d for d in targets if label.node_id in d.scores]
        usable = [d for d in judged if d.status is not Status.ERROR]
        if judged and not usable:
            on_error += 1
            continue
        if not usable:
            unjoined += 1
            if len(unjoined_examples) < _EXAMPLES:
                why = "no such decision" if not targets else "node not judged in that decision"
                if label.decision_id is None and not targets:
                    why = "no record with that query's key"
                unjoined_examples.append(
                    {
                        "decision_id": label.decision_id or "",
                        "node_id": label.node_id,
                        "reason": why,
                        "at": label.source,
                    }
                )
            continue
        for decision in usable:
            pair = (decision.decision_id, label.node_id)
            if label.labeller is not None:
                named.setdefault(pair, {})[label.labeller] = label.relevant
            if pair not in truth:
                truth[pair] = (label.relevant, label.source)
            elif truth[pair][0] == label.relevant:
                duplicates += 1
            elif pair not in conflicting:
                conflicting.add(pair)
                if len(conflict_examples) < _EXAMPLES:
                    conflict_examples.append(
                        {"decision_id": pair[0], "node_id": pair[1], "first": truth[pair][1], "second": label.source}
                    )

    pairs = tuple(
        LabelledPair(
            decision_id=decision_id,
            node_id=node_id,
            p=by_id[decision_id].scores[node_id],
            relevant=relevant,
            group=by_id[decision_id].query_key or decision_id,
        )
        for (decision_id, node_id), (relevant, _) in sorted(truth.items())
        if (decision_id, node_id) not in conflicting
    )
    return JoinedLabels(
        pairs=pairs,
        unjoined=unjoined,
        unjoined_examples=tuple(unjoined_examples),
        conflicts=len(conflicting),
        conflict_examples=tuple(conflict_examples),
        on_error_records=on_error,
        unlabelled=unlabelled,
        duplicates=duplicates,
        by=tuple(sorted(ways)),
        agreement=_agreement(named),
    )


def _agreement(named: dict[tuple[str, str], dict[str, bool]]) -> Agreement | None:
    """Cohen's kappa between labellers on the pairs both labelled (``None``: no overlap)."""
    people = sorted({name for answers in named.values() for name in answers})
    kappas: list[float] = []
    overlap: set[tuple[str, str]] = set()
    for first, second in combinations(people, 2):
        shared = [
            (answers[first], answers[second]) for answers in named.values() if first in answers and second in answers
        ]
        if shared:
            kappas.append(cohen_kappa(shared))
            overlap.update(pair for pair, answers in named.items() if first in answers and second in answers)
    if not kappas:
        return None
    disagreements = sum(1 for pair in overlap if len(set(named[pair].values())) > 1)
    return Agreement(
        kappa=sum(kappas) / len(kappas), pairs=len(overlap), disagreements=disagreements, labellers=tuple(people)
    )
