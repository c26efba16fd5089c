"""The hard relevance set the offline judge is measured on: every kind of pair, and no leak between folds."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from hard_set import KINDS, fitting_rows, load_hard_pairs, lodo_folds, normalised  # noqa: E402


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


def test_no_query_or_passage_of_a_held_out_domain_is_in_its_fit() -> None:
    rows = fitting_rows()
    folds = lodo_folds(rows)

    assert len(folds) == len({pair.domain for pair in load_hard_pairs()})
    for domain, fitted, measured in folds:
        assert measured
        assert set(fitted).isdisjoint(measured)
        assert len(fitted) + len(measured) == len(rows)
        assert all(rows[i].domain == domain for i in measured)
        seen = {normalised(text) for i in fitted for text in (rows[i].query, rows[i].passage)}
        assert not seen & {normalised(rows[i].query) for i in measured}, domain
        assert not seen & {normalised(rows[i].passage) for i in measured}, domain
