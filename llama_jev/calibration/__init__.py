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

Example:
    >>> from llama_jev.calibration import calibrate
    >>> report = calibrate("decisions.jsonl", "labels.jsonl")  # doctest: +SKIP
    >>> report.write_html("report.html")  # doctest: +SKIP

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
