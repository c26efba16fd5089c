"""llama_jev: access control and calibrated relevance judgement after any LlamaIndex retrieval.

What an application writes. Everything else is public in its layer's package (docs/api.md)."""

from llama_jev.acl.rules import (
    Acl as Acl,
)
from llama_jev.acl.rules import (
    MetadataAcl as MetadataAcl,
)
from llama_jev.core.audit import JsonlObserver as JsonlObserver
from llama_jev.core.context import (
    RuntimeContext as RuntimeContext,
)
from llama_jev.core.context import (
    runtime_context as runtime_context,
)
from llama_jev.core.errors import (
    JevAPIError as JevAPIError,
)
from llama_jev.core.errors import (
    JevError as JevError,
)
from llama_jev.core.errors import (
    MissingRuntimeContextError as MissingRuntimeContextError,
)
from llama_jev.core.errors import (
    ResponseWithheldError as ResponseWithheldError,
)
from llama_jev.core.errors import (
    RetrievalInconclusiveError as RetrievalInconclusiveError,
)
from llama_jev.core.errors import (
    RetrievalUnavailableError as RetrievalUnavailableError,
)
from llama_jev.core.records import (
    DecisionRecord as DecisionRecord,
)
from llama_jev.core.records import (
    ExecutionOptions as ExecutionOptions,
)
from llama_jev.core.records import (
    Mode as Mode,
)
from llama_jev.core.records import (
    Status as Status,
)
from llama_jev.engine.selector import CandidateSelector as CandidateSelector
from llama_jev.retrieval.postprocessor import JevNodePostprocessor as JevNodePostprocessor
from llama_jev.retrieval.retriever import JevRetriever as JevRetriever
from llama_jev.retrieval.tool import JevKnowledgeTool as JevKnowledgeTool
from llama_jev.review.agent import JevReviewedAgent as JevReviewedAgent
from llama_jev.review.evaluation import JevGroundingEvaluator as JevGroundingEvaluator
from llama_jev.review.query_engine import JevReviewedQueryEngine as JevReviewedQueryEngine
from llama_jev.review.reviewer import (
    DraftReviewer as DraftReviewer,
)
from llama_jev.review.reviewer import (
    ReviewOutcome as ReviewOutcome,
)
from llama_jev.review.reviewer import (
    ReviewStatus as ReviewStatus,
)
from llama_jev.systemone.client import (
    JevClient as JevClient,
)
from llama_jev.systemone.client import (
    RetryPolicy as RetryPolicy,
)
from llama_jev.systemone.judge import (
    Judge as Judge,
)
from llama_jev.systemone.judge import (
    ScriptedJudge as ScriptedJudge,
)

__version__: str
