"""``JevKnowledgeTool``: a ``search_knowledge`` agent tool whose identity the model cannot set."""

from __future__ import annotations

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore
from llama_index.core.tools import FunctionTool

from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.context import current_runtime_context
from llama_jev.core.errors import MissingRuntimeContextError
from llama_jev.retrieval.evidence import record_evidence

__all__ = ["TOOL_DESCRIPTION", "TOOL_NAME", "JevKnowledgeTool"]

TOOL_NAME = "search_knowledge"
TOOL_DESCRIPTION = (
    "Search the knowledge base for passages that answer the query. Returns a list of passages, "
    "each {id, text}, that were judged relevant. An empty list means no supporting evidence was "
    "found: do not answer from the knowledge base then. An error means the search could not be "
    "completed; it does not mean there is no answer."
)


class JevKnowledgeTool:
    """Expose a retriever (typically a :class:`JevRetriever`) to an agent as ``search_knowledge``.

    The model sees one parameter, ``query``. Who is asking comes from the :class:`RuntimeContext`
    bound around the agent's ``run()``, never from tool arguments, so a model cannot search as
    somebody else. A judge failure or an inconclusive judgement is raised, which agents show the
    model as a tool error, never as an empty result. The passages it returns are added to the
    evidence collector bound for the run (see :func:`~llama_jev.retrieval.collect_evidence`), which is what
    :class:`~llama_jev.JevReviewedAgent` reviews the final answer against.

    Example:
        >>> tool = JevKnowledgeTool(jev_retriever, top_k=5).as_tool()  # doctest: +SKIP
        >>> agent = FunctionAgent(tools=[tool], llm=llm)  # doctest: +SKIP
        >>> with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme")):  # doctest: +SKIP
        ...     answer = await agent.run("What are the refund conditions?")
    """

    def __init__(self, retriever: BaseRetriever, top_k: int = 5) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError("retriever must be a LlamaIndex BaseRetriever (e.g. a JevRetriever)")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        self.retriever = retriever
        self.top_k = top_k

    def search(self, query: str) -> list[dict[str, str]]:
        """Passages relevant to ``query`` that the bound identity may read: ``[{"id", "text"}]``."""
        _check_query(query)
        _require_identity(self.retriever)  # no bound identity: fail here, before any retrieval
        return self._passages(self.retriever.retrieve(query))

    async def asearch(self, query: str) -> list[dict[str, str]]:
        """Async :meth:`search`."""
        _check_query(query)
        _require_identity(self.retriever)
        return self._passages(await self.retriever.aretrieve(query))

    def _passages(self, nodes: list[NodeWithScore]) -> list[dict[str, str]]:
        returned = nodes[: self.top_k]
        # What the model is shown is the evidence its answer is reviewed against (JevReviewedAgent).
        record_evidence(returned)
        return [{"id": node.node.node_id, "text": node.node.get_content()} for node in returned]

    def as_tool(self) -> FunctionTool:
        """The LlamaIndex ``FunctionTool`` named ``search_knowledge`` (sync and async)."""
        return FunctionTool.from_defaults(
            fn=self.search, async_fn=self.asearch, name=TOOL_NAME, description=TOOL_DESCRIPTION
        )


def _require_identity(retriever: BaseRetriever) -> None:
    try:
        current_runtime_context()
    except MissingRuntimeContextError:
        missing = True
    else:
        missing = False
    if missing:
        # Raised outside the except block: the generic error would only repeat "wrap the call",
        # which a user binding after agent.run() started believes they did.
        acl = getattr(retriever, "acl", None)
        tenant = (
            " (with tenant_id: this ACL checks a tenant)" if isinstance(acl, MetadataAcl) and acl.tenant_key else ""
        )
        raise MissingRuntimeContextError(
            f"{TOOL_NAME} ran with no RuntimeContext bound. An agent's tools see the identity bound "
            f"when agent.run() was called: bind it{tenant} before run() starts "
            "(`with runtime_context(ctx): handler = agent.run(...)`, then await the handler), not after."
        )


def _check_query(query: str) -> None:
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-blank string")
