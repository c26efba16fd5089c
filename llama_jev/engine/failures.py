"""What a failed judgement tells a user: the reason, the error class, the status, whether to retry.

:func:`describe_failure` reads an ``ERROR`` decision into a :class:`JudgeFailure`, whose message
is what ``RetrievalUnavailableError`` and the SHADOW warning say; never any text of the query or
the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llama_jev.core.errors import JevAPIError, LocalJudgeTimeoutError
from llama_jev.core.records import Decision, Reason

__all__ = ["JudgeFailure", "describe_failure"]


@dataclass(frozen=True)
class JudgeFailure:
    """What a failed judgement can tell a user, without any text: the facts of the error."""

    reason: str
    error_type: str
    status_code: int | None
    retryable: bool
    # What failed, when the error says it better than the reason's headline (an in-process timeout).
    detail: str | None = None

    def facts(self) -> dict[str, Any]:
        """``error_type``, ``status_code`` and ``retryable``: what telemetry may say of the failure."""
        return {"error_type": self.error_type, "status_code": self.status_code, "retryable": self.retryable}

    @property
    def summary(self) -> str:
        """``reason, error class, HTTP status, retryable`` in one phrase (for logs)."""
        status = f"HTTP {self.status_code}" if self.status_code is not None else "no HTTP status"
        hint = "retryable" if self.retryable else "not retryable"
        return f"{self.reason}, {self.error_type}, {status}, {hint}"

    def message(self) -> str:
        """The message of :class:`RetrievalUnavailableError`: what failed, whether to retry, what to do."""
        status = f"HTTP {self.status_code}" if self.status_code is not None else "no HTTP status"
        what = self.detail or _HEADLINES.get(self.reason, "the relevance judge failed")
        return (
            f"{what} ({self.reason}: {self.error_type}, {status}); this is not an empty result, the "
            f"knowledge base was not searched to a conclusion. {self._advice()}"
        )

    def _advice(self) -> str:
        if self.reason == "CANDIDATE_TOO_LARGE":
            return "Retrying will not help: split the documents into smaller nodes."
        if self.reason == "QUERY_TOO_LARGE":
            return "Retrying will not help: shorten the query."
        if self.reason == "UNENCODABLE_TEXT":
            return "Retrying will not help: repair the lone surrogate where the text is decoded or ingested."
        if self.reason == "TIMEOUT" and self.detail is not None:
            return (
                "Retrying will not help: the judge runs in this process and the same work takes as long again; "
                "raise ExecutionOptions(budget=...) or judge fewer or shorter candidates."
            )
        if self.retryable:
            return "Retrying later may help (the judge timed out, was rate limited, overloaded or unreachable)."
        return f"Retrying will not help: {_not_retryable_advice(self.status_code)}"


_HEADLINES = {
    "CANDIDATE_TOO_LARGE": "a candidate is too large to judge in one request",
    "QUERY_TOO_LARGE": "the query is too large to judge in one request",
    "UNENCODABLE_TEXT": "the query or a candidate holds text that cannot be encoded",
}


def _not_retryable_advice(status: int | None) -> str:
    if status in (401, 403):
        return "the judge refused the API key; check TYPESAFE_API_KEY (or api_key=) and its permissions."
    if status == 404:
        return "the judge's endpoint or model was not found; check base_url and model."
    if status in (400, 422):
        return "the judge rejected the request; check the selector's configuration (question, request size)."
    return "the judge could not answer this request; check its configuration (or the server's answers)."


def describe_failure(decision: Decision) -> JudgeFailure:
    """The facts of an ``ERROR`` decision: reason, error class, HTTP status, whether retrying can help.

    Only a timeout (of the budget or an attempt) and errors the client marks retryable (408, 429,
    529, 5xx, connection failures) count as retryable; a wrong key, a rejected request, an
    invalid answer, data the judge cannot take or an unknown error do not.

    Example:
        >>> from llama_jev.core import Reason, Status
        >>> describe_failure(Decision(Status.ERROR, Reason.TIMEOUT, error=TimeoutError())).retryable
        True
    """
    error = decision.error
    status_code = error.status_code if isinstance(error, JevAPIError) else None
    if isinstance(error, LocalJudgeTimeoutError):
        # The judge computes in this process: the same work would run out of the same budget again.
        return JudgeFailure(
            reason=decision.reason.value,
            error_type=type(error).__name__,
            status_code=None,
            retryable=False,
            detail=error.message,
        )
    if isinstance(error, JevAPIError):
        retryable = error.retryable or decision.reason is Reason.TIMEOUT
    else:
        retryable = isinstance(error, TimeoutError)
    return JudgeFailure(
        reason=decision.reason.value,
        error_type=type(error).__name__ if error is not None else "unknown error",
        status_code=status_code,
        retryable=retryable,
    )
