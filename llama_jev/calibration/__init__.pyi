"""Calibration: from SHADOW records and a few labels to thresholds (or a mapping) you can defend."""

from llama_jev.calibration.analysis import (
    MIN_HELD_OUT as MIN_HELD_OUT,
)
from llama_jev.calibration.analysis import (
    MIN_LABELS as MIN_LABELS,
)
from llama_jev.calibration.analysis import (
    MIN_PER_CLASS as MIN_PER_CLASS,
)
from llama_jev.calibration.analysis import (
    calibrate as calibrate,
)
from llama_jev.calibration.golden import (
    Collected as Collected,
)
from llama_jev.calibration.golden import (
    GoldenQuery as GoldenQuery,
)
from llama_jev.calibration.golden import (
    acollect as acollect,
)
from llama_jev.calibration.golden import (
    collect as collect,
)
from llama_jev.calibration.html import CliFiles as CliFiles
from llama_jev.calibration.join import Agreement as Agreement
from llama_jev.calibration.labels import (
    Label as Label,
)
from llama_jev.calibration.labels import (
    load_labels as load_labels,
)
from llama_jev.calibration.mapping import (
    CalibratedJudge as CalibratedJudge,
)
from llama_jev.calibration.mapping import (
    IsotonicMapping as IsotonicMapping,
)
from llama_jev.calibration.mapping import (
    PlattMapping as PlattMapping,
)
from llama_jev.calibration.mapping import (
    ProbabilityMapping as ProbabilityMapping,
)
from llama_jev.calibration.mapping import (
    fit_isotonic as fit_isotonic,
)
from llama_jev.calibration.mapping import (
    fit_platt as fit_platt,
)
from llama_jev.calibration.mapping import (
    mapping_from_dict as mapping_from_dict,
)
from llama_jev.calibration.records import (
    CalibrationInputError as CalibrationInputError,
)
from llama_jev.calibration.records import (
    InsufficientLabelsError as InsufficientLabelsError,
)
from llama_jev.calibration.records import (
    LoggedDecision as LoggedDecision,
)
from llama_jev.calibration.records import (
    MixedRecordsError as MixedRecordsError,
)
from llama_jev.calibration.records import (
    load_records as load_records,
)
from llama_jev.calibration.report import (
    CalibrationReport as CalibrationReport,
)
from llama_jev.calibration.report import (
    RecommendedThresholds as RecommendedThresholds,
)
from llama_jev.calibration.samples import (
    LabelSampler as LabelSampler,
)
from llama_jev.calibration.samples import (
    SampleSheet as SampleSheet,
)
from llama_jev.calibration.samples import (
    read_samples as read_samples,
)
from llama_jev.calibration.samples import (
    write_sample_sheet as write_sample_sheet,
)
from llama_jev.calibration.sheet import (
    LabelSheet as LabelSheet,
)
from llama_jev.calibration.sheet import (
    fetch_texts as fetch_texts,
)
from llama_jev.calibration.sheet import (
    write_label_sheet as write_label_sheet,
)
from llama_jev.calibration.statistics import (
    brier_score as brier_score,
)
from llama_jev.calibration.statistics import (
    cohen_kappa as cohen_kappa,
)
from llama_jev.calibration.statistics import (
    expected_calibration_error as expected_calibration_error,
)
from llama_jev.calibration.statistics import (
    format_threshold as format_threshold,
)
from llama_jev.calibration.statistics import (
    reliability_table as reliability_table,
)
from llama_jev.calibration.statistics import (
    wilson_lower_bound as wilson_lower_bound,
)
