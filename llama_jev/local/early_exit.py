"""A BERT cross-encoder cut after its first layers: the ``[CLS]`` state there, for a fitted head.

The offline judge reads ms-marco-MiniLM-L-12-v2 only up to its ninth layer: three quarters of the
arithmetic of the whole model, and on the project's labelled pairs a logistic head on that layer's
``[CLS]`` state tells answers from same-topic non-answers better than the model's own final logit (the
measurements are in docs/judge-and-local-server.md). :func:`exit_after` rewrites the graph in
memory while the model is loaded (inside :func:`~llama_jev.local.fp32.dequantize`): the pooler
reads the chosen layer instead of the last one, the ``[CLS]`` vector it gathers becomes a second
output, and the layers after it are deleted.

The last layer kept computes only what that ``[CLS]`` state needs: its keys and values for every
token (the ``[CLS]`` position attends to all of them), but its query, attention output and
feed-forward network for the ``[CLS]`` position alone. The result is the same (fp32 rounding
aside); the work is about a ninth less at nine layers (docs/judge-and-local-server.md).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

CLS_OUTPUT: Final = "/bert/pooler/Gather_output_0"
"""The second output of a cut graph: each row's ``[CLS]`` state after the last layer kept."""
_LAYER_OUTPUT: Final = "/bert/encoder/layer.{index}/output/LayerNorm/Add_1_output_0"
_ATTENTION: Final = "/bert/encoder/layer.{index}/attention"
_INT64: Final = 7  # ONNX TensorProto.DataType


def exit_after(graph: Any, layers: int, *, cls_only: bool = True) -> None:
    """Cut ``graph`` (a parsed BERT ONNX graph) after ``layers`` encoder layers, in place.

    The outputs become the model's logit computed from that layer (its pooler and classifier, an
    early exit) and :data:`CLS_OUTPUT`; the later layers no longer feed anything and are removed
    by :func:`~llama_jev.local.fp32.dequantize`'s pruning. ``cls_only=False`` keeps every position
    of the last layer (the same numbers, more work; the tests compare the two).

    Raises:
        ValueError: the graph is not a BERT export with that many layers and a pooler.
    """
    produced = {name for node in graph.node for name in node.output}
    kept = _LAYER_OUTPUT.format(index=layers - 1)
    if layers < 1 or kept not in produced:
        raise ValueError(f"the graph has no encoder layer {layers} to exit after (expected a tensor {kept!r})")
    poolers = [node for node in graph.node if node.op_type == "Gather" and CLS_OUTPUT in node.output]
    if len(poolers) != 1:
        raise ValueError(f"the graph has no pooler reading the [CLS] state (expected a Gather writing {CLS_OUTPUT!r})")
    (pooler,) = poolers
    pooler.input[0] = kept
    if CLS_OUTPUT not in {value.name for value in graph.output}:
        graph.output.add(name=CLS_OUTPUT)
    if cls_only:
        _cls_only(graph, layers - 1)


def _cls_only(graph: Any, index: int) -> None:
    """Layer ``index`` computes its output for the ``[CLS]`` position only (see the module docstring).

    Its input ``x`` (batch, tokens, 384) still gives the keys and values; the query projection and
    the residual connection read ``x[:, :1]`` instead, and the attention mask (batch, 1, tokens,
    tokens) its first query row, so the attention, its output projection, the feed-forward network
    and both layer norms run on one position per row. The reshape that merges the attention heads
    back took the token count from ``x``; it is told -1 instead.
    """
    prefix = _ATTENTION.format(index=index)
    writer = {name: node for node in graph.node for name in node.output}
    query = writer.get(f"{prefix}/self/query/MatMul_output_0")
    scores = f"{prefix}/self/MatMul_output_0"
    masking = writer.get(f"{prefix}/self/Add_output_0")
    residual = writer.get(f"{prefix}/output/Add_output_0")
    merge = writer.get(f"{prefix}/self/Concat_3_output_0")
    if (
        query is None
        or masking is None
        or residual is None
        or merge is None
        or query.op_type != "MatMul"
        or scores not in masking.input
        or len(masking.input) != 2
        or len(merge.input) != 3
    ):
        raise ValueError(f"encoder layer {index + 1} is not the BERT attention this cut knows (an fp32 MatMul query)")
    x = query.input[0]
    if x not in residual.input:
        raise ValueError(f"encoder layer {index + 1}'s residual connection does not read its input {x!r}")
    mask = next(name for name in masking.input if name != scores)
    constants = {"first": 0, "second": 1, "tokens": 1, "queries": 2, "rows": -1}
    names = {key: f"{prefix}/cls_only/{key}" for key in constants}
    for key, value in constants.items():
        graph.initializer.add(
            name=names[key], data_type=_INT64, dims=[1], raw_data=np.array([value], dtype="<i8").tobytes()
        )

    def first(tensor: str, axis: str) -> str:
        """A new tensor: ``tensor`` cut to its first position along ``axis``."""
        cut = f"{prefix}/cls_only/Slice_{axis}_output_0"
        graph.node.add(op_type="Slice", input=[tensor, names["first"], names["second"], names[axis]], output=[cut])
        return cut

    sliced = first(x, "tokens")
    query.input[0] = sliced
    residual.input[list(residual.input).index(x)] = sliced
    masking.input[list(masking.input).index(mask)] = first(mask, "queries")
    merge.input[1] = names["rows"]
    # The export annotates this layer's tensors as (batch, sequence, ...); left in place, those
    # shapes would let onnxruntime share a buffer between a one-position tensor and a full one.
    layer = f"/bert/encoder/layer.{index}/"
    for position in reversed(range(len(graph.value_info))):
        if graph.value_info[position].name.startswith(layer):
            del graph.value_info[position]
