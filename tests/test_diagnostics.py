"""Nothing fails silently: denials, judge failures and misconfigurations are visible (issue 7).

One test per behaviour, over the System One test server on 127.0.0.1 and real LlamaIndex indexes
(in-memory and Qdrant local mode), asserting the outcome and the log records.
"""

from __future__ import annotations

import json
import logging
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters
from llama_index.vector_stores.qdrant import QdrantVectorStore
from pydantic import ValidationError
from qdrant_client import QdrantClient

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    JevKnowledgeTool,
    JevNodePostprocessor,
    JevRetriever,
    MetadataAcl,
    MissingRuntimeContextError,
    Mode,
    RetrievalUnavailableError,
    RetryPolicy,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.errors import JevInvalidResponseError
from llama_jev.local import LocalRelevanceJudge
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .corpus import ACL, ALICE, BY_ID, DOCS, SAM, memory_index, names, qdrant_index, readable
from .support import HashEmbedding, marked_answer
from .test_integration_llamaindex import EventCollector, FixedRetriever, scripted_agent_llm

QUERY = "What are the refund conditions?"
WRONG_KEY = "sk-wrong-0b1d3e5f-secret"


@pytest.fixture
def events() -> Iterator[list[Any]]:
    from llama_index.core.instrumentation import get_dispatcher

    collector = EventCollector()
    root = get_dispatcher()
    root.add_event_handler(collector)
    yield collector.events
    root.event_handlers.remove(collector)


def client(server: SystemOneTestServer, *, key: str = API_KEY, retries: int = 2) -> JevClient:
    return JevClient(
        api_key=key, base_url=server.base_url, retry=RetryPolicy(max_retries=retries, initial_backoff=0.01)
    )


def selector(judge: Any, mode: Mode = Mode.ENFORCE, records: list[DecisionRecord] | None = None) -> CandidateSelector:
    observer = None if records is None else (lambda ctx, record: records.append(record))
    return CandidateSelector(judge, ExecutionOptions(mode=mode, budget=5.0, observer=observer))


def warnings_from(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


def uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"llama-jev-diagnostics/{name}"))


def qdrant(path: Path, nodes: list[TextNode]) -> tuple[VectorStoreIndex, QdrantClient]:
    qclient = QdrantClient(path=str(path))
    store = QdrantVectorStore(collection_name="kb", client=qclient)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        index = VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=HashEmbedding()
        )
    return index, qclient


# --- 1. a boolean public flag ---------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "qdrant"])
def test_a_boolean_true_public_flag_is_served_through_pushdown_on_both_stores(
    jev_server: SystemOneTestServer, tmp_path: Path, store: str
) -> None:
    nodes = [
        TextNode(
            id_=uid("bool-public"),
            text="[p=0.9] Refunds within seven days.",
            metadata={"tenant": "acme", "public": True},
        ),
        TextNode(
            id_=uid("bool-private"), text="[p=0.9] Refund vouchers.", metadata={"tenant": "acme", "public": False}
        ),
        TextNode(
            id_=uid("other-tenant"), text="[p=0.9] Globex refunds.", metadata={"tenant": "globex", "public": True}
        ),
    ]
    acl = MetadataAcl(tenant_key="tenant", users_key="users", public_key="public")
    if store == "memory":
        index, qclient = VectorStoreIndex(nodes, embed_model=HashEmbedding()), None
    else:
        index, qclient = qdrant(tmp_path / "q", nodes)
    try:
        retriever = JevRetriever.from_index(index, selector(client(jev_server)), acl, top_k=10)
        assert retriever.prefilter is True
        with runtime_context(ALICE):
            result = [n.node.node_id for n in retriever.retrieve(QUERY)]
    finally:
        if qclient is not None:
            qclient.close()
    assert result == [uid("bool-public")]


# --- 2. SHADOW with a failing judge ---------------------------------------------------------


