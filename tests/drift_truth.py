"""A source of truth for the drift CLI tests: the grants each node should hold, by its document."""

from __future__ import annotations

from typing import Any

from llama_jev.stores.grants import Stored

# document id -> the grants its chunks should hold
TRUTH: dict[str, dict[str, Any]] = {
    "doc-a": {"tenant": "acme", "users": ["u1"], "public": False},
    "doc-b": {"tenant": "acme", "users": ["u1", "u2"], "public": False},
}


def expected_grants(stored: Stored) -> dict[str, Any]:
    """What ``stored`` should hold: its document's grants (no document: nobody)."""
    return TRUTH.get(str(stored.metadata.get("ref_doc_id")), {})


def not_a_mapping(stored: Stored) -> list[str]:
    return ["u1"]
