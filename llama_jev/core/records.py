"""How a judgement runs and what it leaves behind: modes, options, statuses, decisions, records."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import time
import unicodedata
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from llama_jev.core.identity import RuntimeContext

__all__ = [
    "DEFAULT_ACCEPT",
    "DEFAULT_REJECT",
    "QUERY_KEY_SECRET_ENVIRONMENT",
    "Budget",
    "Decision",
    "DecisionRecord",
    "ExecutionOptions",
    "LabelSink",
    "Mode",
    "Observer",
    "Reason",
    "RetrievalFacts",
    "Selection",
    "Status",
    "normalize_query",
    "query_key",
]

QUERY_KEY_SECRET_ENVIRONMENT = "LLAMA_JEV_QUERY_KEY_SECRET"  # noqa: S105 - a variable name, not a secret

DEFAULT_REJECT = 0.2
"""The default ``reject`` threshold: ``p <= 0.2`` is rejected (selector, review, calibration's replay)."""
DEFAULT_ACCEPT = 0.8
"""The default ``accept`` threshold: ``p >= 0.8`` is selected."""

RestrictionKindName: TypeAlias = Literal["everything", "nothing", "ids", "condition", "none"]
"""What a record says of the restriction a store pre-selected with (``llama_jev.acl.RestrictionKind``'s values)."""

# The package's one logger (DESIGN names it for what a user must be told).
logger = logging.getLogger("llama_jev")


class Mode(str, Enum):
    """What the judge's verdict does to a retrieval.

    ``OFF``: no judge call, no record. ``SHADOW``: the judge is asked and its suggestion recorded,
    the nodes are untouched (calibrate before you enforce). ``ENFORCE``: only what the judge
    clearly accepts is returned.
    """

    OFF = "off"
    SHADOW = "shadow"
    ENFORCE = "enforce"

    @classmethod
    def _missing_(cls, value: object) -> Mode:
        # "ENFORCE", "Shadow" or " off " mean what they say; anything else is refused with the
        # values that work, since "'ENFORCE' is not a valid Mode" leaves a user guessing.
        if isinstance(value, str):
            folded = value.strip().casefold()
            for mode in cls:
                if mode.value == folded:
                    return mode
        valid = ", ".join(repr(mode.value) for mode in cls)
        raise ValueError(
            f"{value!r} is not a valid Mode: use one of {valid} (in any case) or Mode.OFF, Mode.SHADOW, Mode.ENFORCE"
        )


class Status(str, Enum):
    """How a judgement ended."""

    DECIDED = "decided"
    """Every candidate was answered and something was selected or everything was rejected."""
    INCONCLUSIVE = "inconclusive"
    """Nothing was selected and at least one candidate was uncertain."""
    ERROR = "error"
    """The judge failed (timeout, HTTP error after retries, invalid answer)."""
    CANCELLED = "cancelled"
    """The caller cancelled the judgement (asyncio); the cancellation was re-raised."""
    SKIPPED = "skipped"
    """Nothing was asked: mode OFF, or no candidate to judge."""


class Reason(str, Enum):
    """Why a judgement ended with its status."""

    CLASSIFIED = "CLASSIFIED"
    NO_CANDIDATES = "NO_CANDIDATES"
    MODE_OFF = "MODE_OFF"
    TIMEOUT = "TIMEOUT"
    CALL_OR_RESPONSE_ERROR = "CALL_OR_RESPONSE_ERROR"
    CANDIDATE_TOO_LARGE = "CANDIDATE_TOO_LARGE"
    QUERY_TOO_LARGE = "QUERY_TOO_LARGE"
    UNENCODABLE_TEXT = "UNENCODABLE_TEXT"
    CANCELLED = "CANCELLED"
    NO_EVIDENCE = "NO_EVIDENCE"
    """A draft review with no evidence: the draft fails without asking the judge."""


class DecisionRecord(BaseModel):
    """The audit trail of one judgement, for observers and calibration logs (JSONL).

    It holds ids, probabilities and timings only: never query text, node text, credentials or
    exception text, so it can be logged wherever the node ids may be.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    decision_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex, description="Unique id of this judgement (labels join on it)."
    )
    purpose: str
    version: str
    mode: Mode
    status: Status
    reason: Reason
    elapsed_ms: float = Field(ge=0.0)
    candidates: int = Field(ge=0, description="How many candidates were put to the judge (those the ACL let through).")
    judged: int = Field(
        default=0,
        ge=0,
        description=(
            "How many of them the judge answered: len(scores); 0 when the judgement failed or was skipped "
            "(a failed judgement keeps no partial answers)."
        ),
    )
    requests: int = Field(ge=0, description="How many System One requests the judgement needed.")
    model: str | None = Field(default=None, description="The model that answered, as the server named it.")
    selected: tuple[str, ...] = ()
    uncertain: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    scores: dict[str, float] = Field(default_factory=dict)
    retrieved: int | None = Field(
        default=None, ge=0, description="Nodes the upstream retriever returned (None: not a retrieval)."
    )
    denied: int | None = Field(default=None, ge=0, description="Of those, nodes the ACL removed (None: no ACL ran).")
    pushdown: bool = Field(
        default=False,
        description=(
            "Whether the ACL was pushed down into the vector store: then the store dropped the nodes the caller "
            "may not read before retrieval, so retrieved and denied count only what reached the in-process ACL "
            "(denied is usually 0, and retrieved 0 can mean nothing readable matched)."
        ),
    )
    engine: str | None = Field(
        default=None,
        description=(
            "Which ACL made the final check: 'metadata' (MetadataAcl), 'callable' (a plain function), "
            "'cerbos', 'spicedb', ... (None: no ACL ran). A name only, never an identity value."
        ),
    )
    restriction: RestrictionKindName | None = Field(
        default=None,
        description=(
            "The kind of restriction the store pre-selected with for this query: 'everything', 'nothing' (no "
            "store call at all), 'ids', 'condition', or 'none' (no pushdown); never the ids or values themselves."
        ),
    )
    wanted: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many permitted nodes the retriever wanted: top_k in OFF and SHADOW, max(candidate_limit, top_k) "
            "in ENFORCE (None: no count was asked for, e.g. a postprocessor or a retriever without top_k)."
        ),
    )
    found: int | None = Field(
        default=None,
        ge=0,
        description=(
            "How many of them the retrieval found (found < wanted: the store held fewer, or a bound stopped it)."
        ),
    )
    rounds: int | None = Field(
        default=None,
        ge=0,
        description="How many times the store was asked (widening doubles the window until wanted is found).",
    )
    shortfall: str | None = Field(
        default=None,
        description=(
            "Why found < wanted though the store may hold more (None: no shortfall, or the store holds no more): "
            "'bound' (the 1,024-candidate bound was reached while the final check dropped nodes), 'incomplete' "
            "(the store said its search stopped before reading all it may hold, e.g. an HNSW scan's budget), "
            "'no-pushdown', or 'cannot-widen'."
        ),
    )
    query_key: str | None = Field(
        default=None,
        description="HMAC-SHA256 of the normalised query under the configured secret (None: no secret set).",
    )
    queue_ms: float = Field(
        default=0.0,
        ge=0.0,
        description=(
            "The longest a request of this judgement waited for admission by the client's governor "
            "(its bound on requests in flight, or a Retry-After pause); 0.0 for judges without one."
        ),
    )
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="milliseconds"))

    def to_json(self) -> str:
        """One JSON line (no newline), as written to a calibration log."""
        return self.model_dump_json()


@dataclass(frozen=True)
class RetrievalFacts:
    """What a judgement's record says about the retrieval around it (:class:`DecisionRecord`'s fields).

    Written by ``JevRetriever`` and ``JevNodePostprocessor``; counts, names and kinds only.

    Example:
        >>> RetrievalFacts(retrieved=8, denied=3, engine="metadata", restriction="condition").record_fields()["denied"]
        3
    """

    retrieved: int | None = None
    denied: int | None = None
    pushdown: bool = False
    engine: str | None = None
    restriction: RestrictionKindName | None = None
    wanted: int | None = None
    found: int | None = None
    rounds: int | None = None
    shortfall: str | None = None

    def record_fields(self) -> dict[str, Any]:
        """The facts as :class:`DecisionRecord` keyword arguments."""
        return {
            "retrieved": self.retrieved,
            "denied": self.denied,
            "pushdown": self.pushdown,
            "engine": self.engine,
            "restriction": self.restriction,
            "wanted": self.wanted,
            "found": self.found,
            "rounds": self.rounds,
            "shortfall": self.shortfall,
        }


Observer = Callable[["RuntimeContext | None", DecisionRecord], Any]
"""``observer(ctx, record)``: called once per judgement; what it raises is logged and ignored."""


@runtime_checkable
class LabelSink(Protocol):
    """Receives the text of judged retrievals for labelling (``llama_jev.calibration.LabelSampler``
    is one). The engine calls :meth:`offer` after each judged retrieval; what it raises is
    logged and ignored, like an observer's."""

    def offer(self, record: DecisionRecord, query: str, candidates: Sequence[tuple[str, str]]) -> object:
        """One judged retrieval: its record, the query and ``(node_id, text)`` of the candidates
        the ACL let through (what the judge was asked about)."""
        ...


