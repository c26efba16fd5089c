"""The hard relevance set: the offline judge's honest evaluation, figures per kind of pair.

``data/relevance/hard_pairs.jsonl`` holds 666 query/passage pairs written for this purpose, over
13 domains none of which the older sets cover (library, gym, utilities, telecom, renting, car
hire, veterinary care, a restaurant, public transit, post, event tickets, bike sharing, web
hosting); 104 queries, each with passages of every kind:

- ``answer`` and ``paraphrase`` (label 1): a direct answer and one in other words, sharing few
  words with the query;
- ``other_aspect`` (label 0): the same topic, another aspect ("how to cancel" for "how much");
- ``other_entity``: the same kind of answer for another entity or scope (weekday hours for a
  weekend question, another plan, another animal);
- ``opposite``: the opposite operation or an explicit contrast (pausing for cancelling,
  returning for borrowing);
- ``neighbour``: a neighbouring subject of the same domain.

About one query in three also has a long passage (``long``: 90-150 words, a section of a page)
of one of these kinds. Every passage is unique. The figures are **leave-one-domain-out**: a
judge fitted on any of these pairs is measured only on the domains it never saw (see
``judge_training/train_local_judge.py``); today's judge never saw any of them.

Per kind, the table measures the pairs of that kind against the other side's pairs: a negative
kind with all the positives, a positive kind with all the negatives, so AUC, precision at 0.8,
NPV at 0.2 and the uncertain share are the selector's figures had the candidates been only those.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from relevance_set import PAIRS, band, load_pairs, roc_auc

HARD_PAIRS = Path(__file__).resolve().parent.parent / "data" / "relevance" / "hard_pairs.jsonl"
POSITIVE_KINDS = ("answer", "paraphrase")
NEGATIVE_KINDS = ("other_aspect", "other_entity", "opposite", "neighbour")
KINDS = (*POSITIVE_KINDS, *NEGATIVE_KINDS)
REJECT, ACCEPT = 0.2, 0.8


@dataclass(frozen=True)
class HardPair:
    id: str
    query_id: str
    domain: str
    kind: str
    label: bool
    query: str
    passage: str
    long: bool


def load_hard_pairs(path: Path = HARD_PAIRS) -> list[HardPair]:
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        row = json.loads(line)
        if row["kind"] not in KINDS or row["label"] != (row["kind"] in POSITIVE_KINDS):
            raise ValueError(f"{path}:{number}: kind must be one of {KINDS}, label 1 exactly for {POSITIVE_KINDS}")
        pairs.append(
            HardPair(
                id=row["id"],
                query_id=row["query_id"],
                domain=row["domain"],
                kind=row["kind"],
                label=bool(row["label"]),
                query=row["query"],
                passage=row["passage"],
                long=bool(row["long"]),
            )
        )
    return pairs


def figures(probabilities: Sequence[float], labels: Sequence[bool]) -> dict[str, float | int]:
    """AUC, precision at 0.8, NPV at 0.2 and the uncertain share of these pairs."""
    b = band(probabilities, labels, REJECT, ACCEPT)
    return {
        "pairs": len(labels),
        "auc": round(roc_auc(probabilities, labels), 4),
        "precision_at_0.8": round(b.precision, 4),
        "selected": b.selected,
        "npv_at_0.2": round(b.npv, 4),
        "rejected": b.rejected,
        "uncertain": round(b.uncertain, 4),
    }


def per_kind(probabilities: Sequence[float], pairs: Sequence[HardPair]) -> dict[str, dict[str, float | int]]:
    """The figures of all pairs, of the long ones, and of each kind (against the other side's pairs)."""
    table = {"all": figures(probabilities, [pair.label for pair in pairs])}
    for kind in KINDS:
        chosen = [
            (p, pair.label)
            for p, pair in zip(probabilities, pairs, strict=True)
            if pair.kind == kind or (pair.label != (kind in POSITIVE_KINDS))
        ]
        table[kind] = figures([p for p, _ in chosen], [y for _, y in chosen])
    long_rows = [(p, pair.label) for p, pair in zip(probabilities, pairs, strict=True) if pair.long]
    table["long"] = figures([p for p, _ in long_rows], [y for _, y in long_rows])
    return table


def format_table(tables: dict[str, dict[str, dict[str, float | int]]]) -> str:
    """Markdown rows: one per kind, the columns of each named table side by side."""
    names = list(tables)
    head = "| kind | pairs | " + " | ".join(f"{name}: AUC / prec@0.8 / NPV@0.2 / uncertain" for name in names) + " |"
    lines = [head, "|" + "---|" * (2 + len(names))]
    for kind in ("all", *KINDS, "long"):
        cells = []
        for name in names:
            row = tables[name][kind]
            cells.append(
                f"{row['auc']:.3f} / {row['precision_at_0.8']:.3f} ({row['selected']}) / "
                f"{row['npv_at_0.2']:.3f} ({row['rejected']}) / {row['uncertain']:.3f}"
            )
        lines.append(f"| {kind} | {tables[names[0]][kind]['pairs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


class _Text(Protocol):
    domain: str
    query: str
    passage: str


def lodo_folds(items: Sequence[_Text]) -> list[tuple[str, list[int], list[int]]]:
    """Leave-one-domain-out: for each domain of the hard set, the rows fitted on and the rows measured.

    ``items`` are the fitting set's rows (the older sets with ``domain == "old"``, then the hard
    set); a fold fits on every row outside the held-out domain, including the older sets, whose
    domains the hard set does not share.
    """
    domains = sorted({item.domain for item in items} - {"old"})
    return [
        (
            domain,
            [i for i, item in enumerate(items) if item.domain != domain],
            [i for i, item in enumerate(items) if item.domain == domain],
        )
        for domain in domains
    ]


def normalised(text: str) -> str:
    """A text compared for leakage: lower case, single spaces."""
    return " ".join(text.lower().split())


@dataclass(frozen=True)
class Row:
    """A labelled pair of any of the three sets, as the trained judge is fitted on it."""

    key: str
    domain: str  # "old" for the two older sets
    query: str
    passage: str
    label: bool


def first_sentence(passage: str) -> str | None:
    """A passage's first sentence (ended by ``.``, ``;``, ``!`` or ``?``; a ``;`` becomes a full stop)
    when the passage has more than one and it has at least six words, else ``None``."""
    sentences = re.split(r"(?<=[.;!?])\s+", passage.strip())
    if len(sentences) < 2 or len(sentences[0].split()) < 6:
        return None
    first = sentences[0]
    return first[:-1] + "." if first.endswith(";") else first


def fitting_rows(*, mixes: bool = False, shorts: bool = False, sections: bool = False) -> list[Row]:
    """The older sets (``pairs.jsonl``, ``generic_extra.jsonl``: domain ``old``), then the hard set.

    ``shorts`` adds, per short answer or paraphrase of the hard set, its first sentence alone (key
    ``short:``, label 1, the domain's own): the written answers are longer than the non-answers (28
    words against 16), so without short answers a judge learns that a short passage does not answer
    (the first candidate rated "Orders arrive within three to five business days." 0.34 for "How
    long does shipping take?"); the first sentences average 15 words, as the non-answers do.

    ``sections`` adds, per hard query, two sections of a page on its topic, as long as the set's long
    passages (keys ``sec:``): its four non-answers with its answer or paraphrase among them (label 1:
    the section answers), and its four non-answers with two other queries' neighbouring-subject
    passages among them (label 0). The two differ only in whether the answer is there.

    ``mixes`` adds, per hard query, longer passages made of its domain's short passages (keys
    ``mix:`` and ``pad:``, the domain's own, so a fold that holds the domain out holds them out
    too): its answer or paraphrase among two passages of other queries (label 1); three of its
    non-answers together (label 0); and each of its four non-answers followed by another query's
    neighbouring-subject passage (label 0).
    """
    old = [
        Row(f"old:{p.id}", "old", p.query, p.passage, p.label)
        for path in (PAIRS, PAIRS.parent / "generic_extra.jsonl")
        for p in load_pairs(path)
    ]
    hard = load_hard_pairs()
    rows = old + [Row(f"hard:{p.id}", p.domain, p.query, p.passage, p.label) for p in hard]
    if shorts:
        for pair in hard:
            first = None if not pair.label or pair.long else first_sentence(pair.passage)
            if first is not None:
                rows.append(Row(f"short:{pair.id}", pair.domain, pair.query, first, True))
    if not (mixes or sections):
        return rows
    short = [p for p in hard if not p.long]
    by_query: dict[str, list[HardPair]] = {}
    for pair in short:
        by_query.setdefault(pair.query_id, []).append(pair)
    queries = sorted(by_query)
    for number, query_id in enumerate(queries):
        own = {pair.kind: pair for pair in by_query[query_id]}
        domain = own["answer"].domain
        others = [q for q in queries if q != query_id and by_query[q][0].domain == domain]
        # Two passages of other queries of the domain (fixed choice: the next two in order).
        start = others.index(min(others, key=lambda q: (q <= query_id, q)))
        fillers = [by_query[others[(start + k) % len(others)]][2 + (number + k) % 4].passage for k in range(2)]
        answer = own["answer" if number % 2 == 0 else "paraphrase"].passage
        if sections:
            section = [own[kind].passage for kind in NEGATIVE_KINDS]
            without = [*section]
            section.insert(number % 5, answer)
            # two other queries' neighbouring subjects in the answer's place, so the two are as long
            without[number % 4 : number % 4] = [by_query[others[(start + k) % len(others)]][5].passage for k in (2, 3)]
            rows.append(Row(f"sec:{query_id}-1", domain, own["answer"].query, " ".join(section), True))
            rows.append(Row(f"sec:{query_id}-0", domain, own["answer"].query, " ".join(without), False))
        if not mixes:
            continue
        parts = [*fillers]
        parts.insert(number % 3, answer)
        negatives = [own[kind].passage for kind in NEGATIVE_KINDS if kind != NEGATIVE_KINDS[number % 4]]
        rows.append(Row(f"mix:{query_id}-1", domain, own["answer"].query, " ".join(parts), True))
        rows.append(Row(f"mix:{query_id}-0", domain, own["answer"].query, " ".join(negatives), False))
        # Each short non-answer followed by another query's neighbouring-subject passage: the
        # written non-answers are shorter than the answers (16 words against 28 on average), and
        # a judge must not learn that length answers.
        for k, kind in enumerate(NEGATIVE_KINDS):
            filler = by_query[others[(start + k) % len(others)]][5].passage
            rows.append(Row(f"pad:{query_id}-{kind}", domain, own[kind].query, f"{own[kind].passage} {filler}", False))
    return rows


def pad_key(pair: HardPair) -> str | None:
    """The key of the row (``fitting_rows(mixes=True)``) that is this short non-answer lengthened."""
    return None if pair.label or pair.long else f"pad:{pair.query_id}-{pair.kind}"


def length_matched(pairs: Sequence[HardPair], rows: Sequence[Row]) -> list[HardPair]:
    """The hard set with each short non-answer followed by another query's neighbouring-subject
    passage (as in ``fitting_rows(mixes=True)``): non-answers as long as the answers, so that
    length tells nothing (the set as written: 16 words against 28 on average, and length alone
    ranks it with AUC 0.92)."""
    padded = {row.key: row.passage for row in rows if row.key.startswith("pad:")}
    out = []
    for pair in pairs:
        key = pad_key(pair)
        out.append(pair if key is None else replace(pair, id=f"{pair.id}+pad", passage=padded[key]))
    return out


TRAINED = Path(__file__).resolve().parent / "trained" / "local_judge.json"


def trained_candidate() -> dict[str, Any]:
    """The fit ``train_local_judge.py`` wrote to ``judge_training/trained`` (not shipped); its delta by full path."""
    fit: dict[str, Any] = json.loads(TRAINED.read_text(encoding="utf-8"))
    fit["delta"] = {**fit["delta"], "file": str(TRAINED.parent / fit["delta"]["file"])}
    return fit
