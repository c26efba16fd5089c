"""JevRetriever, JevNodePostprocessor and search_knowledge inside real LlamaIndex machinery."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
from llama_index.core.chat_engine import CondensePlusContextChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.instrumentation.span import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.llms import MockLLM
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import IndexNode, MetadataMode, NodeWithScore, QueryBundle, TextNode

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    JevKnowledgeTool,
    JevNodePostprocessor,
    JevRetriever,
    MissingRuntimeContextError,
    Mode,
    RetrievalUnavailableError,
    RetryPolicy,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.engine import PROBABILITY_KEY, JevDecisionEvent
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .corpus import ACL, ALICE, BY_ID, DOCS, GINA, SAM, Doc, memory_index, names, qdrant_index, readable
from .support import marked, marked_answer

QUERY = "What are the refund conditions?"


def client(server: SystemOneTestServer) -> JevClient:
    return JevClient(api_key=API_KEY, base_url=server.base_url, retry=RetryPolicy(initial_backoff=0.01))


def selector(judge: Any, mode: Mode = Mode.ENFORCE, records: list[DecisionRecord] | None = None) -> CandidateSelector:
    observer = None if records is None else (lambda ctx, record: records.append(record))
    return CandidateSelector(judge, ExecutionOptions(mode=mode, budget=5.0, observer=observer))


class PromptCapturingLLM(MockLLM):
    """An offline LLM that remembers every prompt it was given (the answer generator's view)."""

    _prompts: list[str] = PrivateAttr(default_factory=list)

    @property
    def prompts(self) -> list[str]:
        return self._prompts

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self.prompts.append(prompt)
        return super().complete(prompt, formatted=formatted, **kwargs)

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        self.prompts.append(prompt)
        return await super().acomplete(prompt, formatted=formatted, **kwargs)


class FixedRetriever(BaseRetriever):
    """Returns the given nodes as they are (for duplicate ids and oversized candidate sets)."""

    def __init__(self, nodes: Sequence[NodeWithScore]) -> None:
        super().__init__()
        self.nodes = list(nodes)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return list(self.nodes)


class EventCollector(BaseEventHandler):
    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "EventCollector"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)


@pytest.fixture
def events() -> Any:
    collector = EventCollector()
    root = get_dispatcher()
    root.add_event_handler(collector)
    yield collector.events
    root.event_handlers.remove(collector)


# --- nodes intact -------------------------------------------------------------------------


def test_enforce_returns_copies_with_probability_and_leaves_the_docstore_untouched(
    jev_server: SystemOneTestServer,
) -> None:
    index = memory_index()
    inner = index.as_retriever(similarity_top_k=10)
    with runtime_context(ALICE):
        upstream = {node.node.node_id: node for node in inner.retrieve(QUERY)}
        nodes = JevRetriever(inner, selector(client(jev_server)), ACL).retrieve(QUERY)
    assert names(nodes) == ["acme-refund", "acme-alice-note"]
    for node in nodes:
        original = upstream[node.node.node_id]
        assert node.score == original.score
        assert node.node.get_content() == original.node.get_content()
        assert node.node.embedding == original.node.embedding
        assert node.node.metadata == {**original.node.metadata, PROBABILITY_KEY: BY_ID[node.node.node_id].p}
        assert PROBABILITY_KEY not in node.node.get_content(metadata_mode=MetadataMode.LLM)
        assert PROBABILITY_KEY not in node.node.get_content(metadata_mode=MetadataMode.EMBED)
        stored = index.docstore.get_node(node.node.node_id)
        assert PROBABILITY_KEY not in stored.metadata
        assert PROBABILITY_KEY not in original.node.metadata


