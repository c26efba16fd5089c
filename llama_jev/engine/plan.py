"""One judgement as requests, and its answers read back: the selector's input and output checks.

:func:`plan_judgement` checks the candidates and packs them into requests (the batching rules of
``batching.py``); :func:`read_scores` reads a probability per candidate out of the judge's
checked results. Both are pure: the selector (``selector.py``) holds the budget, the mode and the
record; ``gather.py`` sends the requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_jev.core.errors import JevInvalidResponseError
from llama_jev.core.models import copies_with
from llama_jev.core.records import RetrievalFacts
from llama_jev.engine.batching import MAX_CANDIDATES, Candidate, estimate_tokens, even_out, plan_batches
from llama_jev.systemone.queue_wait import QueueWait
from llama_jev.systemone.wire import (
    Instructions,
    NoulAnswer,
    NoulQuestion,
    Question,
    SystemOneRequest,
    SystemOneResult,
    check_result,
)

__all__ = ["Plan", "plan_judgement", "read_scores"]


@dataclass(frozen=True)
class Plan:
    """One judgement, ready to send: the requests and, per request, the candidate id of each item."""

    requests: tuple[SystemOneRequest, ...]
    ids: tuple[dict[str, str], ...]
    count: int
    # What the record says about the retrieval around the judgement (see DecisionRecord).
    retrieval: RetrievalFacts = field(default_factory=RetrievalFacts)
    query_key: str | None = None
    # Where the judge reports how long requests waited for admission (DecisionRecord.queue_ms).
    queue: QueueWait = field(default_factory=QueueWait, compare=False)


def plan_judgement(
    state: Instructions,
    question: str,
    candidates: Sequence[Candidate],
    *,
    batch_size: int,
    max_request_tokens: int,
    **context: Any,
) -> Plan:
    """The requests for ``candidates``; ``context`` is what the record says around them (see :class:`Plan`).

    Raises:
        ValueError: a blank question, more than 1,024 candidates, a blank or repeated id.
        TypeError: a candidate that is not a ``Candidate``, or whose text is not a string.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the question must be a non-blank string")
    if len(candidates) > MAX_CANDIDATES:
        raise ValueError(f"{len(candidates)} candidates exceed the limit of {MAX_CANDIDATES} per judgement")
    seen: set[str] = set()
    for candidate in candidates:
        if not isinstance(candidate, Candidate):
            raise TypeError(f"candidates must be Candidate objects, got {type(candidate).__name__}")
        if not isinstance(candidate.id, str) or not candidate.id.strip():
            raise ValueError("candidate ids must be non-blank strings")
        if not isinstance(candidate.text, str):
            raise TypeError(f"candidate {candidate.id!r}: text must be a string")
        if candidate.id in seen:
            raise ValueError(f"duplicate candidate id {candidate.id!r}")
        seen.add(candidate.id)
    fixed = estimate_tokens(str(state)) + estimate_tokens(question)
    batches = plan_batches(candidates, fixed_tokens=fixed, batch_size=batch_size, max_request_tokens=max_request_tokens)
    batches = even_out(batches, fixed_tokens=fixed, batch_size=batch_size, max_request_tokens=max_request_tokens)
    if batches and not isinstance(state, str):
        # A structured state is the caller's and is validated once, by a full request; the
        # questions are built from checked strings, so the requests are assembled without
        # validating the same shapes a thousand times.
        SystemOneRequest(state=state, questions={"item_0": NoulQuestion(instructions=question)})
    template = NoulQuestion(instructions={"question": question, "candidate": ""})
    requests, ids = [], []
    for batch in batches:
        items = [f"item_{index}" for index in range(len(batch))]
        # The template with only the candidate changed, not validated: each is a checked str.
        asked = copies_with(
            template, "instructions", [{"question": question, "candidate": candidate.text} for candidate in batch]
        )
        questions: dict[str, Question] = dict(zip(items, asked, strict=True))
        requests.append(SystemOneRequest.model_construct(state=state, questions=questions))
        ids.append({item: candidate.id for item, candidate in zip(items, batch, strict=True)})
    return Plan(requests=tuple(requests), ids=tuple(ids), count=len(candidates), **context)


def read_scores(plan: Plan, results: Sequence[SystemOneResult]) -> tuple[dict[str, float], str | None]:
    """Probability by candidate id, and the answering model(s), from checked results.

    Any ``Judge`` is checked here, not only ``JevClient``: a wrong answer is a judge failure
    (``ERROR``), never a selection. ``check_result`` skips results the client has already
    checked against the same request, so each answer is walked once.

    Raises:
        JevInvalidResponseError: an answer that does not fit its request, or a probability
            outside [0, 1].
    """
    scores: dict[str, float] = {}
    for request, ids, result in zip(plan.requests, plan.ids, results, strict=True):
        answers = check_result(request, result).answers
        for item, node_id in ids.items():
            answer = answers[item]
            p = answer.noul if isinstance(answer, NoulAnswer) else None
            # Also for results built without validation (model_construct) by a custom judge.
            if not (isinstance(p, float) and math.isfinite(p) and 0.0 <= p <= 1.0):
                raise JevInvalidResponseError(f"answer {item!r}: probability {p!r} is not in [0, 1]")
            scores[node_id] = p
    models = sorted({result.model for result in results})
    return scores, ",".join(models) or None
