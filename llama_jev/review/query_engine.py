"""``JevReviewedQueryEngine``: any query engine whose answer is reviewed before it is returned."""

from __future__ import annotations

import dataclasses
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    PydanticResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import QueryBundle

from llama_jev.core.records import Mode
from llama_jev.review.reviewer import DraftReviewer, ReviewOutcome, ReviewStatus

__all__ = ["REVIEW_METADATA_KEY", "JevReviewedQueryEngine"]

REVIEW_METADATA_KEY = "jev_review"


class JevReviewedQueryEngine(BaseQueryEngine):
    """Wraps a query engine: its answer is reviewed against the answer's own ``source_nodes``.

    ``query`` / ``aquery`` return a ``Response`` with the reviewed text (the draft, or the
    revision that passed), the same ``source_nodes``, and
    ``metadata["jev_review"] = {"status": "passed" | "revised" | "withheld" | "skipped",
    "probability": p, "revisions": n}``. In ENFORCE an answer that does not pass raises
    :class:`~llama_jev.ResponseWithheldError`; SHADOW returns the draft with the verdict; OFF
    returns the engine's response untouched apart from the metadata.

    Streaming engines: in SHADOW and ENFORCE a streaming response is **buffered**: the whole
    draft is read (nothing reaches the caller), reviewed, and returned as a plain ``Response``.
    So no unreviewed token is ever streamed under ENFORCE. In OFF the stream is passed through.
    A structured (``PydanticResponse``) answer is reviewed as its JSON and returned as text.

    Example:
        >>> reviewer = DraftReviewer(judge, ExecutionOptions(mode=Mode.ENFORCE))  # doctest: +SKIP
        >>> engine = JevReviewedQueryEngine(index.as_query_engine(), reviewer, llm=llm)  # doctest: +SKIP
        >>> response = engine.query("What are the refund conditions?")  # doctest: +SKIP
        >>> response.metadata["jev_review"]["status"]  # doctest: +SKIP
        'passed'
    """

    def __init__(
        self,
        query_engine: BaseQueryEngine,
        reviewer: DraftReviewer,
        llm: LLM | None = None,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        if not isinstance(query_engine, BaseQueryEngine):
            raise TypeError("query_engine must be a LlamaIndex BaseQueryEngine (e.g. index.as_query_engine())")
        if not isinstance(reviewer, DraftReviewer):
            raise TypeError("reviewer must be a DraftReviewer")
        if llm is not None and not isinstance(llm, LLM):
            raise TypeError("llm must be a LlamaIndex LLM or None")
        self.query_engine = query_engine
        self.reviewer = reviewer
        self.llm = llm
        super().__init__(callback_manager=callback_manager or query_engine.callback_manager)

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "JevReviewedQueryEngine"

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_engine": self.query_engine}

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        response = self.query_engine.query(query_bundle)
        if self.reviewer.mode is Mode.OFF:
            return _skipped(response)
        if isinstance(response, AsyncStreamingResponse):
            raise TypeError("the query engine returned an async stream from query(); use aquery()")
        draft = _buffered(response)
        outcome = self.reviewer.review(query_bundle.query_str, _text(draft), draft.source_nodes, llm=self.llm)
        return _reviewed(draft, outcome)

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        response = await self.query_engine.aquery(query_bundle)
        if self.reviewer.mode is Mode.OFF:
            return _skipped(response)
        draft = await response.get_response() if isinstance(response, AsyncStreamingResponse) else _buffered(response)
        outcome = await self.reviewer.areview(query_bundle.query_str, _text(draft), draft.source_nodes, llm=self.llm)
        return _reviewed(draft, outcome)


def _buffered(response: RESPONSE_TYPE) -> Response:
    """The whole answer as a ``Response``; a stream is read to its end, nothing of it shown."""
    if isinstance(response, Response):
        return response
    if isinstance(response, (StreamingResponse, PydanticResponse)):
        return response.get_response()
    raise TypeError(f"the query engine returned {type(response).__name__}, not a LlamaIndex response")


def _text(response: Response) -> str:
    return response.response or ""


def _metadata(metadata: dict[str, Any] | None, outcome: ReviewOutcome) -> dict[str, Any]:
    # A copy: the engine's metadata dict may be shared with whatever produced the response.
    return {**(metadata or {}), REVIEW_METADATA_KEY: outcome.as_metadata()}


def _reviewed(draft: Response, outcome: ReviewOutcome) -> Response:
    return Response(response=outcome.text, source_nodes=draft.source_nodes, metadata=_metadata(draft.metadata, outcome))


def _skipped(response: RESPONSE_TYPE) -> RESPONSE_TYPE:
    outcome = ReviewOutcome(ReviewStatus.SKIPPED, "")
    return dataclasses.replace(response, metadata=_metadata(response.metadata, outcome))
