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

Then the final-draft review (the seeds' offline example): a :class:`~llama_jev.JevReviewedAgent`
in ENFORCE whose scripted model first calls ``search_knowledge``, receives the refund policy in
its second call, and drafts an unconditional promise ("Yes, you can always get a refund."). The
review fails the draft, the model is asked to revise it from the evidence, the revision keeps
the conditions ("unused", "within seven days") and passes; then the withheld case, where the
revision still drops them. Offline, the review's decisions are a scripted rule
(:func:`grounding_rule`): they check the wiring and that the evidence reaches the judge and the
reviser, not how well a real judge decides. With ``TYPESAFE_API_KEY`` set, TypeSafe's Jev judges
the draft and the revision.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.agent.workflow import AgentStream, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM

from examples.plain_text import plain
from examples.refund_policy import kb, store
from examples.refund_policy.failures import EXIT_EVERY_JUDGEMENT_FAILED, watching_failures
from examples.refund_policy.ingest import ensure_collection
from examples.refund_policy.models import Choice, choose_embedding, choose_judge
from examples.refund_policy.query import aopen_index, open_retriever
from llama_jev import (
    DecisionRecord,
    DraftReviewer,
    ExecutionOptions,
    JevClient,
    JevKnowledgeTool,
    JevRetriever,
    JevReviewedAgent,
    Mode,
    ResponseWithheldError,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.retrieval.tool import TOOL_NAME
from llama_jev.review import REVISION_PROMPT
from llama_jev.systemone.client import DEFAULT_BASE_URL

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
        # Not a passage list: the tool raised, and the agent passed its message on. The user gets
        # what happened (the part before the advice meant for the model); only a failure whose
        # message says retrying may help earns "try again later" (an inconclusive judgement does not).
        later = " Please try again later." if "Retrying later may help" in tool_output else ""
        return f"I cannot answer this from the knowledge base ({tool_output.split(';')[0]}).{later}"
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


# --- the final-draft review: the seeds' offline example -----------------------------------------

REVIEW_QUESTION = "Can I get a refund?"
UNCONDITIONAL_DRAFT = "Yes, you can always get a refund."
# The conditions the scripted review rule checks: the refund policy's own.
CONDITIONS = ("unused", "seven days")
WITHHELD_MESSAGE = "I cannot give you a verified answer to that; please contact customer service."


def grounding_rule(state: Any, question_id: str, instructions: Any) -> float:
    """The offline review decision, a fixed rule (not Jev, not a model).

    The answer passes (0.95) when it keeps every condition in :data:`CONDITIONS` that the
    evidence states, and fails (0.05) when it drops one or there is no evidence.
    """
    answer = str(instructions.get("candidate", "")).lower() if isinstance(instructions, Mapping) else ""
    evidence = " ".join(str(item.get("text", "")) for item in state.get("evidence", [])).lower()
    if not evidence:
        return 0.05
    stated = [condition for condition in CONDITIONS if condition in evidence]
    return 0.95 if all(condition in answer for condition in stated) else 0.05


def choose_review_judge(environ: Mapping[str, str] | None = None) -> Choice:
    """TypeSafe's Jev with ``TYPESAFE_API_KEY``; otherwise the scripted :func:`grounding_rule`."""
    environ = os.environ if environ is None else environ
    if environ.get("TYPESAFE_API_KEY", "").strip():
        client = JevClient(api_key=environ["TYPESAFE_API_KEY"], base_url=environ.get("TYPESAFE_BASE_URL") or None)
        where = "TypeSafe's Jev" if client.base_url == DEFAULT_BASE_URL else "the System One server"
        return Choice(client, f"JevClient: {where} at {client.base_url}, asked the grounded question")
    return Choice(
        ScriptedJudge(grounding_rule, model="scripted-grounding-rule"),
        "ScriptedJudge: a fixed rule (keeps 'unused' and 'seven days'?), NOT Jev",
        "Scripted decisions check the wiring and that the evidence reaches the judge and the reviser, not "
        "live accuracy. Set TYPESAFE_API_KEY to have TypeSafe's Jev review the draft.",
    )


_EVIDENCE_LINE = re.compile(r"^\[([^\]]+)\] (.*)$")


class SeedsModel:
    """The seeds' scripted model: search, then an unconditional promise; revise when asked.

    ``keeps_conditions``: the revision quotes the first sentence of the first evidence passage about
    refunds (so it can only keep the conditions if the evidence reached it); otherwise it repeats
    the promise. Everything it is sent and writes is kept, for the printout.
    """

    def __init__(self, *, keeps_conditions: bool = True) -> None:
        self.keeps_conditions = keeps_conditions
        self.calls = 0
        self.received_ids: list[str] = []
        self.drafts: list[str] = []
        self.revision_evidence_ids: list[str] = []
        self.revisions: list[str] = []
        self.llm = MockFunctionCallingLLM(response_generator=self._respond, is_chat_model=True)

    def _respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        if messages and messages[0].content == REVISION_PROMPT:
            return ChatMessage(role=MessageRole.ASSISTANT, content=self._revise(messages[-1].content or ""))
        self.calls += 1
        question, tool_results = _latest_turn(messages)
        if not tool_results:
            call = ToolCallBlock(tool_call_id="call-1", tool_name=TOOL_NAME, tool_kwargs={"query": question})
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
        try:
            passages = ast.literal_eval(tool_results[-1].content or "[]")
        except (ValueError, SyntaxError):
            passages = []
        self.received_ids = [passage["id"] for passage in passages]
        self.drafts.append(UNCONDITIONAL_DRAFT)
        return ChatMessage(role=MessageRole.ASSISTANT, content=UNCONDITIONAL_DRAFT)

    def _revise(self, prompt: str) -> str:
        evidence = prompt.split("Evidence:\n", 1)[-1].split("\n\nDraft answer:", 1)[0]
        passages = [match.groups() for match in map(_EVIDENCE_LINE.match, evidence.splitlines()) if match]
        self.revision_evidence_ids = [node_id for node_id, _ in passages]
        about_refunds = [text for _, text in passages if "refund" in text.lower()]
        if self.keeps_conditions and about_refunds:
            sentence = about_refunds[0].split(". ")[0].rstrip(".")
            revision = f"Yes, under the refund policy: {sentence}."
        else:
            revision = "Yes, refunds are always possible."
        self.revisions.append(revision)
        return revision


@dataclass
class ReviewedRun:
    """What a reviewed agent run published (or why it withheld), and what the user was streamed."""

    answer: str | None
    withheld: ResponseWithheldError | None
    streamed: list[str]
    records: list[DecisionRecord]
    tool_calls: list[str] = field(default_factory=list)


async def run_reviewed_agent(
    retriever: JevRetriever, user: kb.User, question: str, judge: Any, model: SeedsModel
) -> ReviewedRun:
    """Run a :class:`JevReviewedAgent` in ENFORCE with ``search_knowledge`` for ``user``."""
    records: list[DecisionRecord] = []
    options = ExecutionOptions(
        mode=Mode.ENFORCE, budget=5.0, version="refund-review-example-v1", observer=lambda c, r: records.append(r)
    )
    agent = JevReviewedAgent(
        reviewer=DraftReviewer(judge, options),
        tools=[JevKnowledgeTool(retriever, top_k=3).as_tool()],
        llm=model.llm,
        system_prompt=SYSTEM_PROMPT,
    )
    run = ReviewedRun(None, None, [], records)
    with runtime_context(user.context):
        handler = agent.run(user_msg=question)
        try:
            async for event in handler.stream_events():
                if isinstance(event, AgentStream):
                    run.streamed.append(event.delta)
                elif isinstance(event, ToolCallResult):
                    run.tool_calls.append(f"{event.tool_name}({dict(event.tool_kwargs)})")
            run.answer = str(await handler)
        except ResponseWithheldError as error:
            run.withheld = error
    return run


def _verdicts(records: Sequence[DecisionRecord]) -> str:
    parts = []
    for record in records:
        for candidate, p in record.scores.items():
            parts.append(f"{candidate} p={p:.2f} {'passes' if candidate in record.selected else 'fails'}")
        if not record.scores:
            parts.append(f"{record.status.value} ({record.reason.value})")
    return "; ".join(parts)


def _print_review(title: str, model: SeedsModel, run: ReviewedRun) -> None:
    print(f"\n=== final-draft review, ENFORCE: {title} ===")
    print(f"User asks: {REVIEW_QUESTION}")
    print(f"Model call 1 -> tool call: {', '.join(run.tool_calls)}")
    received = [kb.BY_ID[node_id].key for node_id in model.received_ids]
    print(f"Model call 2 received from {TOOL_NAME}: {received}")
    for draft in model.drafts:
        print(f"Model draft (kept by the scripted model; never streamed): {draft}")
    for revision in model.revisions:
        given = [kb.BY_ID[node_id].key for node_id in model.revision_evidence_ids]
        print(f"Reviser was given the draft and the evidence {given}; its revision: {revision}")
    print(f"Review decisions (record: ids and p only): {_verdicts(run.records)}")
    print(f"Streamed to the user: {run.streamed}")
    if run.withheld is not None:
        error = run.withheld
        print(f"WITHHELD: ResponseWithheldError(reason={error.reason}, revisions={error.revisions})")
        print(f"  {error}")
        print(f"The user is told: {WITHHELD_MESSAGE}")
    else:
        print(f"Published answer: {run.answer}")


async def _review_demo(retriever: JevRetriever, user: kb.User, judge: Choice) -> None:
    print(f"\nReview judge : {judge.label}")
    if judge.note:
        print(f"               {judge.note}")
    revised = SeedsModel(keeps_conditions=True)
    run = await run_reviewed_agent(retriever, user, REVIEW_QUESTION, judge.component, revised)
    _print_review(f"{user.name}, the draft is revised and passes", revised, run)
    stubborn = SeedsModel(keeps_conditions=False)
    run = await run_reviewed_agent(retriever, user, REVIEW_QUESTION, judge.component, stubborn)
    _print_review(f"{user.name}, the revision still drops the conditions", stubborn, run)


async def _run_all(storage: str | None, users: Sequence[kb.User], question: str) -> str | None:
    """Run every user's agent and the review demo; the line saying why, when every judgement failed."""
    embedding = choose_embedding()
    judge = choose_judge()
    print(f"Vector store : {store.describe(store.client_options(storage))}")
    print(f"Embedding    : {embedding.label}")
    print(f"Judge        : {judge.label}")
    print("LLM          : scripted function-calling LLM (offline); pass any FunctionCallingLLM to run_agent(llm=...)")
    with store.connect(storage) as client:
        ensure_collection(client, embedding.component)  # no-op when the collection is already built
    seen: list[tuple[str, DecisionRecord]] = []
    every_record: list[DecisionRecord] = []
    tool_errors: list[str] = []

    def observe(ctx: RuntimeContext | None, record: DecisionRecord) -> None:
        seen.append((ctx.user_id if ctx is not None else "<none>", record))
        every_record.append(record)

    # Agents call tools asynchronously, so the store needs the async Qdrant client; one event loop
    # for every run, since a server client's connections belong to the loop that opened them.
    with watching_failures() as failures:
        async with store.connect_async(storage) as async_client:
            index = await aopen_index(async_client, embedding.component)
            retriever = open_retriever(index, Mode.ENFORCE, judge.component, observer=observe)
            for user in users:
                seen.clear()
                print(f"\n=== agent run for {user.name} ({user.who}) ===")
                print(f"User asks: {question}")
                run = await run_agent(retriever, user, question)
                for call in run.tool_calls:
                    if call.is_error:
                        tool_errors.append(call.output)
                    keys = [kb.BY_ID[node_id].key for node_id in call.passage_ids]
                    print(f"Tool call : {call.name}({call.arguments}) -> {'ERROR' if call.is_error else keys}")
                for user_id, record in seen:
                    print(
                        f"Retrieval ran as: {user_id} (the bound RuntimeContext; the model passed no identity), "
                        f"judge status {record.status.value}"
                    )
                print(f"Agent answer:\n{run.answer}")
            review_judge = choose_review_judge()
            await _review_demo(retriever, users[0], review_judge)
    for component in (judge.component, review_judge.component):
        close = getattr(component, "aclose", None)
        if callable(close):
            await close()
    return failures.every_judgement_failed(every_record, tool_errors)


@store.reports_unreachable
def main(argv: list[str] | None = None) -> int:
    """Ask the question as each user through the agent and print what happened."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.agent_search_knowledge",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--storage", help=store.STORAGE_HELP)
    parser.add_argument("--question", default=kb.QUESTION)
    parser.add_argument("--user", action="append", choices=[user.name for user in kb.USERS])
    args = parser.parse_args(argv)
    names = args.user or ["alice", "sam"]
    users = [kb.USER_BY_NAME[name] for name in names]
    failed = asyncio.run(_run_all(args.storage, users, args.question))
    if failed is not None:
        print(f"\n{failed}", file=sys.stderr)
        return EXIT_EVERY_JUDGEMENT_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
