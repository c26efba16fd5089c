"""A labelling sample, opt-in: the text of a few judged retrievals, and the sheet drawn from it.

Decision records never carry text, so a person cannot label from them. A :class:`LabelSampler`
passed as ``ExecutionOptions(label_sampler=...)`` appends, for a ``rate`` fraction of judged
retrievals, one JSONL line with the query and the candidates the ACL let through *for that
caller* (their text and p). The file holds query and document text: it is created with mode
0600, and only people allowed to read every document of every sampled caller may label it.
:func:`write_sample_sheet` draws the pairs a person labels from it (``python -m
llama_jev.label_sheet --samples``).
"""

from __future__ import annotations

import csv
import json
import os
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llama_jev.calibration.labels import labelled_pairs
from llama_jev.calibration.records import CalibrationInputError, json_lines, probability
from llama_jev.core.records import DecisionRecord, Mode, Status, normalize_query

__all__ = [
    "SAMPLE_SHEET_COLUMNS",
    "LabelSampler",
    "SamplePair",
    "SampleSheet",
    "read_samples",
    "write_sample_sheet",
]

SAMPLE_SHEET_COLUMNS = ("decision_id", "node_id", "question", "passage", "relevant")
_STRATA = 10  # equal-width bins of p the sheet is drawn across


class LabelSampler:
    """Appends the query and the authorized candidates' text of a sample of judged retrievals.

    One JSONL line per sampled retrieval (any mode but OFF; statuses ``decided`` or
    ``inconclusive``)::

        {"decision_id", "purpose", "version", "query",
         "candidates": [{"node_id", "text", "p"}], "created_at"}

    Args:
        path: the JSONL file, created with mode 0600 (it holds text: keep it where the documents
            may be read).
        rate: the share of judged retrievals sampled, in (0, 1] (default 0.02).
        seed: seed of the draw (``None``: unpredictable), for reproducible tests.

    Example:
        >>> options = ExecutionOptions(mode=Mode.SHADOW, label_sampler=LabelSampler("samples.jsonl"))  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str], *, rate: float = 0.02, seed: int | None = None) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be a share in (0, 1], got {rate!r}")
        self.path = Path(path)
        self.rate = float(rate)
        self.written = 0
        self._random = random.Random(seed)  # noqa: S311 - a sample, not a secret
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LabelSampler({str(self.path)!r}, rate={self.rate:g})"

    def offer(self, record: DecisionRecord, query: str, candidates: Sequence[tuple[str, str]]) -> bool:
        """Consider one judged retrieval; append it when drawn. Returns whether it was written.

        ``candidates`` are ``(node_id, text)`` of the nodes the ACL let through, as judged.
        """
        if record.mode is Mode.OFF or record.status not in (Status.DECIDED, Status.INCONCLUSIVE):
            return False
        rows = [
            {"node_id": node_id, "text": text, "p": record.scores[node_id]}
            for node_id, text in candidates
            if node_id in record.scores
        ]
        if not rows:
            return False
        with self._lock:
            if self.rate < 1.0 and self._random.random() >= self.rate:
                return False
            line = {
                "decision_id": record.decision_id,
                "purpose": record.purpose,
                "version": record.version,
                "query": query,
                "candidates": rows,
                "created_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            }
            data = (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8")
            # 0600 at creation (the umask can only narrow it); O_APPEND keeps lines whole
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(descriptor, data)
            finally:
                os.close(descriptor)
            self.written += 1
        return True

    def __call__(self, record: DecisionRecord, query: str, candidates: Sequence[tuple[str, str]]) -> bool:
        """Same as :meth:`offer`."""
        return self.offer(record, query, candidates)


@dataclass(frozen=True)
class SamplePair:
    """One (question, passage) of a sample, with the judge's p (never shown to a labeller)."""

    decision_id: str
    node_id: str
    question: str
    passage: str
    p: float


def read_samples(path: str | os.PathLike[str]) -> Iterator[SamplePair]:
    """Every pair of a :class:`LabelSampler` file, in file order.

    Raises:
        CalibrationInputError: a line that is not a sample (file and line named).
    """
    source = Path(path)
    for number, entry in json_lines(source):
        try:
            yield from _pairs(entry)
        except (ValueError, TypeError, KeyError) as error:
            raise CalibrationInputError(f"not a labelling sample: {error}", path=source, line=number) from None


def _pairs(entry: Any) -> Iterator[SamplePair]:
    if not isinstance(entry, dict):
        raise ValueError(f"a sample must be a JSON object, got {type(entry).__name__}")
    decision_id, query, candidates = entry.get("decision_id"), entry.get("query"), entry.get("candidates")
    if not isinstance(decision_id, str) or not decision_id:
        raise ValueError(f"'decision_id' must be a non-empty string, got {decision_id!r}")
    if not isinstance(query, str):
        raise ValueError(f"'query' must be a string, got {query!r}")
    if not isinstance(candidates, list):
        raise ValueError("'candidates' must be a list of {node_id, text, p}")
    for candidate in candidates:
        node_id, text, p = candidate["node_id"], candidate["text"], candidate["p"]
        if not isinstance(node_id, str) or not isinstance(text, str) or not probability(p):
            raise ValueError(f"candidate {node_id!r}: needs a string node_id and text and a p in [0, 1]")
        yield SamplePair(decision_id, node_id, query, text, float(p))