@dataclass(frozen=True)
class ExecutionOptions:
    """How judgements run.

    Args:
        mode: :class:`Mode`, or its value in any case (``"enforce"``, ``"ENFORCE"``). ``OFF`` asks
            no judge and writes no record: an ``observer`` given with it is never called (said
            once, at INFO, when the options are made).
        budget: seconds for the whole judgement of one retrieval: every batch, retry and backoff
            (upstream recall is not counted). When it runs out the judgement is an ``ERROR`` with
            reason ``TIMEOUT``.
        version: your label for this configuration (thresholds, prompt, model), kept in records
            so calibration data from different set-ups is not mixed.
        observer: gets one :class:`DecisionRecord` per judgement, called inline (also from
            ``aselect``, on the event loop): keep it quick, or hand the record to a queue.
        query_key_secret: a secret for ``DecisionRecord.query_key``, the HMAC-SHA256 of the
            normalised query, so labels written against query text can be joined to records
            that never hold it. Defaults to ``LLAMA_JEV_QUERY_KEY_SECRET``; unset, no key is
            written. A plain hash would not do: short queries ("refund?") are guessed by hashing
            candidates, so without the secret the key would reveal the query.
        label_sampler: opt-in, a :class:`LabelSink` such as
            ``llama_jev.calibration.LabelSampler("samples.jsonl")`` that keeps the query and the
            authorized candidates' text of a small share of judged retrievals for people to
            label (the records never hold text).

    Example:
        >>> ExecutionOptions(mode="shadow", budget=1.5).mode
        <Mode.SHADOW: 'shadow'>
    """

    mode: Mode
    budget: float = 2.0
    version: str = "v1"
    observer: Observer | None = field(default=None, compare=False)
    query_key_secret: str | bytes | None = field(default=None, compare=False, repr=False)
    label_sampler: LabelSink | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)):
            raise TypeError(f"budget must be a number of seconds, got {type(self.budget).__name__}")
        if not math.isfinite(self.budget) or self.budget <= 0:
            raise ValueError(f"budget must be a positive, finite number of seconds, got {self.budget!r}")
        if not isinstance(self.version, str) or not self.version.strip():
            raise ValueError("version must be a non-blank string")
        if self.observer is not None and not callable(self.observer):
            raise TypeError("observer must be callable as observer(ctx, record)")
        if self.mode is Mode.OFF and self.observer is not None:
            # OFF skips the judgement, so there is no record to observe; an empty audit log should
            # not be the first sign of it.
            logger.info(
                "ExecutionOptions(mode=OFF) with an observer: OFF asks no judge and writes no DecisionRecord, "
                "so the observer is never called; use Mode.SHADOW to record the judge's view without changing results"
            )
        if self.label_sampler is not None and not callable(getattr(self.label_sampler, "offer", None)):
            raise TypeError("label_sampler must have offer(record, query, candidates), e.g. a LabelSampler")
        secret = self.query_key_secret
        if secret is None:
            secret = os.environ.get(QUERY_KEY_SECRET_ENVIRONMENT) or None
        if secret is not None and (not isinstance(secret, (str, bytes)) or not secret):
            raise ValueError("query_key_secret must be a non-empty str or bytes")
        object.__setattr__(self, "query_key_secret", secret)

    def query_key(self, query: str) -> str | None:
        """The record's ``query_key`` for ``query``, or ``None`` when no secret is configured."""
        if self.query_key_secret is None:
            return None
        return query_key(query, self.query_key_secret)


