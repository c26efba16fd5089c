"""The TypeSafe System One wire format, written once as pydantic models.

Requests are validated when built (before anything is sent); responses are validated when they
arrive, first by shape (:class:`SystemOneResult`) and then against the request they answer
(:func:`check_result`). Inside the package nothing handles loose dicts.
"""

from __future__ import annotations

import math
import weakref
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from llama_jev.core.errors import JevInvalidResponseError

__all__ = [
    "Answer",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "Instructions",
    "NoulAnswer",
    "NoulCriteria",
    "NoulQuestion",
    "Question",
    "ScoreAnswer",
    "ScoreQuestion",
    "SystemOneRequest",
    "SystemOneResult",
    "Usage",
    "check_result",
]

DEFAULT_MODEL = "jev-latest"
MAX_CHOICE_OPTIONS = 255
MAX_SCORE_LEVELS = 10
# Probabilities that should sum to one may be off by rounding on the server side.
_SUM_TOLERANCE = 1e-3
_SCORE_TOLERANCE = 1e-3

Instructions = str | dict[str, Any] | list[Any]
"""What a question asks: plain text, or a JSON object / array the model reads as structure."""

Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True)]


class _Outgoing(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Incoming(BaseModel):
    # Unknown fields are ignored so a server may add information without breaking clients;
    # known fields are strict: "0.9" is not a probability.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class NoulCriteria(_Outgoing):
    """What counts as a yes (``true``) and as a no (``false``) answer."""

    true: Instructions | None = None
    false: Instructions | None = None


class NoulQuestion(_Outgoing):
    """A yes/no question; its answer is the probability of yes.

    Example:
        >>> NoulQuestion(instructions="Is this message about refunds?").type
        'noul'
    """

    type: Literal["noul"] = "noul"
    instructions: Instructions | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_Outgoing):
    """Pick one of 2 to 255 named options (``criteria``: name -> description or ``None``)."""

    type: Literal["choice"] = "choice"
    instructions: Instructions | None = None
    criteria: dict[str, Instructions | None]

    @field_validator("criteria")
    @classmethod
    def _option_count(cls, criteria: dict[str, Instructions | None]) -> dict[str, Instructions | None]:
        if not 2 <= len(criteria) <= MAX_CHOICE_OPTIONS:
            raise ValueError(f"a choice question needs 2 to {MAX_CHOICE_OPTIONS} options, got {len(criteria)}")
        if any(not name.strip() for name in criteria):
            raise ValueError("choice option names must not be blank")
        return criteria


class ScoreQuestion(_Outgoing):
    """Rate against 2 to 10 ordered levels; level ``i`` scores ``i``."""

    type: Literal["score"] = "score"
    instructions: Instructions | None = None
    criteria: list[Instructions]

    @field_validator("criteria")
    @classmethod
    def _level_count(cls, criteria: list[Instructions]) -> list[Instructions]:
        if not 2 <= len(criteria) <= MAX_SCORE_LEVELS:
            raise ValueError(f"a score question needs 2 to {MAX_SCORE_LEVELS} levels, got {len(criteria)}")
        return criteria


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class SystemOneRequest(_Outgoing):
    """One ``POST /v1/systemone`` body: a state and the questions asked about it.

    Example:
        >>> request = SystemOneRequest(
        ...     state="What are the refund conditions?",
        ...     questions={"item_0": NoulQuestion(instructions="Is this passage about refunds?")},
        ... )
        >>> request.wire()["questions"]["item_0"]["type"]
        'noul'
    """

    state: Instructions
    questions: dict[str, Question]
    model: str = DEFAULT_MODEL

    @field_validator("questions")
    @classmethod
    def _question_ids(cls, questions: dict[str, Question]) -> dict[str, Question]:
        if not questions:
            raise ValueError("a request needs at least one question")
        if any(not question_id.strip() for question_id in questions):
            raise ValueError("question ids must not be blank")
        return questions

    @field_validator("model")
    @classmethod
    def _model_name(cls, model: str) -> str:
        if not model.strip():
            raise ValueError("model must not be blank")
        return model

    @model_validator(mode="after")
    def _finite_numbers(self) -> SystemOneRequest:
        # JSON has no NaN or Infinity: refused here, so encoding never writes them (or a null).
        parts: list[Any] = [self.state]
        for question in self.questions.values():
            criteria = question.criteria
            parts.append(question.instructions)
            parts.append(criteria.model_dump() if isinstance(criteria, NoulCriteria) else criteria)
        if not all(_finite(part) for part in parts):
            raise ValueError("numbers in a request must be finite (JSON has no NaN or Infinity)")
        return self

    def wire(self) -> dict[str, Any]:
        """The JSON body as sent: ``None`` fields are left out."""
        return self.model_dump(mode="json", exclude_none=True)

    def wire_json(self) -> bytes:
        """The JSON body as sent, encoded (UTF-8): what :meth:`wire` gives, serialised in one step."""
        return self.__pydantic_serializer__.to_json(self, exclude_none=True)


def _finite(value: Any) -> bool:
    if isinstance(value, str) or value is None:
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(item) for item in value)
    return True


class NoulAnswer(_Incoming):
    """The probability (``noul``) that the answer to a yes/no question is yes."""

    type: Literal["noul"]
    noul: Probability


