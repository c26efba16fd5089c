"""The final-draft review: a draft checked against the evidence it was written from.

``DraftReviewer`` holds the rule; ``JevReviewedQueryEngine``, ``JevReviewedAgent`` and
``JevGroundingEvaluator`` put it where a LlamaIndex application produces answers.
"""

from llama_jev.review.agent import JevReviewedAgent
from llama_jev.review.evaluation import JevGroundingEvaluator
from llama_jev.review.query_engine import REVIEW_METADATA_KEY, JevReviewedQueryEngine
from llama_jev.review.reviewer import (
    DRAFT_ID,
    GROUNDED_QUESTION,
    REVISION_PROMPT,
    DraftReviewer,
    ResponseWithheldError,
    ReviewOutcome,
    ReviewStatus,
    WithheldReason,
    revision_messages,
)

__all__ = [
    "DRAFT_ID",
    "GROUNDED_QUESTION",
    "REVIEW_METADATA_KEY",
    "REVISION_PROMPT",
    "DraftReviewer",
    "JevGroundingEvaluator",
    "JevReviewedAgent",
    "JevReviewedQueryEngine",
    "ResponseWithheldError",
    "ReviewOutcome",
    "ReviewStatus",
    "WithheldReason",
    "revision_messages",
]
