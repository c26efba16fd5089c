"""What the offline judges share (one noul question per passage, a query cache) and
``CosineSimilarityJudge``, the former hand-set curve kept as the benchmark's baseline."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any, Final

import numpy as np

from llama_jev.core.errors import JevBadRequestError, JevTimeoutError
from llama_jev.local.cross_encoder import _logistic
from llama_jev.local.minilm import MiniLMEncoder
from llama_jev.local.weights import _SPECIAL_TOKENS
from llama_jev.systemone.judge import RELEVANCE_QUESTION
from llama_jev.systemone.wire import (
    Answer,
    NoulAnswer,
    NoulQuestion,
    SystemOneRequest,
    SystemOneResult,
    Usage,
    check_result,
)

DEFAULT_MIDPOINT: Final = 0.345
"""The cosine at which the local judge answers ``p = 0.5``."""
DEFAULT_SLOPE: Final = 16.0
"""The steepness of the local judge's curve: ``p = 0.8`` at cosine 0.432, ``p = 0.2`` at 0.258."""


class _PassageJudge:
    """The Judge protocol for requests shaped like the selector's: state = query, one passage per question."""

    model: str
    accepted_questions: frozenset[str] | None
    # The model runs in this process: running out of budget is not retryable (see Judge).
    in_process: Final = True

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

    def query(self, state: object) -> str:
        """The query text of a request's ``state``: the state itself, or its ``"query"`` field.

        The selector sends the query as the state; a structured state (``{"query": ..., ...}``,
        as the Java JevKnowledge adapter sends) carries it in its ``"query"`` field.

        Raises:
            JevBadRequestError: the state is neither text nor an object with a ``"query"`` text.
        """
        if isinstance(state, str):
            return state
        query = state.get("query") if isinstance(state, dict) else None
        if isinstance(query, str):
            return query
        kind = 'an object without a "query" text' if isinstance(state, dict) else f"a JSON {type(state).__name__}"
        raise JevBadRequestError(
            f'the local judge needs the query text as the state (or its "query" field), got {kind}'
        )

    def _read(self, request: SystemOneRequest) -> tuple[str, dict[str, str]]:
        query = self.query(request.state)
        passages = {
            question_id: self.candidate(question_id, question) for question_id, question in request.questions.items()
        }
        return query, passages


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
