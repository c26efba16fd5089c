"""Reading decision records: validated line by line, streamed, so memory grows with labels.

Records are the JSONL a :class:`~llama_jev.JsonlObserver` writes; SHADOW logs grow with traffic
while labels do not. :func:`scan_records` reads them once and keeps whole only the decisions a
label can join (by ``decision_id`` or ``query_key``); of every other record it keeps what a
replay of ENFORCE needs (status and highest p, 9 bytes) and the counts the report shows.
Every problem is reported with the file and line it came from.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from llama_jev.core.errors import JevError
from llama_jev.core.records import DecisionRecord, Status

__all__ = [
    "CalibrationInputError",
    "InsufficientLabelsError",
    "LoggedDecision",
    "MixedRecordsError",
    "RecordsInput",
    "ScannedRecords",
    "json_lines",
    "load_records",
    "scan_records",
    "select_records",
]

_MAX_LISTED = 20  # bad lines listed one by one in an error; the rest are counted


class CalibrationInputError(JevError, ValueError):
    """The records or labels cannot be used; the message names the file and line when known.

    Attributes:
        path: the file the problem is in (``None`` for in-memory input).
        line: the 1-based line number of the (first) bad line (``None`` when not one line's).
        problems: every bad line as ``(line, problem)``, when several were found.
    """

    def __init__(
        self,
        problem: str,
        *,
        path: str | os.PathLike[str] | None = None,
        line: int | None = None,
        problems: Sequence[tuple[int, str]] = (),
    ) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        self.problems = tuple(problems)
        super().__init__(_where(self.path, line) + problem)

    @classmethod
    def from_lines(
        cls, problems: Sequence[tuple[int, str]], *, path: str | os.PathLike[str] | None, what: str
    ) -> CalibrationInputError:
        """One error for every bad line: each named ``file:line: problem``, one per line of text."""
        if len(problems) == 1:
            line, problem = problems[0]
            return cls(problem, path=path, line=line, problems=problems)
        shown = [
            _where(None if path is None else str(path), line) + problem for line, problem in problems[:_MAX_LISTED]
        ]
        more = len(problems) - len(shown)
        text = f"{len(problems)} bad {what} (fix them all, then run again):\n  " + "\n  ".join(shown)
        if more:
            text += f"\n  ... and {more} more"
        error = cls(text, problems=problems)
        error.path = None if path is None else str(path)
        error.line = problems[0][0]
        return error


def _where(path: str | None, line: int | None) -> str:
    if path is not None:
        return f"{path}:{line}: " if line is not None else f"{path}: "
    return f"item {line}: " if line is not None else ""


class InsufficientLabelsError(CalibrationInputError):
    """Too few joined labels (fewer than 50), or fewer than 10 in a class, to recommend anything.

    Attributes:
        labels: joined pairs available; ``relevant`` / ``irrelevant``: of those, per class.
        labels_needed: at least this many more labels before calibrate can say anything (0 when
            only the split is short: every label is for one query or decision).
    """

    def __init__(self, problem: str, *, labels: int, relevant: int, irrelevant: int, labels_needed: int = 0) -> None:
        self.labels = labels
        self.relevant = relevant
        self.irrelevant = irrelevant
        self.labels_needed = labels_needed
        super().__init__(problem)


class MixedRecordsError(CalibrationInputError):
    """The records come from more than one ``purpose`` or ``version``, or mix raw and mapped
    probabilities: pick one to calibrate."""


@dataclass(frozen=True)
class LoggedDecision:
    """What calibration needs of one :class:`~llama_jev.DecisionRecord` (ids and scores only)."""

    decision_id: str
    purpose: str
    version: str
    status: Status
    scores: Mapping[str, float]
    query_key: str | None = None
    model: str | None = None


# --- reading ----------------------------------------------------------------------------------


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for every non-blank line; the first bad one raises."""
    for number, line in _text_lines(path):
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise CalibrationInputError(
                f"not valid JSON ({error.msg} at column {error.colno})", path=path, line=number
            ) from None


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        handle = path.open("rb")  # decoded line by line, so a bad byte is reported at its line
    except OSError as error:
        raise CalibrationInputError(f"cannot read the file: {error.strerror or error}", path=path) from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                # utf-8-sig on the first line: editors on Windows start files with a BOM
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
            except UnicodeDecodeError:
                raise CalibrationInputError("not UTF-8 text", path=path, line=number) from None
            if line:
                yield number, line


def probability(value: Any) -> bool:
    """Whether ``value`` is a number (not a bool) in [0, 1]."""
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0.0 <= value <= 1.0
    )


