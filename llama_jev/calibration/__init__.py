"""Calibration: from SHADOW records and a few labels to thresholds (or a mapping) you can defend.

The probability mappings (:class:`PlattMapping`, :class:`IsotonicMapping`) and
:class:`CalibratedJudge`, which applies one to any judge.
"""

from llama_jev.calibration.mapping import (
    CalibratedJudge,
    IsotonicMapping,
    PlattMapping,
    ProbabilityMapping,
    fit_isotonic,
    fit_platt,
    mapping_from_dict,
)

__all__ = [
    "CalibratedJudge",
    "IsotonicMapping",
    "PlattMapping",
    "ProbabilityMapping",
    "fit_isotonic",
    "fit_platt",
    "mapping_from_dict",
]