def test_enforce_never_mutates_the_upstream_node_objects() -> None:
    # FixedRetriever hands out the very objects it holds (as a docstore cache would).
    upstream = [NodeWithScore(node=doc.node(), score=0.5 + i / 100) for i, doc in enumerate(DOCS)]
    before = [
        (
            n.node.metadata.copy(),
            list(n.node.excluded_llm_metadata_keys),
            list(n.node.excluded_embed_metadata_keys),
            n.score,
        )
        for n in upstream
    ]
    retriever = JevRetriever(FixedRetriever(upstream), selector(ScriptedJudge(marked_answer)), ACL)
    with runtime_context(ALICE):
        nodes = retriever.retrieve(QUERY)
    assert names(nodes) == ["acme-refund", "acme-alice-note"]
    for node in nodes:
        original = next(n for n in upstream if n.node.node_id == node.node.node_id)
        assert node.node is not original.node
        assert node.score == original.score
        assert PROBABILITY_KEY in node.node.excluded_llm_metadata_keys
    after = [
        (n.node.metadata, n.node.excluded_llm_metadata_keys, n.node.excluded_embed_metadata_keys, n.score)
        for n in upstream
    ]
    assert after == before


def test_shadow_keeps_serving_when_a_node_is_too_large_and_enforce_says_why() -> None:
    huge = NodeWithScore(
        node=TextNode(id_="huge", text="refund " * 40_000, metadata={"tenant": "acme", "public": "true"}), score=1.0
    )
    small = NodeWithScore(node=DOCS[0].node(), score=0.9)
    records: list[DecisionRecord] = []
    shadow = JevRetriever(
        FixedRetriever([huge, small]), selector(ScriptedJudge(marked_answer), Mode.SHADOW, records), ACL
    )
    with runtime_context(ALICE):
        assert [n.node.node_id for n in shadow.retrieve(QUERY)] == ["huge", DOCS[0].id]
        enforce = JevRetriever(FixedRetriever([huge, small]), selector(ScriptedJudge(marked_answer)), ACL)
        with pytest.raises(RetrievalUnavailableError, match="too large") as caught:
            enforce.retrieve(QUERY)
    assert caught.value.reason == "CANDIDATE_TOO_LARGE"
    assert [r.reason.value for r in records] == ["CANDIDATE_TOO_LARGE"]


def test_index_nodes_are_not_expanded_behind_the_acl() -> None:
    secret = TextNode(id_="behind", text="PRIVATE-COMPENSATION via an index node", metadata={"tenant": "acme"})
    pointer = IndexNode(
        id_="pointer",
        text="[p=0.9] pointer",
        index_id="x",
        obj=FixedRetriever([NodeWithScore(node=secret, score=1.0)]),
        metadata={"tenant": "acme", "public": "true"},
    )
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=pointer, score=1.0)]), selector(ScriptedJudge(marked_answer)), ACL
    )
    with runtime_context(ALICE):
        result = retriever.retrieve(QUERY)
    assert all("PRIVATE" not in n.node.get_content() for n in result)


def test_judge_receives_node_content_without_metadata(jev_server: SystemOneTestServer) -> None:
    inner = memory_index().as_retriever(similarity_top_k=10)
    with runtime_context(SAM):
        JevRetriever(inner, selector(client(jev_server)), ACL).retrieve(QUERY)
    sent = jev_server.received_text()
    assert "Refund policy: refunds for unused items" in sent
    assert "ACLFIELD-" not in sent
    assert "support" not in sent.replace("ALICE", "")


# BaseRetriever.retrieve already drops repeated ids, so duplicates reach us through the postprocessor.
@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
def test_duplicate_node_ids_are_a_value_error(mode: Mode) -> None:
    node = NodeWithScore(node=DOCS[0].node(), score=1.0)
    post = JevNodePostprocessor(selector(ScriptedJudge(marked_answer), mode), ACL)
    with pytest.raises(ValueError, match="duplicate"):
        post.postprocess_nodes([node, node], query_str=QUERY, ctx=ALICE)


def test_duplicates_pass_through_off() -> None:
    node = NodeWithScore(node=DOCS[0].node(), score=1.0)
    post = JevNodePostprocessor(selector(ScriptedJudge(marked_answer), Mode.OFF), ACL)
    assert len(post.postprocess_nodes([node, node], query_str=QUERY, ctx=ALICE)) == 2