def text_field(entry: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    """``entry[key]`` as a non-blank string (``None`` when absent and not required)."""
    value = entry.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string, got {value!r}")
    return value


_STATUSES = {status.value: status for status in Status}


def _decision(entry: Any) -> LoggedDecision:
    if isinstance(entry, DecisionRecord):
        entry = entry.model_dump(mode="json")
    if not isinstance(entry, Mapping):
        raise ValueError(f"a record must be a JSON object, got {type(entry).__name__}")
    status_value = entry.get("status")
    status = _STATUSES.get(status_value) if isinstance(status_value, str) else None
    if status is None:
        raise ValueError(f"'status' must be one of {[s.value for s in Status]}, got {status_value!r}")
    scores = entry.get("scores", {})
    if not isinstance(scores, Mapping):
        raise ValueError("'scores' must be an object node id -> probability")
    _check_scores(scores)
    model = entry.get("model")
    return LoggedDecision(
        decision_id=str(text_field(entry, "decision_id")),
        purpose=str(text_field(entry, "purpose")),
        version=str(text_field(entry, "version")),
        status=status,
        scores=scores if isinstance(scores, dict) else dict(scores),
        query_key=text_field(entry, "query_key", required=False),
        model=model if isinstance(model, str) else None,
    )


_NUMBERS = frozenset({float, int})


def _check_scores(scores: Mapping[str, Any]) -> None:
    """Every score a probability in [0, 1]. Checked in C-level passes first (types, bounds, a sum
    that is finite only without NaN or infinity): logs run to millions of records."""
    values = scores.values()
    if not values:
        return
    if (
        set(map(type, values)) <= _NUMBERS
        and math.isfinite(math.fsum(values))
        and min(values) >= 0.0
        and max(values) <= 1.0
    ):
        return
    for node_id, p in scores.items():
        if not probability(p):
            raise ValueError(f"score of node {node_id!r} must be a probability in [0, 1], got {p!r}")


RecordsInput = str | os.PathLike[str] | Iterable[DecisionRecord | Mapping[str, Any]]


def _items(records: RecordsInput) -> tuple[Path | None, Iterable[tuple[int, Any]]]:
    if isinstance(records, (str, os.PathLike)):
        path = Path(records)
        return path, json_lines(path)
    return None, enumerate(records, start=1)


def _decisions(path: Path | None, items: Iterable[tuple[int, Any]]) -> Iterator[tuple[int, LoggedDecision]]:
    for number, entry in items:
        try:
            yield number, _decision(entry)
        except ValueError as error:
            raise CalibrationInputError(f"not a decision record: {error}", path=path, line=number) from None


def load_records(records: RecordsInput) -> list[LoggedDecision]:
    """Read every decision record from a JSONL path, or from ``DecisionRecord`` objects / dicts.

    Fields calibration does not use are ignored (so logs with ``include_user=True`` or from a
    newer version still read). Duplicate ``decision_id`` values are refused: labels could not
    say which one they mean. This holds every record in memory; :func:`calibrate` streams instead.

    Raises:
        CalibrationInputError: naming the file and line of the first bad record.
    """
    path, items = _items(records)
    decisions: list[LoggedDecision] = []
    seen: dict[str, int] = {}
    for number, decision in _decisions(path, items):
        if decision.decision_id in seen:
            raise _duplicate(decision.decision_id, seen[decision.decision_id], number, path)
        seen[decision.decision_id] = number
        decisions.append(decision)
    if not decisions:
        raise CalibrationInputError("no decision records (nothing to calibrate)", path=path)
    return decisions


def _duplicate(decision_id: str, first: int, line: int, path: Path | None) -> CalibrationInputError:
    return CalibrationInputError(
        f"decision_id {decision_id!r} appears twice (first at line {first})", path=path, line=line
    )


# --- streaming --------------------------------------------------------------------------------

# Status codes of the replay arrays (one byte per record).
_CODES = {Status.DECIDED: 0, Status.INCONCLUSIVE: 1, Status.ERROR: 2, Status.SKIPPED: 3, Status.CANCELLED: 4}
CODE_STATUS = {code: status for status, code in _CODES.items()}


@dataclass
class ScannedRecords:
    """One pass over the records, for one purpose and version.

    ``kept``: the decisions labels can join, whole. ``statuses`` / ``top``: per record, its
    status code and highest p (-1.0 without scores), enough to replay ENFORCE at any thresholds.
    """

    kept: list[LoggedDecision]
    statuses: array[int]
    top: array[float]
    purpose: str
    version: str
    models: list[str]
    records: int
    errors: int
    skipped: int
    kept_rows: dict[str, int] = field(default_factory=dict)
    """The row of each kept decision in ``statuses`` / ``top`` (for replays of a subset)."""


def scan_records(
    records: RecordsInput,
    *,
    decision_ids: frozenset[str] = frozenset(),
    query_keys: frozenset[str] = frozenset(),
    purpose: str | None = None,
    version: str | None = None,
) -> ScannedRecords:
    """Read ``records`` once, keeping whole only the decisions in ``decision_ids`` or with a
    ``query_key`` in ``query_keys`` (what labels name), and 9 bytes of every other one.

    Duplicate ``decision_id`` values are refused as in :func:`load_records`, found through
    64-bit hashes (8 bytes a record) and confirmed by a second read only when two hashes meet.

    Raises:
        CalibrationInputError: a bad record (file and line), no record, a duplicate id.
        MixedRecordsError: several purposes / versions / probability scales and none chosen.
    """
    if not isinstance(records, (str, os.PathLike)) and not isinstance(records, (list, tuple)):
        records = list(records)  # in memory already; read twice when a duplicate id is suspected
    path, items = _items(records)
    kept: list[LoggedDecision] = []
    kept_rows: dict[str, int] = {}
    statuses, top = array("b"), array("d")
    hashes = array("q")
    sets: dict[tuple[str, str], int] = {}
    models: set[str] = set()
    total = errors = skipped = 0
    for _, decision in _decisions(path, items):
        total += 1
        hashes.append(hash(decision.decision_id))
        group = (decision.purpose, decision.version)
        sets[group] = sets.get(group, 0) + 1
        if (purpose is not None and decision.purpose != purpose) or (
            version is not None and decision.version != version
        ):
            continue
        if decision.model:
            models.add(decision.model)
        if decision.status is Status.ERROR:
            errors += 1
        elif decision.status in (Status.SKIPPED, Status.CANCELLED):
            skipped += 1
        if decision.decision_id in decision_ids or (
            decision.query_key is not None and decision.query_key in query_keys
        ):
            kept_rows[decision.decision_id] = len(statuses)
            kept.append(decision)
        statuses.append(_CODES[decision.status])
        top.append(max(decision.scores.values(), default=-1.0))
    if not total:
        raise CalibrationInputError("no decision records (nothing to calibrate)", path=path)
    _check_unique(hashes, records, path)
    del hashes
    chosen = _check_selection(sets, models, purpose, version)
    return ScannedRecords(
        kept=kept,
        statuses=statuses,
        top=top,
        purpose=chosen[0],
        version=chosen[1],
        models=sorted(models),
        records=len(statuses),
        errors=errors,
        skipped=skipped,
        kept_rows=kept_rows,
    )


def _check_unique(hashes: array[int], records: RecordsInput, path: Path | None) -> None:
    ordered = sorted(hashes)
    suspects = {a for a, b in pairwise(ordered) if a == b}
    del ordered
    if not suspects:
        return
    seen: dict[str, int] = {}
    _, items = _items(records)
    for number, decision in _decisions(path, items):
        if hash(decision.decision_id) not in suspects:
            continue
        if decision.decision_id in seen:
            raise _duplicate(decision.decision_id, seen[decision.decision_id], number, path)
        seen[decision.decision_id] = number


def _check_selection(
    sets: Mapping[tuple[str, str], int], models: set[str], purpose: str | None, version: str | None
) -> tuple[str, str]:
    chosen = sorted(
        group for group in sets if (purpose is None or group[0] == purpose) and (version is None or group[1] == version)
    )
    if not chosen:
        raise MixedRecordsError(
            f"no record has purpose={purpose!r} version={version!r}; the records hold (purpose, version) {sorted(sets)}"
        )
    for index, (key, option) in enumerate((("purpose", "--purpose"), ("version", "--version"))):
        values = sorted({group[index] for group in chosen})
        if len(values) > 1:
            raise MixedRecordsError(
                f"the records mix {len(values)} {key}s {values}: calibrating them together would blend "
                f"different set-ups; choose one with {option} (API: {key}=)"
            )
    if len({_scale(model) for model in models}) > 1:
        raise MixedRecordsError(
            f"the records mix raw and mapped probabilities (models {sorted(models)}; a CalibratedJudge writes "
            "<model>+<mapping>): thresholds over both scales would mean nothing; give each set-up its own "
            "ExecutionOptions(version=...) and choose one with --version (API: version=)"
        )
    return chosen[0]


def select_records(
    decisions: Sequence[LoggedDecision], *, purpose: str | None = None, version: str | None = None
) -> list[LoggedDecision]:
    """The decisions of one ``purpose`` and ``version``; refuse a mix unless one is chosen.

    Raises:
        MixedRecordsError: more than one purpose or version and none selected, the selection
            matches nothing, or it mixes a judge's raw probabilities with mapped ones.
    """
    sets: dict[tuple[str, str], int] = {}
    for d in decisions:
        sets[(d.purpose, d.version)] = sets.get((d.purpose, d.version), 0) + 1
    chosen = [
        d for d in decisions if (purpose is None or d.purpose == purpose) and (version is None or d.version == version)
    ]
    _check_selection(sets, {d.model for d in chosen if d.model}, purpose, version)
    return chosen


def _scale(model: str) -> str:
    """``"raw"``, or the mapping a :class:`~llama_jev.calibration.CalibratedJudge` appended (``jev-1+platt``)."""
    return model.rpartition("+")[2] if "+" in model else "raw"
