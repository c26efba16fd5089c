"""What a review says: the statuses, the reasons an answer is withheld, ``ReviewOutcome``, and the
questions and prompt the review asks."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from llama_index.core.schema import NodeWithScore

from llama_jev.core.records import Decision, DecisionRecord

if TYPE_CHECKING:
    pass


GROUNDED_QUESTION = (
    "Is every factual claim in this answer supported by the evidence, and does the answer keep every "
    "condition, limit and exception the evidence states for what it claims or promises? "
    "If the evidence is empty, answer no."
)
"""The yes/no question asked about a draft. The draft is the question's candidate; the state holds
``{"query", "answer", "evidence": [{"id", "text"}]}``. "Keep every condition" is asked on its own
because an unconditional promise ("you can always get a refund") has no false fact in it: what is
wrong is what it leaves out."""

REVISION_PROMPT = (
    "You revise a draft answer so that it says only what the evidence supports. Revise only the draft: "
    "keep every claim the evidence supports, correct or remove any claim it does not support, and keep "
    "every condition, limit and exception the evidence states for what the answer claims or promises. "
    "Add nothing the evidence does not state. Do not call tools. Reply with the revised answer only."
)
"""The system message of a revision request; the user message carries the query, evidence and draft."""

DRAFT_ID = "draft"
"""The candidate id of the draft in records; revisions are ``revision_1``, ``revision_2``, ..."""

# The contract's logger for SHADOW judge failures is "llama_jev" itself (not a submodule's).


class ReviewStatus(str, Enum):
    """What a review did to the draft.

    ``PASSED``: the draft passed as written. ``REVISED``: a revision passed; ``text`` is the
    revision. ``WITHHELD``: SHADOW only, the draft would have been withheld in ENFORCE (the draft
    is still shown; ENFORCE raises :class:`~llama_jev.ResponseWithheldError` instead).
    ``SKIPPED``: mode OFF, nothing was asked.
    """

    PASSED = "passed"
    REVISED = "revised"
    WITHHELD = "withheld"
    SKIPPED = "skipped"


class WithheldReason(str, Enum):
    """Why a draft did not pass (``ResponseWithheldError.reason``, ``ReviewOutcome.reason``)."""

    UNSUPPORTED = "UNSUPPORTED"
    """The judge said no (``p <= reject``): a claim or a condition is not supported by the evidence."""
    UNCERTAIN = "UNCERTAIN"
    """The judge was not sure either way (``reject < p < accept``)."""
    NO_EVIDENCE = "NO_EVIDENCE"
    """There was no evidence to check the draft against; the judge was not asked."""
    TIMEOUT = "TIMEOUT"
    """The judge did not answer within the budget (retry may help)."""
    CALL_OR_RESPONSE_ERROR = "CALL_OR_RESPONSE_ERROR"
    """The judge call failed (HTTP error after retries, invalid answer)."""
    EVIDENCE_TOO_LARGE = "EVIDENCE_TOO_LARGE"
    """The evidence and the draft do not fit in one request (:class:`~llama_jev.errors.EvidenceTooLargeError`)."""
    REVISION_FAILED = "REVISION_FAILED"
    """The LLM raised while revising."""
    REVISION_EMPTY = "REVISION_EMPTY"
    """The LLM returned an empty revision."""
    REVISION_HAS_TOOL_CALLS = "REVISION_HAS_TOOL_CALLS"
    """The LLM answered the revision request with tool calls."""


@dataclass(frozen=True)
class ReviewOutcome:
    """The result of one review.

    ``text`` is what may be shown: the draft (PASSED, SKIPPED, and always in SHADOW) or the
    revision that passed (REVISED). ``probability`` is the judge's last ``p`` (``None`` when it
    was not asked or failed), ``revisions`` how many revisions were asked, ``record`` the last
    :class:`~llama_jev.DecisionRecord` (ids and probabilities, no text) and ``records`` all of
    them, one per judgement. ``reason`` says why a SHADOW draft would have been withheld.
    """

    status: ReviewStatus
    text: str
    probability: float | None = None
    revisions: int = 0
    record: DecisionRecord | None = None
    records: tuple[DecisionRecord, ...] = ()
    reason: WithheldReason | None = None

    def as_metadata(self) -> dict[str, Any]:
        """The ``metadata["jev_review"]`` entry: ``{"status", "probability", "revisions"}``."""
        return {"status": self.status.value, "probability": self.probability, "revisions": self.revisions}


# --- what the pure step logic asks of the I/O edges -----------------------------------------


@dataclass(frozen=True)
class _Judge:
    """Ask the judge about ``text`` (candidate id ``candidate_id``)."""

    text: str
    candidate_id: str


@dataclass(frozen=True)
class _Revise:
    """Ask the LLM to revise ``text``."""

    text: str


@dataclass(frozen=True)
class _Revision:
    """What the LLM answered: its text and whether it called tools, or the exception it raised."""

    text: str = ""
    tool_calls: bool = False
    error: Exception | None = field(default=None, compare=False)


_Step = _Judge | _Revise
_Reply = Decision | _Revision | None
_Steps = Generator[_Step, _Reply, ReviewOutcome]


@dataclass(frozen=True)
class _Evidence:
    """The evidence as the judge and the reviser see it: node id and content only."""

    items: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, evidence: Sequence[NodeWithScore]) -> _Evidence:
        if isinstance(evidence, (str, bytes)) or not isinstance(evidence, Sequence):
            raise TypeError("evidence must be a list of NodeWithScore (the nodes the draft was written from)")
        seen: dict[str, str] = {}
        for node in evidence:
            if not isinstance(node, NodeWithScore):
                raise TypeError(f"evidence must hold NodeWithScore objects, got {type(node).__name__}")
            # The same passage returned twice (two searches of one agent run) is one piece of evidence.
            seen.setdefault(node.node.node_id, node.node.get_content())
        return cls(tuple(seen.items()))

    def state(self, query: str, answer: str) -> dict[str, Any]:
        return {"query": query, "answer": answer, "evidence": [{"id": i, "text": t} for i, t in self.items]}
