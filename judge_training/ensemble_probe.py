"""An ensemble of the shipped judge (v2) and a trained candidate: per kind leave-one-domain-out, and outside the set.

Both read the cross-encoder's layers 1-8 unchanged; the candidate's layer 9 is the base layer 9 plus
its trained delta. The ensemble computes layer 9 twice (base for v2's head, tuned for the
candidate's head) and combines the two raw logits: ``z = w * z_candidate + (1 - w) * z_v2`` (or
their max / min), then maps ``z`` by Platt's fit (tightened, as ``train_local_judge.py`` maps the
candidate), fitted leave-one-domain-out on the other domains' held-out combined logits
(``train_local_judge.lodo_tables``: the hard set's rows and its lengthened non-answers).

Run in the **training** venv (the mapping code is ``train_local_judge.py``'s, which imports torch):

    nice -n 10 python judge_training/train_local_judge.py --mixes --epochs 12 --threads 1 \\
        --out /tmp/cand --save-lodo /tmp/cand/lodo.npy          # the first candidate, written to a scratch dir
    python judge_training/ensemble_probe.py --lodo /tmp/cand/lodo.npy --fit /tmp/cand/local_judge.json --outside 0.5

- v2's raw logit is its head on the untrained layer 9 (``weights · window_features + bias``, the
  shipped fit), computed here on the same rows (``hard_set.fitting_rows(mixes=True)``, the order of
  the saved held-out logits); v2 never saw the hard set, so its logits are held out by construction.
- Columns: v2 with its shipped mapping (the docs' figures), v2 and the candidate each mapped
  leave-one-domain-out (the ensemble's ends, w = 0 and w = 1), and each combination.
- Gates: each combination against v2 (shipped mapping) on every kind, both views (AUC, precision
  at 0.8, NPV at 0.2 not lower, uncertain not higher), and the independent set's bar on all
  pairs (AUC >= 0.92, precision >= 0.9, NPV >= 0.95, uncertain <= 0.25).
- ``--outside w ...``: the ensemble with the candidate trained on all rows (``--fit``) and the
  mapping fitted on all held-out combined logits, scored by ``outside_probes.measure`` (the
  tests' probes, the example, its golden set, the 2,000-token passage).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hard_set import KINDS, Row, fitting_rows, format_table, length_matched, load_hard_pairs, pad_key, per_kind
from outside_probes import load_fit, measure
from train_local_judge import fitted_mapping, lodo_tables

from llama_jev.calibration import PlattMapping, mapping_from_dict
from llama_jev.local.relevance import LocalRelevanceJudge, load_parameters

TARGETS = {"auc": 0.92, "precision_at_0.8": 0.9, "npv_at_0.2": 0.95, "uncertain": 0.25}
HIGHER = ("auc", "precision_at_0.8", "npv_at_0.2")


def logits(judge: LocalRelevanceJudge, items: Sequence[Row], rows: Sequence[int]) -> dict[int, float]:
    """Each row's raw logit (its one window's ``weights · features + bias``), the rows batched per query."""
    by_query: dict[str, list[int]] = {}
    for i in rows:
        by_query.setdefault(items[i].query, []).append(i)
    out: dict[int, float] = {}
    weights = np.asarray(judge.weights, dtype=np.float64)
    for query, chosen in by_query.items():
        tables = judge.window_features(query, [items[i].passage for i in chosen])
        for i, table in zip(chosen, tables, strict=True):
            if table.shape[0] != 1:
                raise ValueError(f"{items[i].key}: {table.shape[0]} windows, one expected")
            out[i] = float(table[0] @ weights + judge.bias)
    return out


def v2_logits(items: Sequence[Row], rows: list[int], cache: Path) -> np.ndarray:
    """v2's raw logits on ``rows`` (0 elsewhere: those rows never reach a table), cached by their text."""
    digest = hashlib.sha256(
        json.dumps([load_parameters(), [(items[i].query, items[i].passage) for i in rows]]).encode()
    ).hexdigest()
    if cache.exists():
        saved = np.load(cache)
        if str(saved["digest"]) == digest:
            return np.asarray(saved["z"])
    z = np.zeros(len(items))
    for i, value in logits(LocalRelevanceJudge(), items, rows).items():
        z[i] = value
    np.savez(cache, digest=np.array(digest), z=z)
    return z


