"""What the judge sees of a node, and what a judged node carries back: its probability, hidden from the LLM."""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.schema import NodeWithScore, TextNode

from llama_jev.core.models import copy_with
from llama_jev.engine.batching import Candidate

__all__ = ["PROBABILITY_KEY", "to_candidates", "with_probability"]

PROBABILITY_KEY = "jev_probability"


def to_candidates(nodes: Sequence[NodeWithScore]) -> list[Candidate]:
    """What the judge sees of each node: its id and its content, without any metadata."""
    # A plain TextNode's content without metadata is its text; get_content would first format
    # the metadata string it then drops (most of this step's time). Subclasses may say otherwise.
    return [
        Candidate(id=node.node.node_id, text=node.node.text if type(node.node) is TextNode else node.node.get_content())
        for node in nodes
    ]


def with_probability(node: NodeWithScore, probability: float) -> NodeWithScore:
    """A copy of ``node`` carrying ``metadata["jev_probability"]``, hidden from LLM and embeddings.

    The upstream node (often a docstore object shared across queries and users) is not touched:
    a shallow copy shares the metadata dict and the exclusion lists, so new ones are given to
    the copy. They are set without validation (:func:`copy_with`): the values are a fresh dict
    and fresh lists of the same types the node already validated.
    """
    source = node.node
    copy = copy_with(
        source,
        {
            "metadata": {**source.metadata, PROBABILITY_KEY: probability},
            "excluded_llm_metadata_keys": _with_key(source.excluded_llm_metadata_keys),
            "excluded_embed_metadata_keys": _with_key(source.excluded_embed_metadata_keys),
        },
    )
    return NodeWithScore(node=copy, score=node.score)  # validating two fields costs less than copying


def _with_key(keys: list[str]) -> list[str]:
    return list(keys) if PROBABILITY_KEY in keys else [*keys, PROBABILITY_KEY]
