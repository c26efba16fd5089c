"""Reading labels: JSONL, or a CSV sheet in any common dialect, every bad line reported.

Labels are JSONL lines ``{"node_id": ..., "relevant": true|false}`` with either
``"decision_id"`` or ``"query"``, and optionally ``"labeller"`` (``"relevant"`` is a JSON
boolean, never 1 / 0; ``null`` is a pair not labelled yet, or skipped: counted, not used). A
CSV sheet's cells are text, so there true / false, yes / no and 1 / 0 all read, and an empty
cell is not labelled yet. The sheet may be separated by ``,``, ``;`` or tabs (a spreadsheet in a
European locale writes ``;``) and start with a UTF-8 byte order mark.

One labeller's later line for the same pair replaces the earlier one (the labelling page
appends a correction when a person goes back), so a file written by ``python -m
llama_jev.label`` is read as that person's last word on each pair.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from llama_jev.calibration.records import CalibrationInputError, json_lines, text_field
from llama_jev.core.records import QUERY_KEY_SECRET_ENVIRONMENT, normalize_query, query_key

__all__ = ["CSV_DELIMITERS", "Label", "LabelsInput", "LoadedLabels", "labelled_pairs", "load_labels", "read_table"]

CSV_DELIMITERS = ",;\t"
_DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab"}
_TRUE = {"true", "yes", "1", "y"}
_FALSE = {"false", "no", "0", "n"}


@dataclass(frozen=True)
class Label:
    """One human judgement: is ``node_id`` relevant for a decision (or for a query's key)?"""

    node_id: str
    relevant: bool
    decision_id: str | None = None
    query_key: str | None = None
    source: str = ""
    """Where it came from (``file:line``), for reports of conflicts and unjoined labels."""
    labeller: str | None = None
    """Who labelled it, when the label says (two labellers: their agreement is reported)."""


class LoadedLabels(NamedTuple):
    """What :func:`load_labels` read: the labels, and how many pairs have no answer yet
    (``labels, unlabelled = load_labels(...)``)."""

    labels: list[Label]
    unlabelled: int


LabelsInput = str | os.PathLike[str] | Iterable[Label | Mapping[str, Any]]


def read_table(path: Path) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """A CSV file's header and its rows as ``(line, {column: cell})``, in the file's dialect.

    The delimiter is the one of ``,`` ``;`` tab that splits the header into the most columns; a
    UTF-8 byte order mark is dropped; cells may be quoted and hold line breaks (the line named
    is where the row starts).

    Raises:
        CalibrationInputError: the file cannot be read, is not UTF-8, or has no header.
    """
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as error:
        raise CalibrationInputError(f"cannot read the file: {error.strerror or error}", path=path) from None
    except UnicodeDecodeError as error:
        line = text_line_of(path, error.start)
        raise CalibrationInputError("not UTF-8 text (save the sheet as 'CSV UTF-8')", path=path, line=line) from None
    first = text.split("\n", 1)[0]
    if not first.strip():
        raise CalibrationInputError(
            "no header line (expected columns such as decision_id, node_id, relevant)", path=path
        )
    delimiter = max(CSV_DELIMITERS, key=first.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = [cell.strip() for cell in next(reader)]
    except csv.Error as error:
        raise CalibrationInputError(f"unreadable header: {error}", path=path, line=1) from None

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        start = reader.line_num + 1
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise CalibrationInputError(f"unreadable CSV row: {error}", path=path, line=start) from None
            if any(cell.strip() for cell in cells):
                yield start, dict(zip(header, cells, strict=False))  # a short row leaves its last cells out
            start = reader.line_num + 1

    return header, rows()


def text_line_of(path: Path, offset: int) -> int:
    """The 1-based line of byte ``offset`` in ``path``."""
    return path.read_bytes()[:offset].count(b"\n") + 1


def _relevant(value: Any, *, text: bool) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if text and isinstance(value, str):  # CSV cells are text; only there is "1" a spelling of true
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        if not lowered:
            return None
        raise ValueError(
            f"column 'relevant' holds {value!r}; accepted: true/false, yes/no, y/n, 1/0, or empty (not labelled yet)"
        )
    # JSON has a boolean type: a 1, 0 or "yes" there is a different export or a slip, not a label
    raise ValueError(f"'relevant' must be true or false (a JSON boolean; null: not labelled yet), got {value!r}")


def _cell(entry: Mapping[str, Any], key: str, *, text: bool) -> str:
    if not text:
        return str(text_field(entry, key))
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"column {key!r} is empty; every row needs a {key}")
    return value.strip()


def _label(
    entry: Any, secret: str | bytes | None, source: str, *, text: bool
) -> tuple[tuple[str, str, str], Label | None]:
    """``(labeller, join key, node id)`` and the label (``None``: no answer yet, or skipped)."""
    if isinstance(entry, Label):
        join = f"d:{entry.decision_id}" if entry.decision_id is not None else f"k:{entry.query_key}"
        return (entry.labeller or "", join, entry.node_id), entry
    if not isinstance(entry, Mapping):
        raise ValueError(f"a label must be a JSON object, got {type(entry).__name__}")
    node_id = _cell(entry, "node_id", text=text)
    if "relevant" not in entry:  # null (an unfilled sheet row) is counted; a missing key is a wrong file
        raise ValueError("'relevant' is missing: give true or false (null for a row not labelled yet)")
    relevant = _relevant(entry["relevant"], text=text)
    labeller = entry.get("labeller") or None
    if labeller is not None and not isinstance(labeller, str):
        raise ValueError(f"'labeller' must be a string, got {labeller!r}")
    decision_id = entry.get("decision_id") or None
    query = entry.get("query") or None
    if decision_id is None and query is None:
        raise ValueError("a label needs 'decision_id' (a record's id) or 'query' (joined through query_key)")
    if decision_id is not None:
        decision_id = _cell(entry, "decision_id", text=text)
        key = (labeller or "", "d:" + decision_id, node_id)
        if relevant is None:
            return key, None
        return key, Label(node_id=node_id, relevant=relevant, decision_id=decision_id, source=source, labeller=labeller)
    if not isinstance(query, str):
        raise ValueError(f"'query' must be a string, got {query!r}")
    if relevant is None:
        return (labeller or "", "q:" + normalize_query(query), node_id), None
    if secret is None:
        raise ValueError(
            "labels with 'query' join through query_key: pass --query-key-secret (query_key_secret=) "
            f"or set {QUERY_KEY_SECRET_ENVIRONMENT} to the secret the records were written with"
        )
    key = (labeller or "", "q:" + normalize_query(query), node_id)
    return key, Label(
        node_id=node_id, relevant=relevant, query_key=query_key(query, secret), source=source, labeller=labeller
    )


def load_labels(labels: LabelsInput, *, query_key_secret: str | bytes | None = None) -> LoadedLabels:
    """Read labels from a JSONL or CSV path, or from ``Label`` objects / dicts.

    The secret defaults to ``LLAMA_JEV_QUERY_KEY_SECRET``; it is needed only for labels with
    ``query``. A labeller's later line on the same pair replaces the earlier one (a ``null``
    withdraws it); lines without a labeller are each kept (:func:`join_labels` counts equal
    duplicates once and leaves disagreeing ones out).

    Raises:
        CalibrationInputError: naming the file and line of every bad label (up to 20 listed).
    """
    secret = query_key_secret or os.environ.get(QUERY_KEY_SECRET_ENVIRONMENT) or None
    path = Path(labels) if isinstance(labels, (str, os.PathLike)) else None
    is_csv = path is not None and path.suffix.lower() in (".csv", ".tsv")
    items: Iterable[tuple[int, Any]]
    if path is not None and is_csv:
        header, items = read_table(path)
        _check_header(header, path)
    elif path is not None:
        items = json_lines(path)
    else:
        items = enumerate(labels, start=1)  # type: ignore[arg-type]
    # (labeller, join key, node id) -> the latest answer of that labeller (None: withdrawn / skipped)
    latest: dict[tuple[str, str, str], Label | None] = {}
    anonymous: list[Label] = []
    unanswered = 0
    problems: list[tuple[int, str]] = []
    for number, entry in items:
        source = f"{path}:{number}" if path is not None else f"item {number}"
        try:
            key, label = _label(entry, secret, source, text=is_csv)
        except ValueError as error:
            problems.append((number, f"not a label: {error}"))
            continue
        if not key[0]:  # no labeller: every line stands on its own
            if label is None:
                unanswered += 1
            else:
                anonymous.append(label)
            continue
        latest.pop(key, None)  # re-inserted last: a correction keeps file order
        latest[key] = label
    if problems:
        raise CalibrationInputError.from_lines(problems, path=path, what="labels")
    named = [label for label in latest.values() if label is not None]
    withdrawn = sum(1 for label in latest.values() if label is None)
    return LoadedLabels(labels=anonymous + named, unlabelled=unanswered + withdrawn)


def labelled_pairs(path: str | os.PathLike[str]) -> set[tuple[str, str]]:
    """The pairs a labels file (JSONL, or a filled CSV sheet) already holds an answer for.

    Each is ``("d:" + decision_id, node_id)`` or, for a label by query, ``("q:" + the normalized
    query, node_id)``. Answered means true or false, or skipped on the labelling page (a ``null``
    with a labeller: the page would not show that pair to its labeller again); a blank sheet row
    is not answered. What a second sheet leaves out (``label_sheet --exclude``).

    Raises:
        CalibrationInputError: every bad line named (file:line).
    """
    source = Path(path)
    is_csv = source.suffix.lower() in (".csv", ".tsv")
    items: Iterable[tuple[int, Any]]
    if is_csv:
        header, items = read_table(source)
        _check_header(header, source)
    else:
        items = json_lines(source)
    pairs: set[tuple[str, str]] = set()
    problems: list[tuple[int, str]] = []
    for number, entry in items:
        try:
            if not isinstance(entry, Mapping):
                raise ValueError(f"a label must be a JSON object, got {type(entry).__name__}")
            node_id = _cell(entry, "node_id", text=is_csv)
            relevant = _relevant(entry.get("relevant"), text=is_csv)
            if relevant is None and not entry.get("labeller"):
                continue  # not labelled yet
            if entry.get("decision_id"):
                pairs.add(("d:" + _cell(entry, "decision_id", text=is_csv), node_id))
            elif isinstance(entry.get("query"), str):
                pairs.add(("q:" + normalize_query(entry["query"]), node_id))
            else:
                raise ValueError("a label needs 'decision_id' or 'query'")
        except ValueError as error:
            problems.append((number, f"not a label: {error}"))
    if problems:
        raise CalibrationInputError.from_lines(problems, path=source, what="labels")
    return pairs


def _check_header(header: list[str], path: Path) -> None:
    missing = [column for column in ("node_id", "relevant") if column not in header]
    if not ("decision_id" in header or "query" in header):
        missing.append("decision_id (or query)")
    if missing:
        found = ", ".join(repr(column) for column in header) or "nothing"
        raise CalibrationInputError(
            f"the header has no {', '.join(missing)} column; found {found}. Accepted: a sheet from "
            "python -m llama_jev.label_sheet, separated by " + ", ".join(_DELIMITER_NAMES.values()) + "s",
            path=path,
            line=1,
        )