def combine(z_candidate: np.ndarray, z_v2: np.ndarray, rule: str) -> np.ndarray:
    if rule == "max":
        return np.maximum(z_candidate, z_v2)
    if rule == "min":
        return np.minimum(z_candidate, z_v2)
    w = float(rule)
    return w * z_candidate + (1 - w) * z_v2


def misses_v2(table: dict[str, dict[str, float | int]], v2: dict[str, dict[str, float | int]]) -> list[str]:
    """Where a table does worse than v2's (n/a on v2's side: not counted; n/a on this side: a miss)."""
    out = []
    for kind in ("all", *KINDS, "long"):
        for key in (*HIGHER, "uncertain"):
            mine, theirs = float(table[kind][key]), float(v2[kind][key])
            if math.isnan(theirs):
                continue
            worse = math.isnan(mine) or (mine < theirs if key in HIGHER else mine > theirs)
            if worse:
                out.append(
                    f"{kind} {key.split('_')[0]} {mine:.3f}<{theirs:.3f}"
                    if key in HIGHER
                    else f"{kind} uncertain {mine:.3f}>{theirs:.3f}"
                )
    return out


def misses_bar(row: dict[str, float | int]) -> list[str]:
    out = []
    for key, bar in TARGETS.items():
        value = float(row[key])
        if math.isnan(value) or (value < bar if key in HIGHER else value > bar):
            out.append(f"{key} {value:.3f}")
    return out


def outside_row(name: str, out: dict[str, Any]) -> str:
    """One row of ``outside_probes.measure``'s figures: each probe's p (! where a test's rule fails), the
    example's answers, the golden set, the long passage."""
    probes = " ".join(f"{row['p']:.3f}{'' if row['ok'] else '!'}" for row in out["probes"])
    example = out["example"]
    answers = ", ".join(
        f"{example[key]:.3f}" for key in ("acme/refund-policy", "acme/compensation-rule", "globex/refund-policy")
    )
    failed = sum(not row["ok"] for row in out["probes"]) + sum(not ok for ok in out["example_ok"].values())
    long = out["2000 tokens, 96-token windows"]
    return (
        f"| {name} | {probes} | {answers} | {out['golden']} | {long['p']:.3f}{'' if long['ok'] else '!'} | "
        f"{failed + (not long['ok'])} |"
    )


