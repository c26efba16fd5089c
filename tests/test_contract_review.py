"""Contract audit of DESIGN Part 2 "Final-draft review", written as an outsider would test it."""

from __future__ import annotations

import logging

import pytest

from llama_jev import ExecutionOptions, JevGroundingEvaluator, Mode
from llama_jev.testing import Fault, SystemOneTestServer

from .review_support import DRAFT, POLICY, QUERY, client


def test_a_failed_grounding_evaluation_is_invalid_and_logged_with_error_class_and_status(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    evaluator = JevGroundingEvaluator(judge=client(jev_server), options=ExecutionOptions(mode=Mode.ENFORCE))
    jev_server.inject_always(Fault.status(503))
    caplog.set_level(logging.WARNING, logger="llama_jev")
    result = evaluator.evaluate(query=QUERY, response=DRAFT, contexts=[POLICY])
    assert result.invalid_result is True
    assert result.passing is None
    assert result.invalid_reason is not None
    assert "CALL_OR_RESPONSE_ERROR" in result.invalid_reason
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(logged) == 1, logged
    assert "JevServerError" in logged[0]
    assert "HTTP 503" in logged[0]
    for text in (QUERY, DRAFT, POLICY):
        assert text not in logged[0]
        assert text not in result.invalid_reason


def test_the_review_section_names_import_from_llama_jev_review() -> None:
    import llama_jev
    from llama_jev.review import (
        GROUNDED_QUESTION,
        DraftReviewer,
        JevGroundingEvaluator,
        JevReviewedAgent,
        JevReviewedQueryEngine,
        ResponseWithheldError,
        ReviewOutcome,
        ReviewStatus,
    )

    assert JevReviewedQueryEngine is llama_jev.JevReviewedQueryEngine
    assert JevReviewedAgent is llama_jev.JevReviewedAgent
    assert JevGroundingEvaluator is llama_jev.JevGroundingEvaluator
    assert ResponseWithheldError is llama_jev.ResponseWithheldError
    assert issubclass(ResponseWithheldError, llama_jev.JevError)
    assert (DraftReviewer, ReviewOutcome, ReviewStatus) == (
        llama_jev.DraftReviewer,
        llama_jev.ReviewOutcome,
        llama_jev.ReviewStatus,
    )
    # GROUNDED_QUESTION left the top level for llama_jev.review: the old path still answers, warning.
    with pytest.deprecated_call(match="llama_jev.review"):
        assert llama_jev.GROUNDED_QUESTION == GROUNDED_QUESTION
    with pytest.raises(AttributeError):
        _ = llama_jev.review.NoSuchName  # type: ignore[attr-defined]