def test_shadow_with_a_wrong_key_serves_and_logs_one_warning_per_failed_judgement(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    records: list[DecisionRecord] = []
    shadow = selector(client(jev_server, key=WRONG_KEY), Mode.SHADOW, records)
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), shadow, ACL)
    postprocessor = JevNodePostprocessor(shadow, ACL)
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        served = retriever.retrieve(QUERY)
        retriever.retrieve(QUERY)
        postprocessor.postprocess_nodes(served, query_str=QUERY)
    assert set(names(served)) == readable(ALICE)
    logged = warnings_from(caplog, "llama_jev")
    assert len(logged) == 3 == len(records)
    for message, record in zip(logged, records, strict=True):
        assert record.status.value == "error"
        assert record.decision_id in message
        assert "CALL_OR_RESPONSE_ERROR, JevAuthenticationError, HTTP 401, not retryable" in message
    assert all(getattr(r, "jev_status_code", None) == 401 for r in caplog.records if r.name == "llama_jev")


# --- 3. what an unavailable judgement says --------------------------------------------------


def test_enforce_with_a_wrong_key_says_http_401_and_that_retrying_will_not_help(
    jev_server: SystemOneTestServer,
) -> None:
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server, key=WRONG_KEY)), ACL
    )
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError) as caught:
        retriever.retrieve(QUERY)
    error = caught.value
    assert (error.reason, error.status_code, error.retryable, error.error_type) == (
        "CALL_OR_RESPONSE_ERROR",
        401,
        False,
        "JevAuthenticationError",
    )
    assert "JevAuthenticationError, HTTP 401" in str(error)
    assert "Retrying will not help" in str(error)
    assert "retry later" not in str(error)
    assert jev_server.request_count == 1  # a 401 is not retried


def test_enforce_with_an_overloaded_judge_says_http_529_and_that_retrying_may_help(
    jev_server: SystemOneTestServer,
) -> None:
    jev_server.inject_always(Fault.overloaded())
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server, retries=0)), ACL
    )
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError) as caught:
        retriever.retrieve(QUERY)
    assert (caught.value.status_code, caught.value.retryable) == (529, True)
    assert "JevOverloadedError, HTTP 529" in str(caught.value)
    assert "Retrying later may help" in str(caught.value)


@pytest.mark.slow
def test_a_local_judge_asked_a_question_it_cannot_answer_is_a_configuration_error_not_retryable() -> None:
    judge = LocalRelevanceJudge()
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(judge), ACL, question="Is this passage polite?"
    )
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError) as caught:
        retriever.retrieve(QUERY)
    assert (caught.value.status_code, caught.value.retryable, caught.value.error_type) == (
        None,
        False,
        "JevBadRequestError",
    )
    assert "no HTTP status" in str(caught.value)
    assert "Retrying will not help" in str(caught.value)


async def test_the_agent_sees_the_status_and_whether_retrying_helps_in_the_tool_error(
    jev_server: SystemOneTestServer,
) -> None:
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server, key=WRONG_KEY)), ACL
    )
    agent = FunctionAgent(tools=[JevKnowledgeTool(retriever).as_tool()], llm=scripted_agent_llm({"query": QUERY}))
    with runtime_context(ALICE):
        answer = str(await agent.run(QUERY))
    assert "JevAuthenticationError, HTTP 401" in answer
    assert "Retrying will not help" in answer
    assert WRONG_KEY not in answer


# --- 4. the ACL denied everything -----------------------------------------------------------


def misspelled_nodes() -> list[TextNode]:
    # The data says allowed_users; the ACL below says users.
    return [
        TextNode(id_=uid(f"note-{n}"), text=f"[p=0.9] Refund note {n}.", metadata={"allowed_users": ["alice"]})
        for n in range(3)
    ]


@pytest.mark.parametrize("store", ["post-filter", "memory-pushdown", "qdrant-pushdown"])
def test_an_acl_key_absent_from_every_node_is_logged_once_naming_the_key(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture, tmp_path: Path, store: str
) -> None:
    acl = MetadataAcl(users_key="users")
    records: list[DecisionRecord] = []
    qclient = None
    if store == "qdrant-pushdown":
        index, qclient = qdrant(tmp_path / "q", misspelled_nodes())
    else:
        index = VectorStoreIndex(misspelled_nodes(), embed_model=HashEmbedding())
    retriever = JevRetriever.from_index(
        index, selector(client(jev_server), records=records), acl, top_k=10, prefilter=store != "post-filter"
    )
    caplog.set_level(logging.WARNING, logger="llama_jev")
    try:
        with runtime_context(ALICE):
            assert retriever.retrieve(QUERY) == []
            assert retriever.retrieve(QUERY) == []
    finally:
        if qclient is not None:
            qclient.close()
    logged = warnings_from(caplog, "llama_jev")
    assert len(logged) == 1, logged  # once per key set, not per query
    assert "configured metadata key(s) 'users'" in logged[0]
    if store != "qdrant-pushdown":
        assert "'allowed_users'" in logged[0]  # the keys the nodes do have
    expected_counts = (3, 3) if store == "post-filter" else (0, 0)
    assert [(r.retrieved, r.denied, r.reason.value) for r in records] == [(*expected_counts, "NO_CANDIDATES")] * 2


