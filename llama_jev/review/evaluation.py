"""``JevGroundingEvaluator``: the draft-review question as a LlamaIndex evaluator."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from llama_index.core.evaluation import BaseEvaluator, EvaluationResult
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.schema import NodeWithScore, TextNode

from llama_jev.core.records import DEFAULT_ACCEPT, DEFAULT_REJECT, ExecutionOptions, Mode, Status
from llama_jev.review.reviewer import GROUNDED_QUESTION, DraftReviewer, ReviewStatus
from llama_jev.systemone.judge import Judge

__all__ = ["JevGroundingEvaluator"]


class JevGroundingEvaluator(BaseEvaluator):
    """Is a response grounded in its contexts? One System One judgement per evaluation.

    The same question, state and thresholds as :class:`~llama_jev.DraftReviewer` (it is one, run
    in SHADOW: the judge is always asked, nothing is revised or withheld). ``passing`` is
    ``p >= accept``, ``score`` is ``p``. Empty contexts fail without a judge call; a judge failure
    is an ``invalid_result`` naming the record's reason, never a pass (the error class and HTTP
    status are in the SHADOW WARNING the review logs on ``llama_jev``). ``options`` supplies the
    budget, version and observer (its mode is ignored).

    Example:
        >>> evaluator = JevGroundingEvaluator(JevClient())  # doctest: +SKIP
        >>> runner = BatchEvalRunner({"grounded": evaluator}, workers=4)  # doctest: +SKIP
        >>> results = await runner.aevaluate_response_strs(  # doctest: +SKIP
        ...     queries=queries, response_strs=answers, contexts_list=contexts
        ... )
    """

    def __init__(
        self,
        judge: Judge,
        options: ExecutionOptions | None = None,
        *,
        question: str = GROUNDED_QUESTION,
        reject: float = DEFAULT_REJECT,
        accept: float = DEFAULT_ACCEPT,
        purpose: str = "grounding_evaluation",
    ) -> None:
        options = dataclasses.replace(options, mode=Mode.SHADOW) if options else ExecutionOptions(mode=Mode.SHADOW)
        self.reviewer = DraftReviewer(
            judge, options, question=question, reject=reject, accept=accept, max_revisions=0, purpose=purpose
        )

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts_dict: PromptDictType) -> None:
        return None

    async def aevaluate(
        self,
        query: str | None = None,
        response: str | None = None,
        contexts: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> EvaluationResult:
        """Judge whether ``response`` (to ``query``) is supported by ``contexts``."""
        if response is None or not response.strip():
            raise ValueError("response must be a non-empty string")
        texts = list(contexts or [])
        evidence = [NodeWithScore(node=TextNode(id_=f"context_{i}", text=text)) for i, text in enumerate(texts)]
        outcome = await self.reviewer.areview(query or "", response, evidence)
        record = outcome.record
        if record is not None and record.status is Status.ERROR:
            return EvaluationResult(
                query=query,
                response=response,
                contexts=texts,
                invalid_result=True,
                invalid_reason=f"the judge failed ({record.reason.value})",
            )
        passing = outcome.status is ReviewStatus.PASSED
        reason = outcome.reason.value if outcome.reason is not None else "SUPPORTED"
        return EvaluationResult(
            query=query,
            response=response,
            contexts=texts,
            passing=passing,
            score=outcome.probability if outcome.probability is not None else 0.0,
            feedback=f"{reason} (p={outcome.probability})",
        )
