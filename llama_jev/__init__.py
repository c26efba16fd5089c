"""llama_jev: access control and calibrated relevance judgement after any LlamaIndex retrieval.

Upstream recall -> ACL over node metadata -> one independent System One (Jev) yes/no judgement
per authorized candidate -> order by probability -> limit. See ``README.md`` for the tour and
``docs/`` for the reference (``docs/api.md`` lists every public name by package).

This package holds what an application writes; everything else is public in its layer's package
(``llama_jev.errors``, ``llama_jev.systemone``, ``llama_jev.calibration``, ...). The names are
listed once, in ``__init__.pyi``, and load on first use, so a command that needs one corner of
the package (``python -m llama_jev.calibrate``) does not import LlamaIndex.
"""

from llama_jev import _moved_modules
from llama_jev._exports import attach

__version__ = "0.2.0"

# Names that left the top level in 0.2.0 -> their home now (CHANGELOG.md). They still import
# from here, with a DeprecationWarning naming the new home, until 0.3.
_MOVED = {
    "AnswerFunction": "llama_jev.systemone",
    "CalibratedJudge": "llama_jev.calibration",
    "CalibrationReport": "llama_jev.calibration",
    "Candidate": "llama_jev.engine",
    "CandidateTooLargeError": "llama_jev.errors",
    "ChoiceAnswer": "llama_jev.systemone",
    "ChoiceQuestion": "llama_jev.systemone",
    "Decision": "llama_jev.core",
    "EvidenceCollector": "llama_jev.retrieval",
    "EvidenceTooLargeError": "llama_jev.errors",
    "GROUNDED_QUESTION": "llama_jev.review",
    "Governor": "llama_jev.systemone",
    "GovernorStats": "llama_jev.systemone",
    "JevAuthenticationError": "llama_jev.errors",
    "JevBadRequestError": "llama_jev.errors",
    "JevConnectionError": "llama_jev.errors",
    "JevDecisionEvent": "llama_jev.engine",
    "JevInvalidResponseError": "llama_jev.errors",
    "JevNotFoundError": "llama_jev.errors",
    "JevOverloadedError": "llama_jev.errors",
    "JevPermissionDeniedError": "llama_jev.errors",
    "JevRateLimitError": "llama_jev.errors",
    "JevServerError": "llama_jev.errors",
    "JevTimeoutError": "llama_jev.errors",
    "LocalJudgeTimeoutError": "llama_jev.errors",
    "NoulAnswer": "llama_jev.systemone",
    "NoulCriteria": "llama_jev.systemone",
    "NoulQuestion": "llama_jev.systemone",
    "Observer": "llama_jev.core",
    "PROBABILITY_KEY": "llama_jev.engine",
    "QueryTooLargeError": "llama_jev.errors",
    "RELEVANCE_QUESTION": "llama_jev.engine",
    "Reason": "llama_jev.core",
    "ScoreAnswer": "llama_jev.systemone",
    "ScoreQuestion": "llama_jev.systemone",
    "Selection": "llama_jev.core",
    "SystemOneRequest": "llama_jev.systemone",
    "SystemOneResult": "llama_jev.systemone",
    "UnencodableTextError": "llama_jev.errors",
    "Usage": "llama_jev.systemone",
    "WithheldReason": "llama_jev.review",
    "calibrate": "llama_jev.calibration",
    "check_acl": "llama_jev.acl",
    "collect_evidence": "llama_jev.retrieval",
    "current_runtime_context": "llama_jev.core",
    "resolve_runtime_context": "llama_jev.core",
}

__getattr__, __dir__, __all__ = attach(__name__, __file__, moved=_MOVED)
_moved_modules.install()  # 0.2's module paths of engines and stores that are folders now
