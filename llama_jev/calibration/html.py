"""The calibration report as one self-contained HTML page: inline SVG charts, no script, no network."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from llama_jev.calibration.statistics import format_threshold

if TYPE_CHECKING:
    from llama_jev.calibration.results import CalibrationFindings, EnforceReplay

__all__ = ["render_report"]

_WIDTH, _PLOT_HEIGHT = 520, 280
# Under the plot: tick labels and the x-axis label (58 px), then the legend, one row per 18 px.
_LEFT, _RIGHT, _TOP, _UNDER, _LEGEND_ROW = 56, 16, 28, 58, 18
# Legend labels longer than this get a row each; shorter ones share a row two by two.
_SHORT_LABEL = 26
_BLUE, _ORANGE, _GREY, _GREEN, _RED = "#1f6fb2", "#d9731a", "#8a8f98", "#2e8540", "#b3261e"

_STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430;
       margin: 24px auto; max-width: 1120px; padding: 0 16px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
.muted { color: #5b6472; } .small { font-size: 13px; }
.verdict { border-radius: 8px; padding: 14px 18px; margin: 16px 0; }
.ok { background: #e8f4ec; border: 1px solid #9fd0ac; }
.no { background: #fbeaea; border: 1px solid #e3a5a1; }
.verdict .big { font-size: 22px; font-weight: 600; }
.grid { display: flex; flex-wrap: wrap; gap: 24px; } figure { margin: 0; }
figcaption { font-size: 13px; color: #5b6472; max-width: 520px; }
table { border-collapse: collapse; margin: 6px 0; }
td, th { padding: 4px 10px; border-bottom: 1px solid #e3e6ea; text-align: right; }
th { background: #f4f6f8; font-weight: 600; } td:first-child, th:first-child { text-align: left; }
tr.pick td { background: #fff6d6; font-weight: 600; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #e3e6ea; border-radius: 8px; padding: 10px 14px; min-width: 150px; }
.card .v { font-size: 22px; font-weight: 600; } .card .k { font-size: 13px; color: #5b6472; }
svg text { font: 12px system-ui, sans-serif; fill: #1d2430; }
"""


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


