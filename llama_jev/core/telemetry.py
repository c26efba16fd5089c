"""What llama_jev tells OpenTelemetry: ``llama_jev.*`` span attributes and metrics.

OpenTelemetry's guidance for libraries: depend on the API only, and let the application choose
the SDK and the exporters. Here even the API is optional: without the ``opentelemetry-api``
package every function below does nothing. With it but without a tracer or meter provider set by
the application, the API's own no-op objects answer, so nobody listening costs a few
microseconds per retrieval.

Only counts, modes, statuses, reasons, ids, error classes and HTTP statuses are written: never a
query, node text, identity value or key (records carry none either; see :class:`DecisionRecord`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_jev.core.records import DecisionRecord, Mode, Reason, RetrievalFacts, Status

__all__ = [
    "ATTRIBUTE_PREFIX",
    "CANDIDATES",
    "CLIENT_RATE_LIMITED",
    "CLIENT_RETRIES",
    "DECISIONS",
    "DECISION_SPAN",
    "JUDGEMENT_DURATION",
    "METER_NAME",
    "OUTCOMES",
    "TRACER_NAME",
    "count_rate_limited",
    "count_retry",
    "decision_attributes",
    "observe_decision",
    "observe_unjudged",
]

METER_NAME = "llama_jev"
TRACER_NAME = "llama_jev"
DECISION_SPAN = "llama_jev.decision"
"""A span of its own holding the ``llama_jev.*`` attributes, a child of the traced judgement (see
:func:`observe_decision`)."""
ATTRIBUTE_PREFIX = "llama_jev."

DECISIONS = "llama_jev.decisions"
"""Counter: retrievals by ``llama_jev.mode``, ``llama_jev.status`` and ``llama_jev.reason`` (OFF counts too)."""
JUDGEMENT_DURATION = "llama_jev.judgement.duration"
"""Histogram, seconds: how long each judgement took, by ``llama_jev.mode`` and ``llama_jev.status``."""
CANDIDATES = "llama_jev.candidates"
"""Counter: nodes by ``llama_jev.mode`` and ``llama_jev.outcome`` (one of :data:`OUTCOMES`)."""
CLIENT_RETRIES = "llama_jev.client.retries"
"""Counter: System One attempts retried by ``JevClient``, by ``error.type`` and ``http.response.status_code``."""
CLIENT_RATE_LIMITED = "llama_jev.client.rate_limited"
"""Counter: 429 (rate limited) and 529 (overloaded) answers received, by ``http.response.status_code``."""

OUTCOMES = ("denied", "selected", "rejected", "uncertain")
"""``denied``: removed by the ACL; the others: what the judge made of an authorized node."""


DECISIONS_DESCRIPTION = "Judged retrievals (and OFF retrievals) by mode, status and reason."
DURATION_DESCRIPTION = "Wall time of one relevance judgement, from planning to the decision."
CANDIDATES_DESCRIPTION = "Retrieved nodes by outcome: denied by the ACL, selected, rejected or uncertain."
RETRIES_DESCRIPTION = "System One attempts that failed retryably and were tried again."
RATE_LIMITED_DESCRIPTION = "System One answers asking the client to slow down (429, 529)."


class _Instruments:
    """The meter's instruments, made once. The API's proxies follow a provider set later."""

    def __init__(self) -> None:
        from opentelemetry import metrics, trace

        self.current_span = trace.get_current_span
        self.tracer = trace.get_tracer(TRACER_NAME)
        meter = metrics.get_meter(METER_NAME)
        self.decisions = meter.create_counter(DECISIONS, unit="{decision}", description=DECISIONS_DESCRIPTION)
        self.duration = meter.create_histogram(JUDGEMENT_DURATION, unit="s", description=DURATION_DESCRIPTION)
        self.candidates = meter.create_counter(CANDIDATES, unit="{node}", description=CANDIDATES_DESCRIPTION)
        self.retries = meter.create_counter(CLIENT_RETRIES, unit="{retry}", description=RETRIES_DESCRIPTION)
        self.rate_limited = meter.create_counter(
            CLIENT_RATE_LIMITED, unit="{response}", description=RATE_LIMITED_DESCRIPTION
        )


_instruments: _Instruments | None = None
_loaded = False


def _telemetry() -> _Instruments | None:
    """The instruments, or ``None`` without ``opentelemetry-api``. Imported on first use: the API
    takes ~50 ms to import, which a program that never judges (a CLI) should not pay."""
    global _instruments, _loaded
    if not _loaded:
        try:
            _instruments = _Instruments()
        except ImportError:
            _instruments = None
        _loaded = True
    return _instruments


# Attribute sets are few (modes x statuses x reasons); built once, they cost nothing per call.
_decision_labels: dict[tuple[Mode, Status, Reason], Mapping[str, str]] = {}
_outcome_labels: dict[tuple[Mode, str], Mapping[str, str]] = {}
_duration_labels: dict[tuple[Mode, Status], Mapping[str, str]] = {}


def _decision_label(mode: Mode, status: Status, reason: Reason) -> Mapping[str, str]:
    key = (mode, status, reason)
    labels = _decision_labels.get(key)
    if labels is None:
        labels = _decision_labels[key] = {
            "llama_jev.mode": mode.value,
            "llama_jev.status": status.value,
            "llama_jev.reason": reason.value,
        }
    return labels


def _outcome_label(mode: Mode, outcome: str) -> Mapping[str, str]:
    labels = _outcome_labels.get((mode, outcome))
    if labels is None:
        labels = _outcome_labels[(mode, outcome)] = {"llama_jev.mode": mode.value, "llama_jev.outcome": outcome}
    return labels


def _duration_label(mode: Mode, status: Status) -> Mapping[str, str]:
    labels = _duration_labels.get((mode, status))
    if labels is None:
        labels = _duration_labels[(mode, status)] = {"llama_jev.mode": mode.value, "llama_jev.status": status.value}
    return labels


def decision_attributes(record: DecisionRecord) -> dict[str, Any]:
    """The ``llama_jev.*`` span attributes of one judgement: mode, status, reason, counts, timing.

    Example:
        >>> from llama_jev.core.records import DecisionRecord, Mode, Reason, RetrievalFacts, Status
        >>> record = DecisionRecord(purpose="p", version="v", mode=Mode.ENFORCE, status=Status.DECIDED,
        ...                         reason=Reason.CLASSIFIED, elapsed_ms=1.0, candidates=2, requests=1)
        >>> decision_attributes(record)["llama_jev.status"]
        'decided'
    """
    attributes: dict[str, Any] = {
        "llama_jev.decision_id": record.decision_id,
        "llama_jev.mode": record.mode.value,
        "llama_jev.status": record.status.value,
        "llama_jev.reason": record.reason.value,
        "llama_jev.candidates": record.candidates,
        "llama_jev.judged": record.judged,
        "llama_jev.selected": len(record.selected),
        "llama_jev.rejected": len(record.rejected),
        "llama_jev.uncertain": len(record.uncertain),
        "llama_jev.requests": record.requests,
        "llama_jev.elapsed_ms": record.elapsed_ms,
        "llama_jev.queue_ms": record.queue_ms,
        "llama_jev.pushdown": record.pushdown,
        "llama_jev.purpose": record.purpose,
        "llama_jev.version": record.version,
    }
    if record.model is not None:
        attributes["llama_jev.model"] = record.model
    attributes.update(_retrieval_attributes(record.retrieved, record.denied, record))
    return attributes


def _retrieval_attributes(
    retrieved: int | None, denied: int | None, facts: DecisionRecord | RetrievalFacts
) -> dict[str, Any]:
    """``llama_jev.retrieved`` ... ``llama_jev.rounds``: what was retrieved, denied, by which engine, how widely.

    Counts, the engine's name and the restriction's kind only: never an id or an identity value.
    """
    values = {
        "llama_jev.retrieved": retrieved,
        "llama_jev.denied": denied,
        "llama_jev.engine": facts.engine,
        "llama_jev.restriction": facts.restriction,
        "llama_jev.wanted": facts.wanted,
        "llama_jev.found": facts.found,
        "llama_jev.rounds": facts.rounds,
    }
    return {name: value for name, value in values.items() if value is not None}


def observe_decision(
    record: DecisionRecord, failure: Mapping[str, Any] | None = None, *, crowded: bool = False
) -> None:
    """Count one judgement and write its ``llama_jev.*`` attributes on the current span.

    ``failure`` adds what a failed judgement can tell (``error_type``, ``status_code``,
    ``retryable``), written as ``llama_jev.error_type`` and so on. ``crowded``: the current span
    is a LlamaIndex handler's, which writes every document into it when it ends; a span keeps
    128 attributes by default and drops the oldest (ours) beyond, which OpenInference reaches
    with 16 candidates. The attributes then also go on a child span, :data:`DECISION_SPAN`, that
    holds nothing else.
    """
    instruments = _telemetry()
    if instruments is None:
        return
    mode, status = record.mode, record.status
    instruments.decisions.add(1, _decision_label(mode, status, record.reason))
    instruments.duration.record(record.elapsed_ms / 1000.0, _duration_label(mode, status))
    counts = (record.denied or 0, len(record.selected), len(record.rejected), len(record.uncertain))
    for outcome, count in zip(OUTCOMES, counts, strict=True):
        if count:
            instruments.candidates.add(count, _outcome_label(mode, outcome))
    span = instruments.current_span()
    if span.is_recording():
        attributes = decision_attributes(record)
        if failure:
            attributes.update({f"llama_jev.{name}": value for name, value in failure.items() if value is not None})
        span.set_attributes(attributes)
        if crowded:
            instruments.tracer.start_span(DECISION_SPAN, attributes=attributes).end()


def observe_unjudged(
    mode: Mode, retrieved: int, denied: int, pushdown: bool, *, facts: RetrievalFacts | None = None
) -> None:
    """Count a retrieval nothing was judged for (mode ``OFF``) and describe it on the current span.

    ``facts`` adds the engine, the restriction kind and the widening counts (``llama_jev.engine``,
    ``llama_jev.restriction``, ``llama_jev.wanted``, ``llama_jev.found``, ``llama_jev.rounds``).
    """
    instruments = _telemetry()
    if instruments is None:
        return
    instruments.decisions.add(1, _decision_label(mode, Status.SKIPPED, Reason.MODE_OFF))
    if denied:
        instruments.candidates.add(denied, _outcome_label(mode, "denied"))
    span = instruments.current_span()
    if span.is_recording():
        span.set_attributes(
            {
                "llama_jev.mode": mode.value,
                "llama_jev.status": Status.SKIPPED.value,
                "llama_jev.reason": Reason.MODE_OFF.value,
                "llama_jev.pushdown": pushdown,
                **_retrieval_attributes(retrieved, denied, facts or RetrievalFacts()),
            }
        )


_retry_labels: dict[tuple[str, int | None], Mapping[str, Any]] = {}
_rate_limited_labels: dict[int, Mapping[str, Any]] = {}


def count_retry(error_type: str, status_code: int | None) -> None:
    """One System One attempt failed retryably and will be tried again (``JevClient``)."""
    instruments = _telemetry()
    if instruments is None:
        return
    key = (error_type, status_code)
    labels = _retry_labels.get(key)
    if labels is None:
        labels = {"error.type": error_type}
        if status_code is not None:
            labels["http.response.status_code"] = status_code
        _retry_labels[key] = labels
    instruments.retries.add(1, labels)


def count_rate_limited(status_code: int) -> None:
    """The server answered 429 or 529: the client was asked to slow down."""
    instruments = _telemetry()
    if instruments is None:
        return
    labels = _rate_limited_labels.get(status_code)
    if labels is None:
        labels = _rate_limited_labels[status_code] = {"http.response.status_code": status_code}
    instruments.rate_limited.add(1, labels)