@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
def test_more_than_1024_authorized_candidates_is_a_value_error(mode: Mode) -> None:
    nodes = [
        NodeWithScore(node=TextNode(id_=f"n{i}", text="x", metadata={"tenant": "acme", "public": "true"}), score=1.0)
        for i in range(1025)
    ]
    retriever = JevRetriever(FixedRetriever(nodes), selector(ScriptedJudge(marked_answer), mode), ACL)
    with runtime_context(ALICE), pytest.raises(ValueError, match="1024"):
        retriever.retrieve(QUERY)


def test_acl_that_raises_fails_the_retrieval() -> None:
    def broken_acl(ctx: RuntimeContext, node: Any) -> bool:
        raise KeyError("acl backend down")

    inner = memory_index().as_retriever(similarity_top_k=3)
    for mode in Mode:
        retriever = JevRetriever(inner, selector(ScriptedJudge(marked_answer), mode), broken_acl)
        with runtime_context(ALICE), pytest.raises(KeyError, match="acl backend down"):
            retriever.retrieve(QUERY)


def test_missing_identity_is_an_error_and_explicit_ctx_works() -> None:
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(ScriptedJudge(marked_answer)), ACL
    )
    with pytest.raises(MissingRuntimeContextError):
        retriever.retrieve(QUERY)
    assert names(retriever.retrieve(QUERY, ctx=GINA)) == ["globex-refund"]


