"""The hard relevance set the offline judge is measured on: every kind of pair, and no leak between folds."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

JUDGE_TRAINING = Path(__file__).resolve().parent.parent / "judge_training"
sys.path.insert(0, str(JUDGE_TRAINING))

from hard_set import KINDS, fitting_rows, length_matched, load_hard_pairs, lodo_folds, normalised  # noqa: E402


def test_the_hard_set_covers_every_kind_for_every_query_over_at_least_12_domains() -> None:
    pairs = load_hard_pairs()
    kinds_by_query: dict[str, set[str]] = {}
    for pair in pairs:
        kinds_by_query.setdefault(pair.query_id, set()).add(pair.kind)

    assert len(pairs) >= 600
    assert len({pair.domain for pair in pairs}) >= 12
    assert all(kinds == set(KINDS) for kinds in kinds_by_query.values())
    assert sum(pair.long for pair in pairs) >= 30
    assert max(Counter(normalised(pair.passage) for pair in pairs).values()) == 1


@pytest.mark.parametrize(
    ("mixes", "shorts", "sections"), [(False, False, False), (True, False, False), (True, True, True)]
)
def test_no_query_or_passage_of_a_held_out_domain_is_in_its_fit(mixes: bool, shorts: bool, sections: bool) -> None:
    rows = fitting_rows(mixes=mixes, shorts=shorts, sections=sections)
    folds = lodo_folds(rows)

    assert len(folds) == len({pair.domain for pair in load_hard_pairs()})
    for domain, fitted, measured in folds:
        assert measured
        assert set(fitted).isdisjoint(measured)
        assert len(fitted) + len(measured) == len(rows)
        assert all(rows[i].domain == domain for i in measured)
        queries = {normalised(rows[i].query) for i in fitted}
        # One text of every fitted passage: a held-out passage inside a longer fitted one is a leak too.
        passages = "\n".join(normalised(rows[i].passage) for i in fitted)
        assert not queries & {normalised(rows[i].query) for i in measured}, domain
        assert not [i for i in measured if normalised(rows[i].passage) in passages], domain
        assert not [i for i in measured if normalised(rows[i].query) in passages], domain


def test_the_length_matched_view_lengthens_every_short_non_answer_and_nothing_else() -> None:
    pairs = load_hard_pairs()
    matched = length_matched(pairs, fitting_rows(mixes=True))

    for before, after in zip(pairs, matched, strict=True):
        lengthened = not before.label and not before.long
        assert (after.passage != before.passage) == lengthened
        assert after.passage.startswith(before.passage)
    words = {label: [len(p.passage.split()) for p in matched if p.label == label and not p.long] for label in (0, 1)}
    assert abs(sum(words[0]) / len(words[0]) - sum(words[1]) / len(words[1])) < 5


def test_the_short_answers_are_first_sentences_of_the_hard_sets_short_answers_as_short_as_its_non_answers() -> None:
    pairs = {f"short:{pair.id}": pair for pair in load_hard_pairs()}
    shorts = [row for row in fitting_rows(shorts=True) if row.key.startswith("short:")]

    assert len(shorts) >= 150
    for row in shorts:
        pair = pairs[row.key]
        assert row.label
        assert pair.label
        assert not pair.long
        assert (row.domain, row.query) == (pair.domain, pair.query)
        assert pair.passage.startswith(row.passage[:-1])
        assert len(row.passage) < len(pair.passage)
    non_answers = [len(p.passage.split()) for p in pairs.values() if not p.label and not p.long]
    words = [len(row.passage.split()) for row in shorts]
    assert abs(sum(words) / len(words) - sum(non_answers) / len(non_answers)) < 2
