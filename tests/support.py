"""Helpers shared by the tests: deterministic answer functions and a tiny offline embedding."""

from __future__ import annotations

import re
from typing import Any

from llama_jev.testing import HashEmbedding

__all__ = ["HashEmbedding", "eventually", "marked", "marked_answer"]

_MARK = re.compile(r"\[p=([0-9.]+)\]")


def marked_answer(state: Any, question_id: str, instructions: Any) -> float:
    """The probability written in the candidate text as ``[p=0.93]``; 0.05 when unmarked."""
    match = _MARK.search(str(instructions["candidate"] if isinstance(instructions, dict) else instructions))
    return float(match.group(1)) if match else 0.05


def marked(p: float, text: str) -> str:
    """Candidate text carrying its scripted probability."""
    return f"[p={p}] {text}"


def eventually(condition: Any, timeout: float = 3.0) -> bool:
    """Poll ``condition()`` until it is true or ``timeout`` passes (for server-side bookkeeping)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())