@pytest.mark.parametrize(
    ("candidate_limit", "top_k", "message"), [(0, 5, "candidate_limit"), (1025, 5, "candidate_limit"), (20, 0, "top_k")]
)
def test_limits_are_validated(candidate_limit: int, top_k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JevRetriever(memory_index().as_retriever(), selector(ScriptedJudge(marked_answer)), ACL, candidate_limit, top_k)


# --- recall expansion ---------------------------------------------------------------------

MANY = tuple(Doc(f"acme-doc-{i:02d}", 0.9, f"refund conditions passage {i}", "acme", public=True) for i in range(40))


@pytest.mark.parametrize(
    ("mode", "recalled", "judged"), [(Mode.OFF, 5, 0), (Mode.SHADOW, 5, 5), (Mode.ENFORCE, 20, 20)]
)
async def test_recall_expansion_per_mode(
    jev_server: SystemOneTestServer, events: list[BaseEvent], mode: Mode, recalled: int, judged: int
) -> None:
    inner = memory_index(MANY).as_retriever(similarity_top_k=5)
    retriever = JevRetriever(inner, selector(client(jev_server), mode), ACL, candidate_limit=20, top_k=5)
    jev_server.set_answer(lambda *args: 0.9)
    with runtime_context(ALICE):
        sync_nodes = retriever.retrieve(QUERY)
        async_nodes = await retriever.aretrieve(QUERY)
    ends = [len(e.nodes) for e in events if isinstance(e, RetrievalEndEvent)]
    assert ends == [recalled, 5, recalled, 5]  # inner retrieval, then ours: sync and async
    assert len(sync_nodes) == len(async_nodes) == 5
    assert [len(r.json["questions"]) for r in jev_server.requests] == [judged] * (2 if judged else 0)  # type: ignore[index]
    assert inner.similarity_top_k == 5  # the caller's retriever is never mutated


class SpanCollector(BaseSpanHandler[SimpleSpan]):
    """Records the id of every span entered (``JevRetriever.retrieve-<uuid>``, ...)."""

    entered: list[str] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "SpanCollector"

    def new_span(
        self,
        id_: str,
        bound_args: Any,
        instance: Any = None,
        parent_span_id: str | None = None,
        tags: Any = None,
        **kwargs: Any,
    ) -> SimpleSpan:
        self.entered.append(id_)
        return SimpleSpan(id_=id_, parent_id=parent_span_id, tags=tags or {})

    def prepare_to_exit_span(
        self, id_: str, bound_args: Any, instance: Any = None, result: Any = None, **kwargs: Any
    ) -> SimpleSpan | None:
        return None

    def prepare_to_drop_span(
        self, id_: str, bound_args: Any, instance: Any = None, err: BaseException | None = None, **kwargs: Any
    ) -> SimpleSpan | None:
        return None


@pytest.mark.parametrize("heard_by", ["spans", "events"])
@pytest.mark.parametrize("use_async", [False, True])
async def test_a_handler_added_later_hears_the_retriever_that_nobody_heard_before(
    use_async: bool, heard_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nobody listening the retriever skips LlamaIndex's span and events around itself (a
    cost for no one); the moment a span handler or an event handler is added, they are there again."""
    method = "aretrieve" if use_async else "retrieve"
    through_base: list[str] = []
    original = getattr(BaseRetriever, method)

    def counted(self: BaseRetriever, *args: Any, **kwargs: Any) -> Any:
        through_base.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BaseRetriever, method, counted)
    retriever = JevRetriever(
        memory_index(MANY).as_retriever(similarity_top_k=5), selector(ScriptedJudge(lambda *a: 0.9)), ACL, top_k=2
    )

    async def retrieve() -> list[NodeWithScore]:
        with runtime_context(ALICE):
            return await retriever.aretrieve(QUERY) if use_async else retriever.retrieve(QUERY)

    unheard = await retrieve()
    assert through_base == ["VectorIndexRetriever"]  # ours skipped LlamaIndex's layer: nobody listens
    root = get_dispatcher()
    events, spans = EventCollector(), SpanCollector()
    if heard_by == "spans":
        root.add_span_handler(spans)
    else:
        root.add_event_handler(events)
    try:
        heard = await retrieve()
    finally:
        if heard_by == "spans":
            root.span_handlers.remove(spans)
        else:
            root.event_handlers.remove(events)

    assert through_base[1:] == ["JevRetriever", "VectorIndexRetriever"]
    assert [n.node.node_id for n in unheard] == [n.node.node_id for n in heard]
    assert len(heard) == 2
    if heard_by == "spans":
        ours = [id_.rsplit("-", 5)[0] for id_ in spans.entered if id_.startswith("JevRetriever.")]
        assert ours == [f"JevRetriever.{method}", "JevRetriever.judge"]
    else:
        ends = [len(e.nodes) for e in events.events if isinstance(e, RetrievalEndEvent)]
        assert ends == [20, 2]  # the wrapped retriever's, then ours


def test_a_legacy_callback_handler_still_gets_the_retrievers_retrieve_event() -> None:
    debug = LlamaDebugHandler()
    inner = memory_index(MANY).as_retriever(similarity_top_k=5)
    retriever = JevRetriever(
        inner, selector(ScriptedJudge(lambda *a: 0.9)), ACL, top_k=2, callback_manager=CallbackManager([debug])
    )
    with runtime_context(ALICE):
        nodes = retriever.retrieve(QUERY)

    pairs = debug.get_event_pairs(CBEventType.RETRIEVE)
    assert len(nodes) == 2
    assert [len(end.payload[EventPayload.NODES]) for _, end in pairs] == [
        2
    ]  # ours (the wrapped one has its own manager)


async def test_concurrent_queries_with_different_k_do_not_interfere(jev_server: SystemOneTestServer) -> None:
    inner = memory_index(MANY).as_retriever(similarity_top_k=5)
    enforce = JevRetriever(inner, selector(ScriptedJudge(lambda *a: 0.9)), ACL, candidate_limit=30, top_k=5)
    off = JevRetriever(inner, selector(ScriptedJudge(lambda *a: 0.9), Mode.OFF), ACL, top_k=3)
    with runtime_context(ALICE):
        results = await asyncio.gather(*(r.aretrieve(QUERY) for r in [enforce, off] * 20))
    assert [len(nodes) for nodes in results] == [5, 3] * 20
    assert inner.similarity_top_k == 5


# --- two users at once ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(Mode))
async def test_two_users_concurrently_get_only_their_own_documents(jev_server: SystemOneTestServer, mode: Mode) -> None:
    # One index shared by asyncio tasks and threads at once (Qdrant local mode cannot serve a sync
    # and an async client from one folder; the Qdrant paths are covered by the matrix).
    index = memory_index()
    jev_server.set_answer(marked_answer)
    jev_server.set_latency(0.01)
    retriever = JevRetriever(index.as_retriever(similarity_top_k=10), selector(client(jev_server), mode), ACL, top_k=10)
    users = {"alice": ALICE, "sam": SAM, "gina": GINA}

    async def one(user: str, i: int) -> tuple[str, list[str]]:
        with runtime_context(users[user]):
            nodes = await retriever.aretrieve(f"{QUERY} (asked by {user} #{i})")
        return user, names(nodes)

    def threaded(user: str, i: int) -> tuple[str, list[str]]:
        with runtime_context(users[user]):
            return user, names(retriever.retrieve(f"{QUERY} (asked by {user} #{i})"))

    tasks = [one(user, i) for i in range(25) for user in ("alice", "gina")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(threaded, user, i) for i in range(10) for user in ("sam", "alice")]
        results = await asyncio.gather(*tasks)
        results += [future.result() for future in futures]
    assert len(results) == 70
    for user, got in results:
        assert got, user
        assert set(got) <= readable(users[user]), user
    # Every request the judge received carried only text the asking user may read.
    for recorded in jev_server.requests:
        body = recorded.json
        assert body is not None
        user = body["state"].split("asked by ")[1].split(" ")[0]
        allowed_texts = {marked(doc.p, doc.text) for doc in DOCS if doc.name in readable(users[user])}
        sent = {question["instructions"]["candidate"] for question in body["questions"].values()}
        assert sent <= allowed_texts, user
    assert ("GLOBEX" in jev_server.received_text()) == (mode is not Mode.OFF)


def test_context_follows_copied_context_into_threads() -> None:
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(ScriptedJudge(marked_answer)), ACL
    )
    with runtime_context(GINA), concurrent.futures.ThreadPoolExecutor(2) as pool:
        result = pool.submit(contextvars.copy_context().run, retriever.retrieve, QUERY).result()
    assert names(result) == ["globex-refund"]


# --- pushdown -------------------------------------------------------------------------------


def test_prefilter_fills_the_candidate_limit_when_most_of_the_collection_is_another_tenant(tmp_path: Path) -> None:
    mine = tuple(Doc(f"acme-{i:03d}", 0.9, f"refund conditions note {i}", "acme", public=True) for i in range(10))
    theirs = tuple(Doc(f"other-{i:03d}", 0.9, f"refund conditions note {i}", "globex", public=True) for i in range(190))
    index, qdrant = qdrant_index(tmp_path / "qdrant", mine + theirs)
    judge = ScriptedJudge(lambda *a: 0.9)
    counts = {}
    for prefilter in (False, True):
        retriever = JevRetriever(
            index.as_retriever(similarity_top_k=5),
            selector(judge),
            ACL,
            candidate_limit=10,
            top_k=10,
            prefilter=prefilter,
        )
        before = len(judge.requests)
        with runtime_context(ALICE):
            nodes = retriever.retrieve(QUERY)
        assert set(names_of(nodes)) <= {doc.name for doc in mine}
        judged = sum(len(r.questions) for r in judge.requests[before:])
        counts[prefilter] = judged
    qdrant.close()
    assert counts[True] == 10
    # Without pushdown the store is asked again, with a wider window, until 10 readable are found.
    assert counts[False] == 10


def names_of(nodes: Sequence[NodeWithScore]) -> list[str]:
    return [str(node.node.metadata["name"]) for node in nodes]


def test_from_index_on_the_in_memory_store_prefilters(jev_server: SystemOneTestServer) -> None:
    retriever = JevRetriever.from_index(memory_index(), selector(client(jev_server)), ACL, top_k=10)
    assert retriever.prefilter is True
    with runtime_context(ALICE):
        assert names(retriever.retrieve(QUERY)) == ["acme-refund", "acme-alice-note"]


def test_from_index_on_qdrant_prefilters(jev_server: SystemOneTestServer, tmp_path: Path) -> None:
    index, qdrant = qdrant_index(tmp_path / "qdrant")
    retriever = JevRetriever.from_index(index, selector(client(jev_server)), ACL, top_k=10)
    with runtime_context(SAM):
        result = names(retriever.retrieve(QUERY))
    qdrant.close()
    assert retriever.prefilter is True
    assert result == ["acme-refund", "acme-compensation"]


def test_prefilter_on_the_in_memory_store_expresses_any_metadata_acl() -> None:
    # A node-id restriction computed by the ACL itself: tenant AND (users OR roles OR public) works.
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(ScriptedJudge(marked_answer)), ACL, prefilter=True
    )
    with runtime_context(ALICE):
        assert names(retriever.retrieve(QUERY)) == ["acme-refund", "acme-alice-note"]


def test_prefilter_requires_a_metadata_acl() -> None:
    with pytest.raises(TypeError, match="MetadataAcl"):
        JevRetriever(
            memory_index().as_retriever(), selector(ScriptedJudge(marked_answer)), lambda c, n: True, prefilter=True
        )


# --- query engines, chat engines, instrumentation -----------------------------------------


@pytest.mark.parametrize("use_async", [False, True])
async def test_query_engine_answer_generator_sees_only_enforced_nodes(
    jev_server: SystemOneTestServer, use_async: bool
) -> None:
    llm = PromptCapturingLLM()
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    with runtime_context(ALICE):
        response = await engine.aquery(QUERY) if use_async else engine.query(QUERY)
    assert names(response.source_nodes) == ["acme-refund", "acme-alice-note"]
    prompt = "\n".join(llm.prompts)
    assert "Refund policy: refunds for unused items" in prompt
    assert "ALICE-ONLY" in prompt
    for hidden in ("PRIVATE-COMPENSATION", "GLOBEX", "Shipping policy", "Office hours", PROBABILITY_KEY):
        assert hidden not in prompt


@pytest.mark.parametrize("use_async", [False, True])
async def test_postprocessor_in_as_query_engine(jev_server: SystemOneTestServer, use_async: bool) -> None:
    llm = PromptCapturingLLM()
    records: list[DecisionRecord] = []
    post = JevNodePostprocessor(selector(client(jev_server), records=records), ACL, top_n=1)
    engine = memory_index().as_query_engine(similarity_top_k=10, node_postprocessors=[post], llm=llm)
    with runtime_context(SAM):
        response = await engine.aquery(QUERY) if use_async else engine.query(QUERY)
    assert names(response.source_nodes) == ["acme-refund"]
    assert "PRIVATE-COMPENSATION" not in "\n".join(llm.prompts)
    assert len(records) == 1
    assert BY_ID[records[0].selected[1]].name == "acme-compensation"


def test_postprocessor_with_explicit_ctx_and_class_name() -> None:
    post = JevNodePostprocessor(selector(ScriptedJudge(marked_answer)), ACL)
    nodes = [NodeWithScore(node=doc.node(), score=1.0) for doc in DOCS]
    assert names(post.postprocess_nodes(nodes, query_str=QUERY, ctx=GINA)) == ["globex-refund"]
    assert JevNodePostprocessor.class_name() == "JevNodePostprocessor"
    with pytest.raises(MissingRuntimeContextError):
        post.postprocess_nodes(nodes, query_str=QUERY)


def test_postprocessor_judge_failure_is_unavailable_not_empty(jev_server: SystemOneTestServer) -> None:
    jev_server.inject_always(Fault.status(503))
    post = JevNodePostprocessor(selector(client(jev_server)), ACL)
    nodes = [NodeWithScore(node=doc.node(), score=1.0) for doc in DOCS]
    with pytest.raises(RetrievalUnavailableError):
        post.postprocess_nodes(nodes, query_str=QUERY, ctx=ALICE)


async def test_chat_engine_context_holds_only_enforced_nodes(jev_server: SystemOneTestServer) -> None:
    llm = PromptCapturingLLM()
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    engine = CondensePlusContextChatEngine.from_defaults(retriever=retriever, llm=llm)
    with runtime_context(ALICE):
        response = await engine.achat(QUERY)
        engine.chat("And for opened items?")
    assert names(response.source_nodes) == ["acme-refund", "acme-alice-note"]
    assert all("PRIVATE-COMPENSATION" not in p and "GLOBEX" not in p for p in llm.prompts)


def test_decision_record_is_an_instrumentation_event(jev_server: SystemOneTestServer, events: list[BaseEvent]) -> None:
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    with runtime_context(ALICE):
        retriever.retrieve(QUERY)
    decisions = [event for event in events if isinstance(event, JevDecisionEvent)]
    assert len(decisions) == 1
    assert [BY_ID[i].name for i in decisions[0].record.selected] == ["acme-refund", "acme-alice-note"]
    assert JevRetriever.class_name() == "JevRetriever"


# --- the agent tool -------------------------------------------------------------------------


def scripted_agent_llm(tool_kwargs: dict[str, Any]) -> MockFunctionCallingLLM:
    """A function-calling LLM that calls search_knowledge once, then answers with what it got."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        tool_results = [m for m in messages if m.role == MessageRole.TOOL]
        if not tool_results:
            call = ToolCallBlock(tool_call_id="call-1", tool_name="search_knowledge", tool_kwargs=tool_kwargs)
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"ANSWER FROM: {tool_results[-1].content}")

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def knowledge_tool(server: SystemOneTestServer) -> Any:
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(server)), ACL)
    return JevKnowledgeTool(retriever, top_k=5).as_tool()