def normalize_query(query: str) -> str:
    """The form a query is keyed in: Unicode NFKC, case-folded, whitespace collapsed.

    ``"  What are the REFUND  conditions?"`` and ``"what are the refund conditions?"`` key alike.
    """
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def query_key(query: str, secret: str | bytes) -> str:
    """HMAC-SHA256 (hex) of :func:`normalize_query` of ``query`` under ``secret``.

    Example:
        >>> query_key("Refund?", "s3cret") == query_key("  refund? ", "s3cret")
        True
    """
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    # surrogatepass: a lone surrogate (broken emoji escapes) still keys, deterministically.
    message = normalize_query(query).encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Selection:
    """The classified candidates: ``selected`` by probability descending then id ascending;
    ``uncertain`` and ``rejected`` in the same order; ``scores`` maps every judged id to its p."""

    selected: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    uncertain: tuple[str, ...] = ()
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """The outcome of one judgement: its status and reason, the selection when there is one, the
    record given to the observer, and (for ``ERROR``) the exception, for the caller's logs only."""

    status: Status
    reason: Reason
    selection: Selection | None = None
    record: DecisionRecord | None = None
    error: BaseException | None = field(default=None, compare=False)


class Budget:
    """A deadline on the monotonic clock, started on construction."""

    def __init__(self, seconds: float) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.deadline - time.monotonic())

    def elapsed_ms(self) -> float:
        """Milliseconds since the start."""
        return (time.monotonic() - self.started) * 1000.0
