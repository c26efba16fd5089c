"""The offline judge as Part 2 shipped it, kept for ``bench_local.py`` to compare with: four models' signals
combined with fitted weights (``four_signal_judge.json``), calibrated on the labelled pairs."""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np
from encoders import BgeSmallEncoder, ParaphraseMiniLMEncoder
from numpy.typing import NDArray

from llama_jev.local.cross_encoder import MarcoCrossEncoder
from llama_jev.local.minilm import MiniLMEncoder
from llama_jev.local.passages import _check_accepted, _QueryCache
from llama_jev.local.relevance import _WindowedHead
from llama_jev.local.weights import _INSTALL_HINT, _SPECIAL_TOKENS, Vectors, _LoadedOnce
from llama_jev.systemone.judge import RELEVANCE_QUESTION

DEFAULT_WINDOW_TOKENS: Final = 96
"""Tokens per window of :class:`FourSignalJudge`: the fit saw passages of up to 50 tokens, and
a short answer inside a long window is diluted in the embeddings' average."""
DEFAULT_WINDOW_OVERLAP: Final = 32
"""Tokens shared by consecutive windows: any sentence of up to 32 tokens lies whole in one window."""
FEATURES: Final = ("cross_encoder_logit", "bge_cosine", "minilm_cosine", "paraphrase_cosine")
"""The signals :class:`FourSignalJudge` combines, in order."""
# The most windows in one forward pass (the token bound of weights._batches usually decides first).
_PASS_ROWS: Final = 64


class _QuerySide(NamedTuple):
    """A query's token ids, and either its window vectors (bge, MiniLM, paraphrase) or, before they
    are computed, the windows to embed for each of those three models."""

    ids: list[int]
    windows: tuple[list[list[int]], list[list[int]], list[list[int]]]
    vectors: tuple[Vectors, Vectors, Vectors] | None = None


def load_parameters() -> dict[str, Any]:
    """The fit :class:`FourSignalJudge` shipped with (``judge_training/four_signal_judge.json``)."""
    text = (Path(__file__).resolve().parent / "four_signal_judge.json").read_text(encoding="utf-8")
    parameters: dict[str, Any] = json.loads(text)
    return parameters