def test_tool_exposes_only_the_query_parameter(jev_server: SystemOneTestServer) -> None:
    tool = knowledge_tool(jev_server)
    assert tool.metadata.name == "search_knowledge"
    assert json.loads(tool.metadata.fn_schema_str)["properties"].keys() == {"query"}
    assert "no supporting evidence" in tool.metadata.description


async def test_agent_calls_search_knowledge_for_the_bound_user(jev_server: SystemOneTestServer) -> None:
    agent = FunctionAgent(tools=[knowledge_tool(jev_server)], llm=scripted_agent_llm({"query": QUERY}))
    with runtime_context(ALICE):
        answer = str(await agent.run(QUERY))
    assert "Refund policy: refunds for unused items" in answer
    assert "ALICE-ONLY" in answer
    assert "PRIVATE-COMPENSATION" not in answer
    assert "GLOBEX" not in answer


async def test_agent_naming_another_user_in_the_query_still_searches_as_the_bound_user(
    jev_server: SystemOneTestServer,
) -> None:
    llm = scripted_agent_llm({"query": "refund conditions; I am sam from support, user_id=sam, tenant globex"})
    agent = FunctionAgent(tools=[knowledge_tool(jev_server)], llm=llm)
    with runtime_context(ALICE):
        answer = str(await agent.run(QUERY))
    assert jev_server.request_count > 0  # the search really ran
    assert "ALICE-ONLY" in answer  # ... as alice
    assert "PRIVATE-COMPENSATION" not in answer
    assert "GLOBEX" not in answer
    assert "PRIVATE-COMPENSATION" not in jev_server.received_text()
    assert "GLOBEX" not in jev_server.received_text()


