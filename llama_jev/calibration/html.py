"""The calibration report as one self-contained HTML page: inline SVG charts, no script, no network.

Written for the person who decides whether to switch ENFORCE on: the verdict first, then what to
do next (the exact lines to paste, or why to stay in SHADOW and how many more labels would help),
then the evidence.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from llama_jev.calibration.charts import SPARSE_BIN, npv_svg, precision_svg, reliability_svg
from llama_jev.calibration.statistics import format_threshold

if TYPE_CHECKING:
    from llama_jev.calibration.results import CalibrationFindings, EnforceReplay

__all__ = ["CliFiles", "render_report"]


@dataclass(frozen=True)
class CliFiles:
    """The files a ``python -m llama_jev.calibrate`` run read and wrote: the report's commands name them
    (``samples``: the labelling sample the sheets were drawn from, when known)."""

    records: str
    labels: str
    report: str | None = None
    purpose: str | None = None
    version: str | None = None
    samples: str | None = None


_STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430;
       margin: 24px auto; max-width: 1120px; padding: 0 16px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 30px 0 8px; }
h3 { font-size: 15px; margin: 0 0 4px; }
.muted { color: #5b6472; } .small { font-size: 13px; }
.verdict { border-radius: 8px; padding: 14px 18px; margin: 16px 0; }
.ok { background: #e8f4ec; border: 1px solid #9fd0ac; }
.warn { background: #fff4e0; border: 1px solid #e8c07a; }
.no { background: #fbeaea; border: 1px solid #e3a5a1; }
.verdict .big { font-size: 22px; font-weight: 600; margin-bottom: 4px; }
.next { border: 2px solid #1f6fb2; border-radius: 8px; padding: 12px 18px; margin: 16px 0; }
.next h2 { margin: 0 0 6px; font-size: 17px; color: #1f6fb2; }
.next ol { margin: 6px 0; padding-left: 22px; } .next li { margin: 4px 0; }
pre { background: #1d2430; color: #f3f5f8; border-radius: 6px; padding: 10px 14px; font-size: 13.5px;
      overflow-x: auto; margin: 6px 0; }
code { font-size: 13.5px; }
.grid { display: flex; flex-wrap: wrap; gap: 28px; } figure { margin: 0; }
figcaption { font-size: 13px; color: #5b6472; max-width: 520px; }
table { border-collapse: collapse; margin: 6px 0; }
td, th { padding: 4px 10px; border-bottom: 1px solid #e3e6ea; text-align: right; white-space: nowrap; }
th { background: #f4f6f8; font-weight: 600; } td:first-child, th:first-child { text-align: left; }
tr.pick td { background: #fff6d6; font-weight: 600; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #e3e6ea; border-radius: 8px; padding: 10px 14px; min-width: 140px; }
.card .v { font-size: 22px; font-weight: 600; } .card .k { font-size: 13px; color: #5b6472; }
.card.miss { border-color: #e3a5a1; background: #fbeaea; }
dl.terms dt { font-weight: 600; margin-top: 8px; } dl.terms dd { margin: 2px 0 0 0; color: #3a4350; }
svg text { font: 12px system-ui, sans-serif; fill: #1d2430; }
/* a phone (390 px): the page never scrolls sideways; a wide table scrolls inside its own box and a
   chart shrinks to the width (its viewBox keeps the proportions) */
figure { max-width: 100%; } svg { max-width: 100%; height: auto; }
table { display: block; max-width: 100%; overflow-x: auto; }
code { overflow-wrap: anywhere; }
"""


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _word(report: CalibrationFindings) -> str:
    return "recommended" if report.recommended is not None else "candidate"


def _cards(items: Sequence[tuple[str, str, bool]]) -> str:
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card{" miss" if miss else ""}"><div class="v">{escape(v)}</div>'
            f'<div class="k">{escape(k)}</div></div>'
            for k, v, miss in items
        )
        + "</div>"
    )


