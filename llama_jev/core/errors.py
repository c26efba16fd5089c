"""The exception tree of llama_jev.

Every error a user can act on has its own class; messages say what failed, with which status and
whether a retry could help. Messages never carry an API key, query text or document text: tool
exceptions are shown to an LLM, and records end up in logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llama_jev.core.records import DecisionRecord, Status

__all__ = [
    "CandidateTooLargeError",
    "JevAPIError",
    "JevAuthenticationError",
    "JevBadRequestError",
    "JevConnectionError",
    "JevError",
    "JevInvalidResponseError",
    "JevNotFoundError",
    "JevOverloadedError",
    "JevPermissionDeniedError",
    "JevRateLimitError",
    "JevServerError",
    "JevTimeoutError",
    "EvidenceTooLargeError",
    "LocalJudgeTimeoutError",
    "MissingRuntimeContextError",
    "PermissionsUnavailableError",
    "ResponseWithheldError",
    "QueryTooLargeError",
    "RetrievalInconclusiveError",
    "RetrievalUnavailableError",
    "UnencodableTextError",
    "UntranslatableFilterError",
]


class JevError(Exception):
    """Base class of every error raised by llama_jev."""


class JevAPIError(JevError):
    """A System One call failed.

    Attributes:
        status_code: the HTTP status of the response, or ``None`` when no response arrived
            (connection failure, per-attempt timeout) or the response was unusable.
        retryable: whether the same request may succeed if sent again.
        retry_after: seconds the server asked to wait before a retry (``Retry-After``), if any.
        message: the server's message (``message``, ``error`` or ``detail`` of the body) or a
            description of what went wrong, with any credential removed.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.retry_after = retry_after
        super().__init__(message)

    def __str__(self) -> str:
        status = f"HTTP {self.status_code}" if self.status_code is not None else "no HTTP status"
        hint = "retryable" if self.retryable else "not retryable"
        return f"{self.message} ({status}, {hint})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class JevAuthenticationError(JevAPIError):
    """401: the API key is missing, wrong or revoked. Not retried."""


class JevPermissionDeniedError(JevAuthenticationError):
    """403: the key is valid but may not use this model or endpoint. Not retried."""


class JevBadRequestError(JevAPIError):
    """400 or 422: the server rejected the request body. Not retried: the same body fails again."""


class JevNotFoundError(JevAPIError):
    """404: wrong base URL or unknown model. Not retried."""


class JevRateLimitError(JevAPIError):
    """429: rate limited. Retried after ``retry_after`` seconds when the server says so."""


class JevOverloadedError(JevAPIError):
    """529: the service is overloaded. Retried with backoff (or after ``retry_after``)."""


class JevServerError(JevAPIError):
    """A 5xx response (other than 529). Retried with backoff."""


class JevTimeoutError(JevAPIError, TimeoutError):
    """An attempt, or the whole call, ran out of time (also 408). Retried while budget remains."""


class LocalJudgeTimeoutError(JevTimeoutError):
    """A judge that runs in this process (the offline judge) needed more than the judgement's budget.

    Not retryable: nothing was slow to answer, the work itself takes longer than the budget on
    this machine, and would again. Raise ``ExecutionOptions(budget=...)`` or judge fewer or
    shorter candidates. ``budget`` (seconds) and ``candidates`` say what was asked.
    """

    def __init__(self, *, budget: float, candidates: int) -> None:
        self.budget = budget
        self.candidates = candidates
        super().__init__(
            f"the local judge needed more than the {budget:g} s budget for {candidates} candidates; raise `budget=`",
            retryable=False,
        )


class JevConnectionError(JevAPIError, ConnectionError):
    """The server could not be reached, or closed the connection before answering. Retried."""


class JevInvalidResponseError(JevAPIError):
    """The response broke the protocol (bad JSON, wrong keys or types, probability outside [0, 1]).

    Not retried: a server that answers wrongly once is not to be trusted by asking again.
    """


class CandidateTooLargeError(JevError, ValueError):
    """A single candidate's text exceeds what one System One request can carry.

    Nothing is truncated: split such documents into smaller nodes (a node parser with a smaller
    ``chunk_size``), or raise the selector's ``max_request_tokens`` if your server allows it.
    """


class QueryTooLargeError(JevError, ValueError):
    """The query alone (with the question) takes more of a System One request than there is room for.

    Nothing is truncated: shorten the query, or raise the selector's ``max_request_tokens`` if
    your server allows it. The candidates are not at fault.
    """


class UnencodableTextError(JevError, ValueError):
    """The query or a candidate's text cannot be encoded as UTF-8 (a lone surrogate).

    Lone surrogates appear when broken emoji escapes (``"\\ud83d"`` without its pair) are decoded;
    no server can be sent such text. Repair it where it is decoded or ingested. The message names
    the node id (or says "the query"), never the text.
    """


class UntranslatableFilterError(JevError, ValueError):
    """A caller's ``MetadataFilter`` a store's native filter cannot state exactly (Chroma's ``where``).

    The message names the filter's key and operator, never its value. Pushdown catches it: that
    retriever gets no pushdown, and the ACL post-filters (``llama_jev.stores``).
    """