class FourSignalJudge(_WindowedHead):
    """Part 2's offline judge: the cross-encoder's logit and three bi-encoders' cosines, combined.

    ``cross_encoder_logit`` (ms-marco-MiniLM-L-12-v2, all 12 layers), ``bge_cosine``
    (bge-small-en-v1.5), ``minilm_cosine`` (all-MiniLM-L6-v2) and ``paraphrase_cosine``
    (paraphrase-MiniLM-L3-v2), each window of 96 tokens (32 shared) scored on its own, weighed by
    logistic regression and mapped by a Platt line; a passage gets its best window's p. Replaced by
    :class:`llama_jev.local.LocalRelevanceJudge`; ``bench_local.py`` measures both side by side.
    """

    def __init__(
        self,
        encoder: MiniLMEncoder | None = None,
        *,
        bge: BgeSmallEncoder | None = None,
        paraphrase: ParaphraseMiniLMEncoder | None = None,
        cross_encoder: MarcoCrossEncoder | None = None,
        parameters: Mapping[str, Any] | None = None,
        model: str | None = None,
        accepted_questions: Collection[str] | None = (RELEVANCE_QUESTION,),
        window_tokens: int = DEFAULT_WINDOW_TOKENS,
        window_overlap: int = DEFAULT_WINDOW_OVERLAP,
        query_cache_size: int = 128,
    ) -> None:
        from llama_jev.calibration import mapping_from_dict  # the one implementation of the mappings

        fit = dict(parameters) if parameters is not None else load_parameters()
        try:
            weights = [float(fit["weights"][name]) for name in FEATURES]
            bias = float(fit["bias"])
            mapping = mapping_from_dict(fit["mapping"])
            name = str(model if model is not None else fit["model"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"parameters need weights for {list(FEATURES)}, a bias, a mapping and a model name: {error}"
            ) from error
        self._set_head(weights, bias, mapping, name)
        self.accepted_questions = _check_accepted(accepted_questions)
        self._set_windows(window_tokens, window_overlap, most=MiniLMEncoder.max_tokens - _SPECIAL_TOKENS)
        for carrier in {BgeSmallEncoder._file[0], ParaphraseMiniLMEncoder._file[0], MarcoCrossEncoder._file[0]}:
            # Checked now, not at the first request: a missing extra is a setup error, not a judge failure.
            try:
                importlib.metadata.distribution(carrier)
            except importlib.metadata.PackageNotFoundError:
                raise ImportError(f"{_INSTALL_HINT} (missing: {carrier})") from None
        self.encoder = encoder if encoder is not None else MiniLMEncoder()
        self.bge = bge if bge is not None else BgeSmallEncoder()
        self.paraphrase = paraphrase if paraphrase is not None else ParaphraseMiniLMEncoder()
        self.cross_encoder = cross_encoder if cross_encoder is not None else MarcoCrossEncoder()
        self._queries = _QueryCache(query_cache_size)
        # Loaded now, not by the first request: loading takes seconds on a busy machine, and inside
        # a judgement it would spend the judgement's budget (2 s by default) and time it out.
        self.load()

    def __repr__(self) -> str:
        return f"FourSignalJudge(model={self.model!r}, mapping={self.mapping!r})"

    def load(self) -> None:
        """Load the four models (construction already does; a no-op once they are loaded)."""
        models: list[_LoadedOnce] = [self.cross_encoder, self.bge, self.encoder, self.paraphrase]
        # Two at a time: hashing, dequantising and onnxruntime's session set-up release the GIL,
        # so on two cores the four load in about half the time.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="llama-jev-load") as pool:
            for loading in [pool.submit(model.load) for model in models]:
                loading.result()

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The number of tokens of each text (the shared WordPiece vocabulary)."""
        return self.encoder.count_tokens(texts)

    def window_count(self, passage: str) -> int:
        """How many windows (rows of every model's forward pass) ``passage`` takes."""
        (ids,) = self.encoder.token_ids([passage])
        return len(self._cut(ids)) if passage.strip() else 0

    def _query_side(self, query: str) -> _QuerySide:
        """The query's token ids and, when not cached, the windows each bi-encoder must embed for it."""
        cached: _QuerySide | None = self._queries.get(query)
        if cached is not None:
            return cached
        query_ids, prefixed_ids = self.encoder.token_ids([query, self.bge.query_prefix + query])
        query_windows = self._cut(query_ids)
        return _QuerySide(query_ids, (self._cut(prefixed_ids), query_windows, query_windows))

    def window_features(
        self, query: str, passages: Sequence[str], *, deadline: float | None = None
    ) -> list[NDArray[np.float64]]:
        """For each passage, a ``(windows, 4)`` array of :data:`FEATURES` (``(0, 4)`` when blank).

        ``deadline`` (a :func:`time.monotonic` value): ``TimeoutError`` instead of starting a
        forward pass after it.
        """
        if isinstance(passages, str):
            raise TypeError("passages must be a sequence of strings, not a single string")
        empty = np.zeros((0, len(FEATURES)))
        present = [passage for passage in passages if passage.strip()]
        if not query.strip() or not present:
            return [empty for _ in passages]
        side = self._query_side(query)
        cuts = [self._cut(ids) for ids in self.encoder.token_ids(present)]
        windows = [window for cut in cuts for window in cut]
        # Model by model (its weights stay in the CPU caches), the windows of every passage (and of
        # an uncached query) together, in as few forward passes as the batch bound allows. fp32 rows
        # are independent of each other (padding is masked), so a passage's answer does not depend
        # on which other passages share the request.
        columns = [self.cross_encoder.window_logits(side.ids, windows, deadline=deadline, batch_size=_PASS_ROWS)]
        vectors = []
        for index, encoder in enumerate((self.bge, self.encoder, self.paraphrase)):
            own = side.windows[index]
            embedded = encoder.encode_token_windows([*own, *windows], deadline=deadline, batch_size=_PASS_ROWS)
            query_vectors = embedded[: len(own)] if side.vectors is None else side.vectors[index]
            vectors.append(query_vectors)
            columns.append(np.max(embedded[len(own) :] @ query_vectors.T, axis=1))
        if side.vectors is None:
            self._queries.put(query, _QuerySide(side.ids, ([], [], []), (vectors[0], vectors[1], vectors[2])))
        return self._per_passage(np.column_stack(columns), cuts, passages, empty)
