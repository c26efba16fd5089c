"""llama_jev: access control and calibrated relevance judgement after any LlamaIndex retrieval.

Upstream recall -> ACL over node metadata -> one independent System One (Jev) yes/no judgement
per authorized candidate -> order by probability -> limit. See ``README.md`` for the tour and
``docs/`` for the reference.
"""

from llama_jev.acl.rules import Acl, MetadataAcl, check_acl
from llama_jev.calibration import CalibratedJudge, CalibrationReport, calibrate
from llama_jev.core.audit import JsonlObserver
from llama_jev.core.context import RuntimeContext, current_runtime_context, resolve_runtime_context, runtime_context
from llama_jev.core.errors import (
    CandidateTooLargeError,
    EvidenceTooLargeError,
    JevAPIError,
    JevAuthenticationError,
    JevBadRequestError,
    JevConnectionError,
    JevError,
    JevInvalidResponseError,
    JevNotFoundError,
    JevOverloadedError,
    JevPermissionDeniedError,
    JevRateLimitError,
    JevServerError,
    JevTimeoutError,
    LocalJudgeTimeoutError,
    MissingRuntimeContextError,
    QueryTooLargeError,
    ResponseWithheldError,
    RetrievalInconclusiveError,
    RetrievalUnavailableError,
    UnencodableTextError,
)
from llama_jev.core.records import Decision, DecisionRecord, ExecutionOptions, Mode, Observer, Reason, Selection, Status
from llama_jev.engine.pipeline import PROBABILITY_KEY, JevDecisionEvent
from llama_jev.engine.selector import RELEVANCE_QUESTION, Candidate, CandidateSelector
from llama_jev.retrieval.evidence import EvidenceCollector, collect_evidence
from llama_jev.retrieval.postprocessor import JevNodePostprocessor
from llama_jev.retrieval.retriever import JevRetriever
from llama_jev.retrieval.tool import JevKnowledgeTool
from llama_jev.review import (
    GROUNDED_QUESTION,
    DraftReviewer,
    JevGroundingEvaluator,
    JevReviewedAgent,
    JevReviewedQueryEngine,
    ReviewOutcome,
    ReviewStatus,
    WithheldReason,
)
from llama_jev.systemone.client import JevClient, RetryPolicy
from llama_jev.systemone.governor import Governor, GovernorStats
from llama_jev.systemone.judge import AnswerFunction, Judge, ScriptedJudge
from llama_jev.systemone.wire import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulCriteria,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneRequest,
    SystemOneResult,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "GROUNDED_QUESTION",
    "PROBABILITY_KEY",
    "RELEVANCE_QUESTION",
    "Acl",
    "AnswerFunction",
    "CalibratedJudge",
    "CalibrationReport",
    "Candidate",
    "CandidateSelector",
    "CandidateTooLargeError",
    "ChoiceAnswer",
    "ChoiceQuestion",
    "Decision",
    "DecisionRecord",
    "DraftReviewer",
    "EvidenceCollector",
    "EvidenceTooLargeError",
    "ExecutionOptions",
    "Governor",
    "GovernorStats",
    "JevAPIError",
    "JevAuthenticationError",
    "JevBadRequestError",
    "JevClient",
    "JevConnectionError",
    "JevDecisionEvent",
    "JevError",
    "JevGroundingEvaluator",
    "JevInvalidResponseError",
    "JevKnowledgeTool",
    "JevNodePostprocessor",
    "JevNotFoundError",
    "JevOverloadedError",
    "JevPermissionDeniedError",
    "JevRateLimitError",
    "JevRetriever",
    "JevReviewedAgent",
    "JevReviewedQueryEngine",
    "JevServerError",
    "JevTimeoutError",
    "JsonlObserver",
    "Judge",
    "LocalJudgeTimeoutError",
    "MetadataAcl",
    "MissingRuntimeContextError",
    "Mode",
    "NoulAnswer",
    "NoulCriteria",
    "NoulQuestion",
    "Observer",
    "QueryTooLargeError",
    "Reason",
    "ResponseWithheldError",
    "RetrievalInconclusiveError",
    "RetrievalUnavailableError",
    "RetryPolicy",
    "ReviewOutcome",
    "ReviewStatus",
    "RuntimeContext",
    "ScoreAnswer",
    "ScoreQuestion",
    "ScriptedJudge",
    "Selection",
    "Status",
    "SystemOneRequest",
    "SystemOneResult",
    "UnencodableTextError",
    "Usage",
    "WithheldReason",
    "__version__",
    "calibrate",
    "check_acl",
    "collect_evidence",
    "current_runtime_context",
    "resolve_runtime_context",
    "runtime_context",
]
