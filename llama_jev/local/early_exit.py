"""A BERT cross-encoder cut after its first layers: the ``[CLS]`` state there, for a fitted head.

The offline judge reads ms-marco-MiniLM-L-12-v2 only up to its ninth layer: three quarters of the
arithmetic of the whole model, and on the project's labelled pairs a logistic head on that layer's
``[CLS]`` state tells answers from same-topic non-answers better than the model's own final logit (the
measurements are in docs/judge-and-local-server.md). :func:`exit_after` rewrites the graph in
memory while the model is loaded (inside :func:`~llama_jev.local.fp32.dequantize`): the pooler
reads the chosen layer instead of the last one, the ``[CLS]`` vector it gathers becomes a second
output, and the layers after it are deleted.
"""

from __future__ import annotations

from typing import Any, Final

CLS_OUTPUT: Final = "/bert/pooler/Gather_output_0"
"""The second output of a cut graph: each row's ``[CLS]`` state after the last layer kept."""
_LAYER_OUTPUT: Final = "/bert/encoder/layer.{index}/output/LayerNorm/Add_1_output_0"


def exit_after(graph: Any, layers: int) -> None:
    """Cut ``graph`` (a parsed BERT ONNX graph) after ``layers`` encoder layers, in place.

    The outputs become the model's logit computed from that layer (its pooler and classifier, an
    early exit) and :data:`CLS_OUTPUT`; the later layers no longer feed anything and are removed
    by :func:`~llama_jev.local.fp32.dequantize`'s pruning.

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
