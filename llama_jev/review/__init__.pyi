"""The final-draft review: a draft checked against the evidence it was written from."""

from llama_jev.core.errors import ResponseWithheldError as ResponseWithheldError
from llama_jev.review.agent import JevReviewedAgent as JevReviewedAgent
from llama_jev.review.evaluation import JevGroundingEvaluator as JevGroundingEvaluator
from llama_jev.review.query_engine import (
    REVIEW_METADATA_KEY as REVIEW_METADATA_KEY,
)
from llama_jev.review.query_engine import (
    JevReviewedQueryEngine as JevReviewedQueryEngine,
)
from llama_jev.review.reviewer import (
    DRAFT_ID as DRAFT_ID,
)
from llama_jev.review.reviewer import (
    GROUNDED_QUESTION as GROUNDED_QUESTION,
)
from llama_jev.review.reviewer import (
    REVISION_PROMPT as REVISION_PROMPT,
)
from llama_jev.review.reviewer import (
    DraftReviewer as DraftReviewer,
)
from llama_jev.review.reviewer import (
    ReviewOutcome as ReviewOutcome,
)
from llama_jev.review.reviewer import (
    ReviewStatus as ReviewStatus,
)
from llama_jev.review.reviewer import (
    WithheldReason as WithheldReason,
)
from llama_jev.review.reviewer import (
    revision_messages as revision_messages,
)
