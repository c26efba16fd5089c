"""Shared pieces of the draft-review tests: a judge script, a scripted reviser, evidence nodes."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.schema import NodeWithScore, TextNode

from llama_jev import DecisionRecord, DraftReviewer, ExecutionOptions, JevClient, Mode, RetryPolicy
from llama_jev.review import GROUNDED_QUESTION, REVISION_PROMPT
from llama_jev.testing import SystemOneTestServer

from .conftest import API_KEY
from .support import marked_answer

QUERY = "Can I get a refund?"
POLICY = "Refunds are available for unused items returned within seven days of delivery."
DRAFT = "yes, you can always get a refund"
REVISION = "Yes: refunds are available for unused items returned within seven days of delivery."

_MARK = re.compile(r"\[p=([0-9.]+)\]")


def grounded(state: Any, answer: str) -> float:
    """The scripted review verdict: a ``[p=...]`` mark in the answer, else "does it keep the conditions"."""
    mark = _MARK.search(answer)
    if mark:
        return float(mark.group(1))
    evidence = " ".join(item["text"] for item in state.get("evidence", []))
    if "unused" in evidence and "seven days" in evidence:
        return 0.95 if "unused" in answer and "seven days" in answer else 0.05
    return 0.05


def review_answer(state: Any, question_id: str, instructions: Any) -> float:
    """Grounded-question requests are judged by :func:`grounded`, relevance requests by their marks."""
    if isinstance(instructions, dict) and instructions.get("question") == GROUNDED_QUESTION:
        return grounded(state, str(instructions["candidate"]))
    return marked_answer(state, question_id, instructions)


def client(server: SystemOneTestServer) -> JevClient:
    return JevClient(api_key=API_KEY, base_url=server.base_url, retry=RetryPolicy(max_retries=0))


def reviewer(
    server: SystemOneTestServer,
    mode: Mode,
    records: list[DecisionRecord] | None = None,
    *,
    budget: float = 5.0,
    **kwargs: Any,
) -> DraftReviewer:
    observer = None if records is None else (lambda ctx, record: records.append(record))
    options = ExecutionOptions(mode=mode, budget=budget, observer=observer, **kwargs)
    return DraftReviewer(client(server), options)


def evidence(*texts: str, metadata: dict[str, Any] | None = None) -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(id_=f"passage-{index}", text=text, metadata=dict(metadata or {})), score=0.5)
        for index, text in enumerate(texts)
    ]


def is_revision_request(messages: Sequence[ChatMessage]) -> bool:
    return bool(messages) and messages[0].role == MessageRole.SYSTEM and messages[0].content == REVISION_PROMPT


class Reviser:
    """A scripted reviser (LlamaIndex's ``MockFunctionCallingLLM``) that keeps what it was asked.

    ``reply(messages)`` gives the revision; by default the conditions are kept only when the
    evidence in the prompt states them, so a passing revision proves the evidence reached it.
    """

    def __init__(self, reply: Callable[[Sequence[ChatMessage]], ChatMessage] | None = None) -> None:
        self.calls: list[tuple[list[ChatMessage], dict[str, Any]]] = []
        self._reply = reply or keep_the_conditions
        self.llm = MockFunctionCallingLLM(response_generator=self._respond, is_chat_model=True)

    def _respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        self.calls.append((list(messages), dict(kwargs)))
        return self._reply(messages)


def keep_the_conditions(messages: Sequence[ChatMessage]) -> ChatMessage:
    prompt = messages[-1].content or ""
    evidence = prompt.split("Evidence:", 1)[1].split("Draft answer:", 1)[0]
    text = REVISION if "unused" in evidence and "seven days" in evidence else "Yes, you can get a refund."
    return ChatMessage(role=MessageRole.ASSISTANT, content=text)


def still_unconditional(messages: Sequence[ChatMessage]) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content="Yes, refunds are always possible.")


def empty_revision(messages: Sequence[ChatMessage]) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content="   ")


def tool_call_revision(messages: Sequence[ChatMessage]) -> ChatMessage:
    call = ToolCallBlock(tool_call_id="call-x", tool_name="search_knowledge", tool_kwargs={"query": "refund"})
    # The revised text and a tool call: the text alone would pass, the tool call makes it a failure.
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=[TextBlock(text=REVISION), call])


def records_json(records: Sequence[DecisionRecord]) -> str:
    return "\n".join(record.to_json() for record in records)
