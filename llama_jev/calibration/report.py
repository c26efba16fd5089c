"""``CalibrationReport``: everything a calibration run found, as JSON and as one HTML page."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llama_jev.calibration.html import CliFiles, render_report
from llama_jev.calibration.results import (
    AcceptThreshold,
    AgreementSummary,
    CalibrationFindings,
    EnforceReplay,
    HoldoutResult,
    LogSummary,
    ProblemSummary,
    RecommendedThresholds,
    RejectThreshold,
    ReliabilityRow,
    SplitSummary,
)

__all__ = [
    "AcceptThreshold",
    "AgreementSummary",
    "CalibrationReport",
    "EnforceReplay",
    "HoldoutResult",
    "LogSummary",
    "ProblemSummary",
    "RecommendedThresholds",
    "ReliabilityRow",
    "RejectThreshold",
    "SplitSummary",
]


class CalibrationReport(CalibrationFindings):
    """The result of :func:`~llama_jev.calibration.calibrate` (and of the CLI's ``--json``).

    ``recommended`` is ``None`` unless the thresholds chosen on the calibration split were
    proven on the held-out split; then ``reason`` says why, and ``candidate`` holds the
    unproven choice (``None`` when nothing met the targets even on the calibration split).
    ``holdout`` measures the candidate (the recommendation, when proven) on the held-out split;
    ``thresholds`` is the accept sweep on the calibration split, where the choice is made; ``ece``, ``brier`` and
    ``reliability`` describe the judge on every joined pair. ``mapping`` is a Platt mapping
    fitted on the calibration split (load it with ``mapping_from_dict`` and wrap the judge in
    ``CalibratedJudge`` when the raw probabilities are off).

    Every object in it reads by attribute or, like the JSON, by key: ``report.recommended.accept``
    is ``report.recommended["accept"]``, ``report.thresholds[0]["precision_lower"]`` works.

    Example:
        >>> report = calibrate("decisions.jsonl", "labels.jsonl")  # doctest: +SKIP
        >>> report.recommended  # doctest: +SKIP
        RecommendedThresholds(reject=0.12, accept=0.86)
        >>> report.holdout["npv"] == report.holdout.npv  # doctest: +SKIP
        True
    """

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON types."""
        return self.model_dump(mode="json")

    def to_json(self, *, indent: int | None = None) -> str:
        """The report as one JSON object (the CLI's ``--json`` output)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def to_html(self, *, cli: bool = False, files: CliFiles | None = None) -> str:
        """One self-contained HTML page: inline SVG charts, no script, no network (``cli``: its
        advice worded for the command line rather than for this Python object; ``files``: the
        files the command read, named in the commands the page suggests)."""
        return render_report(self, cli=cli, files=files)

    def write_html(self, path: str | os.PathLike[str], *, cli: bool = False, files: CliFiles | None = None) -> Path:
        """Write :meth:`to_html` to ``path`` (UTF-8) and return the path."""
        target = Path(path)
        target.write_text(self.to_html(cli=cli, files=files), encoding="utf-8")
        return target
