"""What goes into a request: candidates, their token estimates, batches that fit the request budget,
and the classification of the probabilities that come back (pure functions, no I/O)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llama_jev.core.errors import (
    CandidateTooLargeError,
    QueryTooLargeError,
    UnencodableTextError,
)
from llama_jev.core.records import (
    Reason,
    Selection,
)
from llama_jev.systemone.wire import (
    Instructions,
)

if TYPE_CHECKING:
    pass


MAX_CANDIDATES = 1024
# Fixed cost of one question in the request (id, type, the instruction keys).
_QUESTION_OVERHEAD_TOKENS = 16


@dataclass(frozen=True)
class Candidate:
    """One thing to judge: its id (a node id) and the text sent to the judge."""

    id: str
    text: str


def estimate_tokens(text: str) -> int:
    """A conservative token count: one token per 3 UTF-8 bytes (English runs about 4 per token)."""
    # An ASCII string's UTF-8 bytes are its characters (isascii is a flag read, not a scan).
    return (len(text) if text.isascii() else len(text.encode("utf-8"))) // 3 + 1


def plan_batches(
    candidates: Sequence[Candidate], *, fixed_tokens: int, batch_size: int, max_request_tokens: int
) -> list[list[Candidate]]:
    """Split candidates into requests of at most ``batch_size`` questions and ``max_request_tokens``.

    ``fixed_tokens`` is what every request carries anyway (the state and the question). Order is
    kept. A candidate that cannot fit even alone raises :class:`CandidateTooLargeError`: it is
    never truncated nor silently left out. When the query is what leaves no room (it is larger
    than the candidate that does not fit), :class:`QueryTooLargeError` is raised instead.
    """
    batches: list[list[Candidate]] = []
    current: list[Candidate] = []
    used = fixed_tokens
    for candidate in candidates:
        cost = estimate_tokens(candidate.text) + _QUESTION_OVERHEAD_TOKENS
        if fixed_tokens + cost > max_request_tokens:
            if fixed_tokens >= cost:
                # Blame the larger part: a 100k-character query beside a one-line candidate is
                # not fixed by splitting documents.
                raise QueryTooLargeError(
                    f"the query and question are about {fixed_tokens} tokens; with a candidate of about "
                    f"{cost} tokens they exceed the {max_request_tokens}-token request budget. Shorten the query."
                )
            raise CandidateTooLargeError(
                f"candidate {candidate.id!r} is about {cost} tokens; with the query and question "
                f"({fixed_tokens} tokens) it exceeds the {max_request_tokens}-token request budget. "
                "Split the document into smaller nodes."
            )
        if current and (len(current) >= batch_size or used + cost > max_request_tokens):
            batches.append(current)
            current, used = [], fixed_tokens
        current.append(candidate)
        used += cost
    if current:
        batches.append(current)
    return batches


def even_out(
    batches: Sequence[Sequence[Candidate]], *, fixed_tokens: int, batch_size: int, max_request_tokens: int
) -> list[list[Candidate]]:
    """The same candidates in as many requests, with the estimated tokens spread evenly.

    Packing fills requests up to the budget and leaves the remainder in the last one
    (308 + 308 + 308 + 100); a server answers a wave when its largest request is done, so
    evening out (256 x 4) makes the wave shorter. Order is kept; when an even split would
    break a limit (very uneven candidate sizes), the packed batches are returned unchanged.
    """
    if len(batches) < 2:
        return [list(batch) for batch in batches]
    count = len(batches)
    flat = [candidate for batch in batches for candidate in batch]
    costs = [estimate_tokens(candidate.text) + _QUESTION_OVERHEAD_TOKENS for candidate in flat]
    total = sum(costs)
    even: list[list[Candidate]] = [[] for _ in range(count)]
    used = [fixed_tokens] * count
    before = 0
    for candidate, cost in zip(flat, costs, strict=True):
        # A candidate goes to the request its midpoint falls in, on the cumulative cost scale.
        slot = min(count - 1, (2 * before + cost) * count // (2 * total))
        even[slot].append(candidate)
        used[slot] += cost
        before += cost
    if any(not 1 <= len(batch) <= batch_size for batch in even) or max(used) > max_request_tokens:
        return [list(batch) for batch in batches]
    return even


def classify(scores: Mapping[str, float], *, reject: float, accept: float) -> Selection:
    """Accept ``p >= accept``, reject ``p <= reject``, the rest is uncertain (bounds inclusive).

    Each group is ordered by probability descending, then id ascending, so ties are stable.
    """
    ordered = sorted(scores, key=lambda node_id: (-scores[node_id], node_id))
    return Selection(
        selected=tuple(node_id for node_id in ordered if scores[node_id] >= accept),
        rejected=tuple(node_id for node_id in ordered if scores[node_id] <= reject),
        uncertain=tuple(node_id for node_id in ordered if reject < scores[node_id] < accept),
        scores=dict(scores),
    )


_UNSENDABLE_REASONS: dict[type[Exception], Reason] = {
    CandidateTooLargeError: Reason.CANDIDATE_TOO_LARGE,
    QueryTooLargeError: Reason.QUERY_TOO_LARGE,
    UnencodableTextError: Reason.UNENCODABLE_TEXT,
}


def _unencodable(state: Instructions, candidates: Sequence[Candidate]) -> UnencodableTextError | None:
    """The error for the first text no server can be sent (a lone surrogate), or ``None``.

    Returned, not raised from the codec's ``UnicodeEncodeError``: that exception holds the whole
    string, and nothing reachable from our errors may hold query or node text.
    """
    query = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, default=str)
    where = "the query" if not _encodes(query) else None
    for candidate in candidates:
        if where is not None:
            break
        if isinstance(candidate, Candidate) and isinstance(candidate.text, str) and not _encodes(candidate.text):
            where = f"candidate {candidate.id!r}"  # named only when it fails: the rest cost nothing
    if where is None:
        return None
    return UnencodableTextError(
        f"{where} holds text that cannot be encoded as UTF-8 (a lone surrogate, typically from a "
        "broken emoji escape); repair the text where it is decoded or ingested"
    )


def _encodes(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
