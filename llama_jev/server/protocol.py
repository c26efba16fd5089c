"""The System One protocol as the server speaks it: routes, limits, error bodies and the request
body's checks, as pure functions (no sockets, no framework)."""

from __future__ import annotations

import http
import json
from typing import Any, Final

from pydantic import ValidationError

from llama_jev.systemone.judge import AnswerFunction, ScriptedValue
from llama_jev.systemone.wire import ChoiceQuestion, Instructions, ScoreQuestion, SystemOneRequest

SYSTEM_ONE_PATH: Final = "/v1/systemone"
MODELS_PATH: Final = "/v1/models"
HEALTH_PATH: Final = "/healthz"
READY_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
ROUTES: Final = (SYSTEM_ONE_PATH, MODELS_PATH, HEALTH_PATH, READY_PATH, METRICS_PATH)

MAX_NESTING: Final = 64
"""The deepest JSON nesting a request body may have (deeper: 400)."""
MAX_CANDIDATES: Final = 1024
"""The most questions (candidates) one request may hold (more: 413)."""
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
# The admission, batching and body-time defaults, the same for ``create_app`` and ``python -m llama_jev.serve``.
DEFAULT_MAX_IN_FLIGHT: Final = 4
DEFAULT_QUEUE: Final = 16
DEFAULT_MAX_BATCH_TOKENS: Final = 8192
DEFAULT_BODY_TIMEOUT: Final = 30.0
JSON_TYPE: Final = "application/json"

# Statuses the System One API uses that http.HTTPStatus does not know.
_EXTRA_REASONS = {529: "Overloaded"}


def reason(status: int) -> str:
    """The reason phrase of ``status`` (``"Overloaded"`` for System One's 529)."""
    if status in _EXTRA_REASONS:
        return _EXTRA_REASONS[status]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def json_bytes(payload: object) -> bytes:
    """``payload`` as JSON bytes.

    ``allow_nan`` stays on: the test server's probability fault must reach a client as the
    literal token ``NaN``, as a careless server would send it; real answers are validated first.
    """
    return json.dumps(payload, allow_nan=True).encode("utf-8")


def error_payload(message: str) -> dict[str, Any]:
    """The body of every error the server gives, other than a body that fails validation."""
    return {"error": message}


def invalid_body_payload(message: str, kind: str) -> dict[str, Any]:
    """A body the server cannot read (400) or that fails validation (422), in FastAPI's shape."""
    return {"detail": [{"loc": ["body"], "msg": message, "type": kind}]}


def validation_detail(error: ValidationError) -> list[dict[str, Any]]:
    """FastAPI's ``detail`` list for ``error``; ``input`` is left out so a 422 never echoes text back."""
    return [
        {"loc": ["body", *item["loc"]], "msg": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False)
    ]


def candidate_errors(request: SystemOneRequest) -> list[dict[str, Any]]:
    """A 422's ``detail`` for every question whose ``instructions.candidate`` is not text (empty: none).

    The candidate is the passage judged: a number or an object there is a client's bug, which a
    judge would otherwise answer "uncertain" (0.5) without a word.

    Example:
        >>> from llama_jev.systemone.wire import NoulQuestion
        >>> bad = NoulQuestion(instructions={"question": "Relevant?", "candidate": 12345})
        >>> candidate_errors(SystemOneRequest(state="q", questions={"item_0": bad}))[0]["loc"]
        ['body', 'questions', 'item_0', 'instructions', 'candidate']
    """
    detail = []
    for question_id, question in request.questions.items():
        instructions = question.instructions
        if isinstance(instructions, dict) and "candidate" in instructions:
            value = instructions["candidate"]
            if not isinstance(value, str):
                kind = "null" if value is None else type(value).__name__
                message = f"the candidate must be text (a JSON string), got {kind}"
                loc = ["body", "questions", question_id, "instructions", "candidate"]
                detail.append({"loc": loc, "msg": message, "type": "string_type"})
    return detail


def known_fields(body: Any) -> Any:
    """``body`` without unknown top-level fields (a client's trace id, a future option), as TypeSafe does."""
    if isinstance(body, dict):
        return {key: value for key, value in body.items() if key in SystemOneRequest.model_fields}
    return body


def is_json_content_type(content_type: str | None) -> bool:
    """Whether a request's Content-Type announces JSON; a request without one is read as JSON."""
    if content_type is None or not content_type.strip():
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON_TYPE or (media.startswith("application/") and media.endswith("+json"))


class BodyError(ValueError):
    """A request body the server refuses before validating it: the status and what to tell the client."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def parse_body(body: bytes) -> Any:
    """The parsed JSON of ``body``.

    Raises:
        BodyError: 400 when it is empty, not UTF-8 JSON, or nested deeper than :data:`MAX_NESTING`.
    """
    if not body.strip():
        raise BodyError(400, "the body is empty: send a JSON object", "json_invalid")
    try:
        parsed = json.loads(body)
    except RecursionError:
        # The C parser gives up on very deep nesting itself; no stack is left to it.
        raise BodyError(400, f"the body is nested deeper than {MAX_NESTING} levels", "json_too_deep") from None
    except ValueError as error:
        raise BodyError(400, f"the body is not JSON ({type(error).__name__})", "json_invalid") from None
    if _depth_exceeds(parsed, MAX_NESTING):
        raise BodyError(400, f"the body is nested deeper than {MAX_NESTING} levels", "json_too_deep")
    return parsed


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Iterative, so a hostile body cannot exhaust the stack here either.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def uniform_answers(request: SystemOneRequest) -> AnswerFunction:
    """The maximally uncertain answers: 0.5 for yes/no, uniform over options and levels otherwise."""

    def answer(state: Instructions, question_id: str, instructions: Instructions | None) -> ScriptedValue:
        question = request.questions[question_id]
        if isinstance(question, ChoiceQuestion):
            return {option: 1.0 / len(question.criteria) for option in question.criteria}
        if isinstance(question, ScoreQuestion):
            return [1.0 / len(question.criteria)] * len(question.criteria)
        return 0.5

    return answer
