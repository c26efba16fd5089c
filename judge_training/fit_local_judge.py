"""Refit the offline judge on the shipped labelled set and write ``llama_jev/assets/local_judge.json``.

That fit (``local-relevance-v2``, a head on the untrained cross-encoder's layer 9) is also where
``judge_training/train_local_judge.py`` starts.

Run: ``python judge_training/fit_local_judge.py`` (needs ``pip install -e ".[local]"`` in the clone; offline,
deterministic, about a minute on two cores). ``--check`` refits and compares with the shipped file
instead of writing it.

1. Features of every pair with the real model: the ms-marco cross-encoder's ``[CLS]`` state after
   layer 9 and its early-exit logit (``LocalRelevanceJudge.window_features``, the same code the
   judge runs; every passage of the set fits one window).
2. Logistic regression on the ``train`` split, on standardised features (Newton's method, an L2
   penalty on the weights chosen by the out-of-fold AUC of 5 folds by query), the standardisation
   folded into the weights written: ``raw = sigmoid(w · features + bias)``.
3. Calibration with ``llama_jev.calibration.fit_platt`` on out-of-fold raw probabilities of the
   train split (5 folds by query, so the mapping never sees a pair its regression was fitted on).
4. Tightening for the selector's band: if on those out-of-fold probabilities ``p >= 0.8`` has a
   precision below 0.9 or ``p <= 0.2`` an NPV below 0.95, the mapping is the Platt line through
   the raw scores where the data reaches those targets instead (a wider uncertain band, never
   narrower than Platt's own).
5. Measures on the ``heldout`` split, which no step above has seen, are written beside the fit,
   and on ``generic_extra.jsonl`` (written after the first fit, never used by this one).
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

from hard_set import figures
from relevance_set import PAIRS, Pair, brier, expected_calibration_error, load_pairs, roc_auc

from llama_jev.calibration import PlattMapping, fit_platt
from llama_jev.local import FEATURES, LocalRelevanceJudge
from llama_jev.local.relevance import EXIT_LAYER

ASSET = Path(__file__).resolve().parent.parent / "llama_jev" / "assets" / "local_judge.json"
MODEL = "local-relevance-v2"
# Candidate L2 penalties (on standardised features, loss summed over pairs); the fit picks one.
PENALTIES = (1.0, 3.0, 10.0, 30.0, 100.0)
FOLDS = 5
TARGET_PRECISION, TARGET_NPV, REJECT, ACCEPT = 0.9, 0.95, 0.2, 0.8


def features(pairs: Sequence[Pair]) -> np.ndarray:
    unfitted = {
        "model": "fitting",
        "weights": [0.0] * len(FEATURES),
        "layers": EXIT_LAYER,
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


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    """Weights then bias, by Newton's method with an L2 penalty on the weights only."""
    design = np.hstack([x, np.ones((len(x), 1))])
    penalty = l2 * np.diag([1.0] * x.shape[1] + [0.0])
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
    """The hard set's figures (hard_set.figures) plus how well calibrated ``probabilities`` are."""
    return {
        **figures(probabilities, labels),
        "ece": round(expected_calibration_error(probabilities, labels), 4),
        "brier": round(brier(probabilities, labels), 4),
    }