def test_a_caller_without_a_tenant_is_logged_once_naming_tenant_id(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    records: list[DecisionRecord] = []
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server), records=records), ACL
    )
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(RuntimeContext(user_id="alice")):
        assert retriever.retrieve(QUERY) == []
        assert retriever.retrieve(QUERY) == []
    logged = warnings_from(caplog, "llama_jev")
    assert len(logged) == 1
    assert "tenant_key 'tenant'" in logged[0]
    assert "no tenant_id" in logged[0]
    assert [(r.retrieved, r.denied) for r in records] == [(len(DOCS), len(DOCS))] * 2
    assert jev_server.request_count == 0


def test_a_legitimate_denial_logs_nothing(jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture) -> None:
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(RuntimeContext(user_id="nina", tenant_id="initech")):
        assert retriever.retrieve(QUERY) == []
    assert warnings_from(caplog, "llama_jev") == []


# --- 5. from_index keywords -----------------------------------------------------------------


def test_from_index_asks_the_given_question(jev_server: SystemOneTestServer) -> None:
    question = "Does this passage state a refund deadline?"
    retriever = JevRetriever.from_index(memory_index(), selector(client(jev_server)), ACL, question=question)
    with runtime_context(ALICE):
        retriever.retrieve(QUERY)
    asked = {q["instructions"]["question"] for r in jev_server.requests for q in r.json["questions"].values()}
    assert asked == {question}


def test_from_index_refuses_a_misspelled_keyword() -> None:
    with pytest.raises(TypeError, match="'similarity_cutof'"):
        JevRetriever.from_index(memory_index(), selector(ScriptedJudge(marked_answer)), ACL, similarity_cutof=0.5)
    # A real keyword still passes through.
    JevRetriever.from_index(
        memory_index(), selector(ScriptedJudge(marked_answer)), ACL, vector_store_query_mode="default"
    )


# --- 6. async over a sync-only Qdrant store -------------------------------------------------


async def test_aretrieve_over_a_sync_only_qdrant_store_works_in_a_thread_and_warns_once(
    jev_server: SystemOneTestServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index, qclient = qdrant_index(tmp_path / "q")
    retriever = JevRetriever.from_index(index, selector(client(jev_server)), ACL, top_k=10)
    caplog.set_level(logging.WARNING, logger="llama_jev")
    try:
        with runtime_context(SAM):
            first = names(await retriever.aretrieve(QUERY))
        with runtime_context(ALICE):
            second = names(await retriever.aretrieve(QUERY))
    finally:
        qclient.close()
    assert first == ["acme-refund", "acme-compensation"]
    assert second == ["acme-refund", "acme-alice-note"]
    logged = warnings_from(caplog, "llama_jev")
    assert len(logged) == 1
    assert "AsyncQdrantClient" in logged[0]


# --- 7. lone surrogates -----------------------------------------------------------------------


def surrogate_retriever(mode: Mode, server: SystemOneTestServer, records: list[DecisionRecord]) -> JevRetriever:
    broken = TextNode(
        id_=uid("broken-emoji"),
        text="[p=0.9] Refunds \ud83d within seven days.",
        metadata={"tenant": "acme", "public": "true"},
    )
    fine = TextNode(id_=uid("fine"), text="[p=0.9] Refund desk hours.", metadata={"tenant": "acme", "public": "true"})
    index = VectorStoreIndex([broken, fine], embed_model=HashEmbedding())
    # The ACL these two nodes are written for (the corpus ACL's users and roles keys would be
    # named as keys no node holds, which is not what these tests are about).
    acl = MetadataAcl(tenant_key="tenant", public_key="public")
    return JevRetriever.from_index(index, selector(client(server), mode, records), acl, top_k=10)


def test_a_lone_surrogate_in_a_node_is_served_and_recorded_in_shadow(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    records: list[DecisionRecord] = []
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        served = surrogate_retriever(Mode.SHADOW, jev_server, records).retrieve(QUERY)
    assert {n.node.node_id for n in served} == {uid("broken-emoji"), uid("fine")}
    assert [(r.status.value, r.reason.value) for r in records] == [("error", "UNENCODABLE_TEXT")]
    assert "UNENCODABLE_TEXT, UnencodableTextError" in warnings_from(caplog, "llama_jev")[0]
    assert jev_server.request_count == 0


def test_a_lone_surrogate_in_enforce_is_a_typed_unavailable_error(jev_server: SystemOneTestServer) -> None:
    records: list[DecisionRecord] = []
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError) as caught:
        surrogate_retriever(Mode.ENFORCE, jev_server, records).retrieve(QUERY)
    assert (caught.value.reason, caught.value.retryable) == ("UNENCODABLE_TEXT", False)
    assert repr(uid("broken-emoji")) in str(caught.value.__cause__)  # names the node, not its text
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError, match="cannot be encoded"):
        JevRetriever.from_index(memory_index(), selector(client(jev_server)), ACL).retrieve("refund \udc00 policy")


