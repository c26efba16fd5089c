"""Calibration: from SHADOW records and a few labels to thresholds (or a mapping) you can defend.

- :class:`LabelSampler` (``ExecutionOptions(label_sampler=...)``) keeps the text of a few judged
  retrievals; :func:`write_sample_sheet` draws the pairs a person labels
  (``python -m llama_jev.label_sheet --samples``, then ``python -m llama_jev.label``);
- :func:`collect` / :func:`acollect` (a golden set through a SHADOW retriever) and
  :func:`write_label_sheet` (a sheet sampled from SHADOW records) produce labels too;
- :func:`calibrate` joins decision records and labels, chooses ``reject`` / ``accept`` on one
  split and proves them on another (CLI: ``python -m llama_jev.calibrate``);
- :class:`PlattMapping`, :class:`IsotonicMapping` and :class:`CalibratedJudge` fix a judge whose
  raw probabilities are off.

Names load on first use, so ``python -m llama_jev.calibrate`` never imports LlamaIndex.

Example:
    >>> from llama_jev.calibration import calibrate
    >>> report = calibrate("decisions.jsonl", "labels.jsonl")  # doctest: +SKIP
    >>> report.write_html("report.html")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llama_jev.calibration.analysis import MIN_HELD_OUT, MIN_LABELS, MIN_PER_CLASS, calibrate
    from llama_jev.calibration.golden import Collected, GoldenQuery, acollect, collect
    from llama_jev.calibration.join import Agreement
    from llama_jev.calibration.labels import Label, load_labels
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
        LoggedDecision,
        MixedRecordsError,
        load_records,
    )
    from llama_jev.calibration.report import CalibrationReport, RecommendedThresholds
    from llama_jev.calibration.samples import LabelSampler, SampleSheet, read_samples, write_sample_sheet
    from llama_jev.calibration.sheet import LabelSheet, fetch_texts, write_label_sheet
    from llama_jev.calibration.statistics import (
        brier_score,
        cohen_kappa,
        expected_calibration_error,
        format_threshold,
        reliability_table,
        wilson_lower_bound,
    )

_HOMES = {
    "analysis": ("MIN_HELD_OUT", "MIN_LABELS", "MIN_PER_CLASS", "calibrate"),
    "golden": ("Collected", "GoldenQuery", "acollect", "collect"),
    "join": ("Agreement",),
    "labels": ("Label", "load_labels"),
    "mapping": (
        "CalibratedJudge",
        "IsotonicMapping",
        "PlattMapping",
        "ProbabilityMapping",
        "fit_isotonic",
        "fit_platt",
        "mapping_from_dict",
    ),
    "records": (
        "CalibrationInputError",
        "InsufficientLabelsError",
        "LoggedDecision",
        "MixedRecordsError",
        "load_records",
    ),
    "report": ("CalibrationReport", "RecommendedThresholds"),
    "samples": ("LabelSampler", "SampleSheet", "read_samples", "write_sample_sheet"),
    "sheet": ("LabelSheet", "fetch_texts", "write_label_sheet"),
    "statistics": (
        "brier_score",
        "cohen_kappa",
        "expected_calibration_error",
        "format_threshold",
        "reliability_table",
        "wilson_lower_bound",
    ),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "Agreement",
    "CalibratedJudge",
    "CalibrationInputError",
    "CalibrationReport",
    "Collected",
    "GoldenQuery",
    "InsufficientLabelsError",
    "IsotonicMapping",
    "Label",
    "LabelSampler",
    "LabelSheet",
    "LoggedDecision",
    "MIN_HELD_OUT",
    "MIN_LABELS",
    "MIN_PER_CLASS",
    "MixedRecordsError",
    "PlattMapping",
    "ProbabilityMapping",
    "RecommendedThresholds",
    "SampleSheet",
    "acollect",
    "brier_score",
    "calibrate",
    "cohen_kappa",
    "collect",
    "expected_calibration_error",
    "fetch_texts",
    "fit_isotonic",
    "fit_platt",
    "format_threshold",
    "load_labels",
    "load_records",
    "mapping_from_dict",
    "read_samples",
    "reliability_table",
    "wilson_lower_bound",
    "write_label_sheet",
    "write_sample_sheet",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562) and keep the name here."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
