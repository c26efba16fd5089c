"""``HashEmbedding``: a deterministic bag-of-words embedding for tests and offline demos."""

from __future__ import annotations

import hashlib
import math
import re

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import Field

__all__ = ["HashEmbedding"]

_WORD = re.compile(r"[a-z0-9]+")
# Words that say nothing about the topic.
_STOPWORDS = frozenset(
    {
        *("a", "an", "and", "are", "can", "do", "does", "for", "how", "i", "is", "my", "of", "on", "or"),
        *("the", "to", "what", "when", "where", "which", "who", "why"),
    }
)


class HashEmbedding(BaseEmbedding):
    """Word stems hashed into ``dimensions`` buckets: texts sharing words are close. No model.

    Deterministic, instant and offline, for tests and for demos without the ``local`` extra. It
    knows nothing about meaning: use :class:`llama_jev.local.LocalEmbedding` or a real model.

    Example:
        >>> embedding = HashEmbedding()
        >>> len(embedding.get_text_embedding("Refunds within seven days"))
        64
    """

    model_name: str = "hash-embedding"
    dimensions: int = Field(default=64, ge=2, description="Length of the vectors.")

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "HashEmbedding"

    def _vector(self, text: str) -> list[float]:
        # Bucket 0 is a constant so no vector is all zeros (a zero vector has no cosine).
        vector = [0.0] * self.dimensions
        vector[0] = 0.1
        for word in _WORD.findall(text.lower()):
            if word not in _STOPWORDS:
                # The first five letters: "refund" and "refunds" land in the same bucket.
                bucket = 1 + hashlib.sha256(word[:5].encode()).digest()[0] % (self.dimensions - 1)
                vector[bucket] += 1.0
        norm = math.sqrt(sum(value * value for value in vector))
        return [value / norm for value in vector]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vector(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vector(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vector(text)