# --- 8. a query too large -------------------------------------------------------------------


def test_a_huge_query_is_query_too_large_not_a_candidate_too_large(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    huge_query = "refund conditions " * 6_000  # ~108k characters
    records: list[DecisionRecord] = []
    index = memory_index()
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError) as caught:
        JevRetriever.from_index(index, selector(client(jev_server), records=records), ACL, top_k=10).retrieve(
            huge_query
        )
    assert (caught.value.reason, caught.value.retryable) == ("QUERY_TOO_LARGE", False)
    assert "the query is too large" in str(caught.value)
    assert "split the documents" not in str(caught.value)
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        served = JevRetriever.from_index(
            index, selector(client(jev_server), Mode.SHADOW, records), ACL, top_k=10
        ).retrieve(huge_query)
    assert set(names(served)) == readable(ALICE)
    assert [r.reason.value for r in records] == ["QUERY_TOO_LARGE", "QUERY_TOO_LARGE"]
    assert "QUERY_TOO_LARGE, QueryTooLargeError" in warnings_from(caplog, "llama_jev")[0]
    assert jev_server.request_count == 0


# --- 9. the caller's own flat filters with pushdown -----------------------------------------


def test_pushdown_on_the_in_memory_store_keeps_the_callers_own_flat_filters(jev_server: SystemOneTestServer) -> None:
    own = MetadataFilters(filters=[MetadataFilter(key="name", value="acme-alice-note")])
    inner = memory_index().as_retriever(similarity_top_k=10, filters=own)
    retriever = JevRetriever(inner, selector(client(jev_server)), ACL, prefilter=True)
    with runtime_context(ALICE):
        assert names(retriever.retrieve(QUERY)) == ["acme-alice-note"]
    with runtime_context(SAM):  # the note is alice's: the ACL and the caller's filter together leave nothing
        assert retriever.retrieve(QUERY) == []
    assert inner._filters is own  # never mutated


# --- 10. the key is unreachable from any exception ------------------------------------------


def reachable(error: BaseException) -> Iterator[Any]:
    """Every object reachable from ``error`` through its chain, args and attributes."""
    seen: set[int] = set()
    stack: list[Any] = [error]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        yield item
        if isinstance(item, BaseException):
            stack += [item.__cause__, item.__context__, *item.args, *vars(item).values()]
            if isinstance(item, ValidationError):
                stack += [json.dumps(item.errors(), default=str)]


ECHOES = {
    "answer-key": lambda key: {"model": "m", "answers": {key: {"type": "noul", "noul": 0.5}}},
    "answer-type": lambda key: {"model": "m", "answers": {"item_0": {"type": key, "noul": 0.5}}},
    "answer-value": lambda key: {"model": "m", "answers": {"item_0": {"type": "noul", "noul": key}}},
    "model-type": lambda key: {"model": {"k": key}, "answers": {"item_0": {"type": "noul", "noul": 0.5}}},
}


