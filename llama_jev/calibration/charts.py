"""The report's charts as inline SVG, drawn without a plotting dependency (no script, no URL)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from llama_jev.calibration.statistics import format_below, format_threshold

if TYPE_CHECKING:
    from llama_jev.calibration.results import CalibrationFindings

__all__ = ["SPARSE_BIN", "npv_svg", "precision_svg", "reliability_svg"]

_WIDTH, _PLOT_HEIGHT = 520, 280
# Under the plot: tick labels and the x-axis label (58 px), then the legend, one row per 18 px.
_LEFT, _RIGHT, _TOP, _UNDER, _LEGEND_ROW = 56, 16, 28, 58, 18
# Legend labels longer than this get a row each; shorter ones share a row two by two.
_SHORT_LABEL = 26
_BLUE, _ORANGE, _GREY, _GREEN, _RED, _INK = "#1f6fb2", "#d9731a", "#8a8f98", "#2e8540", "#b3261e", "#1d2430"
SPARSE_BIN = 5
"""Reliability bins with fewer labels than this are drawn hollow: too few to read a rate from."""


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


class Plot:
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

    def point(self, x: float, y: float, color: str, label: str) -> None:
        """A marked point with its label beside it (left of the point in the right half)."""
        anchor, shift = ("end", -9) if x > 0.55 else ("start", 9)
        lift = 20 if y > 0.15 else -12  # under the point: above it sits the plot's edge and title
        self.parts.append(
            f'<circle cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="5.5" fill="#fff" stroke="{color}" '
            'stroke-width="2.5"/>'
            f'<text x="{self.x(x) + shift:.1f}" y="{self.y(y) + lift:.1f}" text-anchor="{anchor}" '
            f'stroke="#fff" stroke-width="4" paint-order="stroke" style="font-weight:600;fill:{color}">'
            f"{escape(label)}</text>"
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


def reliability_svg(report: CalibrationFindings) -> str:
    """Observed share relevant per tenth of p against the diagonal; sparse bins hollow."""
    plot = Plot("judge's probability p", "observed share relevant")
    most = max((row.count for row in report.reliability), default=1) or 1
    sparse = False
    for row in report.reliability:
        if not row.count or row.rate is None or row.mean_p is None:
            continue
        left, right = plot.x(row.lower) + 2, plot.x(row.upper) - 2
        top, bottom = plot.y(row.rate), plot.y(0)
        if row.count < SPARSE_BIN:
            sparse = True
            # hollow: 2 labels make a bar of 0% or 100%, which would read as a finding
            bar = (
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{max(bottom - top, 1):.1f}" '
                f'fill="none" stroke="{_BLUE}" stroke-width="1.5" stroke-dasharray="4 3"/>'
            )
        else:
            opacity = 0.35 + 0.5 * row.count / most  # darker where more labels stand behind it
            bar = (
                f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{bottom - top:.1f}" '
                f'fill="{_BLUE}" fill-opacity="{opacity:.2f}"/>'
            )
        plot.raw(
            bar + f'<circle cx="{plot.x(row.mean_p):.1f}" cy="{top:.1f}" r="3.5" fill="{_ORANGE}"/>'
            f'<text x="{(left + right) / 2:.1f}" y="{top - 6:.1f}" text-anchor="middle" class="small">'
            f"n={row.count}</text>"
        )
    plot.line([(0, 0), (1, 1)], _GREY, width=1.5, dash="6 4")
    entries = [
        ("perfectly calibrated", _GREY, "6 4"),
        ("share relevant per bin", _BLUE, "band"),
        ("share relevant, at the bin's mean p", _ORANGE, "dot"),
    ]
    if sparse:
        entries.append((f"hollow: fewer than {SPARSE_BIN} labels, not a finding", _BLUE, "4 3"))
    plot.legend(entries)
    return plot.svg("Reliability: is p the share that is relevant?")


def precision_svg(report: CalibrationFindings) -> str:
    """Precision (with its lower bound), coverage and recall by accept threshold; the chosen (or
    best) accept marked."""
    plot = Plot("accept threshold (select p ≥ threshold)", "share")
    rows = report.thresholds
    plot.band([(row.accept, row.precision) for row in rows], [(row.accept, row.precision_lower) for row in rows], _BLUE)
    plot.line([(row.accept, row.precision) for row in rows], _BLUE)
    plot.line([(row.accept, row.precision_lower) for row in rows], _BLUE, width=1, dash="3 2")
    plot.line([(row.accept, row.coverage) for row in rows], _ORANGE)
    plot.line([(row.accept, row.recall) for row in rows], _GREEN, width=1.5)
    target = report.targets["precision"]
    plot.line([(0, target), (1, target)], _RED, width=1, dash="6 4")
    chosen = report.candidate.accept if report.candidate is not None else None
    row = next((row for row in rows if row.accept == chosen), None)
    if row is not None:
        word = "accept" if report.recommended is not None else "candidate"
        plot.point(
            row.accept,
            row.precision_lower,
            _INK,
            f"{word} {format_threshold(row.accept)}: ≥ {_pct(row.precision_lower)}",
        )
    elif (best := next((row for row in rows if row.accept == report.best_accept), None)) is not None:
        # the row the reason names (an observed p), not another threshold that selects the same pairs
        plot.point(
            best.accept,
            best.precision_lower,
            _INK,
            # the bound as the reason prints it: never rounded up onto the target it misses
            f"best {format_threshold(best.accept)}: ≥ {format_below(best.precision_lower, target)}",
        )
    plot.legend(
        [
            ("precision", _BLUE, ""),
            ("95% Wilson band (to lower bound)", _BLUE, "band"),
            ("coverage (share selected)", _ORANGE, ""),
            ("recall", _GREEN, ""),
            (f"target precision {target:g}", _RED, "6 4"),
        ]
    )
    return plot.svg("Precision by accept threshold (calibration split)")


def npv_svg(report: CalibrationFindings) -> str:
    """NPV (with its band) and the share rejected by reject threshold; the chosen reject marked."""
    plot = Plot("reject threshold (reject p ≤ threshold)", "share")
    rows = report.reject_thresholds
    plot.band([(row.reject, row.npv) for row in rows], [(row.reject, row.npv_lower) for row in rows], _BLUE)
    plot.line([(row.reject, row.npv) for row in rows], _BLUE)
    plot.line([(row.reject, row.coverage) for row in rows], _ORANGE)
    target = report.targets["npv"]
    plot.line([(0, target), (1, target)], _RED, width=1, dash="6 4")
    chosen = report.candidate.reject if report.candidate is not None else None
    row = next((row for row in rows if row.reject == chosen), None)
    if row is not None:
        word = "reject" if report.recommended is not None else "candidate"
        plot.point(row.reject, row.npv_lower, _INK, f"{word} {format_threshold(row.reject)}: ≥ {_pct(row.npv_lower)}")
    plot.legend(
        [
            ("NPV: share irrelevant among the rejected", _BLUE, ""),
            ("95% Wilson band", _BLUE, "band"),
            ("share rejected", _ORANGE, ""),
            (f"target NPV {target:g}", _RED, "6 4"),
        ]
    )
    return plot.svg("Negative predictive value by reject threshold (calibration split)")
