"""What the labelling page (``python -m llama_jev.label``) does, without the web server.

A :class:`LabellingSession` walks the pairs of a sheet one at a time for one labeller. Every
answer is appended to the labels file and flushed to disk before the next pair is shown, so a
closed tab, a killed server or a power cut loses at most the pair on screen; started again on
the same files it resumes at the first pair this labeller has not answered. Going back and
answering again appends a correction (the labeller's last line on a pair is the one that
counts, see :mod:`llama_jev.calibration.labels`). The judge's p is never part of what is shown.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llama_jev.calibration.labels import read_table
from llama_jev.calibration.records import CalibrationInputError, json_lines

__all__ = ["LabellingSession", "SheetPair", "StalePageError", "read_sheet"]

_UNANSWERED = object()


@dataclass(frozen=True)
class SheetPair:
    """One row of a sheet: a question and a passage to judge, and the ids labels join on."""

    decision_id: str
    node_id: str
    question: str
    passage: str

    @property
    def key(self) -> str:
        """A stable id of the pair for the page (the two ids, joined)."""
        return f"{self.decision_id}\x1f{self.node_id}"


def read_sheet(path: str | os.PathLike[str]) -> list[SheetPair]:
    """The pairs of a sheet from ``python -m llama_jev.label_sheet --samples`` (CSV in any common
    dialect, or JSONL), in sheet order, each pair once.

    Raises:
        CalibrationInputError: every bad row named (file:line), or no pair at all.
    """
    source = Path(path)
    rows: Iterator[tuple[int, Mapping[str, Any]]]
    if source.suffix.lower() in (".csv", ".tsv"):
        header, rows = read_table(source)
        missing = [column for column in ("decision_id", "node_id", "question", "passage") if column not in header]
        if missing:
            raise CalibrationInputError(
                f"the sheet has no {', '.join(missing)} column (found {', '.join(header) or 'nothing'}); write it with "
                "python -m llama_jev.label_sheet --samples SAMPLES.jsonl --out sheet.csv",
                path=source,
                line=1,
            )
    else:
        rows = json_lines(source)
    pairs: list[SheetPair] = []
    seen: set[str] = set()
    problems: list[tuple[int, str]] = []
    for number, row in rows:
        values = {key: row.get(key) if isinstance(row, Mapping) else None for key in ("decision_id", "node_id")}
        text = {key: row.get(key) if isinstance(row, Mapping) else None for key in ("question", "passage")}
        empty = [key for key, value in values.items() if not isinstance(value, str) or not value.strip()]
        empty += [key for key, value in text.items() if not isinstance(value, str)]
        if empty:
            problems.append((number, f"no {' or '.join(empty)} in this row"))
            continue
        pair = SheetPair(
            decision_id=str(values["decision_id"]).strip(),
            node_id=str(values["node_id"]).strip(),
            question=str(text["question"]),
            passage=str(text["passage"]),
        )
        if pair.key not in seen:
            seen.add(pair.key)
            pairs.append(pair)
    if problems:
        raise CalibrationInputError.from_lines(problems, path=source, what="sheet rows")
    if not pairs:
        raise CalibrationInputError("the sheet holds no pair to label", path=source)
    return pairs


class StalePageError(ValueError):
    """The page answered a pair that is no longer the one on screen (another tab, a restart)."""


class LabellingSession:
    """One labeller working through a sheet; thread-safe (one lock around every step).

    Args:
        pairs: the sheet's pairs, in the order to show them.
        out: the labels file (JSONL), appended to; created if missing.
        labeller: the name written on every label (two labellers: their agreement is reported).
        records: the records file to name in the next command, when known.
    """

    def __init__(
        self, pairs: list[SheetPair], out: str | os.PathLike[str], labeller: str, *, records: str | None = None
    ) -> None:
        if not labeller.strip():
            raise ValueError("labeller must be a non-blank name")
        self.pairs = pairs
        self.out = Path(out)
        self.labeller = labeller
        self.records = records
        self._lock = threading.Lock()
        self._answers: dict[str, bool | None] = {}
        self._repair_and_load()
        self._handle = self.out.open("a", encoding="utf-8")
        self.position = self._next_open(0)

    def _repair_and_load(self) -> None:
        if not self.out.exists():
            return
        data = self.out.read_bytes()
        if data and not data.endswith(b"\n"):
            # a line cut short by a crash mid-write: that answer was never acknowledged to the page
            with self.out.open("r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)
        known = {pair.key for pair in self.pairs}
        for _, entry in json_lines(self.out):
            if not isinstance(entry, dict) or entry.get("labeller") != self.labeller:
                continue
            key = f"{entry.get('decision_id')}\x1f{entry.get('node_id')}"
            if key in known:
                self._answers[key] = entry.get("relevant")

    def close(self) -> None:
        """Close the labels file."""
        with self._lock:
            self._handle.close()

    def _next_open(self, start: int) -> int:
        for index in range(start, len(self.pairs)):
            if self.pairs[index].key not in self._answers:
                return index
        return len(self.pairs)

    def state(self) -> dict[str, Any]:
        """What the page shows: progress, and the pair at the current position (``None``: done)."""
        with self._lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        answered = [self._answers[pair.key] for pair in self.pairs if pair.key in self._answers]
        pair: dict[str, Any] | None = None
        if self.position < len(self.pairs):
            current = self.pairs[self.position]
            pair = {"id": current.key, "question": current.question, "passage": current.passage}
            previous = self._answers.get(current.key, _UNANSWERED)
            if previous is not _UNANSWERED:
                pair["answer"] = previous
        return {
            "total": len(self.pairs),
            "labelled": len(answered),
            "skipped": sum(1 for answer in answered if answer is None),
            "position": self.position,
            "pair": pair,
            "labeller": self.labeller,
            "out": str(self.out),
            "next_command": self.next_command(),
            "records_known": self.records is not None,
        }

    def next_command(self) -> str:
        """The command to run once the sheet is done (``DECISIONS.jsonl`` stands for the decision log
        when the session was not given ``records``)."""
        records = str(self.records) if self.records is not None else "DECISIONS.jsonl"
        words = ["python", "-m", "llama_jev.calibrate", "--records", records, "--labels", str(self.out)]
        return shlex.join([*words, "--report", "report.html"])

    def answer(self, position: int, pair_id: str, relevant: bool | None) -> dict[str, Any]:
        """Record ``relevant`` (``None``: skipped) for the pair at ``position``, flushed to disk,
        then move to the next pair this labeller has not answered.

        Raises:
            StalePageError: ``position`` / ``pair_id`` is not the pair on screen.
        """
        if relevant is not None and not isinstance(relevant, bool):
            raise ValueError("relevant must be true, false or null (skip)")
        with self._lock:
            self._check(position, pair_id)
            pair = self.pairs[position]
            if self._answers.get(pair.key, _UNANSWERED) != relevant:  # the same answer again adds no line
                line = {
                    "decision_id": pair.decision_id,
                    "node_id": pair.node_id,
                    "relevant": relevant,
                    "labeller": self.labeller,
                    "labelled_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
                self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
                self._handle.flush()
                os.fsync(self._handle.fileno())  # on disk before the page moves on
                self._answers[pair.key] = relevant
            self.position = self._next_open(position + 1)
            return self._state()

    def back(self, position: int) -> dict[str, Any]:
        """Show the pair before ``position`` again (its answer can be changed)."""
        with self._lock:
            if position != self.position:
                raise StalePageError("the page is out of date: reload it")
            self.position = max(0, position - 1)
            return self._state()

    def _check(self, position: int, pair_id: str) -> None:
        if position != self.position or position >= len(self.pairs) or self.pairs[position].key != pair_id:
            raise StalePageError("the page is out of date (answered elsewhere, or the server restarted): reload it")
