"""Helpers shared by the tests: deterministic answer functions and a tiny offline embedding."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding

_MARK = re.compile(r"\[p=([0-9.]+)\]")


def marked_answer(state: Any, question_id: str, instructions: Any) -> float:
    """The probability written in the candidate text as ``[p=0.93]``; 0.05 when unmarked."""
    match = _MARK.search(str(instructions["candidate"] if isinstance(instructions, dict) else instructions))
    return float(match.group(1)) if match else 0.05


def marked(p: float, text: str) -> str:
    """Candidate text carrying its scripted probability."""
    return f"[p={p}] {text}"


class HashEmbedding(BaseEmbedding):
    """Deterministic bag-of-words embedding (32 dims): texts sharing words are close. Offline, fast."""

    dimensions: int = 32

    @classmethod
    def class_name(cls) -> str:
        return "HashEmbedding"

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            digest = hashlib.sha256(word.encode()).digest()
            vector[digest[0] % self.dimensions] += 1.0
        norm = math.sqrt(sum(value * value for value in vector)) or 1.0
        return [value / norm for value in vector]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vector(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vector(text)


def eventually(condition: Any, timeout: float = 3.0) -> bool:
    """Poll ``condition()`` until it is true or ``timeout`` passes (for server-side bookkeeping)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())