class MissingRuntimeContextError(JevError, LookupError):
    """No ``RuntimeContext`` is bound and none was passed: there is no implicit identity."""


class PermissionsUnavailableError(JevError):
    """The authorization engine could not decide (down, slower than allowed, or unreadable): no node is returned.

    Raised in every mode (OFF and SHADOW too): permissions are never guessed, and nothing the
    engine did not clearly allow is served or cached. The message names the engine and what
    failed, never an identity value, a node id or text.

    Attributes:
        engine: which engine was asked (``"cerbos"``, ``"spicedb"``, ...).
        reason: ``UNREACHABLE`` (no connection), ``TIMEOUT`` (no answer in time),
            ``INVALID_RESPONSE`` (an answer that cannot be read as a decision), ``REFUSED``
            (the engine rejected the request: configuration, schema or credentials).
        retryable: whether asking again can help (``UNREACHABLE`` and ``TIMEOUT``: yes).

    Example::

        try:
            nodes = retriever.retrieve("What are the refund conditions?")
        except PermissionsUnavailableError as error:
            ...  # answer "search is unavailable right now", never "no documents"
    """

    def __init__(self, message: str, *, engine: str, reason: str, retryable: bool = False) -> None:
        self.engine = engine
        self.reason = reason
        self.retryable = retryable
        super().__init__(message)


class RetrievalUnavailableError(JevError):
    """ENFORCE could not judge the candidates (timeout, HTTP error after retries, invalid answer).

    This is not "no evidence": the knowledge base may well hold the answer. The message says
    what failed and whether a retry can help; the same facts are attributes:

    Attributes:
        reason: the decision record's reason (``TIMEOUT``, ``CALL_OR_RESPONSE_ERROR``,
            ``CANDIDATE_TOO_LARGE``, ``QUERY_TOO_LARGE``, ``UNENCODABLE_TEXT``).
        status_code: the judge's HTTP status, or ``None`` (no response, a local judge, bad data).
        retryable: whether asking again can help (timeouts, 408, 429, 529, 5xx, connection
            failures); ``False`` for a wrong key (401/403), a rejected request (400/422/404), a bad
            configuration or data the judge cannot take.
        error_type: the class name of the underlying error (``JevAuthenticationError``, ...).

    Example::

        try:
            nodes = retriever.retrieve("What are the refund conditions?")
        except RetrievalUnavailableError as error:
            if error.retryable:
                ...  # try again later, or answer "the search is unavailable right now"
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        status_code: int | None = None,
        retryable: bool = False,
        error_type: str | None = None,
    ) -> None:
        self.reason = reason
        self.status_code = status_code
        self.retryable = retryable
        self.error_type = error_type
        super().__init__(message)


class RetrievalInconclusiveError(JevError):
    """ENFORCE selected nothing and at least one candidate was uncertain.

    ``uncertain`` holds the node ids whose probability fell strictly between the thresholds.
    """

    def __init__(self, message: str, *, uncertain: tuple[str, ...]) -> None:
        self.uncertain = uncertain
        super().__init__(message)


class ResponseWithheldError(JevError):
    """ENFORCE: the final answer was not published, because its review did not pass.

    The draft (and any revision) failed the grounding question, stayed uncertain, had no evidence
    to be checked against, could not be judged, or could not be revised. The message and the
    attributes say which, never the answer, the evidence or the query.

    Attributes:
        reason: why, one of ``llama_jev.WithheldReason`` (``UNSUPPORTED``, ``UNCERTAIN``,
            ``NO_EVIDENCE``, ``TIMEOUT``, ``CALL_OR_RESPONSE_ERROR``, ``CANDIDATE_TOO_LARGE``,
            ``REVISION_FAILED``, ``REVISION_EMPTY``, ``REVISION_HAS_TOOL_CALLS``).
        status: the ``Status`` of the last judgement (``decided``, ``inconclusive``, ``error``,
            ``skipped`` when no judge was asked), or ``None`` when none was recorded.
        probability: the last probability the judge gave, if any.
        revisions: how many revisions were asked of the LLM.
        retryable: whether asking again may succeed (a judge timeout, 429 or 5xx; an LLM
            timeout), as opposed to a verdict on the answer.
        status_code: the judge's HTTP status when the judge failed with one.
        record: the last ``DecisionRecord`` (ids and probabilities only), if any.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        status: Status | None = None,
        probability: float | None = None,
        revisions: int = 0,
        retryable: bool = False,
        status_code: int | None = None,
        record: DecisionRecord | None = None,
    ) -> None:
        self.reason = reason
        self.status = status
        self.probability = probability
        self.revisions = revisions
        self.retryable = retryable
        self.status_code = status_code
        self.record = record
        super().__init__(message)


class EvidenceTooLargeError(ResponseWithheldError, CandidateTooLargeError):
    """The evidence and the draft do not fit in one System One request, so the draft cannot be reviewed.

    Nothing is truncated: pass fewer or smaller passages (a smaller ``top_k``, smaller nodes).
    Raised in ENFORCE (the answer is withheld); SHADOW keeps the draft and records the ``ERROR``.
    """