def _replay_row(name: str, replay: EnforceReplay | None) -> str:
    if replay is None:
        return f"<tr><td>{escape(name)}</td><td colspan=6>no candidate</td></tr>"
    cells = [
        f"{format_threshold(replay.reject)} / {format_threshold(replay.accept)}",
        str(replay.retrievals),
        _pct(replay.answered),
        _pct(replay.empty),
        _pct(replay.inconclusive),
        _pct(replay.unavailable),
    ]
    return f"<tr><td>{escape(name)}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _enforce_section(report: CalibrationFindings) -> str:
    rows = []
    if report.holdout is not None:
        rows.append(_replay_row(f"held-out retrievals, {_word(report)}", report.holdout.enforce))
    rows.append(_replay_row(f"whole log, {_word(report)}", report.enforce))
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
    chosen = report.candidate.accept if report.candidate else None
    # With no candidate the verdict names the best accept (the highest lower bound): its row is shown too.
    best = report.best_accept if chosen is None else None
    marked = {accept: tag for accept, tag in ((chosen, "chosen"), (best, "best")) if accept is not None}
    shown = [row for row in report.thresholds if row.accept in marked or _every_five_hundredths(row.accept)]
    for row in shown:
        tag = marked.get(row.accept)
        mark = ' class="pick"' if tag else ""
        rows.append(
            f"<tr{mark}><td>{format_threshold(row.accept)}{f' ({tag})' if tag else ''}</td><td>{row.selected}</td>"
            f"<td>{_pct(row.precision)}</td><td>{_pct(row.precision_lower)}</td><td>{_pct(row.recall)}</td>"
            f"<td>{_pct(row.coverage)}</td></tr>"
        )
    return (
        "<h2>Accept thresholds on the calibration split</h2>"
        "<table><tr><th>accept</th><th>selected</th><th>precision</th><th>95% lower</th><th>recall</th>"
        "<th>coverage</th></tr>" + "".join(rows) + "</table>"
        '<p class="muted small">Every 0.05 shown, and the chosen accept (or, when none meets the target, the best: '
        "the highest 95% lower bound): an observed p, never a value between two observed ones, where no label says "
        "anything. The JSON output has every 0.01.</p>"
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
    if report.agreement is not None:
        agreement = report.agreement
        items.append(
            f"Two labellers ({escape(', '.join(agreement.labellers))}) both labelled {agreement.pairs} pairs: Cohen's "
            f"kappa {agreement.kappa:.2f} (1: always agree, 0: no better than chance); the {agreement.disagreements} "
            "pairs they disagreed on were left out."
        )
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
        rows = "1 sheet row has" if report.unlabelled == 1 else f"{report.unlabelled} sheet rows have"
        items.append(f"{rows} no relevant value (left blank or skipped): not used.")
    if report.duplicate_labels:
        items.append(f"{report.duplicate_labels} agreeing duplicate labels counted once.")
    return "<h2>The data</h2><ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def _verdict(report: CalibrationFindings) -> str:
    targets = (
        f"precision ≥ {report.targets['precision']:g} and NPV ≥ {report.targets['npv']:g} "
        "(one-sided 95% Wilson lower bounds on the calibration split, point estimates on the held-out split)"
    )
    if report.recommended is not None:
        rec, held = report.recommended, report.holdout
        summary = ""
        if held is not None:
            summary = (
                f" On the held-out split ({held.labels} labels they were not chosen on) they selected "
                f"{_pct(held.coverage)} of candidates with precision {_pct(held.precision)}, rejected "
                f"{_pct(held.rejected / held.labels if held.labels else None)} with NPV {_pct(held.npv)}, and left "
                f"{_pct(held.uncertain)} uncertain."
            )
        return (
            '<div class="verdict ok">'
            f'<div class="big">Recommended: reject = {format_threshold(rec.reject)}, '
            f"accept = {format_threshold(rec.accept)}</div>"
            f"<div><b>Ready for ENFORCE.</b> Chosen for {escape(targets)}, and proven on data they were not "
            f"chosen on.{escape(summary)}</div>" + _cautions(report) + "</div>"
        )
    if report.candidate is not None:
        cand = report.candidate
        return (
            '<div class="verdict warn">'
            '<div class="big">No thresholds recommended: the candidate is not proven, stay in SHADOW</div>'
            f"<div>The calibration split suggests reject = {format_threshold(cand.reject)}, accept = "
            f"{format_threshold(cand.accept)} for {escape(targets)}, but it is {escape(report.reason or '')}</div>"
            "</div>"
        )
    return (
        '<div class="verdict no"><div class="big">No thresholds recommended: none meets the targets, stay in '
        "SHADOW</div>"
        f"<div>{escape(report.reason or '')}</div></div>"
    )


def _calibrate_command(report: CalibrationFindings, files: CliFiles | None, *, html: bool = True) -> str:
    """The command that runs this calibration again, on the files this run read (``decisions.jsonl``
    and ``labels.jsonl`` where the report does not know them: :func:`_placeholders` says what they are)."""
    records, labels = (files.records, files.labels) if files else ("decisions.jsonl", "labels.jsonl")
    words = ["python", "-m", "llama_jev.calibrate", "--records", records, "--labels", labels]
    words += ["--target-precision", f"{report.targets['precision']:g}", "--min-npv", f"{report.targets['npv']:g}"]
    if not math.isclose(report.split.holdout_share, 0.3):
        words += ["--holdout", f"{report.split.holdout_share:g}"]
    if report.split.seed != 0:
        words += ["--seed", str(report.split.seed)]
    if files and files.purpose is not None:
        words += ["--purpose", files.purpose]
    if files and files.version is not None:
        words += ["--version", files.version]
    if html:
        words += ["--report", files.report if files and files.report else "report.html"]
    return shlex.join(words)


def _label_commands(size: int | None, files: CliFiles | None) -> str:
    """A new sheet of pairs not labelled yet, from the labelling sample, labelled into the labels
    file this run read."""
    samples = shlex.quote(files.samples) if files and files.samples else "samples.jsonl"
    labels = shlex.quote(files.labels) if files else "labels.jsonl"
    return (
        f"python -m llama_jev.label_sheet --samples {samples} --out more.csv \\\n"
        f"    {'' if size is None else f'--size {size} '}--exclude {labels}   # only pairs not labelled yet\n"
        f"python -m llama_jev.label more.csv --out {labels}   # the same labels file"
    )


def _placeholders(files: CliFiles | None, *, records: bool = False, samples: bool = False) -> str:
    """What the commands' stand-in file names are, for the ones this report does not know."""
    said = []
    if files is None and records:
        said.append("<code>decisions.jsonl</code> is your decision log (the file of your <code>JsonlObserver</code>)")
    if files is None:
        said.append("<code>labels.jsonl</code> the labels you calibrated with")
    if samples and (files is None or files.samples is None):
        said.append(
            "<code>samples.jsonl</code> your labelling sample (the file of "
            '<code>ExecutionOptions(label_sampler=LabelSampler("samples.jsonl"))</code>, or of '
            '<code>collect(..., samples="samples.jsonl")</code>)'
        )
    return f'<p class="muted small">{"; ".join(said)}.</p>' if said else ""


def _next_steps(report: CalibrationFindings, *, cli: bool, files: CliFiles | None = None) -> str:
    """The "what to do next" box: the lines to paste, or how to get to a recommendation."""
    if report.recommended is not None:
        rec = report.recommended
        code = (
            'selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE, version="'
            f'{escape(report.log.version)}"),\n                             '
            f"reject={format_threshold(rec.reject)}, accept={format_threshold(rec.accept)})"
        )
        items = [
            f"Switch the selector to ENFORCE with these thresholds:<pre>{code}</pre>",
            "Handle <code>RetrievalInconclusiveError</code> (nothing clearly relevant, something uncertain) and "
            "<code>RetrievalUnavailableError</code> (the judge failed) where you call the retriever.",
            "Keep the decision log (<code>JsonlObserver</code>) and the label sampler on: calibrate again on fresh "
            "labels when the judge, the prompt or the documents change (give that set-up a new "
            "<code>version=</code>).",
        ]
    else:
        items = ["Keep <code>mode=Mode.SHADOW</code>: nothing changes for your users while you gather evidence."]
        if report.labels_needed:
            items.append(
                f"Label about <b>{report.labels_needed}</b> more pairs (keep SHADOW sampling a while longer if the "
                f"sample holds few new questions):<pre>{escape(_label_commands(max(report.labels_needed, 50), files))}"
                f"</pre>{_placeholders(files, samples=True)}"
            )
        elif report.candidate is None:
            items.append(
                "No thresholds meet the targets even on the labels they are chosen from, so nothing was tested "
                "on held-out data. Where the precision curve (below) runs above the target line but its band "
                "reaches under it, more labels narrow the band; where the curve itself stays under the line, "
                "lower the targets if your application tolerates it, or try a better-separating judge or a "
                "fitted probability mapping (below), then label and calibrate again. To label more pairs:"
                f"<pre>{escape(_label_commands(None, files))}</pre>{_placeholders(files, samples=True)}"
            )
        else:
            items.append(
                "More labels alone may not help: the judge misses the targets on data it was not chosen on. Lower "
                "the targets if your application tolerates it, or try a better-separating judge or a fitted "
                "probability mapping (below), then label and calibrate again."
            )
        command = _calibrate_command(report, files).replace(" --target-precision", " \\\n    --target-precision")
        items.append(
            f"Run calibration again:<pre>{escape(command)}</pre>{_placeholders(files, records=True)}"
            if cli
            else "Call <code>calibrate</code> again."
        )
    return (
        '<div class="next"><h2>What to do next</h2><ol>' + "".join(f"<li>{item}</li>" for item in items) + "</ol></div>"
    )


def _cautions(report: CalibrationFindings) -> str:
    """What someone switching ENFORCE on should know beyond the two numbers."""
    notes = []
    replay = report.enforce
    if replay is not None and replay.inconclusive >= 0.1:
        notes.append(
            f"{_pct(replay.inconclusive)} of logged retrievals would have raised RetrievalInconclusiveError "
            f"(at the defaults 0.2 / 0.8: {_pct(report.enforce_default.inconclusive)})."
        )
    if replay is not None and replay.empty >= 0.3:
        notes.append(f"{_pct(replay.empty)} of logged retrievals would have come back empty (no evidence).")
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
    precision_miss = held.precision is None or held.precision < report.targets["precision"] or held.selected < 10
    npv_miss = held.npv is None or held.npv < report.targets["npv"] or held.rejected < 10
    cards = _cards(
        [
            (f"precision of the {held.selected} selected", _pct(held.precision), precision_miss),
            (f"NPV of the {held.rejected} rejected", _pct(held.npv), npv_miss),
            ("coverage (share selected)", _pct(held.coverage), False),
            ("uncertain (neither)", _pct(held.uncertain), False),
            ("recall", _pct(held.recall), False),
        ]
    )
    what = "recommendation" if report.recommended is not None else "candidate"
    return (
        f"<h2>What the {what} did on held-out data</h2>"
        f'<p class="muted">{held.labels} labelled candidates in {report.split.holdout_groups} '
        f"held-out {'queries' if report.split.unit == 'query' else 'decisions'}, never used to choose; split by "
        f"{escape(report.split.unit)} with seed {report.split.seed}, never by candidate. Proven needs precision ≥ "
        f"{report.targets['precision']:g} on at least 10 selected and NPV ≥ {report.targets['npv']:g} on at least "
        f"10 rejected; red cards miss.</p>{cards}"
    )


def _judge_section(report: CalibrationFindings) -> str:
    return (
        "<h2>How well the judge's p matches reality</h2>"
        '<dl class="terms">'
        f"<dt>ECE {report.ece:.3f}</dt><dd>Expected calibration error: on average, how far p is from the share "
        "of candidates that were actually relevant at that p (0 is perfect; 0.05 is good).</dd>"
        f"<dt>Brier score {report.brier:.3f}</dt><dd>The mean squared gap between p and the truth (1 relevant, "
        "0 not): 0 is perfect, 0.25 is what always answering p = 0.5 scores.</dd>"
        "</dl>"
    )


def _mapping_section(report: CalibrationFindings, *, cli: bool, files: CliFiles | None = None) -> str:
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
    if cli:
        # --json prints the report on stdout; no command writes a file of it unless told to
        save = _calibrate_command(report, files, html=False) + " --json > calibration.json"
        where = (
            "It is the <code>mapping</code> object of the <code>--json</code> output; save that output:"
            f"<pre>{escape(save)}</pre>{_placeholders(files, records=True)}"
            "and wrap the judge: "
            '<code>CalibratedJudge(judge, mapping_from_dict(json.load(open("calibration.json"))["mapping"]))</code>'
        )
    else:
        where = "To use it, wrap the judge: <code>CalibratedJudge(judge, mapping_from_dict(report.mapping))</code>"
    return (
        "<h2>A fitted probability mapping</h2>"
        f"<p>Platt scaling fitted on the calibration split: slope {_num(report.mapping.get('slope'))}, "
        f"intercept {_num(report.mapping.get('intercept'))}.{comparison}</p><p>{where}. Records written through "
        "it are on the mapped scale, so calibrate again on those before enforcing.</p>"
    )


def render_report(report: CalibrationFindings, *, cli: bool = False, files: CliFiles | None = None) -> str:
    """The HTML page for ``report`` (``cli``: worded for the command line, not the Python API;
    ``files``: the files the command read and wrote, named in the commands it suggests)."""
    sparse = any(0 < row.count < SPARSE_BIN for row in report.reliability)
    figures = (
        '<div class="grid">'
        f"<figure><h3>Reliability: is p the share that is relevant?</h3>{reliability_svg(report)}"
        f"<figcaption>All {report.labels} joined labels in ten bins of p (n = labels per bin). Bars below the "
        "diagonal: the judge is over-confident there; above: under-confident."
        + (f" Hollow bars hold fewer than {SPARSE_BIN} labels: too few to read." if sparse else "")
        + "</figcaption></figure>"
        f"<figure><h3>Precision by accept threshold</h3>{precision_svg(report)}<figcaption>Calibration split. "
        "The marked point is the chosen accept (or the best one): the lowest observed p, rounded up, whose 95% "
        "lower bound (bottom of the band) reaches the target line.</figcaption></figure>"
        f"<figure><h3>NPV by reject threshold</h3>{npv_svg(report)}<figcaption>Calibration split. The marked "
        "point is the chosen reject: the highest observed p below accept, rounded down, whose NPV lower bound "
        "reaches its target.</figcaption></figure>"
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
        + _next_steps(report, cli=cli, files=files)
        + _holdout_section(report)
        + _enforce_section(report)
        + "<h2>The evidence</h2>"
        + figures
        + _judge_section(report)
        + _sweep_table(report)
        + _mapping_section(report, cli=cli, files=files)
        + _data_section(report)
        + "</body></html>"
    )
