"""The review inside LlamaIndex: a reviewed query engine, a reviewed FunctionAgent, a grounding evaluator."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Generator, Sequence
from typing import Any

import pytest
from llama_index.core.agent.workflow import AgentStream, FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, CompletionResponse, MessageRole, ToolCallBlock
from llama_index.core.base.response.schema import Response, StreamingResponse
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.evaluation import BatchEvalRunner
from llama_index.core.llms import MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import Context

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    DraftReviewer,
    ExecutionOptions,
    JevGroundingEvaluator,
    JevKnowledgeTool,
    JevRetriever,
    JevReviewedAgent,
    JevReviewedQueryEngine,
    Mode,
    ResponseWithheldError,
    ReviewStatus,
    Status,
    runtime_context,
)
from llama_jev.retrieval import collect_evidence
from llama_jev.review import GROUNDED_QUESTION, WithheldReason
from llama_jev.testing import Fault, SystemOneTestServer

from .corpus import ACL, ALICE, BY_ID, DOCS, GINA, memory_index
from .review_support import (
    DRAFT,
    REVISION,
    Reviser,
    client,
    is_revision_request,
    keep_the_conditions,
    records_json,
    review_answer,
    reviewer,
    still_unconditional,
)

QUESTION = "Can I return my order for a refund?"
ACME_REFUND = DOCS[0]
GLOBEX_REFUND = DOCS[5]


@pytest.fixture
def server(jev_server: SystemOneTestServer) -> SystemOneTestServer:
    jev_server.set_answer(review_answer)
    return jev_server


def review_requests(server: SystemOneTestServer) -> list[dict[str, Any]]:
    """The bodies of the grounded-question requests the server received, in order."""
    bodies = [request.json for request in server.requests if request.json is not None]
    return [body for body in bodies if body["questions"]["item_0"]["instructions"].get("question") == GROUNDED_QUESTION]


# --- the query engine --------------------------------------------------------------------------


class DraftLLM(MockLLM):
    """The answer generator of the query engine: always writes ``draft`` (word by word when streaming)."""

    _draft: str = PrivateAttr(default=DRAFT)

    @classmethod
    def writing(cls, draft: str) -> DraftLLM:
        llm = cls()
        llm._draft = draft
        return llm

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self._draft)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        def words() -> Generator[CompletionResponse, None, None]:
            text = ""
            for word in self._draft.split(" "):
                delta = word if not text else f" {word}"
                text += delta
                yield CompletionResponse(text=text, delta=delta)

        return words()


def engine(server: SystemOneTestServer, mode: Mode, *, streaming: bool = False, draft: str = DRAFT, **kw: Any) -> Any:
    inner = RetrieverQueryEngine.from_args(
        memory_index((ACME_REFUND,)).as_retriever(), llm=DraftLLM.writing(draft), streaming=streaming
    )
    return inner, JevReviewedQueryEngine(inner, reviewer(server, mode), **kw)


@pytest.mark.parametrize("use_async", [False, True], ids=["query", "aquery"])
def test_query_engine_returns_the_revision_that_passed_with_the_same_sources(
    server: SystemOneTestServer, use_async: bool
) -> None:
    reviser = Reviser()
    _, reviewed = engine(server, Mode.ENFORCE, llm=reviser.llm)
    response = asyncio.run(reviewed.aquery(QUESTION)) if use_async else reviewed.query(QUESTION)
    assert isinstance(response, Response)
    assert response.response == REVISION
    assert [node.node.node_id for node in response.source_nodes] == [ACME_REFUND.id]
    assert response.metadata is not None
    assert response.metadata["jev_review"] == {"status": "revised", "probability": 0.95, "revisions": 1}
    first, second = review_requests(server)
    assert (
        first["state"]["evidence"]
        == second["state"]["evidence"]
        == [{"id": ACME_REFUND.id, "text": ACME_REFUND.node().get_content()}]
    )
    assert first["state"]["query"] == QUESTION


@pytest.mark.parametrize("use_async", [False, True], ids=["query", "aquery"])
def test_query_engine_withholds_under_enforce(server: SystemOneTestServer, use_async: bool) -> None:
    _, reviewed = engine(server, Mode.ENFORCE, llm=Reviser(still_unconditional).llm)
    with pytest.raises(ResponseWithheldError) as caught:
        asyncio.run(reviewed.aquery(QUESTION)) if use_async else reviewed.query(QUESTION)
    assert caught.value.reason == WithheldReason.UNSUPPORTED
    assert DRAFT not in str(caught.value)


def test_query_engine_in_shadow_returns_the_draft_with_the_verdict(server: SystemOneTestServer) -> None:
    _, reviewed = engine(server, Mode.SHADOW, llm=Reviser().llm)
    response = reviewed.query(QUESTION)
    assert response.response == DRAFT
    assert response.metadata["jev_review"] == {"status": "withheld", "probability": 0.05, "revisions": 0}


def test_query_engine_in_off_passes_the_response_through_without_asking(server: SystemOneTestServer) -> None:
    _, reviewed = engine(server, Mode.OFF, streaming=True)
    response = reviewed.query(QUESTION)
    assert isinstance(response, StreamingResponse)  # nothing to review, nothing buffered
    assert str(response) == DRAFT
    assert response.metadata["jev_review"]["status"] == "skipped"
    assert server.request_count == 0


@pytest.mark.parametrize("use_async", [False, True], ids=["query", "aquery"])
def test_a_streaming_engine_under_enforce_is_buffered_and_reviewed_before_anything_is_returned(
    server: SystemOneTestServer, use_async: bool
) -> None:
    inner, reviewed = engine(server, Mode.ENFORCE, streaming=True, llm=Reviser().llm)
    unreviewed = inner.query(QUESTION)
    assert isinstance(unreviewed, StreamingResponse)  # the wrapped engine really streams
    server.reset()
    response = asyncio.run(reviewed.aquery(QUESTION)) if use_async else reviewed.query(QUESTION)
    assert type(response) is Response  # a plain response: no token of the draft is streamed
    assert response.response == REVISION
    assert review_requests(server)[0]["state"]["answer"] == DRAFT  # the whole draft was reviewed

    _, withholding = engine(server, Mode.ENFORCE, streaming=True)
    with pytest.raises(ResponseWithheldError):
        withholding.query(QUESTION)


# --- the agent -------------------------------------------------------------------------------------


class SeedsLLM:
    """The seeds' scripted model: search first, then an unconditional promise; revise on request.

    ``drafts`` names what the final answer is per call; ``tool_results`` keeps what the second
    call received from ``search_knowledge``.
    """

    def __init__(self, revise: Any = keep_the_conditions, *, search: bool = True) -> None:
        self.revise = revise
        self.search = search
        self.tool_results: list[str] = []
        self.revision_prompts: list[str] = []
        self.llm = MockFunctionCallingLLM(response_generator=self._respond, is_chat_model=True)

    def _respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        if is_revision_request(messages):
            assert "tools" not in kwargs
            self.revision_prompts.append(messages[-1].content or "")
            return self.revise(messages)  # type: ignore[no-any-return]
        results = [message for message in messages if message.role == MessageRole.TOOL]
        if not results and self.search:
            question = [message for message in messages if message.role == MessageRole.USER][-1].content
            call = ToolCallBlock(tool_call_id="call-1", tool_name="search_knowledge", tool_kwargs={"query": question})
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
        content = results[-1].content if results else "[]"
        self.tool_results.append(content or "")
        # The draft names the passages it was written from, so a review request shows whose run it is.
        ids = [passage["id"] for passage in ast.literal_eval(content or "[]")]
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"{DRAFT} (sources: {', '.join(ids)})")


def knowledge_tool(server: SystemOneTestServer) -> FunctionTool:
    selector = CandidateSelector(client(server), ExecutionOptions(mode=Mode.ENFORCE, budget=5.0))
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector, ACL)
    return JevKnowledgeTool(retriever, top_k=5).as_tool()


def agent(server: SystemOneTestServer, mode: Mode, model: SeedsLLM, records: list[DecisionRecord] | None = None) -> Any:
    return JevReviewedAgent(reviewer=reviewer(server, mode, records), tools=[knowledge_tool(server)], llm=model.llm)


async def run_agent(
    agent: FunctionAgent, question: str = QUESTION, ctx: Context | None = None
) -> tuple[str, list[Any], BaseException | None]:
    """The answer, every streamed event, and the exception the run ended with (if any)."""
    events: list[Any] = []
    handler = agent.run(user_msg=question, ctx=ctx)
    try:
        async for event in handler.stream_events():
            events.append(event)
        return str(await handler), events, None
    except Exception as error:
        return "", events, error


def streamed_text(events: list[Any]) -> str:
    return "\n".join(event.model_dump_json() if hasattr(event, "model_dump_json") else repr(event) for event in events)


async def test_agent_answer_is_revised_to_keep_the_conditions_before_anyone_sees_it(
    server: SystemOneTestServer,
) -> None:
    model = SeedsLLM()
    records: list[DecisionRecord] = []
    reviewed = agent(server, Mode.ENFORCE, model, records)
    ctx = Context(reviewed)
    with runtime_context(ALICE):
        answer, events, error = await run_agent(reviewed, ctx=ctx)
    assert error is None
    assert answer == REVISION
    # The conversation memory (what the next turn sees) holds the revision, not the draft.
    memory = await ctx.store.get("memory")
    remembered = [message.content or "" for message in await memory.aget()]
    assert remembered[-1] == REVISION
    assert not any(DRAFT in content for content in remembered)
    # The second model call received the refund policy from search_knowledge ...
    (tool_result,) = model.tool_results
    assert ACME_REFUND.node().get_content() in tool_result
    # ... the review saw that passage both times (draft, then revision), and the reviser got it too.
    first, second = review_requests(server)
    evidence_ids = {item["id"] for item in first["state"]["evidence"]}
    assert ACME_REFUND.id in evidence_ids
    assert first["state"]["evidence"] == second["state"]["evidence"]
    assert first["state"]["answer"].startswith(DRAFT)
    assert second["state"]["answer"] == REVISION
    assert ACME_REFUND.node().get_content() in model.revision_prompts[0]
    # Nothing the caller was streamed carries the unreviewed draft; the revision is streamed once.
    assert DRAFT not in streamed_text(events)
    streams = [event for event in events if isinstance(event, AgentStream)]
    assert [event.delta for event in streams] == [REVISION]
    assert [(r.rejected, r.selected) for r in records] == [(("draft",), ()), ((), ("revision_1",))]


async def test_agent_answer_that_still_fails_is_withheld_and_never_streamed(server: SystemOneTestServer) -> None:
    model = SeedsLLM(still_unconditional)
    with runtime_context(ALICE):
        answer, events, error = await run_agent(agent(server, Mode.ENFORCE, model))
    assert isinstance(error, ResponseWithheldError)
    assert error.reason == WithheldReason.UNSUPPORTED
    assert answer == ""
    assert DRAFT not in streamed_text(events)
    assert "always possible" not in streamed_text(events)
    assert len(review_requests(server)) == 2


async def test_agent_without_search_has_no_evidence_and_its_answer_is_withheld(server: SystemOneTestServer) -> None:
    with runtime_context(ALICE):
        _, events, error = await run_agent(agent(server, Mode.ENFORCE, SeedsLLM(search=False)))
    assert isinstance(error, ResponseWithheldError)
    assert error.reason == WithheldReason.NO_EVIDENCE
    assert server.request_count == 0
    assert DRAFT not in streamed_text(events)


async def test_agent_in_shadow_streams_and_returns_the_draft_and_records_the_verdict(
    server: SystemOneTestServer,
) -> None:
    records: list[DecisionRecord] = []
    with runtime_context(ALICE):
        answer, events, error = await run_agent(agent(server, Mode.SHADOW, SeedsLLM(), records))
    assert error is None
    assert answer.startswith(DRAFT)
    assert DRAFT in streamed_text(events)  # SHADOW changes nothing for the user (and the check above can fail)
    (record,) = records
    assert (record.status, record.rejected) == (Status.DECIDED, ("draft",))


async def test_agent_in_off_is_a_plain_function_agent(server: SystemOneTestServer) -> None:
    with runtime_context(ALICE):
        answer, _, error = await run_agent(agent(server, Mode.OFF, SeedsLLM()))
    assert error is None
    assert answer.startswith(DRAFT)
    assert review_requests(server) == []


async def test_concurrent_agent_runs_review_against_their_own_evidence_only(server: SystemOneTestServer) -> None:
    server.set_latency(0.1)  # every request in flight long enough for the two runs to interleave
    shared = agent(server, Mode.ENFORCE, SeedsLLM())  # one agent object, two runs at once

    async def ask(user: Any) -> tuple[str, list[Any], BaseException | None]:
        with runtime_context(user):
            return await run_agent(shared)

    (alice_answer, _, alice_error), (_, _, gina_error) = await asyncio.gather(ask(ALICE), ask(GINA))

    # The two retrievals were on the wire before any review: the runs really overlapped.
    ordered = sorted(server.requests, key=lambda request: request.started)
    assert [
        body is not None and body["questions"]["item_0"]["instructions"].get("question")
        for body in (request.json for request in ordered[:2])
    ] == ["Does this passage provide evidence relevant to the query?"] * 2
    assert alice_error is None
    assert alice_answer == REVISION
    assert isinstance(gina_error, ResponseWithheldError)  # globex's policy has no "unused ... seven days"
    for body in review_requests(server):
        ids = {item["id"] for item in body["state"]["evidence"]}
        tenants = {BY_ID[node_id].tenant for node_id in ids}
        assert len(tenants) == 1, "a review saw evidence from two runs"
        if body["state"]["answer"].startswith(DRAFT):
            # The draft names its run's sources: the evidence is exactly what that run's tool returned.
            assert ids == set(body["state"]["answer"].split("sources: ")[1].rstrip(")").split(", "))
    assert any(GLOBEX_REFUND.id in {i["id"] for i in b["state"]["evidence"]} for b in review_requests(server))


def test_agent_refuses_return_direct_tools_under_enforce(server: SystemOneTestServer) -> None:
    direct = FunctionTool.from_defaults(fn=lambda query: "raw", name="direct", return_direct=True)
    with pytest.raises(ValueError, match="return_direct"):
        JevReviewedAgent(reviewer=reviewer(server, Mode.ENFORCE), tools=[direct], llm=SeedsLLM().llm)
    JevReviewedAgent(reviewer=reviewer(server, Mode.SHADOW), tools=[direct], llm=SeedsLLM().llm)


def test_records_of_the_agent_hold_no_text(server: SystemOneTestServer) -> None:
    records: list[DecisionRecord] = []

    async def go() -> None:
        with runtime_context(ALICE):
            await run_agent(agent(server, Mode.ENFORCE, SeedsLLM(), records))

    asyncio.run(go())
    logged = records_json(records)
    assert len(records) == 2
    for text in (DRAFT, REVISION, QUESTION, ACME_REFUND.text, "seven days"):
        assert text not in logged


# --- the evidence collector (the tool's side) ---------------------------------------------------------


@pytest.mark.parametrize("use_async", [False, True], ids=["call", "acall"])
def test_search_knowledge_adds_what_it_returns_to_the_bound_collector(
    server: SystemOneTestServer, use_async: bool
) -> None:
    tool = knowledge_tool(server)
    with runtime_context(ALICE), collect_evidence() as outer, collect_evidence() as inner:
        output = asyncio.run(tool.acall(query=QUESTION)) if use_async else tool.call(query=QUESTION)
    returned = [passage["id"] for passage in output.raw_output]
    assert [node.node.node_id for node in inner.nodes] == returned
    assert [node.node.node_id for node in outer.nodes] == returned  # an enclosing collector sees it too
    with runtime_context(ALICE):
        tool.call(query=QUESTION)  # no collector bound: nothing is kept anywhere
    assert len(inner) == len(returned)


# --- the evaluator ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:asyncio_module:DeprecationWarning")  # inside llama-index's BatchEvalRunner
async def test_grounding_evaluator_runs_in_batch_eval_runner(server: SystemOneTestServer) -> None:
    policy = ACME_REFUND.node().get_content()
    evaluator = JevGroundingEvaluator(client(server))
    runner = BatchEvalRunner({"grounded": evaluator}, workers=2)
    results = await runner.aevaluate_response_strs(
        queries=[QUESTION, QUESTION, QUESTION],
        response_strs=[REVISION, DRAFT, REVISION],
        contexts_list=[[policy], [policy], []],
    )
    supported, unconditional, no_context = results["grounded"]
    assert (supported.passing, supported.score) == (True, 0.95)
    assert (unconditional.passing, unconditional.score) == (False, 0.05)
    assert no_context.passing is False
    assert len(review_requests(server)) == 2  # empty contexts: no judge call


async def test_grounding_evaluator_reports_a_judge_failure_as_invalid_not_failing(server: SystemOneTestServer) -> None:
    server.inject_always(Fault.status(503))
    result = await JevGroundingEvaluator(client(server)).aevaluate(QUESTION, REVISION, ["policy"])
    assert result.invalid_result is True
    assert result.passing is None
    assert "CALL_OR_RESPONSE_ERROR" in (result.invalid_reason or "")


def test_grounding_evaluator_never_withholds_whatever_the_mode(server: SystemOneTestServer) -> None:
    evaluator = JevGroundingEvaluator(client(server), ExecutionOptions(mode=Mode.ENFORCE))
    result = evaluator.evaluate(QUESTION, DRAFT, [ACME_REFUND.node().get_content()])
    assert result.passing is False
    assert evaluator.reviewer.mode is Mode.SHADOW
    assert isinstance(evaluator.reviewer, DraftReviewer)
    assert ReviewStatus.WITHHELD.value == "withheld"