class EnsembleJudge:
    """v2 and the candidate read the same windows; per window ``z`` combined, mapped, the highest p per passage."""

    def __init__(self, *, parameters: dict[str, Any], **options: Any) -> None:
        self.model = parameters["model"]
        self.rule = parameters["rule"]
        self.mapping = mapping_from_dict(parameters["mapping"])
        self.v2 = LocalRelevanceJudge(**options)
        self.candidate = LocalRelevanceJudge(parameters=parameters["candidate"], **options)

    def probabilities(self, query: str, passages: Sequence[str]) -> list[float]:
        out = []
        v2_tables = self.v2.window_features(query, passages)
        candidate_tables = self.candidate.window_features(query, passages)
        for a, b in zip(v2_tables, candidate_tables, strict=True):
            if a.shape[0] == 0:
                out.append(0.0)
                continue
            z_v2 = a @ np.asarray(self.v2.weights) + self.v2.bias
            z_candidate = b @ np.asarray(self.candidate.weights) + self.candidate.bias
            z = combine(z_candidate, z_v2, self.rule)
            out.append(max(float(self.mapping(1 / (1 + math.exp(-value)))) for value in z))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lodo", type=Path, required=True, help="the candidate's held-out logits (--save-lodo)")
    parser.add_argument("--fit", type=Path, help="the candidate trained on all rows (its local_judge.json)")
    parser.add_argument("--rules", nargs="*", default=["0.3", "0.4", "0.5", "0.6", "0.7", "max", "min"])
    parser.add_argument("--outside", nargs="*", default=[], help="rules to score outside the set (needs --fit)")
    parser.add_argument("--v2-cache", type=Path, default=Path("/tmp/llama_jev_v2_logits.npz"))
    parser.add_argument("--untightened", action="store_true", help="Platt's mapping as fitted, not widened")
    args = parser.parse_args()
    started = time.monotonic()
    items, hard = fitting_rows(mixes=True), load_hard_pairs()
    labels = np.array([float(item.label) for item in items])
    z_candidate = np.load(args.lodo)
    if z_candidate.shape != (len(items),):
        raise SystemExit(f"{args.lodo}: {z_candidate.shape} logits, {len(items)} rows of fitting_rows(mixes=True)")
    calibration_rows = [i for i, item in enumerate(items) if item.key.startswith(("hard:", "pad:"))]
    z_v2 = v2_logits(items, calibration_rows, args.v2_cache)
    print(f"v2's logits on {len(calibration_rows)} rows: {time.monotonic() - started:.0f} s", flush=True)

    # v2 with its shipped mapping: the docs' figures (a check that the logits are v2's, in the row order).
    index = {item.key: i for i, item in enumerate(items)}
    shipped = mapping_from_dict(load_parameters()["mapping"])
    p_v2 = [float(shipped(1 / (1 + math.exp(-value)))) for value in z_v2]
    matched = length_matched(hard, items)
    hard_rows = [index[f"hard:{pair.id}"] for pair in hard]
    pad_rows = [index[pad_key(pair) or f"hard:{pair.id}"] for pair in hard]
    views = {
        "as written": {"v2, shipped mapping": per_kind([p_v2[i] for i in hard_rows], hard)},
        "length-matched": {"v2, shipped mapping": per_kind([p_v2[i] for i in pad_rows], matched)},
    }
    rules = ["0", "1", *args.rules]
    names = {"0": "v2, LODO mapping (w=0)", "1": "candidate, LODO (w=1)"}
    for rule in rules:
        tables = lodo_tables(items, hard, combine(z_candidate, z_v2, rule), labels, tightened=not args.untightened)
        name = names.get(rule, f"w={rule}" if rule not in ("max", "min") else rule)
        for view, table in tables.items():
            views[view][name] = table
    for view, columns in views.items():
        print(f"\n## {view} (AUC / precision at 0.8 (selected) / NPV at 0.2 (rejected) / uncertain)\n")
        print(format_table(columns))
    print("\n## gates: worse than v2 (shipped mapping) anywhere, both views; the independent set's bar on all pairs\n")
    for name in views["as written"]:
        if name == "v2, shipped mapping":
            continue
        worse = {view: misses_v2(columns[name], columns["v2, shipped mapping"]) for view, columns in views.items()}
        bar = {view: misses_bar(columns[name]["all"]) for view, columns in views.items()}
        print(
            f"- {name}: worse than v2 in {sum(map(len, worse.values()))} figures "
            f"(as written: {'; '.join(worse['as written']) or 'none'} | "
            f"length-matched: {'; '.join(worse['length-matched']) or 'none'}); "
            f"bar missed: as written {', '.join(bar['as written']) or 'none'}, "
            f"length-matched {', '.join(bar['length-matched']) or 'none'}"
        )

    if args.outside:
        if args.fit is None:
            raise SystemExit("--outside needs --fit (the candidate trained on all rows)")
        candidate = load_fit(args.fit)
        print("\n## outside the set (outside_probes.measure; ! marks a figure that fails its test's rule)\n")
        print(
            "| judge | probes: shipping 3-5 days, 2-4 days (>= 0.8), DHL, office (<= 0.2), swimming child "
            "(> next), adult (<= 0.2), newspaper cancel (> next), suspend (<= 0.2) | example: acme refund, "
            "compensation rule (>= 0.8), globex refund | golden | 2,000 tokens (>= 0.8) | rules failed |"
        )
        print("|---|---|---|---|---|---:|")
        print(outside_row("v2", measure(load_parameters())), flush=True)
        print(outside_row("candidate", measure(candidate)), flush=True)
        for rule in args.outside:
            z = combine(z_candidate, z_v2, rule)
            mapping: PlattMapping = fitted_mapping(
                z[calibration_rows], labels[calibration_rows], tightened=not args.untightened
            )
            fit = {"model": f"ensemble {rule}", "rule": rule, "mapping": mapping.to_dict(), "candidate": candidate}
            name = f"w={rule}" if rule not in ("max", "min") else rule
            slope, intercept = mapping.slope, mapping.intercept
            print(outside_row(f"{name} (Platt {slope:.3f}, {intercept:.3f})", measure(fit, EnsembleJudge)), flush=True)
    print(f"\n{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
