"""An agent with the ``search_knowledge`` tool, run for a bound user: ``python -m examples.agent_search_knowledge``.

The agent is LlamaIndex's ``FunctionAgent``; its only tool is
``JevKnowledgeTool(retriever).as_tool()`` over the refund-policy collection (built on first run,
see :mod:`examples.refund_policy`). The retriever runs in ENFORCE mode, so the tool returns only
passages the caller may read *and* the judge accepts.

Who is asking is bound with ``runtime_context(...)`` around ``agent.run()``: the model sees one
tool parameter, ``query``, and cannot search as anybody else.

The LLM: offline, a scripted function-calling model (:func:`scripted_llm`) that first calls
``search_knowledge`` with the user's question, then answers from what the tool returned. To use
a real model, pass any LlamaIndex ``FunctionCallingLLM`` instead, e.g.
``run_agent(retriever, user, question, llm=OpenAI(model="gpt-4o-mini"))`` after
``pip install llama-index-llms-openai`` (not a dependency of this project).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM

from examples.refund_policy import kb, store
from examples.refund_policy.ingest import ensure_collection
from examples.refund_policy.models import choose_embedding, choose_judge
from examples.refund_policy.query import aopen_index, open_retriever
from llama_jev import DecisionRecord, JevKnowledgeTool, JevRetriever, Mode, RuntimeContext, runtime_context
from llama_jev.tool import TOOL_NAME

SYSTEM_PROMPT = (
    "You answer customer questions from the knowledge base only. Call search_knowledge first. If it "
    "returns no passages, say that the knowledge base has no answer; if it fails, say the search failed."
)


def _latest_turn(messages: Sequence[ChatMessage]) -> tuple[str, list[ChatMessage]]:
    """The last user message and the tool results that came after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == MessageRole.USER:
            results = [message for message in messages[index + 1 :] if message.role == MessageRole.TOOL]
            return messages[index].content or "", results
    return "", []


def _answer_from(tool_output: str) -> str:
    """Compose the reply from a ``search_knowledge`` result (a list of {id, text}) or its error text."""
    try:
        passages = ast.literal_eval(tool_output)
    except (ValueError, SyntaxError):
        # Not a passage list: the tool raised, and the agent passed its message on.
        return f"I could not search the knowledge base ({tool_output}). Please try again later."
    if not passages:
        return "The knowledge base has no passage that answers this, so I cannot answer it from there."
    cited = "\n".join(f"- {passage['text']} [source {passage['id']}]" for passage in passages)
    return f"According to the knowledge base:\n{cited}"


def _scripted_turn(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
    question, tool_results = _latest_turn(messages)
    if not tool_results:
        call_id = f"call-{uuid.uuid4().hex[:8]}"
        call = ToolCallBlock(tool_call_id=call_id, tool_name=TOOL_NAME, tool_kwargs={"query": question})
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
    return ChatMessage(role=MessageRole.ASSISTANT, content=_answer_from(tool_results[-1].content or ""))


def scripted_llm() -> FunctionCallingLLM:
    """An offline function-calling LLM: search with the user's question, then answer from the result.

    Built on llama-index-core's own ``MockFunctionCallingLLM`` with a response generator, so the
    agent drives it through the same tool-calling path as a real model.
    """
    return MockFunctionCallingLLM(response_generator=_scripted_turn)


@dataclass
class ToolCallRecord:
    """One tool call the agent made: what the model asked for and what it got back."""

    name: str
    arguments: dict[str, Any]
    output: str
    is_error: bool
    passage_ids: list[str] = field(default_factory=list)


@dataclass
class AgentRun:
    """The agent's final answer and the tool calls that led to it."""

    answer: str
    tool_calls: list[ToolCallRecord]


async def run_agent(
    retriever: JevRetriever, user: kb.User, question: str, *, llm: FunctionCallingLLM | None = None
) -> AgentRun:
    """Run a ``FunctionAgent`` with ``search_knowledge`` for ``user``.

    The identity is bound before ``agent.run()`` starts: the workflow's tasks copy the context
    when they are created, so a binding made later would never reach the tool.
    """
    tool = JevKnowledgeTool(retriever, top_k=3).as_tool()
    agent = FunctionAgent(tools=[tool], llm=llm or scripted_llm(), system_prompt=SYSTEM_PROMPT)
    calls: list[ToolCallRecord] = []
    with runtime_context(user.context):
        handler = agent.run(user_msg=question)
        async for event in handler.stream_events():
            if isinstance(event, ToolCallResult):
                raw = event.tool_output.raw_output
                ids = [passage["id"] for passage in raw] if isinstance(raw, list) else []
                calls.append(
                    ToolCallRecord(
                        name=event.tool_name,
                        arguments=dict(event.tool_kwargs),
                        output=event.tool_output.content or "",
                        is_error=bool(event.tool_output.is_error),
                        passage_ids=ids,
                    )
                )
        response = await handler
    return AgentRun(answer=str(response), tool_calls=calls)


async def _run_all(storage: str | None, users: Sequence[kb.User], question: str) -> None:
    embedding = choose_embedding()
    judge = choose_judge(embedding.component)
    print(f"Vector store : {store.describe(store.client_options(storage))}")
    print(f"Embedding    : {embedding.label}")
    print(f"Judge        : {judge.label}")
    print("LLM          : scripted function-calling LLM (offline); pass any FunctionCallingLLM to run_agent(llm=...)")
    with store.connect(storage) as client:
        ensure_collection(client, embedding.component)  # no-op when the collection is already built
    seen: list[tuple[str, DecisionRecord]] = []

    def observe(ctx: RuntimeContext | None, record: DecisionRecord) -> None:
        seen.append((ctx.user_id if ctx is not None else "<none>", record))

    # Agents call tools asynchronously, so the store needs the async Qdrant client; one event loop
    # for every run, since a server client's connections belong to the loop that opened them.
    async with store.connect_async(storage) as async_client:
        index = await aopen_index(async_client, embedding.component)
        retriever = open_retriever(index, Mode.ENFORCE, judge.component, observer=observe)
        for user in users:
            seen.clear()
            print(f"\n=== agent run for {user.name} ({user.who}) ===")
            print(f"User asks: {question}")
            run = await run_agent(retriever, user, question)
            for call in run.tool_calls:
                keys = [kb.BY_ID[node_id].key for node_id in call.passage_ids]
                print(f"Tool call : {call.name}({call.arguments}) -> {'ERROR' if call.is_error else keys}")
            for user_id, record in seen:
                print(
                    f"Retrieval ran as: {user_id} (the bound RuntimeContext; the model passed no identity), "
                    f"judge status {record.status.value}"
                )
            print(f"Agent answer:\n{run.answer}")
    close = getattr(judge.component, "aclose", None)
    if callable(close):
        await close()


def main(argv: list[str] | None = None) -> int:
    """Ask the question as each user through the agent and print what happened."""
    parser = argparse.ArgumentParser(prog="python -m examples.agent_search_knowledge", description=__doc__)
    parser.add_argument("--storage", help=store.STORAGE_HELP)
    parser.add_argument("--question", default=kb.QUESTION)
    parser.add_argument("--user", action="append", choices=[user.name for user in kb.USERS])
    args = parser.parse_args(argv)
    names = args.user or ["alice", "sam"]
    users = [kb.USER_BY_NAME[name] for name in names]
    asyncio.run(_run_all(args.storage, users, args.question))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
