"""``JevReviewedAgent``: a ``FunctionAgent`` whose final answer is reviewed against what its tools found.

Each ``run()`` binds a fresh :class:`~llama_jev.retrieval.evidence.EvidenceCollector`; ``search_knowledge``
(:class:`~llama_jev.JevKnowledgeTool`) adds the passages it returns to it; when the model gives
its final answer (a response without tool calls), that answer is reviewed by a
:class:`~llama_jev.DraftReviewer` against the collected passages before it leaves the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.agent.workflow import AgentOutput, AgentStream, FunctionAgent
from llama_index.core.agent.workflow.agent_context import AgentContext
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms import LLM
from llama_index.core.memory import BaseMemory
from llama_index.core.tools import AsyncBaseTool, BaseTool
from llama_index.core.workflow import Context, StopEvent, WorkflowRuntimeError
from workflows.handler import WorkflowHandler

from llama_jev.core.records import Mode
from llama_jev.retrieval.evidence import collect_evidence, current_evidence_collector
from llama_jev.review.reviewer import DraftReviewer

__all__ = ["JevReviewedAgent"]


class JevReviewedAgent(FunctionAgent):
    """A ``FunctionAgent`` whose final answer is reviewed against the passages its tools returned in that run.

    The evidence is what ``search_knowledge`` returned during this ``run()`` (collected per run:
    two concurrent runs never see each other's passages). The reviser is ``review_llm``, or the
    agent's own ``llm`` (asked without tools). Modes are the reviewer's:

    - OFF: a plain ``FunctionAgent``.
    - SHADOW: the answer is streamed and returned as the model wrote it; the verdict is recorded.
    - ENFORCE: the LLM is called without streaming (no ``AgentStream`` delta of an unreviewed
      draft reaches the caller); the answer that passed (the draft or its revision) is what the
      ``AgentOutput`` event, the memory and the result hold, and, when ``streaming`` is on, it is
      written as one ``AgentStream`` event after the review. An answer that does not pass
      raises :class:`~llama_jev.ResponseWithheldError` from ``await handler``; it never reaches
      the memory. A run that searched nothing has no evidence, so its answer is withheld.
      Tools with ``return_direct`` are refused, and ``early_stopping_method="generate"`` fails
      the run, since both would publish text the review never saw.

    Example:
        >>> reviewer = DraftReviewer(judge, ExecutionOptions(mode=Mode.ENFORCE))  # doctest: +SKIP
        >>> agent = JevReviewedAgent(reviewer=reviewer, tools=[tool], llm=llm)  # doctest: +SKIP
        >>> with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme")):  # doctest: +SKIP
        ...     answer = await agent.run(user_msg="What are the refund conditions?")
    """

    reviewer: DraftReviewer = Field(description="Reviews the final answer against the run's evidence.")
    review_llm: LLM | None = Field(
        default=None, description="The LLM asked for revisions (no tools); defaults to the agent's llm."
    )

    def __init__(self, *, reviewer: DraftReviewer, review_llm: LLM | None = None, **kwargs: Any) -> None:
        if not isinstance(reviewer, DraftReviewer):
            raise TypeError("reviewer must be a DraftReviewer")
        super().__init__(reviewer=reviewer, review_llm=review_llm, **kwargs)
        if reviewer.mode is Mode.ENFORCE:
            direct = [
                tool.metadata.name
                for tool in self.tools or []
                if isinstance(tool, BaseTool) and tool.metadata.return_direct
            ]
            if direct:
                raise ValueError(
                    f"tools {direct} return directly to the user, bypassing the review; under ENFORCE every "
                    "answer is reviewed, so remove return_direct"
                )

    def run(self, *args: Any, **kwargs: Any) -> WorkflowHandler:
        """``FunctionAgent.run`` with a fresh evidence collector bound for this run.

        The collector is bound before the workflow starts, so the run's tasks (and the tools they
        call) inherit it; it is unbound again when ``run()`` returns the handler.
        """
        with collect_evidence():
            return super().run(*args, **kwargs)

    async def _get_streaming_response(
        self, ctx: AgentContext, current_llm_input: list[ChatMessage], tools: Sequence[AsyncBaseTool]
    ) -> ChatResponse:
        if self.reviewer.mode is Mode.ENFORCE:
            # Buffered: whether this response is the final answer is known only at its end.
            return await self._get_response(current_llm_input, tools)
        return await super()._get_streaming_response(ctx, current_llm_input, tools)

    async def take_step(
        self,
        ctx: AgentContext,
        llm_input: list[ChatMessage],
        tools: Sequence[AsyncBaseTool],
        memory: BaseMemory,
    ) -> AgentOutput:
        """One model step; a final answer (no tool calls) is reviewed before it is returned."""
        output = await super().take_step(ctx, llm_input, tools, memory)
        draft = output.response.content or ""
        if output.tool_calls or self.reviewer.mode is Mode.OFF or not draft.strip():
            # Tool calls are not an answer; a blank answer says nothing that could be unsupported.
            return output
        query = await ctx.store.get("user_msg_str", default="") or ""
        collector = current_evidence_collector()
        evidence = collector.nodes if collector is not None else []
        outcome = await self.reviewer.areview(query, draft, evidence, llm=self.review_llm or self.llm)
        if self.reviewer.mode is not Mode.ENFORCE:
            return output
        if outcome.text != draft:
            message = ChatMessage(role=MessageRole.ASSISTANT, content=outcome.text)
            # The memory is fed from the scratchpad at finalize: it must hold the revision, not the draft.
            scratchpad: list[ChatMessage] = await ctx.store.get(self.scratchpad_key, default=[])
            last = scratchpad[-1] if scratchpad else None
            if last is not None and last.role == MessageRole.ASSISTANT and (last.content or "") == draft:
                scratchpad[-1] = message
                await ctx.store.set(self.scratchpad_key, scratchpad)
            # raw is the provider's response, which holds the draft.
            output = output.model_copy(update={"response": message, "raw": None})
        if self.streaming:
            ctx.write_event_to_stream(
                AgentStream(
                    delta=outcome.text,
                    response=outcome.text,
                    tool_calls=[],
                    raw=None,
                    current_agent_name=self.name,
                )
            )
        return output

    async def _generate_early_stopping_response(self, ctx: Context, max_iterations: int) -> StopEvent:
        if self.reviewer.mode is Mode.ENFORCE:
            raise WorkflowRuntimeError(
                f"Max iterations of {max_iterations} reached. Under ENFORCE an answer generated at the "
                "iteration limit is not published unreviewed; raise max_iterations instead."
            )
        return await super()._generate_early_stopping_response(ctx, max_iterations)
