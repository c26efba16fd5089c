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
aside); the arithmetic is about a tenth less at nine layers (docs/judge-and-local-server.md).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from llama_jev.local.fp32 import INT64

CLS_OUTPUT: Final = "/bert/pooler/Gather_output_0"
"""The second output of a cut graph: each row's ``[CLS]`` state after the last layer kept."""
_LAYER: Final = "/bert/encoder/layer.{index}/"
"""The prefix of every tensor of an encoder layer (``index`` counts from 0)."""
_LAYER_OUTPUT: Final = _LAYER + "output/LayerNorm/Add_1_output_0"
_ATTENTION: Final = _LAYER + "attention"


def exit_after(graph: Any, layers: int, *, cls_only: bool = True) -> None:
    """Cut ``graph`` (a parsed BERT ONNX graph) after ``layers`` encoder layers, in place.

    The outputs become the model's logit computed from that layer (its pooler and classifier, an
    early exit) and :data:`CLS_OUTPUT`; the later layers no longer feed anything and are removed
    by :func:`~llama_jev.local.fp32.dequantize`'s pruning. ``cls_only=False`` keeps every position
    of the last layer (the same numbers, more work; the tests compare the two).

    The graph must already compute in fp32 (:func:`~llama_jev.local.fp32.dequantize` calls this
    after replacing the int8 products).

    Raises:
        ValueError: the graph is not a BERT export with that many layers and a pooler, or (with
            ``cls_only``) its last layer kept is not the fp32 attention the cut knows.
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
    back took the token count from ``x``; it is told to infer it (-1) instead.
    """
    query, masking, mask, residual, merge = _attention_nodes(graph, index)
    x = query.input[0]
    sliced = _first_position(graph, x, axis=1)
    query.input[0] = sliced
    residual.input[list(residual.input).index(x)] = sliced
    masking.input[list(masking.input).index(mask)] = _first_position(graph, mask, axis=2)
    merge.input[1] = _int64(graph, f"{x}/inferred", -1)
    _forget_shapes(graph, _LAYER.format(index=index))


def _attention_nodes(graph: Any, index: int) -> tuple[Any, Any, str, Any, Any]:
    """Layer ``index``'s query projection, mask addition and the mask it adds, residual addition and
    head-merge shape.

    Raises:
        ValueError: the layer is not the fp32 BERT attention of this export (e.g. still int8).
    """
    prefix = _ATTENTION.format(index=index)
    scores = f"{prefix}/self/MatMul_output_0"
    writer = {name: node for node in graph.node for name in node.output}
    query = writer.get(f"{prefix}/self/query/MatMul_output_0")
    masking = writer.get(f"{prefix}/self/Add_output_0")
    residual = writer.get(f"{prefix}/output/Add_output_0")
    merge = writer.get(f"{prefix}/self/Concat_3_output_0")
    if not (
        query is not None
        and query.op_type == "MatMul"
        and masking is not None
        and len(masking.input) == 2
        and scores in masking.input
        and residual is not None
        and query.input[0] in residual.input
        and merge is not None
        and len(merge.input) == 3
    ):
        raise ValueError(
            f"encoder layer {index + 1} is not the BERT attention this cut knows (an fp32 MatMul query whose input "
            "the residual connection reads, a mask added to the scores, a three-part head-merge shape)"
        )
    return query, masking, next(name for name in masking.input if name != scores), residual, merge


def _int64(graph: Any, name: str, value: int) -> str:
    """A new one-element int64 initializer; its name."""
    graph.initializer.add(name=name, data_type=INT64, dims=[1], raw_data=np.array([value], dtype="<i8").tobytes())
    return name


def _first_position(graph: Any, tensor: str, *, axis: int) -> str:
    """A new tensor: ``tensor`` cut to its first position along ``axis`` (a ``Slice`` node); its name."""
    cut = f"{tensor}/first_along_{axis}"
    bounds = [_int64(graph, f"{cut}/{key}", value) for key, value in (("start", 0), ("end", 1), ("axis", axis))]
    graph.node.add(op_type="Slice", input=[tensor, *bounds], output=[cut])
    return cut


def _forget_shapes(graph: Any, prefix: str) -> None:
    """Delete the shape annotations of the tensors named ``prefix...``.

    The export annotates a layer's tensors as (batch, sequence, ...); left in place after the cut,
    those shapes let onnxruntime share one buffer between a one-position tensor and a full one
    (layer 1 then fails with "Shape mismatch attempting to re-use buffer").
    """
    for position in reversed(range(len(graph.value_info))):
        if graph.value_info[position].name.startswith(prefix):
            del graph.value_info[position]