@pytest.mark.parametrize("echo", sorted(ECHOES))
def test_no_exception_reachable_from_an_error_holds_the_api_key(jev_server: SystemOneTestServer, echo: str) -> None:
    body = json.dumps(ECHOES[echo](API_KEY)).encode()
    jev_server.inject_always(Fault.respond(200, body))
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=DOCS[0].node(), score=1.0)]), selector(client(jev_server)), ACL
    )
    with runtime_context(ALICE), pytest.raises(RetrievalUnavailableError) as caught:
        retriever.retrieve(QUERY)
    chain = list(reachable(caught.value))
    assert any(isinstance(item, JevInvalidResponseError) for item in chain)
    for item in chain:
        assert API_KEY not in repr(item)
        assert API_KEY not in str(item)


def test_a_server_echoing_the_key_as_its_model_name_never_puts_it_in_a_record(jev_server: SystemOneTestServer) -> None:
    body = {
        "model": f"jev-{API_KEY}",
        "answers": {"item_0": {"type": "noul", "noul": 0.9}},
        "usage": {"input_tokens": 1, "output_tokens": 0},
    }
    jev_server.inject(Fault.respond(200, json.dumps(body).encode()))
    records: list[DecisionRecord] = []
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=DOCS[0].node(), score=1.0)]),
        selector(client(jev_server), records=records),
        ACL,
    )
    with runtime_context(ALICE):
        retriever.retrieve(QUERY)
    assert records[0].model == "[redacted]"


# --- 11. pushdown keeps tracing clean -------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "qdrant"])
def test_pushdown_keeps_unreadable_nodes_out_of_the_wrapped_retrievers_events(
    jev_server: SystemOneTestServer, events: list[Any], tmp_path: Path, store: str
) -> None:
    qclient = None
    if store == "memory":
        index = memory_index()
    else:
        index, qclient = qdrant_index(tmp_path / "q")
    try:
        retriever = JevRetriever.from_index(index, selector(client(jev_server)), ACL, top_k=10)
        with runtime_context(ALICE):
            retriever.retrieve(QUERY)
    finally:
        if qclient is not None:
            qclient.close()
    traced = [BY_ID[n.node.node_id].name for e in events if isinstance(e, RetrievalEndEvent) for n in e.nodes]
    assert traced  # the events were seen at all
    assert set(traced) <= readable(ALICE)


def test_without_pushdown_the_wrapped_retrievers_events_carry_unreadable_nodes(
    jev_server: SystemOneTestServer, events: list[Any]
) -> None:
    # What the README warns about: post-filter only leaves tracing to see everything recalled.
    retriever = JevRetriever.from_index(memory_index(), selector(client(jev_server)), ACL, top_k=10, prefilter=False)
    with runtime_context(ALICE):
        retriever.retrieve(QUERY)
    traced = {BY_ID[n.node.node_id].name for e in events if isinstance(e, RetrievalEndEvent) for n in e.nodes}
    assert traced - readable(ALICE)


# --- 12. a blank query ----------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
async def test_a_blank_query_is_a_value_error_before_anything_is_sent(
    jev_server: SystemOneTestServer, query: str
) -> None:
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    postprocessor = JevNodePostprocessor(selector(client(jev_server)), ACL)
    nodes = [NodeWithScore(node=DOCS[0].node(), score=1.0)]
    with runtime_context(ALICE):
        with pytest.raises(ValueError, match="non-blank"):
            retriever.retrieve(query)
        with pytest.raises(ValueError, match="non-blank"):
            await retriever.aretrieve(query)
        with pytest.raises(ValueError, match="non-blank"):
            postprocessor.postprocess_nodes(nodes, query_str=query)
        with pytest.raises(ValueError, match="blank"):
            selector(client(jev_server)).select(query, "Relevant?", [])
    assert jev_server.request_count == 0


async def test_a_none_query_is_the_same_value_error_as_a_blank_one(jev_server: SystemOneTestServer) -> None:
    # retrieve(None) raised AttributeError ('NoneType' has no query_str) from inside the retriever.
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    with runtime_context(ALICE):
        with pytest.raises(ValueError, match="non-blank string"):
            retriever.retrieve(None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="non-blank string"):
            await retriever.aretrieve(None)  # type: ignore[arg-type]
    assert jev_server.request_count == 0