class ChoiceAnswer(_Incoming):
    """The chosen option, the model's confidence and the probability of every option."""

    type: Literal["choice"]
    choice: StrictStr
    confidence: Probability
    probabilities: dict[str, Probability]


class ScoreAnswer(_Incoming):
    """The expected level (``score`` = sum of i * p_i), with the per-level probabilities."""

    type: Literal["score"]
    score: Annotated[float, Field(ge=0.0, allow_inf_nan=False, strict=True)]
    confidence: Probability
    legend: dict[str, Instructions]
    probabilities: dict[str, Probability]


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class Usage(_Incoming):
    """Token counts the server billed for the request."""

    input_tokens: Annotated[StrictInt, Field(ge=0)]
    output_tokens: Annotated[StrictInt, Field(ge=0)]


class SystemOneResult(_Incoming):
    """A validated System One response: the answering model, answers by question id, usage."""

    model: StrictStr
    answers: dict[str, Answer]
    usage: Usage

    @model_validator(mode="after")
    def _not_empty(self) -> SystemOneResult:
        if not self.answers:
            raise ValueError("the response holds no answers")
        return self

    def noul(self, question_id: str) -> float:
        """The yes-probability answered for ``question_id`` (a noul question)."""
        answer = self.answers[question_id]
        if not isinstance(answer, NoulAnswer):
            raise TypeError(f"answer {question_id!r} is a {answer.type} answer, not noul")
        return answer.noul


def check_result(request: SystemOneRequest, result: SystemOneResult) -> SystemOneResult:
    """Check that ``result`` answers exactly ``request``; return it, or raise.

    Answer ids must equal the question ids, each answer must have its question's type, and choice
    and score distributions must be consistent with the question (same options or levels, summing
    to one, ``choice`` the most probable option, ``score`` the expectation).

    A result already checked against this same ``request`` object (and still holding the same
    answers) is returned without walking it again: every answer is checked exactly once, by
    whoever sees it first (the client for the wire, the selector for any other judge).

    Raises:
        JevInvalidResponseError: naming the first question id whose answer is wrong.
    """
    if _is_checked(request, result):
        return result
    asked, answered = set(request.questions), set(result.answers)
    if asked != answered:
        missing, extra = sorted(asked - answered), sorted(answered - asked)
        raise JevInvalidResponseError(
            f"answer ids do not match the question ids (missing: {missing}, unexpected: {extra})"
        )
    for question_id, question in request.questions.items():
        problem = _answer_problem(question, result.answers[question_id])
        if problem is not None:
            raise JevInvalidResponseError(f"answer {question_id!r}: {problem}")
    _mark_checked(request, result)
    return result


# Results already checked, by id: the request and the very answers dict they were checked
# against. Kept beside the results, not in them, so checking never changes a result's ``==``;
# an entry leaves with its result (weakref callback), so an id is never mistaken for another.
_checked: dict[int, tuple[weakref.ref[SystemOneResult], SystemOneRequest, dict[str, Answer]]] = {}


def _mark_checked(request: SystemOneRequest, result: SystemOneResult) -> None:
    key = id(result)
    _checked[key] = (weakref.ref(result, lambda _: _checked.pop(key, None)), request, result.answers)


def _is_checked(request: SystemOneRequest, result: SystemOneResult) -> bool:
    entry = _checked.get(id(result))
    return entry is not None and entry[0]() is result and entry[1] is request and entry[2] is result.answers


def _answer_problem(question: Question, answer: Answer) -> str | None:
    if answer.type != question.type:
        return f"a {answer.type} answer to a {question.type} question"
    if isinstance(question, ChoiceQuestion) and isinstance(answer, ChoiceAnswer):
        return _choice_problem(question, answer)
    if isinstance(question, ScoreQuestion) and isinstance(answer, ScoreAnswer):
        return _score_problem(question, answer)
    return None


def _distribution_problem(expected_keys: set[str], probabilities: dict[str, float]) -> str | None:
    if set(probabilities) != expected_keys:
        return f"probabilities are keyed {sorted(probabilities)}, expected {sorted(expected_keys)}"
    total = math.fsum(probabilities.values())
    if abs(total - 1.0) > _SUM_TOLERANCE:
        return f"probabilities sum to {total:.6f}, not 1"
    return None


def _choice_problem(question: ChoiceQuestion, answer: ChoiceAnswer) -> str | None:
    problem = _distribution_problem(set(question.criteria), answer.probabilities)
    if problem is not None:
        return problem
    best = max(answer.probabilities.values())
    if answer.probabilities.get(answer.choice, -1.0) < best - _SUM_TOLERANCE:
        return f"choice {answer.choice!r} is not the most probable option"
    return None


def _score_problem(question: ScoreQuestion, answer: ScoreAnswer) -> str | None:
    levels = {str(level) for level in range(len(question.criteria))}
    problem = _distribution_problem(levels, answer.probabilities)
    if problem is not None:
        return problem
    if set(answer.legend) != levels:
        return f"legend is keyed {sorted(answer.legend)}, expected {sorted(levels)}"
    expectation = math.fsum(int(level) * p for level, p in answer.probabilities.items())
    if abs(expectation - answer.score) > _SCORE_TOLERANCE * len(levels):
        return f"score {answer.score} is not the expectation {expectation:.4f} of its probabilities"
    return None