async def test_agent_identity_arguments_are_refused_not_used(jev_server: SystemOneTestServer) -> None:
    attempt = {"query": QUERY, "user_id": "sam", "roles": ["support"], "tenant_id": "globex"}
    agent = FunctionAgent(tools=[knowledge_tool(jev_server)], llm=scripted_agent_llm(attempt))
    with runtime_context(ALICE):
        answer = str(await agent.run(QUERY))
    assert "unexpected keyword argument" in answer  # the model is told its call was wrong
    assert jev_server.request_count == 0
    assert "PRIVATE-COMPENSATION" not in answer
    assert "GLOBEX" not in answer


async def test_agent_sees_a_judge_failure_as_a_tool_error(jev_server: SystemOneTestServer) -> None:
    jev_server.inject_always(Fault.status(500))
    agent = FunctionAgent(tools=[knowledge_tool(jev_server)], llm=scripted_agent_llm({"query": QUERY}))
    handler_events = []
    with runtime_context(ALICE):
        handler = agent.run(QUERY)
        async for event in handler.stream_events():
            handler_events.append(event)
        answer = str(await handler)
    results = [e for e in handler_events if type(e).__name__ == "ToolCallResult"]
    assert len(results) == 1
    assert results[0].tool_output.is_error
    assert "relevance judge failed" in answer
    assert "[]" not in answer


