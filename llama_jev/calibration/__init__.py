"""Calibration: from SHADOW records and a few labels to thresholds (or a mapping) you can defend.

- :func:`calibrate` joins decision records and labels, chooses ``reject`` / ``accept`` on one
  split and measures them on another (CLI: ``python -m llama_jev.calibrate``);
- :func:`collect` / :func:`acollect` (a golden set through a SHADOW retriever) and
  :func:`write_label_sheet` (a sheet sampled from SHADOW records) produce the labels;
- :class:`PlattMapping`, :class:`IsotonicMapping` and :class:`CalibratedJudge` fix a judge whose
  raw probabilities are off.

Example:
    >>> from llama_jev.calibration import calibrate
    >>> report = calibrate("decisions.jsonl", "labels.jsonl")  # doctest: +SKIP
    >>> report.write_html("report.html")  # doctest: +SKIP
"""

from llama_jev.calibration.analysis import MIN_LABELS, MIN_PER_CLASS, calibrate
from llama_jev.calibration.collect import Collected, GoldenQuery, acollect, collect
from llama_jev.calibration.mapping import (
    CalibratedJudge,
    IsotonicMapping,
    PlattMapping,
    ProbabilityMapping,
    fit_isotonic,
    fit_platt,
    mapping_from_dict,
)
from llama_jev.calibration.records import (
    CalibrationInputError,
    InsufficientLabelsError,
    Label,
    LoggedDecision,
    MixedRecordsError,
    load_labels,
    load_records,
)
from llama_jev.calibration.report import CalibrationReport, RecommendedThresholds
from llama_jev.calibration.sheet import LabelSheet, fetch_texts, write_label_sheet
from llama_jev.calibration.statistics import (
    brier_score,
    expected_calibration_error,
    format_threshold,
    reliability_table,
    wilson_lower_bound,
)

__all__ = [
    "MIN_LABELS",
    "MIN_PER_CLASS",
    "CalibratedJudge",
    "CalibrationInputError",
    "CalibrationReport",
    "Collected",
    "GoldenQuery",
    "InsufficientLabelsError",
    "IsotonicMapping",
    "Label",
    "LabelSheet",
    "LoggedDecision",
    "MixedRecordsError",
    "PlattMapping",
    "ProbabilityMapping",
    "RecommendedThresholds",
    "acollect",
    "brier_score",
    "calibrate",
    "collect",
    "expected_calibration_error",
    "fetch_texts",
    "fit_isotonic",
    "fit_platt",
    "format_threshold",
    "load_labels",
    "load_records",
    "mapping_from_dict",
    "reliability_table",
    "wilson_lower_bound",
    "write_label_sheet",
]
