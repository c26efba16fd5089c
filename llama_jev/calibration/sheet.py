"""Labelled data from production: a labelling sheet sampled from SHADOW records.

Records hold ids and probabilities only. The sheet adds the node text, fetched by node id from
*your* index or docstore, so a person can mark each row relevant or not; it is written to your
disk and nowhere else. Fill in ``relevant`` and feed the sheet back as labels.
"""

from __future__ import annotations

import csv
import json
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core.indices.base import BaseIndex
from llama_index.core.schema import BaseNode
from llama_index.core.storage.docstore.types import BaseDocumentStore
from llama_index.core.vector_stores.types import BasePydanticVectorStore

from llama_jev.calibration.records import RecordsInput, load_records, select_records
from llama_jev.core.records import Status

__all__ = ["SHEET_COLUMNS", "LabelSheet", "TextSource", "fetch_texts", "write_label_sheet"]

SHEET_COLUMNS = ("decision_id", "node_id", "p", "relevant", "text")

TextSource = Callable[[str], "str | None"] | BaseIndex[Any] | BaseDocumentStore | BasePydanticVectorStore
"""Where node text comes from: an index, a docstore, a vector store that stores text, or a
function ``node_id -> text`` (``None`` when unknown)."""


@dataclass(frozen=True)
class LabelSheet:
    """What :func:`write_label_sheet` wrote: where, how many decisions and rows, rows without text."""

    path: Path
    decisions: int
    rows: int
    missing_text: int


def _from_nodes(nodes: Iterable[BaseNode]) -> dict[str, str]:
    return {node.node_id: node.get_content() for node in nodes}


def fetch_texts(source: TextSource, node_ids: Sequence[str]) -> dict[str, str]:
    """The content of every node of ``node_ids`` that ``source`` knows (what the judge saw)."""
    wanted = list(dict.fromkeys(node_ids))
    if isinstance(source, BaseIndex):
        texts: dict[str, str] = {}
        for node_id in wanted:
            node = source.docstore.get_node(node_id, raise_error=False)
            if node is not None:
                texts[node_id] = node.get_content()
        missing = [node_id for node_id in wanted if node_id not in texts]
        vector_store = getattr(source, "vector_store", None)
        # Stores such as Qdrant keep the text with the vectors and leave the docstore empty.
        if missing and isinstance(vector_store, BasePydanticVectorStore) and vector_store.stores_text:
            texts.update(_from_nodes(vector_store.get_nodes(node_ids=missing)))
        return texts
    if isinstance(source, BaseDocumentStore):
        found = (source.get_node(node_id, raise_error=False) for node_id in wanted)
        return _from_nodes(node for node in found if node is not None)
    if isinstance(source, BasePydanticVectorStore):
        return _from_nodes(source.get_nodes(node_ids=wanted))
    if callable(source):
        texts = {}
        for node_id in wanted:
            text = source(node_id)
            if text is not None:
                texts[node_id] = text
        return texts
    raise TypeError("source must be an index, a docstore, a vector store, or a function node_id -> text")


def write_label_sheet(
    records: RecordsInput,
    source: TextSource,
    path: str | os.PathLike[str],
    *,
    sample: int = 100,
    seed: int = 0,
    purpose: str | None = None,
    version: str | None = None,
) -> LabelSheet:
    """Sample ``sample`` judged decisions from ``records`` and write a sheet to ``path``.

    One row per candidate of each sampled decision: ``decision_id``, ``node_id``, ``p``, an
    empty ``relevant`` to fill in (true / false), and the node ``text`` from ``source``. The
    format follows the suffix: ``.csv`` (for a spreadsheet) or JSONL otherwise. Both read back
    as labels (``python -m llama_jev.calibrate --labels sheet.csv``); rows left empty count as
    unlabelled. ERROR and SKIPPED decisions have nothing to label and are never sampled.

    Example:
        >>> sheet = write_label_sheet("decisions.jsonl", index, "sheet.csv", sample=60)  # doctest: +SKIP
        >>> sheet.rows, sheet.missing_text  # doctest: +SKIP
        (180, 0)

    Raises:
        CalibrationInputError: unreadable records; MixedRecordsError: several purposes/versions.
        ValueError: ``sample`` < 1.
    """
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ValueError(f"sample must be a positive number of decisions, got {sample!r}")
    decisions = [
        d
        for d in select_records(load_records(records), purpose=purpose, version=version)
        if d.status in (Status.DECIDED, Status.INCONCLUSIVE) and d.scores
    ]
    chosen = random.Random(seed).sample(decisions, min(sample, len(decisions)))  # noqa: S311 - reproducible sample
    texts = fetch_texts(source, [node_id for d in chosen for node_id in d.scores])
    rows = [
        {"decision_id": d.decision_id, "node_id": node_id, "p": p, "relevant": None, "text": texts.get(node_id)}
        for d in chosen
        for node_id, p in sorted(d.scores.items(), key=lambda item: (-item[1], item[0]))
    ]
    target = Path(path)
    with target.open("w", encoding="utf-8", newline="") as handle:
        if target.suffix.lower() == ".csv":
            writer = csv.DictWriter(handle, fieldnames=SHEET_COLUMNS)
            writer.writeheader()
            writer.writerows({**row, "relevant": "", "text": row["text"] or ""} for row in rows)
        else:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return LabelSheet(
        path=target,
        decisions=len(chosen),
        rows=len(rows),
        missing_text=sum(1 for row in rows if row["text"] is None),
    )