async def test_agent_sees_an_inconclusive_judgement_as_a_tool_error_saying_what_to_do(
    jev_server: SystemOneTestServer,
) -> None:
    jev_server.set_answer(lambda *args: 0.5)  # every passage uncertain: nothing selected
    agent = FunctionAgent(tools=[knowledge_tool(jev_server)], llm=scripted_agent_llm({"query": QUERY}))
    with runtime_context(ALICE):
        answer = str(await agent.run(QUERY))
    # The model reads the error's message: not "no evidence", not "try again", and no passage.
    assert "not an empty result" in answer
    assert "do not answer from it" in answer
    assert "Retrying the same query is unlikely to help" in answer
    assert "[]" not in answer
    assert "Refund policy: refunds for unused items" not in answer


def test_tool_without_bound_identity_fails(jev_server: SystemOneTestServer) -> None:
    tool = knowledge_tool(jev_server)
    with pytest.raises(MissingRuntimeContextError):
        tool.call(query=QUERY)
    assert jev_server.request_count == 0


async def test_tool_async_returns_id_and_text(jev_server: SystemOneTestServer) -> None:
    tool = knowledge_tool(jev_server)
    with runtime_context(GINA):
        output = await tool.acall(query=QUERY)
    assert output.raw_output == [{"id": BY_ID_NAME["globex-refund"], "text": marked(0.95, DOCS[5].text)}]


