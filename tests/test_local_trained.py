"""A trained exit layer for the offline judge: its delta, sha256-checked and merged into the fp32 weights at load.

The fit is the candidate ``judge_training/train_local_judge.py`` wrote to ``judge_training/trained`` (not the
shipped judge; docs/judge-and-local-server.md says why).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from llama_jev.local.cross_encoder import MarcoCrossEncoder
from llama_jev.local.fp32 import dequantize
from llama_jev.local.relevance import LocalRelevanceJudge, load_parameters
from llama_jev.local.tuned import DELTA_ASSET, ROLES, LayerDelta, matmul_output
from llama_jev.local.weights import carried_file

JUDGE_TRAINING = Path(__file__).resolve().parent.parent / "judge_training"
sys.path.insert(0, str(JUDGE_TRAINING))

from hard_set import TRAINED, trained_candidate  # noqa: E402

# Not in any labelled set: a question, its answer, and a passage of a failure kind (another entity; the
# opposite operation) that the shipped judge selects or leaves uncertain. (The candidate also leaves
# the first answer far below 0.8: one reason it is not shipped.)
CASES = [
    (
        "How much does a swimming lesson for children cost?",
        "A course of ten swimming lessons for children costs 85 euros, including pool entry.",
        "Adult swimming lessons cost 120 euros for a course of ten.",
    ),
    (
        "How do I cancel my newspaper subscription?",
        "Call our reader service or use the online form to end your subscription; it stops at the end of the "
        "current billing month.",
        "You can suspend delivery of your newspaper while you are on holiday for up to four weeks.",
    ),
]


def test_the_trained_delta_is_small_and_its_fit_names_its_sha256() -> None:
    fit = trained_candidate()
    path = TRAINED.parent / Path(DELTA_ASSET).name

    assert fit["delta"] == {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert path.stat().st_size < 300_000
    assert "delta" not in load_parameters()  # the shipped judge reads the untrained layer


def test_the_delta_is_added_to_the_exit_layers_fp32_weights_and_nothing_else() -> None:
    fit = trained_candidate()
    delta = LayerDelta(fit["delta"]["file"], fit["delta"]["sha256"], layer=fit["layers"])
    data = carried_file(*MarcoCrossEncoder._file).read_bytes()
    _, base = dequantize(data)
    names: dict[str, str] = {}

    def tune(graph: object, weights: dict[str, np.ndarray]) -> None:
        writer = {name: node for node in graph.node for name in node.output}  # type: ignore[attr-defined]
        names.update({role: writer[matmul_output(delta.layer - 1, role)].input[1] for role in ROLES})
        delta.merge(graph, weights)

    _, merged = dequantize(data, tune=tune)

    assert merged.keys() == base.keys()
    changed = {name for name in base if not np.array_equal(base[name], merged[name])}
    assert changed == set(names.values())
    for role, name in names.items():
        update = delta.arrays[f"{role}.lora_a"].astype(np.float64) @ delta.arrays[f"{role}.lora_b"].astype(np.float64)
        assert np.array_equal(merged[name], (base[name].astype(np.float64) + update).astype(np.float32))


def test_a_delta_with_another_sha256_or_missing_arrays_is_refused(tmp_path: Path) -> None:
    fit = trained_candidate()
    with pytest.raises(ValueError, match="expected 00"):
        LayerDelta(fit["delta"]["file"], "00" * 32, layer=fit["layers"])
    partial = tmp_path / "partial.npz"
    np.savez(partial, **{"attention.self.query.lora_a": np.zeros((384, 8), dtype=np.float32)})
    digest = hashlib.sha256(partial.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="lacks"):
        LayerDelta(str(partial), digest, layer=fit["layers"])


@pytest.mark.parametrize(("query", "answer", "non_answer"), CASES)
def test_the_trained_judge_rejects_a_near_miss_the_untrained_one_did_not(
    query: str, answer: str, non_answer: str
) -> None:
    trained = LocalRelevanceJudge(parameters=trained_candidate())
    p_answer, p_non_answer = trained.probabilities(query, [answer, non_answer])

    assert p_non_answer <= 0.2 < LocalRelevanceJudge().probabilities(query, [non_answer])[0]
    assert p_answer > p_non_answer


def test_a_cross_encoder_without_the_fits_delta_is_refused() -> None:
    with pytest.raises(ValueError, match="same trained layer"):
        LocalRelevanceJudge(parameters=trained_candidate(), cross_encoder=MarcoCrossEncoder(layers=9))
