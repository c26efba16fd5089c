"""Reading decision records and labels, and joining them into (p, relevant) pairs.

Records are the JSONL a :class:`~llama_jev.JsonlObserver` writes; labels are JSONL lines
``{"node_id": ..., "relevant": true|false}`` with either ``"decision_id"`` or ``"query"``
(``"relevant"`` is a JSON boolean, never 1 / 0; ``null`` is a sheet row not labelled yet:
counted, not used). A CSV sheet's cells are text, so there true / false, yes / no and 1 / 0 all
read, and an empty cell is not labelled yet. Every problem is
reported with the file and line it came from, and nothing is dropped silently: error records,
unjoined labels and disagreeing duplicates are counted and returned.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_jev.core.errors import JevError
from llama_jev.core.records import QUERY_KEY_SECRET_ENVIRONMENT, DecisionRecord, Status, query_key

__all__ = [
    "CalibrationInputError",
    "InsufficientLabelsError",
    "JoinedLabels",
    "Label",
    "LabelledPair",
    "LoggedDecision",
    "MixedRecordsError",
    "join_labels",
    "load_labels",
    "load_records",
    "select_records",
]

_EXAMPLES = 5  # how many unjoined / conflicting labels a report lists by id


class CalibrationInputError(JevError, ValueError):
    """The records or labels cannot be used; the message names the file and line when known.

    Attributes:
        path: the file the problem is in (``None`` for in-memory input).
        line: the 1-based line number (``None`` when the problem is not one line's).
    """

    def __init__(self, problem: str, *, path: str | os.PathLike[str] | None = None, line: int | None = None) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        elif line is not None:
            where = f"item {line}: "
        super().__init__(where + problem)


class InsufficientLabelsError(CalibrationInputError):
    """Too few joined labels (fewer than 50), or fewer than 10 in a class, to recommend anything.

    Attributes:
        labels: joined pairs available; ``relevant`` / ``irrelevant``: of those, per class.
    """

    def __init__(self, problem: str, *, labels: int, relevant: int, irrelevant: int) -> None:
        self.labels = labels
        self.relevant = relevant
        self.irrelevant = irrelevant
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


@dataclass(frozen=True)
class Label:
    """One human judgement: is ``node_id`` relevant for a decision (or for a query's key)?"""

    node_id: str
    relevant: bool
    decision_id: str | None = None
    query_key: str | None = None
    source: str = ""
    """Where it came from (``file:line``), for reports of conflicts and unjoined labels."""


@dataclass(frozen=True)
class LabelledPair:
    """A joined label: the judge's ``p`` for ``node_id`` in ``decision_id`` and the truth."""

    decision_id: str
    node_id: str
    p: float
    relevant: bool
    group: str
    """The split unit: the query key when the record has one, else the decision id."""


@dataclass(frozen=True)
class JoinedLabels:
    """The result of :func:`join_labels`: usable pairs and what could not be used, counted."""

    pairs: tuple[LabelledPair, ...]
    unjoined: int = 0
    unjoined_examples: tuple[dict[str, str], ...] = ()
    conflicts: int = 0
    conflict_examples: tuple[dict[str, str], ...] = ()
    on_error_records: int = 0
    unlabelled: int = 0
    duplicates: int = 0
    by: tuple[str, ...] = field(default=())


# --- reading --------------------------------------------------------------------------------


def _json_lines(path: Path) -> Iterable[tuple[int, Any]]:
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
            if not line:
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                raise CalibrationInputError(
                    f"not valid JSON ({error.msg} at column {error.colno})", path=path, line=number
                ) from None


def _probability(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0.0 <= value <= 1.0
    )


def _text(entry: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = entry.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string, got {value!r}")
    return value


def _decision(entry: Any) -> LoggedDecision:
    if isinstance(entry, DecisionRecord):
        entry = entry.model_dump(mode="json")
    if not isinstance(entry, Mapping):
        raise ValueError(f"a record must be a JSON object, got {type(entry).__name__}")
    status_value = entry.get("status")
    try:
        status = Status(status_value)
    except ValueError:
        raise ValueError(f"'status' must be one of {[s.value for s in Status]}, got {status_value!r}") from None
    scores = entry.get("scores", {})
    if not isinstance(scores, Mapping):
        raise ValueError("'scores' must be an object node id -> probability")
    for node_id, p in scores.items():
        if not _probability(p):
            raise ValueError(f"score of node {node_id!r} must be a probability in [0, 1], got {p!r}")
    model = entry.get("model")
    return LoggedDecision(
        decision_id=str(_text(entry, "decision_id")),
        purpose=str(_text(entry, "purpose")),
        version=str(_text(entry, "version")),
        status=status,
        scores={str(node_id): float(p) for node_id, p in scores.items()},
        query_key=_text(entry, "query_key", required=False),
        model=model if isinstance(model, str) else None,
    )


RecordsInput = str | os.PathLike[str] | Iterable[DecisionRecord | Mapping[str, Any]]
LabelsInput = str | os.PathLike[str] | Iterable[Label | Mapping[str, Any]]


def load_records(records: RecordsInput) -> list[LoggedDecision]:
    """Read decision records from a JSONL path, or from ``DecisionRecord`` objects / dicts.

    Fields calibration does not use are ignored (so logs with ``include_user=True`` or from a
    newer version still read). Duplicate ``decision_id`` values are refused: labels could not
    say which one they mean.

    Raises:
        CalibrationInputError: naming the file and line of the first bad record.
    """
    path = Path(records) if isinstance(records, (str, os.PathLike)) else None
    items: Iterable[tuple[int, Any]] = _json_lines(path) if path is not None else enumerate(records, start=1)  # type: ignore[arg-type]
    decisions: list[LoggedDecision] = []
    seen: dict[str, int] = {}
    for number, entry in items:
        try:
            decision = _decision(entry)
        except ValueError as error:
            raise CalibrationInputError(f"not a decision record: {error}", path=path, line=number) from None
        if decision.decision_id in seen:
            raise CalibrationInputError(
                f"decision_id {decision.decision_id!r} appears twice (first at line {seen[decision.decision_id]})",
                path=path,
                line=number,
            )
        seen[decision.decision_id] = number
        decisions.append(decision)
    if not decisions:
        raise CalibrationInputError("no decision records (nothing to calibrate)", path=path)
    return decisions


def _relevant(value: Any, *, text: bool) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if text and isinstance(value, str):  # CSV cells are text; only there is "1" a spelling of true
        lowered = value.strip().lower()
        if lowered in {"true", "yes", "1", "y"}:
            return True
        if lowered in {"false", "no", "0", "n"}:
            return False
        if not lowered:
            return None
    # JSON has a boolean type: a 1, 0 or "yes" there is a different export or a slip, not a label
    raise ValueError(f"'relevant' must be true or false (a JSON boolean; null: not labelled yet), got {value!r}")


def _label(entry: Any, secret: str | bytes | None, source: str, *, text: bool = False) -> Label | None:
    if isinstance(entry, Label):
        return entry
    if not isinstance(entry, Mapping):
        raise ValueError(f"a label must be a JSON object, got {type(entry).__name__}")
    node_id = str(_text(entry, "node_id"))
    if "relevant" not in entry:  # null (an unfilled sheet row) is counted; a missing key is a wrong file
        raise ValueError("'relevant' is missing: give true or false (null for a row not labelled yet)")
    relevant = _relevant(entry["relevant"], text=text)
    if relevant is None:
        return None  # a sheet row nobody has filled in yet
    decision_id = entry.get("decision_id") or None
    query = entry.get("query") or None
    if decision_id is None and query is None:
        raise ValueError("a label needs 'decision_id' (a record's id) or 'query' (joined through query_key)")
    if decision_id is not None:
        return Label(node_id=node_id, relevant=relevant, decision_id=str(_text(entry, "decision_id")), source=source)
    if not isinstance(query, str):
        raise ValueError(f"'query' must be a string, got {query!r}")
    if secret is None:
        raise ValueError(
            "labels with 'query' join through query_key: pass --query-key-secret (query_key_secret=) "
            f"or set {QUERY_KEY_SECRET_ENVIRONMENT} to the secret the records were written with"
        )
    return Label(node_id=node_id, relevant=relevant, query_key=query_key(query, secret), source=source)


def load_labels(labels: LabelsInput, *, query_key_secret: str | bytes | None = None) -> tuple[list[Label], int]:
    """Read labels from a JSONL (or CSV) path, or from ``Label`` objects / dicts.

    Returns the labels and how many rows had no ``relevant`` value yet (an unfinished sheet).
    The secret defaults to ``LLAMA_JEV_QUERY_KEY_SECRET``; it is needed only for labels with
    ``query``.

    Raises:
        CalibrationInputError: naming the file and line of the first bad label.
    """
    secret = query_key_secret or os.environ.get(QUERY_KEY_SECRET_ENVIRONMENT) or None
    path = Path(labels) if isinstance(labels, (str, os.PathLike)) else None
    items: Iterable[tuple[int, Any]]
    is_csv = path is not None and path.suffix.lower() == ".csv"
    if path is not None and is_csv:
        items = _csv_rows(path)
    elif path is not None:
        items = _json_lines(path)
    else:
        items = enumerate(labels, start=1)  # type: ignore[arg-type]
    result: list[Label] = []
    unlabelled = 0
    for number, entry in items:
        source = f"{path}:{number}" if path is not None else f"item {number}"
        try:
            label = _label(entry, secret, source, text=is_csv)
        except ValueError as error:
            raise CalibrationInputError(f"not a label: {error}", path=path, line=number) from None
        if label is None:
            unlabelled += 1
        else:
            result.append(label)
    return result, unlabelled


def _csv_rows(path: Path) -> Iterable[tuple[int, Any]]:
    try:
        # -sig: a spreadsheet saving "CSV UTF-8" starts the header with a BOM
        with path.open(encoding="utf-8-sig", newline="") as handle:
            # line 1 is the header, so the first row is line 2 of the file
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise CalibrationInputError(f"cannot read the CSV file: {error}", path=path) from None
    return enumerate(rows, start=2)


# --- selecting and joining --------------------------------------------------------------------


def select_records(
    decisions: Sequence[LoggedDecision], *, purpose: str | None = None, version: str | None = None
) -> list[LoggedDecision]:
    """The decisions of one ``purpose`` and ``version``; refuse a mix unless one is chosen.

    Raises:
        MixedRecordsError: more than one purpose or version and none selected, the selection
            matches nothing, or it mixes a judge's raw probabilities with mapped ones.
    """
    chosen = [
        d for d in decisions if (purpose is None or d.purpose == purpose) and (version is None or d.version == version)
    ]
    if not chosen:
        available = sorted({(d.purpose, d.version) for d in decisions})
        raise MixedRecordsError(
            f"no record has purpose={purpose!r} version={version!r}; the records hold (purpose, version) {available}"
        )
    for key, option in (("purpose", "--purpose"), ("version", "--version")):
        values = sorted({getattr(d, key) for d in chosen})
        if len(values) > 1:
            raise MixedRecordsError(
                f"the records mix {len(values)} {key}s {values}: calibrating them together would blend "
                f"different set-ups; choose one with {option} (API: {key}=)"
            )
    scales = {_scale(d.model) for d in chosen if d.model}
    if len(scales) > 1:
        models = sorted({d.model for d in chosen if d.model})
        raise MixedRecordsError(
            f"the records mix raw and mapped probabilities (models {models}; a CalibratedJudge writes "
            "<model>+<mapping>): thresholds over both scales would mean nothing; give each set-up its own "
            "ExecutionOptions(version=...) and choose one with --version (API: version=)"
        )
    return chosen


def _scale(model: str) -> str:
    """``"raw"``, or the mapping a :class:`~llama_jev.CalibratedJudge` appended (``jev-1+platt``)."""
    return model.rpartition("+")[2] if "+" in model else "raw"


def join_labels(decisions: Sequence[LoggedDecision], labels: Sequence[Label], *, unlabelled: int = 0) -> JoinedLabels:
    """Join labels to the judge's probabilities, by ``decision_id`` or through ``query_key``.

    A label by ``query`` joins every decision with that query key that judged the node (the same
    question asked twice gives two pairs). Labels on ERROR decisions are counted, never used. Two
    labels that reach the same (decision, node) and disagree are both dropped and reported; equal
    duplicates count once.
    """
    by_id = {d.decision_id: d for d in decisions}
    by_key: dict[str, list[LoggedDecision]] = {}
    for decision in decisions:
        if decision.query_key is not None:
            by_key.setdefault(decision.query_key, []).append(decision)

    truth: dict[tuple[str, str], tuple[bool, str]] = {}
    conflicting: set[tuple[str, str]] = set()
    conflict_examples: list[dict[str, str]] = []
    unjoined_examples: list[dict[str, str]] = []
    unjoined = on_error = duplicates = 0
    ways: set[str] = set()

    for label in labels:
        if label.decision_id is not None:
            targets = [by_id[label.decision_id]] if label.decision_id in by_id else []
            ways.add("decision_id")
        else:
            targets = list(by_key.get(label.query_key or "", []))
            ways.add("query")
        judged = [d for d in targets if label.node_id in d.scores]
        usable = [d for d in judged if d.status is not Status.ERROR]
        if judged and not usable:
            on_error += 1
            continue
        if not usable:
            unjoined += 1
            if len(unjoined_examples) < _EXAMPLES:
                why = "no such decision" if not targets else "node not judged in that decision"
                if label.decision_id is None and not targets:
                    why = "no record with that query's key"
                unjoined_examples.append(
                    {
                        "decision_id": label.decision_id or "",
                        "node_id": label.node_id,
                        "reason": why,
                        "at": label.source,
                    }
                )
            continue
        for decision in usable:
            pair = (decision.decision_id, label.node_id)
            if pair not in truth:
                truth[pair] = (label.relevant, label.source)
            elif truth[pair][0] == label.relevant:
                duplicates += 1
            elif pair not in conflicting:
                conflicting.add(pair)
                if len(conflict_examples) < _EXAMPLES:
                    conflict_examples.append(
                        {
                            "decision_id": pair[0],
                            "node_id": pair[1],
                            "first": truth[pair][1],
                            "second": label.source,
                        }
                    )

    pairs = tuple(
        LabelledPair(
            decision_id=decision_id,
            node_id=node_id,
            p=by_id[decision_id].scores[node_id],
            relevant=relevant,
            group=by_id[decision_id].query_key or decision_id,
        )
        for (decision_id, node_id), (relevant, _) in sorted(truth.items())
        if (decision_id, node_id) not in conflicting
    )
    return JoinedLabels(
        pairs=pairs,
        unjoined=unjoined,
        unjoined_examples=tuple(unjoined_examples),
        conflicts=len(conflicting),
        conflict_examples=tuple(conflict_examples),
        on_error_records=on_error,
        unlabelled=unlabelled,
        duplicates=duplicates,
        by=tuple(sorted(ways)),
    )
