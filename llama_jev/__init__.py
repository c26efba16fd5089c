"""llama_jev: access control and calibrated relevance judgement after any LlamaIndex retrieval.

Upstream recall -> ACL over node metadata -> one independent System One (Jev) yes/no judgement
per authorized candidate -> order by probability -> limit. See ``README.md`` for the tour and
``docs/`` for the reference.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llama_jev.acl.rules import Acl, MetadataAcl, check_acl
    from llama_jev.calibration.analysis import calibrate
    from llama_jev.calibration.mapping import CalibratedJudge
    from llama_jev.calibration.report import CalibrationReport
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
    from llama_jev.core.records import (
        Decision,
        DecisionRecord,
        ExecutionOptions,
        Mode,
        Observer,
        Reason,
        Selection,
        Status,
    )
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

# Every public name and the module it lives in. Names load on first use (PEP 562), so a command
# that needs a corner of the package (``python -m llama_jev.calibrate``) does not pay for
# importing LlamaIndex; ``from llama_jev import X`` works as before.
_HOMES: dict[str, tuple[str, ...]] = {
    "llama_jev.acl.rules": (
        "Acl",
        "MetadataAcl",
        "check_acl",
    ),
    "llama_jev.core.audit": ("JsonlObserver",),
    "llama_jev.core.context": (
        "RuntimeContext",
        "current_runtime_context",
        "resolve_runtime_context",
        "runtime_context",
    ),
    "llama_jev.core.errors": (
        "CandidateTooLargeError",
        "EvidenceTooLargeError",
        "JevAPIError",
        "JevAuthenticationError",
        "JevBadRequestError",
        "JevConnectionError",
        "JevError",
        "JevInvalidResponseError",
        "JevNotFoundError",
        "JevOverloadedError",
        "JevPermissionDeniedError",
        "JevRateLimitError",
        "JevServerError",
        "JevTimeoutError",
        "LocalJudgeTimeoutError",
        "MissingRuntimeContextError",
        "QueryTooLargeError",
        "ResponseWithheldError",
        "RetrievalInconclusiveError",
        "RetrievalUnavailableError",
        "UnencodableTextError",
    ),
    "llama_jev.core.records": (
        "Decision",
        "DecisionRecord",
        "ExecutionOptions",
        "Mode",
        "Observer",
        "Reason",
        "Selection",
        "Status",
    ),
    "llama_jev.engine.pipeline": (
        "PROBABILITY_KEY",
        "JevDecisionEvent",
    ),
    "llama_jev.engine.selector": (
        "RELEVANCE_QUESTION",
        "Candidate",
        "CandidateSelector",
    ),
    "llama_jev.retrieval.evidence": (
        "EvidenceCollector",
        "collect_evidence",
    ),
    "llama_jev.retrieval.postprocessor": ("JevNodePostprocessor",),
    "llama_jev.retrieval.retriever": ("JevRetriever",),
    "llama_jev.retrieval.tool": ("JevKnowledgeTool",),
    "llama_jev.review": (
        "GROUNDED_QUESTION",
        "DraftReviewer",
        "JevGroundingEvaluator",
        "JevReviewedAgent",
        "JevReviewedQueryEngine",
        "ReviewOutcome",
        "ReviewStatus",
        "WithheldReason",
    ),
    "llama_jev.systemone.client": (
        "JevClient",
        "RetryPolicy",
    ),
    "llama_jev.systemone.governor": (
        "Governor",
        "GovernorStats",
    ),
    "llama_jev.systemone.judge": (
        "AnswerFunction",
        "Judge",
        "ScriptedJudge",
    ),
    "llama_jev.systemone.wire": (
        "ChoiceAnswer",
        "ChoiceQuestion",
        "NoulAnswer",
        "NoulCriteria",
        "NoulQuestion",
        "ScoreAnswer",
        "ScoreQuestion",
        "SystemOneRequest",
        "SystemOneResult",
        "Usage",
    ),
    "llama_jev.calibration.analysis": ("calibrate",),
    "llama_jev.calibration.mapping": ("CalibratedJudge",),
    "llama_jev.calibration.report": ("CalibrationReport",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

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
    "LocalJudgeTimeoutError",
    "JsonlObserver",
    "Judge",
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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