def test_a_zero_similarity_top_k_is_named_as_the_user_wrote_it(jev_server: SystemOneTestServer) -> None:
    with pytest.raises(ValueError, match=r"similarity_top_k must be a positive integer, got 0") as raised:
        JevRetriever(memory_index().as_retriever(similarity_top_k=0), selector(client(jev_server)), ACL)
    assert "top_k=" in str(raised.value)  # and how to fix it
    with pytest.raises(ValueError, match=r"^top_k must be a positive integer, got 0"):
        JevRetriever(memory_index().as_retriever(similarity_top_k=5), selector(client(jev_server)), ACL, top_k=0)


# --- 13. identity bound after agent.run() ---------------------------------------------------


async def test_an_identity_bound_after_agent_run_started_is_told_to_bind_before_run(
    jev_server: SystemOneTestServer,
) -> None:
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=10), selector(client(jev_server)), ACL)
    agent = FunctionAgent(tools=[JevKnowledgeTool(retriever).as_tool()], llm=scripted_agent_llm({"query": QUERY}))
    handler = agent.run(QUERY)  # run() started with nothing bound ...
    with runtime_context(ALICE):  # ... binding now is too late for its tools
        answer = str(await handler)
    assert "MissingRuntimeContextError" in answer or "no RuntimeContext bound" in answer
    assert "before run() starts" in answer
    assert jev_server.request_count == 0
    with pytest.raises(MissingRuntimeContextError, match=r"bind before calling agent\.run"):
        retriever.retrieve(QUERY)


# --- no text, no key anywhere ---------------------------------------------------------------


def test_no_log_line_record_or_error_carries_node_text_query_text_or_the_key(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    secret_query = "SECRET-QUERY-7731 refund conditions"
    records: list[DecisionRecord] = []
    errors: list[BaseException] = []
    caplog.set_level(logging.DEBUG, logger="llama_jev")

    def attempt(retriever: JevRetriever, query: str = secret_query, ctx: RuntimeContext = ALICE) -> None:
        with runtime_context(ctx):
            try:
                retriever.retrieve(query)
            except Exception as error:
                errors.append(error)

    index = memory_index()
    wrong = client(jev_server, key=WRONG_KEY)
    good = client(jev_server)
    attempt(JevRetriever.from_index(index, selector(wrong, Mode.SHADOW, records), ACL, top_k=10))
    attempt(JevRetriever.from_index(index, selector(wrong, Mode.ENFORCE, records), ACL, top_k=10))
    attempt(JevRetriever.from_index(index, selector(good, Mode.ENFORCE, records), ACL, top_k=10), secret_query * 4_000)
    attempt(surrogate_retriever(Mode.SHADOW, jev_server, records))
    attempt(surrogate_retriever(Mode.ENFORCE, jev_server, records))
    attempt(
        JevRetriever.from_index(index, selector(good, Mode.ENFORCE, records), ACL, top_k=10),
        ctx=RuntimeContext(user_id="u"),
    )
    misspelled = VectorStoreIndex(misspelled_nodes(), embed_model=HashEmbedding())
    attempt(JevRetriever.from_index(misspelled, selector(good, Mode.ENFORCE, records), MetadataAcl(users_key="users")))
    jev_server.inject_always(Fault.respond(200, json.dumps(ECHOES["answer-key"](API_KEY)).encode()))
    attempt(JevRetriever.from_index(index, selector(good, Mode.ENFORCE, records), ACL, top_k=10))
    jev_server.clear_faults()
    jev_server.inject_always(Fault.status(500, {"error": f"bad key {API_KEY}"}))
    attempt(
        JevRetriever.from_index(index, selector(client(jev_server, retries=0), Mode.ENFORCE, records), ACL, top_k=10)
    )

    assert len(errors) == 5
    assert len(records) == 9
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "MetadataAcl" in logged
    assert "SHADOW judgement failed" in logged
    texts = [logged, *(record.to_json() for record in records)]
    texts += [repr(item) + str(item) for error in errors for item in reachable(error) if not _is_node_holder(item)]
    forbidden = [API_KEY, WRONG_KEY, "SECRET-QUERY-7731", "Refunds within seven days", "Refund note", "Refund policy"]
    for text in texts:
        for word in forbidden:
            assert word not in text, (word, text[:300])


def _is_node_holder(item: Any) -> bool:
    # Decision.error objects are walked; nodes themselves are never attached to errors.
    return isinstance(item, (TextNode, NodeWithScore))