def out_of_fold(x: np.ndarray, y: np.ndarray, folds: np.ndarray, l2: float) -> np.ndarray:
    """Raw logits of each row from a fit on the other folds."""
    oof = np.zeros(len(x))
    for k in range(FOLDS):
        fit_part, predict_part = folds != k, folds == k
        oof[predict_part] = logits(fit_logistic(x[fit_part], y[fit_part], l2), x[predict_part])
    return oof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped fit instead of writing it")
    args = parser.parse_args()

    pairs = load_pairs()
    extra = load_pairs(PAIRS.parent / "generic_extra.jsonl")
    x = features(pairs)
    y = np.array([pair.label for pair in pairs], dtype=np.float64)
    train = np.array([pair.split == "train" for pair in pairs])
    heldout = ~train
    folds = np.array([fold_of(pair.query_id) for pair in pairs])

    # Standardised on the train split, so one penalty weighs every feature alike.
    mean, scale = x[train].mean(axis=0), x[train].std(axis=0)
    scale[scale == 0] = 1.0
    z_train, y_train = (x[train] - mean) / scale, y[train]
    auc_by_penalty = {
        l2: roc_auc(list(out_of_fold(z_train, y_train, folds[train], l2)), [bool(v) for v in y_train])
        for l2 in PENALTIES
    }
    l2 = max(PENALTIES, key=lambda value: (auc_by_penalty[value], value))
    # Out-of-fold raw logits on the train split, for the calibration mapping.
    oof = out_of_fold(z_train, y_train, folds[train], l2)
    raw_oof = [sigmoid(z) for z in oof]
    platt = fit_platt(raw_oof, [bool(v) for v in y_train])
    mapping, how = tighten(platt, oof, y_train)

    fitted = fit_logistic(z_train, y_train, l2)
    weights = fitted[:-1] / scale
    parameters = {
        "model": MODEL,
        "layers": EXIT_LAYER,
        "weights": [float(value) for value in weights],
        "bias": float(fitted[-1] - np.dot(weights, mean)),
        "mapping": mapping.to_dict(),
    }
    judge = LocalRelevanceJudge(parameters=parameters)
    held_labels = [bool(v) for v in y[heldout]]
    held_p = [judge.probability(row) for row in x[heldout]]
    held_raw = [judge.raw_probability(row) for row in x[heldout]]
    platt_p = [platt(p) for p in held_raw]
    oof_mapped = [mapping(p) for p in raw_oof]
    extra_p = [judge.probability(row) for row in features(extra)]
    parameters["fit"] = {
        "data": str(PAIRS.relative_to(PAIRS.parent.parent.parent)),
        "data_sha256": hashlib.sha256(PAIRS.read_bytes()).hexdigest(),
        "script": "judge_training/fit_local_judge.py",
        "features": f"{FEATURES[0]} .. {FEATURES[-2]}, {FEATURES[-1]} (llama_jev.local.FEATURES)",
        "train_pairs": int(train.sum()),
        "l2": l2,
        "out_of_fold_auc_by_l2": {str(key): round(value, 4) for key, value in auc_by_penalty.items()},
        "platt": platt.to_dict(),
        "tightening": how,
        "train_out_of_fold": measures(oof_mapped, [bool(v) for v in y_train]),
        "heldout": measures(held_p, held_labels),
        "heldout_platt_only": measures(platt_p, held_labels),
        "generic_extra": measures(extra_p, [pair.label for pair in extra]),
    }
    text = json.dumps(parameters, indent=2) + "\n"
    print(json.dumps(parameters["fit"], indent=2))
    if args.check:
        shipped = json.loads(ASSET.read_text(encoding="utf-8"))
        # fp32 sums in another order (another CPU, another graph of the same arithmetic) move the
        # features by ~1e-6, the fitted weights by up to 6e-6 and the bias by 1.7e-5 (measured when
        # the last layer was cut to the [CLS] position); a real change of data or method moves
        # them far more.
        same = len(shipped["weights"]) == len(weights) and all(
            math.isclose(old, new, rel_tol=0.0, abs_tol=5e-5)
            for old, new in zip(shipped["weights"], parameters["weights"], strict=True)
        )
        same = same and math.isclose(shipped["bias"], parameters["bias"], rel_tol=0.0, abs_tol=5e-5)
        print("the shipped fit matches" if same else "the shipped fit DIFFERS from this refit")
        sys.exit(0 if same else 1)
    ASSET.write_text(text, encoding="utf-8")
    print(f"wrote {ASSET}")


if __name__ == "__main__":
    main()
