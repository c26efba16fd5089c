"""A trained exit layer: a small delta merged into the cross-encoder's fp32 weights at load time.

``judge_training/train_local_judge.py`` trains the judge's exit layer (layer 9) further on hard
negatives. What changes fits in one small file (about 250 kB): for each of the layer's six
matrices a rank-8 update ``A @ B``, and the layer's biases and layer norms in full. The pinned
base model is not copied: when the model is loaded, :meth:`LayerDelta.merge` adds ``A @ B`` to
each dequantised weight (computed in float64 and rounded once to fp32, so every CPU gets the same
weights) and replaces the biases and norms. The merged graph has the same shape as the base one,
so it costs no time. A fit names its delta (``"delta": {"file": ..., "sha256": ...}``); the
shipped fit has none (docs/judge-and-local-server.md says why).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

DELTA_ASSET: Final = "assets/local_judge_delta.npz"
"""Where a shipped delta of the judge's exit layer would live inside the ``llama_jev`` package (and
its file name wherever ``train_local_judge.py`` writes one)."""
ROLES: Final = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
"""The six matrices of a BERT layer, named as in the export's initializers (without the layer prefix)."""


def matmul_output(index: int, role: str) -> str:
    """The tensor written by layer ``index``'s (from 0) ``role`` matrix product in the fp32 graph."""
    return f"/bert/encoder/layer.{index}/{role.replace('.', '/')}/MatMul_output_0"


def bias_name(index: int, role: str) -> str:
    """The initializer holding the bias of layer ``index``'s ``role`` matrix."""
    return f"bert.encoder.layer.{index}.{role}.bias"


def layer_norm_names(index: int) -> tuple[str, str, str, str]:
    """The initializers of layer ``index``'s two layer norms: attention weight, bias; output weight, bias."""
    prefix = f"bert.encoder.layer.{index}"
    return (
        f"{prefix}.attention.output.LayerNorm.weight",
        f"{prefix}.attention.output.LayerNorm.bias",
        f"{prefix}.output.LayerNorm.weight",
        f"{prefix}.output.LayerNorm.bias",
    )


class LayerDelta:
    """A trained layer's delta, read from a file and checked against its sha256.

    ``file`` is a name inside ``llama_jev/assets`` or a path (a fit being measured).

    Raises:
        ValueError: the file's sha256 is not ``sha256``, or it lacks an array of the layer.
    """

    def __init__(self, file: str, sha256: str, *, layer: int) -> None:
        data = self._read(file)
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise ValueError(f"the judge's layer delta {file!r} has sha256 {digest}, expected {sha256}")
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: np.asarray(archive[name], dtype=np.float32) for name in archive.files}
        index = layer - 1
        needed = [f"{role}.{part}" for role in ROLES for part in ("lora_a", "lora_b", "bias")]
        missing = [name for name in (*needed, *layer_norm_names(index)) if name not in arrays]
        if missing:
            raise ValueError(f"the judge's layer delta {file!r} lacks {missing}")
        self.file = file
        self.sha256 = sha256
        self.layer = layer
        self.arrays: Mapping[str, NDArray[np.float32]] = arrays

    @staticmethod
    def _read(file: str) -> bytes:
        path = Path(file)
        if path.is_absolute():
            return path.read_bytes()
        return resources.files("llama_jev").joinpath("assets").joinpath(file).read_bytes()

    def merge(self, graph: Any, weights: dict[str, NDArray[np.float32]]) -> None:
        """Add the delta to ``graph``'s exit layer: its fp32 matrices in ``weights``, its biases and norms in place.

        Raises:
            ValueError: the graph has no such layer, or a shape differs from the delta's.
        """
        from llama_jev.local.fp32 import _FLOAT  # the graph's own float code

        index = self.layer - 1
        writer = {name: node for node in graph.node for name in node.output}
        initializers = {tensor.name: tensor for tensor in graph.initializer}
        for role in ROLES:
            node = writer.get(matmul_output(index, role))
            if node is None or node.op_type != "MatMul" or node.input[1] not in weights:
                raise ValueError(f"the graph has no fp32 matrix product for layer {self.layer}'s {role}")
            base = weights[node.input[1]]
            update = self.arrays[f"{role}.lora_a"].astype(np.float64) @ self.arrays[f"{role}.lora_b"].astype(np.float64)
            if update.shape != base.shape:
                raise ValueError(f"layer {self.layer}'s {role} is {base.shape}, the delta {update.shape}")
            weights[node.input[1]] = np.ascontiguousarray((base.astype(np.float64) + update).astype(np.float32))
            self._replace(initializers, bias_name(index, role), self.arrays[f"{role}.bias"], _FLOAT)
        for name in layer_norm_names(index):
            self._replace(initializers, name, self.arrays[name], _FLOAT)

    @staticmethod
    def _replace(initializers: Mapping[str, Any], name: str, value: NDArray[np.float32], code: int) -> None:
        tensor = initializers.get(name)
        if tensor is None or int(tensor.data_type) != code or [int(d) for d in tensor.dims] != list(value.shape):
            raise ValueError(f"the graph has no fp32 initializer {name!r} of shape {value.shape}")
        del tensor.float_data[:]
        tensor.raw_data = np.ascontiguousarray(value, dtype="<f4").tobytes()