BY_ID_NAME = {doc.name: doc.id for doc in DOCS}


# --- other retrievers -----------------------------------------------------------------------


def test_bm25_retriever_gets_recall_expansion_without_being_mutated() -> None:
    from llama_index.retrievers.bm25 import BM25Retriever

    bm25 = BM25Retriever.from_defaults(nodes=[doc.node() for doc in MANY], similarity_top_k=5)
    judge = ScriptedJudge(lambda *a: 0.9)
    retriever = JevRetriever(bm25, selector(judge), ACL, candidate_limit=20)
    with runtime_context(ALICE):
        nodes = retriever.retrieve("refund conditions")
    assert len(judge.requests[0].questions) == 20
    assert len(nodes) == 5
    assert bm25.similarity_top_k == 5


async def test_hybrid_fusion_retriever_is_wrapped_as_it_is(jev_server: SystemOneTestServer) -> None:
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.retrievers.bm25 import BM25Retriever

    index = memory_index()
    bm25 = BM25Retriever.from_defaults(nodes=[doc.node() for doc in DOCS], similarity_top_k=10)
    hybrid = QueryFusionRetriever(
        [index.as_retriever(similarity_top_k=10), bm25],
        similarity_top_k=10,
        num_queries=1,
        mode="reciprocal_rerank",
        llm=MockLLM(),
    )
    retriever = JevRetriever(hybrid, selector(client(jev_server)), ACL)
    with runtime_context(SAM):
        assert names(await retriever.aretrieve(QUERY)) == ["acme-refund", "acme-compensation"]
    assert "GLOBEX" not in jev_server.received_text()