class _Plot:
    """A unit-square plot (x and y in [0, 1]) drawn into an SVG of fixed size."""

    def __init__(self, x_label: str, y_label: str) -> None:
        self.parts: list[str] = []
        self.width = _WIDTH - _LEFT - _RIGHT
        self.height = _PLOT_HEIGHT
        self.total_height = _TOP + _PLOT_HEIGHT + _UNDER
        self._axes(x_label, y_label)

    def x(self, value: float) -> float:
        return _LEFT + value * self.width

    def y(self, value: float) -> float:
        return _TOP + (1 - value) * self.height

    def _axes(self, x_label: str, y_label: str) -> None:
        for i in range(6):
            v = i / 5
            self.parts.append(
                f'<line x1="{self.x(0):.1f}" y1="{self.y(v):.1f}" x2="{self.x(1):.1f}" y2="{self.y(v):.1f}" '
                'stroke="#e6e9ee"/>'
                f'<text x="{self.x(0) - 8:.1f}" y="{self.y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>'
                f'<text x="{self.x(v):.1f}" y="{self.y(0) + 18:.1f}" text-anchor="middle">{v:.1f}</text>'
            )
        self.parts.append(
            f'<rect x="{self.x(0):.1f}" y="{self.y(1):.1f}" width="{self.width}" height="{self.height}" '
            'fill="none" stroke="#9aa2ad"/>'
            f'<text x="{self.x(0.5):.1f}" y="{self.y(0) + 36:.1f}" text-anchor="middle">{escape(x_label)}</text>'
            f'<text transform="translate(14 {self.y(0.5):.1f}) rotate(-90)" text-anchor="middle">'
            f"{escape(y_label)}</text>"
        )

    def line(self, points: Sequence[tuple[float, float]], color: str, *, width: float = 2, dash: str = "") -> None:
        if not points:
            return
        path = " ".join(f"{self.x(px):.1f},{self.y(py):.1f}" for px, py in points)
        dashing = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{width}"{dashing}/>')

    def band(self, upper: Sequence[tuple[float, float]], lower: Sequence[tuple[float, float]], color: str) -> None:
        if not upper:
            return
        outline = list(upper) + list(reversed(lower))
        path = " ".join(f"{self.x(px):.1f},{self.y(py):.1f}" for px, py in outline)
        self.parts.append(f'<polygon points="{path}" fill="{color}" fill-opacity="0.18" stroke="none"/>')

    def vertical(self, at: float, color: str, label: str) -> None:
        anchor = "end" if at > 0.5 else "start"
        shift = -4 if at > 0.5 else 4
        self.parts.append(
            f'<line x1="{self.x(at):.1f}" y1="{self.y(0):.1f}" x2="{self.x(at):.1f}" y2="{self.y(1):.1f}" '
            f'stroke="{color}" stroke-width="1.5" stroke-dasharray="5 3"/>'
            f'<text x="{self.x(at) + shift:.1f}" y="{self.y(1) - 8:.1f}" text-anchor="{anchor}" '
            f'fill="{color}" style="fill:{color}">{escape(label)}</text>'
        )

    def raw(self, svg: str) -> None:
        self.parts.append(svg)

    def legend(self, entries: Sequence[tuple[str, str, str]]) -> None:
        # Under the plot, outside it, so it never hides a curve.
        top = self.y(0) + _UNDER
        columns = 2 if all(len(label) <= _SHORT_LABEL for label, _, _ in entries) else 1
        rows = -(-len(entries) // columns)
        self.total_height = _TOP + _PLOT_HEIGHT + _UNDER + rows * _LEGEND_ROW
        for i, (label, color, dash) in enumerate(entries):
            x0 = _LEFT + (i % columns) * self.width / 2
            y = top + (i // columns) * _LEGEND_ROW
            if dash == "dot":
                self.parts.append(f'<circle cx="{x0 + 11:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')
            elif dash == "band":
                self.parts.append(
                    f'<rect x="{x0:.1f}" y="{y - 6:.1f}" width="22" height="11" fill="{color}" fill-opacity="0.3"/>'
                )
            else:
                dashing = f' stroke-dasharray="{dash}"' if dash else ""
                self.parts.append(
                    f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{x0 + 22:.1f}" y2="{y:.1f}" stroke="{color}" '
                    f'stroke-width="2"{dashing}/>'
                )
            self.parts.append(f'<text x="{x0 + 28:.1f}" y="{y + 4:.1f}">{escape(label)}</text>')

    def svg(self, title: str) -> str:
        # no xmlns: HTML puts an inline <svg> in the SVG namespace itself, and the page holds no URL
        return (
            f'<svg width="{_WIDTH}" height="{self.total_height}" '
            f'viewBox="0 0 {_WIDTH} {self.total_height}" role="img" aria-label="{escape(title)}">'
            f"<title>{escape(title)}</title>" + "".join(self.parts) + "</svg>"
        )


def _reliability_svg(report: CalibrationFindings) -> str:
    plot = _Plot("judge's probability p", "observed share relevant")
    most = max((row.count for row in report.reliability), default=1) or 1
    for row in report.reliability:
        if not row.count or row.rate is None or row.mean_p is None:
            continue
        left, right = plot.x(row.lower) + 2, plot.x(row.upper) - 2
        # bar height: the observed rate; opacity: how many pairs stand behind it
        opacity = 0.25 + 0.55 * row.count / most
        plot.raw(
            f'<rect x="{left:.1f}" y="{plot.y(row.rate):.1f}" width="{right - left:.1f}" '
            f'height="{plot.y(0) - plot.y(row.rate):.1f}" fill="{_BLUE}" fill-opacity="{opacity:.2f}"/>'
            f'<circle cx="{plot.x(row.mean_p):.1f}" cy="{plot.y(row.rate):.1f}" r="3.5" fill="{_ORANGE}"/>'
            f'<text x="{(left + right) / 2:.1f}" y="{plot.y(row.rate) - 5:.1f}" text-anchor="middle" '
            f'class="small">{row.count}</text>'
        )
    plot.line([(0, 0), (1, 1)], _GREY, width=1.5, dash="6 4")
    plot.legend(
        [
            ("perfectly calibrated", _GREY, "6 4"),
            ("share relevant per bin", _BLUE, "band"),
            ("share relevant, at the bin's mean p", _ORANGE, "dot"),
        ]
    )
    return plot.svg("Reliability diagram")


def _precision_svg(report: CalibrationFindings) -> str:
    plot = _Plot("accept threshold (select p ≥ threshold)", "share")
    rows = report.thresholds
    plot.band([(row.accept, row.precision) for row in rows], [(row.accept, row.precision_lower) for row in rows], _BLUE)
    plot.line([(row.accept, row.precision) for row in rows], _BLUE)
    plot.line([(row.accept, row.precision_lower) for row in rows], _BLUE, width=1, dash="3 2")
    plot.line([(row.accept, row.coverage) for row in rows], _ORANGE)
    plot.line([(row.accept, row.recall) for row in rows], _GREEN, width=1.5)
    target = report.targets["precision"]
    plot.line([(0, target), (1, target)], _RED, width=1, dash="6 4")
    if report.recommended is not None:
        plot.vertical(report.recommended.accept, _RED, f"accept {format_threshold(report.recommended.accept)}")
    plot.legend(
        [
            ("precision", _BLUE, ""),
            ("95% Wilson band (to lower bound)", _BLUE, "band"),
            ("coverage (share selected)", _ORANGE, ""),
            ("recall", _GREEN, ""),
            (f"target precision {target:g}", _RED, "6 4"),
        ]
    )
    return plot.svg("Precision and coverage by accept threshold")


def _npv_svg(report: CalibrationFindings) -> str:
    plot = _Plot("reject threshold (reject p ≤ threshold)", "share")
    rows = report.reject_thresholds
    plot.band([(row.reject, row.npv) for row in rows], [(row.reject, row.npv_lower) for row in rows], _BLUE)
    plot.line([(row.reject, row.npv) for row in rows], _BLUE)
    plot.line([(row.reject, row.coverage) for row in rows], _ORANGE)
    target = report.targets["npv"]
    plot.line([(0, target), (1, target)], _RED, width=1, dash="6 4")
    if report.recommended is not None:
        plot.vertical(report.recommended.reject, _RED, f"reject {format_threshold(report.recommended.reject)}")
    plot.legend(
        [
            ("NPV: share irrelevant among the rejected", _BLUE, ""),
            ("95% Wilson band", _BLUE, "band"),
            ("share rejected", _ORANGE, ""),
            (f"target NPV {target:g}", _RED, "6 4"),
        ]
    )
    return plot.svg("Negative predictive value by reject threshold")


def _cards(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="v">{escape(v)}</div><div class="k">{escape(k)}</div></div>'
            for k, v in items
        )
        + "</div>"
    )


def _replay_row(name: str, replay: EnforceReplay | None) -> str:
    if replay is None:
        return f"<tr><td>{escape(name)}</td><td colspan=6>no recommendation</td></tr>"
    cells = [
        f"{format_threshold(replay.reject)} / {format_threshold(replay.accept)}",
        str(replay.retrievals),
        _pct(replay.answered),
        _pct(replay.empty),
        _pct(replay.inconclusive),
        _pct(replay.unavailable),
    ]
    return f"<tr><td>{escape(name)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _verdict(report: CalibrationFindings) -> str:
    if report.recommended is None:
        return (
            '<div class="verdict no"><div class="big">No thresholds recommended: keep SHADOW</div>'
            f"<div>{escape(report.reason or '')}</div></div>"
        )
    rec, held = report.recommended, report.holdout
    reject, accept = format_threshold(rec.reject), format_threshold(rec.accept)
    summary = ""
    if held is not None:
        summary = (
            f"On the held-out split ({held.labels} labels the thresholds were not chosen on) they selected "
            f"{_pct(held.coverage)} of candidates with precision {_pct(held.precision)} "
            f"(95% lower bound {_pct(held.precision_lower)}), "
            f"rejected {_pct(held.rejected / held.labels if held.labels else None)} "
            f"with NPV {_pct(held.npv)}, and left {_pct(held.uncertain)} uncertain."
        )
    return (
        '<div class="verdict ok">'
        f'<div class="big">Recommended: reject = {reject}, accept = {accept}</div>'
        f"<div>Chosen on the calibration split for precision ≥ {report.targets['precision']:g} and "
        f"NPV ≥ {report.targets['npv']:g} at a one-sided 95% Wilson lower bound. {summary}</div>"
        + _cautions(report)
        + f"<div class=small><code>CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE), "
        f"reject={reject}, accept={accept})</code></div></div>"
    )


def _cautions(report: CalibrationFindings) -> str:
    """What someone switching ENFORCE on should know beyond the two numbers."""
    notes = []
    held, replay = report.holdout, report.enforce
    target = report.targets["precision"]
    if held is not None and held.precision is not None and held.precision < target:
        notes.append(
            f"On held-out data the precision ({_pct(held.precision)}) is below the target {target:g}: "
            "the margin is thin, label more before relying on it."
        )
    elif held is not None and held.precision_lower is not None and held.precision_lower < target:
        notes.append(
            f"On held-out data precision is {_pct(held.precision)} but its 95% lower bound "
            f"({_pct(held.precision_lower)}) is under the target: the held-out split is small evidence."
        )
    if replay is not None and replay.inconclusive >= 0.1:
        notes.append(
            f"{_pct(replay.inconclusive)} of logged retrievals would have raised RetrievalInconclusiveError "
            f"(at the defaults 0.2 / 0.8: {_pct(report.enforce_default.inconclusive)}): make sure the "
            "application handles it, or narrow the band with a better or mapped judge."
        )
    if report.log.error_rate > 0:
        notes.append(
            f"The judge failed on {_pct(report.log.error_rate)} of logged retrievals; under ENFORCE each "
            "would raise RetrievalUnavailableError."
        )
    if not notes:
        return ""
    return "<ul>" + "".join(f"<li>{escape(note)}</li>" for note in notes) + "</ul>"


def _holdout_section(report: CalibrationFindings) -> str:
    held = report.holdout
    if held is None:
        return ""
    cards = _cards(
        [
            ("precision of selected", _pct(held.precision)),
            ("precision, 95% lower bound", _pct(held.precision_lower)),
            ("NPV of rejected", _pct(held.npv)),
            ("coverage (selected)", _pct(held.coverage)),
            ("uncertain", _pct(held.uncertain)),
            ("recall", _pct(held.recall)),
        ]
    )
    return (
        f"<h2>What the recommendation did on held-out data</h2>"
        f'<p class="muted">{held.labels} labelled candidates in {report.split.holdout_groups} '
        f"held-out {'queries' if report.split.unit == 'query' else 'decisions'}; split by "
        f"{escape(report.split.unit)} with seed "
        f"{report.split.seed}, never by candidate.</p>{cards}"
    )


def _enforce_section(report: CalibrationFindings) -> str:
    rows = []
    if report.holdout is not None:
        rows.append(_replay_row("held-out retrievals, recommended", report.holdout.enforce))
    rows.append(_replay_row("whole log, recommended", report.enforce))
    rows.append(_replay_row("whole log, defaults", report.enforce_default))
    return (
        "<h2>What ENFORCE would have answered, per retrieval</h2>"
        '<p class="muted">Answered: some evidence returned. Empty: everything judged irrelevant (a real '
        '"no evidence"). Inconclusive: nothing selected but something uncertain '
        "(RetrievalInconclusiveError). Unavailable: the judge failed (RetrievalUnavailableError).</p>"
        "<table><tr><th></th><th>reject / accept</th><th>retrievals</th><th>answered</th><th>empty</th>"
        "<th>inconclusive</th><th>unavailable</th></tr>" + "".join(rows) + "</table>"
    )


def _sweep_table(report: CalibrationFindings) -> str:
    rows = []
    chosen = report.recommended.accept if report.recommended else None
    shown = [row for row in report.thresholds if row.accept == chosen or _every_five_hundredths(row.accept)]
    for row in shown:
        mark = ' class="pick"' if row.accept == chosen else ""
        rows.append(
            f"<tr{mark}><td>{format_threshold(row.accept)}</td><td>{row.selected}</td><td>{_pct(row.precision)}</td>"
            f"<td>{_pct(row.precision_lower)}</td><td>{_pct(row.recall)}</td><td>{_pct(row.coverage)}</td></tr>"
        )
    return (
        "<h2>Accept thresholds on the calibration split</h2>"
        "<table><tr><th>accept</th><th>selected</th><th>precision</th><th>95% lower</th><th>recall</th>"
        "<th>coverage</th></tr>" + "".join(rows) + "</table>"
        '<p class="muted small">Every 0.05 shown, and the recommendation: an observed p, never a value '
        "between two observed ones, where no label says anything. The JSON output has every 0.01.</p>"
    )


def _every_five_hundredths(threshold: float) -> bool:
    hundredths = round(threshold * 100)
    return hundredths % 5 == 0 and math.isclose(threshold * 100, hundredths)


def _data_section(report: CalibrationFindings) -> str:
    log = report.log
    items = [
        f"{report.labels} joined labels ({report.relevant} relevant, {report.irrelevant} irrelevant): "
        f"{report.split.calibration_labels} for choosing, {report.split.holdout_labels} held out.",
        f"{log.records} records of purpose <code>{escape(log.purpose)}</code>, version "
        f"<code>{escape(log.version)}</code>, model {escape(', '.join(log.models) or 'unknown')}.",
        f"Judge errors in the log: {log.errors} ({_pct(log.error_rate)}); never used as scores.",
    ]
    if report.unjoined.count:
        examples = ", ".join(
            escape(f"{e.get('decision_id') or '(query)'}/{e.get('node_id')} ({e.get('reason')})")
            for e in report.unjoined.examples
        )
        items.append(f"{report.unjoined.count} labels joined no record, e.g. {examples}.")
    if report.conflicts.count:
        items.append(f"{report.conflicts.count} candidates had disagreeing labels and were left out (not averaged).")
    if report.labels_on_error_records:
        items.append(f"{report.labels_on_error_records} labels point at ERROR records and were not used.")
    if report.unlabelled:
        items.append(f"{report.unlabelled} sheet rows had no relevant value yet.")
    if report.duplicate_labels:
        items.append(f"{report.duplicate_labels} agreeing duplicate labels counted once.")
    return "<h2>The data</h2><ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def _mapping_section(report: CalibrationFindings) -> str:
    if not report.mapping:
        return ""
    held = report.mapping_holdout
    comparison = ""
    if held:
        comparison = (
            f" On the held-out split it moves ECE from {_num(held.get('ece_raw'))} to "
            f"{_num(held.get('ece_mapped'))} and the Brier score from {_num(held.get('brier_raw'))} to "
            f"{_num(held.get('brier_mapped'))}."
        )
    return (
        "<h2>A fitted probability mapping</h2>"
        f"<p>Platt scaling fitted on the calibration split: slope {_num(report.mapping.get('slope'))}, "
        f"intercept {_num(report.mapping.get('intercept'))}.{comparison} To use it, wrap the judge: "
        "<code>CalibratedJudge(judge, mapping_from_dict(report.mapping))</code>; records written through "
        "it are on the mapped scale, so calibrate again on those before enforcing.</p>"
    )


def render_report(report: CalibrationFindings) -> str:
    """The HTML page for ``report``."""
    figures = (
        '<div class="grid">'
        f"<figure>{_reliability_svg(report)}<figcaption>Reliability on all {report.labels} joined labels: "
        "bars below the diagonal mean the judge is over-confident there. Numbers are labels per bin. "
        f"ECE {report.ece:.3f}, Brier {report.brier:.3f}.</figcaption></figure>"
        f"<figure>{_precision_svg(report)}<figcaption>Calibration split: the recommended accept is the "
        "lowest observed p whose 95% lower bound (bottom of the band) reaches the target line."
        "</figcaption></figure>"
        f"<figure>{_npv_svg(report)}<figcaption>Calibration split: the recommended reject is the highest "
        "observed p below accept whose NPV lower bound reaches its target.</figcaption></figure>"
        "</div>"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>llama_jev calibration report</title><style>{_STYLE}</style></head><body>"
        "<h1>Calibration report</h1>"
        f'<p class="muted">Is this judge ready for ENFORCE? Thresholds are on the scale of the recorded p '
        f"(purpose {escape(report.log.purpose)}, version {escape(report.log.version)}).</p>"
        + _verdict(report)
        + _holdout_section(report)
        + _enforce_section(report)
        + "<h2>The evidence</h2>"
        + figures
        + _sweep_table(report)
        + _mapping_section(report)
        + _data_section(report)
        + "</body></html>"
    )
