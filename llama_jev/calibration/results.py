"""What a calibration run found, as plain data: thresholds, held-out figures, the sweep, the log.

``CalibrationReport`` (in :mod:`llama_jev.calibration.report`) adds the JSON and HTML views;
the HTML renderer reads these fields, so it depends on this module, not on the report."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AcceptThreshold",
    "AgreementSummary",
    "CalibrationFindings",
    "EnforceReplay",
    "HoldoutResult",
    "LogSummary",
    "ProblemSummary",
    "RecommendedThresholds",
    "ReliabilityRow",
    "RejectThreshold",
    "SplitSummary",
]


class _ReadsLikeJson(BaseModel):
    """Item access next to attribute access, so a result reads like its JSON:
    ``report.holdout["npv"]`` is ``report.holdout.npv``, ``report.thresholds[0]["precision_lower"]``
    works, ``"accept" in report.recommended`` is true, and ``dict(row)`` / ``{**row}`` give the
    fields. Only the JSON's keys (the fields) are items; anything else is a ``KeyError``.

    Example:
        >>> row = RecommendedThresholds(reject=0.2, accept=0.8)
        >>> row["accept"] == row.accept, "reject" in row, row.get("missing")
        (True, True, None)
    """

    def __getitem__(self, key: str) -> Any:
        if isinstance(key, str) and key in type(self).model_fields:
            return getattr(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in type(self).model_fields

    def keys(self) -> list[str]:
        """The field names, in the JSON's order."""
        return list(type(self).model_fields)

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]``, or ``default`` when ``key`` is not a field."""
        return getattr(self, key) if key in self else default


class _Frozen(_ReadsLikeJson):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RecommendedThresholds(_Frozen):
    """The thresholds to configure: ``CandidateSelector(..., reject=..., accept=...)``."""

    reject: float
    accept: float


class AcceptThreshold(_Frozen):
    """One row of the accept sweep (calibration split): what ``p >= accept`` selects."""

    accept: float
    selected: int
    precision: float
    precision_lower: float
    recall: float
    coverage: float


class RejectThreshold(_Frozen):
    """One row of the reject sweep (calibration split): what ``p <= reject`` rejects."""

    reject: float
    rejected: int
    npv: float
    npv_lower: float
    coverage: float


class EnforceReplay(_Frozen):
    """Shares of logged retrievals ENFORCE would have answered, returned empty, raised
    inconclusive, or failed (judge errors) at the given thresholds."""

    reject: float
    accept: float
    retrievals: int
    answered: float
    empty: float
    inconclusive: float
    unavailable: float


class HoldoutResult(_Frozen):
    """The candidate (the recommended thresholds, when proven) measured on the held-out split only (``None``: undefined,
    e.g. precision when nothing was selected)."""

    labels: int
    selected: int
    rejected: int
    precision: float | None
    precision_lower: float | None
    npv: float | None
    npv_lower: float | None
    coverage: float
    uncertain: float
    recall: float | None
    enforce: EnforceReplay
    """Per held-out retrieval: what ENFORCE would have done."""


class ReliabilityRow(_Frozen):
    """One of 10 equal-width bins of p over every joined pair."""

    lower: float
    upper: float
    count: int
    mean_p: float | None
    rate: float | None


class SplitSummary(_Frozen):
    """How the joined pairs were split (by ``unit``, never by pair)."""

    unit: str
    seed: int
    holdout_share: float
    calibration_labels: int
    holdout_labels: int
    calibration_groups: int
    holdout_groups: int


class LogSummary(_Frozen):
    """The records read: how many, of which purpose / version / model, how many judge errors."""

    purpose: str
    version: str
    models: list[str]
    records: int
    errors: int
    error_rate: float
    skipped: int


class ProblemSummary(_Frozen):
    """A kind of label that could not be used: how many, and a few examples (ids, file:line)."""

    count: int
    examples: list[dict[str, str]]


class AgreementSummary(_Frozen):
    """Two labellers on the pairs both labelled: Cohen's kappa (1 always agree, 0 chance level),
    how many pairs, and how many they disagreed on (left out of calibration)."""

    kappa: float
    pairs: int
    disagreements: int
    labellers: list[str]


class CalibrationFindings(_Frozen):
    """The fields of :class:`~llama_jev.calibration.report.CalibrationReport` (see there)."""

    labels: int
    relevant: int
    irrelevant: int
    recommended: RecommendedThresholds | None
    """The thresholds to use: chosen on the calibration split and proven on the held-out split."""
    candidate: RecommendedThresholds | None
    """The thresholds chosen on the calibration split, proven or not (``None``: none met the targets)."""
    reason: str | None
    """Why ``recommended`` is ``None``: the targets missed, or the miss on the held-out split."""
    labels_needed: int | None = None
    """About how many more labels would let the held-out split prove the candidate."""
    best_accept: float | None = None
    """The observed p whose accept has the highest 95% lower bound on precision on the calibration
    split (the lowest such p on a tie): what a missed target is measured against; a row of ``thresholds``."""
    targets: dict[str, float]
    holdout: HoldoutResult | None
    ece: float
    brier: float
    reliability: list[ReliabilityRow]
    thresholds: list[AcceptThreshold]
    reject_thresholds: list[RejectThreshold]
    enforce: EnforceReplay | None
    """Every logged retrieval replayed at the candidate (the recommended thresholds when proven)."""
    enforce_default: EnforceReplay
    """Every logged retrieval replayed at the default 0.2 / 0.8."""
    split: SplitSummary
    log: LogSummary
    unjoined: ProblemSummary
    conflicts: ProblemSummary
    agreement: AgreementSummary | None
    """Cohen's kappa of two labellers where their labels overlap (``None``: no overlap)."""
    labels_on_error_records: int
    unlabelled: int
    duplicate_labels: int
    mapping: dict[str, Any]
    mapping_holdout: dict[str, float]

    @property
    def exit_code(self) -> int:
        """0 when thresholds are recommended (proven on held-out data), 1 otherwise."""
        return 0 if self.recommended is not None else 1
