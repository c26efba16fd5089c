"""Synthetic calibration data where the truth is known: an over-confident judge."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from llama_jev import DecisionRecord, Mode, Status
from llama_jev.core import Reason
from llama_jev.core.records import query_key

__all__ = ["SECRET", "overconfident_log", "record", "write_jsonl"]

SECRET = "calibration-test-secret"


def record(decision_id: str, scores: dict[str, float], **fields: Any) -> DecisionRecord:
    """A SHADOW relevance record as the selector writes it."""
    values: dict[str, Any] = {
        "decision_id": decision_id,
        "purpose": "retrieval_relevance",
        "version": "v1",
        "mode": Mode.SHADOW,
        "status": Status.DECIDED,
        "reason": Reason.CLASSIFIED,
        "elapsed_ms": 3.0,
        "candidates": len(scores),
        "requests": 1,
        "model": "synthetic",
        "scores": scores,
    }
    values.update(fields)
    return DecisionRecord(**values)


def overconfident_log(
    queries: int, per_query: int = 8, *, seed: int, exponent: float = 1.5, by_query: bool = False
) -> tuple[list[DecisionRecord], list[dict[str, Any]]]:
    """Records and labels from a judge whose relevance rate at p is ``p ** exponent``.

    With ``by_query`` the records carry a query key and the labels name the query text.
    """
    rng = random.Random(seed)
    records, labels = [], []
    for q in range(queries):
        scores = {f"s{seed}-q{q}-n{i}": round(rng.random(), 4) for i in range(per_query)}
        query = f"synthetic question {seed}-{q}"
        decision_id = f"d{seed}-{q}"
        key = query_key(query, SECRET) if by_query else None
        records.append(record(decision_id, scores, query_key=key))
        for node_id, p in scores.items():
            relevant = rng.random() < p**exponent
            join = {"query": query} if by_query else {"decision_id": decision_id}
            labels.append({**join, "node_id": node_id, "relevant": relevant})
    return records, labels


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """One JSON object per line (records as the JsonlObserver writes them)."""
    lines = [row.to_json() if isinstance(row, DecisionRecord) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