@dataclass(frozen=True)
class SampleSheet:
    """What :func:`write_sample_sheet` wrote: where, how many rows, drawn from how many pairs
    (``available``: distinct pairs not labelled yet), how many rows per tenth of p (``strata[0]``:
    0 <= p < 0.1), and how many distinct pairs were left out as labelled already (``excluded``)."""

    path: Path
    rows: int
    available: int
    strata: tuple[int, ...]
    excluded: int = 0


def _stratum(p: float) -> int:
    return min(int(p * _STRATA), _STRATA - 1)


def _allocate(sizes: Sequence[int], total: int) -> list[int]:
    """Rows per stratum: as equal as the strata allow (a stratum short of its share gives the
    rest to the others), so the middle of p, where thresholds are chosen, is not crowded out by
    the many clear cases at either end."""
    quota = [0] * len(sizes)
    left = min(total, sum(sizes))
    open_strata = [i for i, size in enumerate(sizes) if size]
    while left and open_strata:
        share = max(1, left // len(open_strata))
        for i in list(open_strata):
            take = min(share, sizes[i] - quota[i], left)
            quota[i] += take
            left -= take
            if quota[i] == sizes[i]:
                open_strata.remove(i)
            if not left:
                break
    return quota


def write_sample_sheet(
    samples: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    size: int = 300,
    seed: int = 0,
    blind: bool = True,
    exclude: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] = (),
) -> SampleSheet:
    """Draw ``size`` pairs from a :class:`LabelSampler` file into a sheet to label.

    Columns ``decision_id, node_id, question, passage, relevant`` (blank to fill; ``p`` too when
    not ``blind``). The pairs are drawn stratified over p (as evenly as possible across the ten
    tenths of p) so the band where thresholds are chosen is covered, then shuffled, so neither
    the order nor a p anchors the labeller. The same question and passage is drawn once. The
    format follows the suffix: ``.csv`` (UTF-8, comma) or JSONL otherwise.

    ``exclude``: labels files (JSONL or a filled sheet); a question and passage already answered
    there is not drawn again, so a second sheet labelled into the same file adds only new pairs.

    Example:
        >>> write_sample_sheet("samples.jsonl", "sheet.csv", size=300).rows  # doctest: +SKIP
        300
        >>> write_sample_sheet("samples.jsonl", "more.csv", exclude="labels.jsonl").excluded  # doctest: +SKIP
        300

    Raises:
        CalibrationInputError: an unreadable samples or labels file. ValueError: ``size`` < 1.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive number of pairs, got {size!r}")
    labelled: set[tuple[str, str]] = set()
    for labels in [exclude] if isinstance(exclude, (str, os.PathLike)) else exclude:
        labelled |= labelled_pairs(labels)
    pairs = list(read_samples(samples))
    # A label names its pair by decision id (or by query); the sheet draws each question and passage once.
    done = {(normalize_query(text), node) for kind, text, node in _flat(labelled) if kind == "q"}
    questions = {pair.decision_id: normalize_query(pair.question) for pair in pairs}
    done |= {(questions[text], node) for kind, text, node in _flat(labelled) if kind == "d" and text in questions}
    strata: list[list[SamplePair]] = [[] for _ in range(_STRATA)]
    seen: set[tuple[str, str]] = set()
    for pair in pairs:
        key = (normalize_query(pair.question), pair.node_id)
        if key in seen:
            continue
        seen.add(key)
        if key not in done:
            strata[_stratum(pair.p)].append(pair)
    excluded = len(seen & done)
    available = len(seen) - excluded
    if not seen:
        raise CalibrationInputError("no pairs to label (the samples file holds no candidates)", path=samples)
    if not available:
        raise CalibrationInputError(
            f"no pairs left to label: all {excluded} of the sample are labelled already; keep SHADOW sampling "
            "a while longer for new ones",
            path=samples,
        )
    rng = random.Random(seed)  # noqa: S311 - a reproducible sheet, not a secret
    quota = _allocate([len(stratum) for stratum in strata], size)
    chosen = [pair for stratum, count in zip(strata, quota, strict=True) for pair in rng.sample(stratum, count)]
    rng.shuffle(chosen)
    target = Path(path)
    rows = [
        {
            "decision_id": pair.decision_id,
            "node_id": pair.node_id,
            "question": pair.question,
            "passage": pair.passage,
            "relevant": "",
            **({} if blind else {"p": pair.p}),
        }
        for pair in chosen
    ]
    columns = [*SAMPLE_SHEET_COLUMNS, *(() if blind else ("p",))]
    # the sheet holds the samples' text: as private as they are
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # also when an older sheet of the same name was readable by others
    with open(descriptor, "w", encoding="utf-8", newline="") as handle:
        if target.suffix.lower() == ".csv":
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        else:
            handle.writelines(json.dumps({**row, "relevant": None}, ensure_ascii=False) + "\n" for row in rows)
    return SampleSheet(path=target, rows=len(rows), available=available, strata=tuple(quota), excluded=excluded)


def _flat(labelled: set[tuple[str, str]]) -> Iterator[tuple[str, str, str]]:
    """``("d" | "q", decision id or query, node id)`` of each labelled pair."""
    for joined, node_id in labelled:
        kind, _, text = joined.partition(":")
        yield kind, text, node_id
