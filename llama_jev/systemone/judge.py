"""The ``Judge`` protocol the selector calls, and ``ScriptedJudge`` for tests and offline runs."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from llama_jev.core.errors import JevInvalidResponseError
from llama_jev.systemone.wire import (
    ChoiceQuestion,
    Instructions,
    Question,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResult,
    check_result,
)

__all__ = [
    "RELEVANCE_QUESTION",
    "AnswerFunction",
    "Judge",
    "ScriptedJudge",
    "ScriptedValue",
    "answer_request",
    "runs_in_process",
]

RELEVANCE_QUESTION = "Does this passage provide evidence relevant to the query?"
"""The yes/no question asked about every candidate; the query is the request's state."""


@runtime_checkable
class Judge(Protocol):
    """Anything that answers System One requests: :class:`~llama_jev.JevClient`, ``ScriptedJudge``,
    a local model.

    ``timeout`` is the most time, in seconds, the whole call may take (attempts, retries and
    backoff included); the selector passes what is left of its budget. ``None`` means the judge's
    own limits. A judge returns a result that answers exactly the request, or raises
    :class:`~llama_jev.JevAPIError`.

    A judge that computes its answers in this process (the offline judge) says so with a class
    attribute ``in_process = True`` (see :func:`runs_in_process`): when it runs out of budget the
    failure is a :class:`~llama_jev.errors.LocalJudgeTimeoutError`, not retryable, asking for a larger
    ``budget=``, since the same work would take as long again. Remote judges need not define it.
    """

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer ``request``."""
        ...

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer ``request`` without blocking the event loop."""
        ...


ScriptedValue = float | Mapping[str, float] | Sequence[float]
AnswerFunction = Callable[[Instructions, str, Instructions | None], ScriptedValue]
"""``(state, question_id, instructions) -> answer``: a yes-probability for a noul question, a
mapping option -> probability for a choice question, per-level probabilities for a score question."""


def runs_in_process(judge: object) -> bool:
    """Whether ``judge`` computes its answers in this process (its ``in_process`` attribute is ``True``).

    Example:
        >>> from llama_jev.local import LocalRelevanceJudge  # doctest: +SKIP
        >>> runs_in_process(LocalRelevanceJudge)  # doctest: +SKIP
        True
    """
    return getattr(judge, "in_process", False) is True


def answer_request(request: SystemOneRequest, answer: AnswerFunction, *, model: str) -> SystemOneResult:
    """Answer every question of ``request`` with ``answer`` and validate the result.

    The values ``answer`` returns go through the same checks as a server's response, so a script
    that returns 1.5 or NaN fails with :class:`~llama_jev.errors.JevInvalidResponseError` exactly as a
    misbehaving server would.
    """
    try:
        answers = {
            question_id: _make_answer(question, answer(request.state, question_id, question.instructions))
            for question_id, question in request.questions.items()
        }
        # Validated in one call, as a server's JSON is, rather than one model per answer.
        result = SystemOneResult.model_validate({"model": model, "answers": answers, "usage": _NOTHING_BILLED})
    except (ValidationError, TypeError, ValueError) as error:
        raise JevInvalidResponseError(f"the scripted answer is invalid: {_first_line(error)}") from None
    return check_result(request, result)


def _make_answer(question: Question, value: ScriptedValue) -> dict[str, Any]:
    if isinstance(question, ChoiceQuestion):
        probabilities = _as_mapping(value, "choice")
        choice = max(probabilities, key=lambda option: probabilities[option])
        return {
            "type": "choice",
            "choice": choice,
            "confidence": _choice_confidence(probabilities),
            "probabilities": dict(probabilities),
        }
    if isinstance(question, ScoreQuestion):
        if isinstance(value, Mapping):
            levels = {str(key): float(p) for key, p in value.items()}
        elif isinstance(value, Sequence):
            levels = {str(index): float(p) for index, p in enumerate(value)}
        else:
            raise TypeError("a score question needs per-level probabilities, not a number")
        score = math.fsum(int(level) * p for level, p in levels.items())
        legend = {str(index): level for index, level in enumerate(question.criteria)}
        return {
            "type": "score",
            "score": score,
            "confidence": _score_confidence(levels),
            "legend": legend,
            "probabilities": levels,
        }
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"a noul question needs a probability, got {type(value).__name__}")
    return {"type": "noul", "noul": float(value)}


_NOTHING_BILLED = {"input_tokens": 0, "output_tokens": 0}


def _choice_confidence(probabilities: Mapping[str, float]) -> float:
    # TypeSafe's documented formula: how far the top option is above a uniform guess (0 to 1).
    n = len(probabilities)
    return (max(probabilities.values()) - 1 / n) / (1 - 1 / n)


def _score_confidence(levels: Mapping[str, float]) -> float:
    # TypeSafe's documented formula: 1 - (spread around the most probable level) / (uniform spread).
    probabilities = [levels[str(level)] for level in range(len(levels))]
    n = len(probabilities)
    mode = max(range(n), key=lambda level: probabilities[level])
    spread = math.fsum(p * abs(level - mode) for level, p in enumerate(probabilities))
    uniform = math.fsum(abs(level - (n - 1) / 2) for level in range(n)) / n
    return max(0.0, 1 - spread / uniform)


def _as_mapping(value: ScriptedValue, kind: str) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise TypeError(f"a {kind} question needs a mapping option -> probability")
    return {str(key): float(p) for key, p in value.items()}


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class ScriptedJudge:
    """A deterministic judge answering from a function: for tests and offline examples.

    Example:
        >>> from llama_jev import ScriptedJudge
        >>> from llama_jev.systemone import NoulQuestion, SystemOneRequest
        >>> judge = ScriptedJudge(lambda state, qid, ins: 0.9 if "refund" in str(ins) else 0.1)
        >>> request = SystemOneRequest(
        ...     state="q", questions={"item_0": NoulQuestion(instructions="refund rules")}
        ... )
        >>> judge.system_one(request).noul("item_0")
        0.9

    Every request received is kept in ``requests`` (thread-safe), so tests can assert what was
    asked. A judge that answers without end (a demo server, a benchmark) passes
    ``keep_requests=False``: kept requests grow the heap by about a hundred objects per request,
    and Python's garbage collector then walks that growing heap on behalf of every later call.
    """

    def __init__(self, answer: AnswerFunction, *, model: str = "scripted", keep_requests: bool = True) -> None:
        self._answer = answer
        self._model = model
        self._lock = threading.Lock()
        self._requests: list[SystemOneRequest] | None = [] if keep_requests else None

    @property
    def model(self) -> str:
        """The model its results name (``model=`` when made); traces show it as the reranker's model."""
        return self._model

    @property
    def requests(self) -> list[SystemOneRequest]:
        """A copy of the requests answered so far, oldest first.

        Raises:
            RuntimeError: the judge was made with ``keep_requests=False``, so it has none to show.
        """
        if self._requests is None:
            raise RuntimeError("this ScriptedJudge keeps no requests (keep_requests=False); make it without that")
        with self._lock:
            return list(self._requests)

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer ``request`` from the script (``timeout`` is accepted and unused: no I/O)."""
        if self._requests is not None:
            with self._lock:
                self._requests.append(request)
        return answer_request(request, self._answer, model=self._model)

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`; the script runs inline, it does no I/O."""
        return self.system_one(request, timeout=timeout)

    def __repr__(self) -> str:
        return f"ScriptedJudge(model={self._model!r})"
