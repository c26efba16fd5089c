"""What a newcomer hit on a fresh clone (issue 18): each mistake now says what is wrong and what to do.

One test per behaviour, over real LlamaIndex indexes (in-memory and Qdrant local mode) and the
System One test server on 127.0.0.1, asserting the message a user gets.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import AsyncQdrantClient, QdrantClient

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
    RetryPolicy,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.errors import JevAuthenticationError, JevConnectionError
from llama_jev.systemone import NoulQuestion, SystemOneRequest
from llama_jev.testing import SystemOneTestServer

from .conftest import API_KEY
from .support import HashEmbedding
from .test_integration_llamaindex import FixedRetriever

QUERY = "What are the refund conditions?"
NODE_TEXT = "Refunds within seven days FIRST-USE-NODE-TEXT."
ALICE = RuntimeContext(user_id="alice", tenant_id="acme")
SAM = RuntimeContext(user_id="sam", tenant_id="acme", roles=frozenset({"support"}))


def node(name: str, metadata: dict[str, Any]) -> TextNode:
    return TextNode(id_=str(uuid.uuid5(uuid.NAMESPACE_URL, f"first-use/{name}")), text=NODE_TEXT, metadata=metadata)


# A public policy and a support-only note: the data spells the public flag "public" and roles "roles".
POLICY = node("policy", {"tenant": "acme", "public": "true"})
SUPPORT_NOTE = node("support-note", {"tenant": "acme", "roles": ["support"]})
NODES = [POLICY, SUPPORT_NOTE]


def accepting_selector(records: list[DecisionRecord] | None = None, mode: Mode = Mode.ENFORCE) -> CandidateSelector:
    observer = None if records is None else (lambda ctx, record: records.append(record))
    return CandidateSelector(ScriptedJudge(lambda s, q, i: 0.9), ExecutionOptions(mode=mode, observer=observer))


def acl_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llama_jev" and r.levelno == logging.WARNING]


def qdrant_index(path: Path, nodes: list[TextNode]) -> tuple[VectorStoreIndex, QdrantClient]:
    qclient = QdrantClient(path=str(path))
    store = QdrantVectorStore(collection_name="kb", client=qclient)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        index = VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=HashEmbedding()
        )
    return index, qclient


# --- 1. a misspelled grant key is named, whichever other keys are right -----------------------

MISSPELLED = [
    (MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="is_public"), ALICE, "is_public"),
    (MetadataAcl(tenant_key="tenant", roles_key="role", public_key="public"), SAM, "role"),
]


@pytest.mark.parametrize("store", ["post-filter", "memory-pushdown", "qdrant-pushdown"])
@pytest.mark.parametrize(("acl", "caller", "misspelled"), MISSPELLED, ids=["is_public", "role"])
def test_a_misspelled_grant_key_is_named_once_per_retriever_even_when_the_other_grant_key_is_right(
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    store: str,
    acl: MetadataAcl,
    caller: RuntimeContext,
    misspelled: str,
) -> None:
    qclient = None
    if store == "qdrant-pushdown":
        index, qclient = qdrant_index(tmp_path / "q", NODES)
    else:
        index = VectorStoreIndex(NODES, embed_model=HashEmbedding())
    caplog.set_level(logging.WARNING, logger="llama_jev")
    try:
        for _ in range(2):  # each new retriever says it once, not once per query
            caplog.clear()
            retriever = JevRetriever.from_index(
                index, accepting_selector(), acl, top_k=5, prefilter=store != "post-filter"
            )
            with runtime_context(caller):
                retriever.retrieve(QUERY)
                retriever.retrieve(QUERY)
            logged = acl_warnings(caplog)
            assert len(logged) == 1, logged
            assert f"holds the configured metadata key(s) {misspelled!r}" in logged[0]
            assert f"{misspelled!r} grants nothing" in logged[0]
            assert "check the key names" in logged[0]
            assert "acme" not in logged[0]  # never a value
            assert "'support'" not in logged[0]
    finally:
        if qclient is not None:
            qclient.close()


def test_the_misspelled_key_warning_shows_the_keys_the_nodes_do_hold(caplog: pytest.LogCaptureFixture) -> None:
    index = VectorStoreIndex(NODES, embed_model=HashEmbedding())
    acl = MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="is_public")
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        assert JevRetriever.from_index(index, accepting_selector(), acl, top_k=5).retrieve(QUERY) == []
    (logged,) = acl_warnings(caplog)
    assert logged == (
        "MetadataAcl: not one of the 2 nodes of the in-memory store holds the configured metadata key(s) "
        "'is_public', so 'is_public' grants nothing: a node readable only through it is denied to every "
        "caller; check the key names (the nodes' metadata keys: 'public', 'roles', 'tenant'), or drop from "
        "MetadataAcl a grant key the data does not use"
    )


async def test_a_misspelled_key_is_named_on_async_retrieval_over_an_async_only_qdrant_client(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    index, qclient = qdrant_index(tmp_path / "q", NODES)
    qclient.close()
    aclient = AsyncQdrantClient(path=str(tmp_path / "q"))
    store = QdrantVectorStore(collection_name="kb", aclient=aclient)
    index = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding())
    acl = MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="is_public")
    caplog.set_level(logging.WARNING, logger="llama_jev")
    try:
        with runtime_context(ALICE):
            assert await JevRetriever.from_index(index, accepting_selector(), acl, top_k=5).aretrieve(QUERY) == []
    finally:
        await aclient.close()
    (logged,) = acl_warnings(caplog)
    assert "holds the configured metadata key(s) 'is_public'" in logged
    assert "Qdrant collection 'kb'" in logged


def test_a_retriever_whose_store_cannot_be_asked_names_the_key_none_of_its_returned_nodes_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=n, score=0.5) for n in NODES]),
        accepting_selector(),
        MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="is_public"),
    )
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        assert retriever.retrieve(QUERY) == []
        assert retriever.retrieve(QUERY) == []
    (logged,) = acl_warnings(caplog)
    assert "not one of the 2 nodes the retriever returned" in logged
    assert "'is_public' grants nothing" in logged


def test_the_postprocessor_names_a_misspelled_grant_key_too(caplog: pytest.LogCaptureFixture) -> None:
    postprocessor = JevNodePostprocessor(
        accepting_selector(), MetadataAcl(tenant_key="tenant", roles_key="role", public_key="public")
    )
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(SAM):
        kept = postprocessor.postprocess_nodes([NodeWithScore(node=n, score=0.5) for n in NODES], query_str=QUERY)
    assert [n.node.node_id for n in kept] == [POLICY.node_id]
    (logged,) = acl_warnings(caplog)
    assert "holds the configured metadata key(s) 'role'" in logged


def test_a_correctly_spelled_acl_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    index = VectorStoreIndex(NODES, embed_model=HashEmbedding())
    acl = MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="public")
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        assert len(JevRetriever.from_index(index, accepting_selector(), acl, top_k=5).retrieve(QUERY)) == 1
    assert acl_warnings(caplog) == []


# --- 2. a mode in any case ----------------------------------------------------------------------


@pytest.mark.parametrize("spelled", ["ENFORCE", "Enforce", " enforce "])
def test_a_mode_is_accepted_in_any_case(spelled: str) -> None:
    assert ExecutionOptions(mode=spelled).mode is Mode.ENFORCE  # type: ignore[arg-type]
    assert Mode(spelled) is Mode.ENFORCE


def test_an_unknown_mode_lists_the_valid_values() -> None:
    with pytest.raises(ValueError, match="is not a valid Mode") as caught:
        ExecutionOptions(mode="enforced")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "'enforced' is not a valid Mode: use one of 'off', 'shadow', 'enforce' (in any case) "
        "or Mode.OFF, Mode.SHADOW, Mode.ENFORCE"
    )


# --- 3. OFF with an observer says it writes nothing ---------------------------------------------


def test_off_with_an_observer_logs_once_at_info_that_it_writes_no_records(caplog: pytest.LogCaptureFixture) -> None:
    records: list[DecisionRecord] = []
    caplog.set_level(logging.INFO, logger="llama_jev")
    options = ExecutionOptions(mode=Mode.OFF, observer=lambda ctx, record: records.append(record))
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=POLICY, score=0.5)]),
        CandidateSelector(ScriptedJudge(lambda s, q, i: 0.9), options),
        MetadataAcl(tenant_key="tenant", public_key="public"),
    )
    with runtime_context(ALICE):
        assert len(retriever.retrieve(QUERY)) == 1
        assert len(retriever.retrieve(QUERY)) == 1
    assert records == []  # OFF stays as the seeds have it: no judgement, no record
    logged = [r for r in caplog.records if r.name == "llama_jev" and "OFF" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in logged] == [
        (
            logging.INFO,
            "ExecutionOptions(mode=OFF) with an observer: OFF asks no judge and writes no DecisionRecord, so the "
            "observer is never called; use Mode.SHADOW to record the judge's view without changing results",
        )
    ]


def test_off_without_an_observer_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llama_jev")
    ExecutionOptions(mode=Mode.OFF)
    assert caplog.records == []


# --- 4. no key for a server on this machine -----------------------------------------------------


def _request() -> SystemOneRequest:
    return SystemOneRequest(state="q", questions={"item_0": NoulQuestion(instructions="x")})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_client_for_a_loopback_server_needs_no_key_and_sends_none(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with SystemOneTestServer() as server:
        with JevClient(base_url=f"http://{host}:{server.port}") as client:
            assert client.system_one(_request()).noul("item_0") == 0.5
        (received,) = server.requests
    assert "authorization" not in received.headers
    assert "api_key=None" in repr(client)


@pytest.mark.parametrize("base_url", ["http://127.8.9.10:1", "http://[::1]:8000"])
def test_every_loopback_address_is_called_without_a_key(monkeypatch: pytest.MonkeyPatch, base_url: str) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert JevClient(base_url=base_url).base_url == base_url


@pytest.mark.parametrize(
    "base_url", ["https://api.typesafe.ai", "http://127.0.0.1.example.com", "http://10.0.0.5:8000"]
)
def test_any_other_server_without_a_key_is_a_configuration_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, base_url: str
) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(JevAuthenticationError) as caught:
        JevClient(base_url=base_url)
    assert str(caught.value).startswith(
        f"no System One API key for {base_url}: pass api_key=... or set TYPESAFE_API_KEY (or JEV_API_KEY); "
        "only a server on this machine (a loopback base_url such as http://127.0.0.1:8000, "
        "python -m llama_jev.serve) is called without one"
    )


def test_a_keyed_loopback_server_called_without_a_key_says_no_key_was_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with (
        SystemOneTestServer(api_key=API_KEY) as server,
        JevClient(base_url=server.base_url) as client,
        pytest.raises(JevAuthenticationError) as caught,
    ):
        client.system_one(_request())
    assert "no API key was sent: pass api_key=... or set TYPESAFE_API_KEY" in str(caught.value)


# --- 5. the record says whether the store applied the ACL first ---------------------------------


@pytest.mark.parametrize("store", ["memory", "qdrant"])
def test_a_record_says_pushdown_when_the_store_applied_the_acl(tmp_path: Path, store: str) -> None:
    records: list[DecisionRecord] = []
    qclient = None
    if store == "qdrant":
        index, qclient = qdrant_index(tmp_path / "q", NODES)
    else:
        index = VectorStoreIndex(NODES, embed_model=HashEmbedding())
    acl = MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="public")
    try:
        with runtime_context(ALICE):
            JevRetriever.from_index(index, accepting_selector(records), acl, top_k=5).retrieve(QUERY)
            JevRetriever.from_index(index, accepting_selector(records), acl, top_k=5, prefilter=False).retrieve(QUERY)
    finally:
        if qclient is not None:
            qclient.close()
    pushed, filtered = records
    # Pushed down, the store never returned the support note: nothing reached the ACL to deny.
    assert (pushed.pushdown, pushed.retrieved, pushed.denied) == (True, 1, 0)
    assert (filtered.pushdown, filtered.retrieved, filtered.denied) == (False, 2, 1)
    assert DecisionRecord.model_validate_json(pushed.to_json()).pushdown is True


def test_records_of_the_postprocessor_and_of_direct_selection_say_no_pushdown() -> None:
    records: list[DecisionRecord] = []
    postprocessor = JevNodePostprocessor(
        accepting_selector(records), MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="public")
    )
    with runtime_context(ALICE):
        postprocessor.postprocess_nodes([NodeWithScore(node=n, score=0.5) for n in NODES], query_str=QUERY)
    (record,) = records
    assert record.pushdown is False
    assert (record.retrieved, record.denied) == (2, 1)


def test_an_old_record_without_pushdown_still_loads() -> None:
    record = DecisionRecord.model_validate_json(
        '{"purpose": "retrieval_relevance", "version": "v1", "mode": "shadow", "status": "decided", '
        '"reason": "CLASSIFIED", "elapsed_ms": 1.0, "candidates": 0, "requests": 0}'
    )
    assert record.pushdown is False
    assert record.judged == 0


# --- 8. a huge query: the message names the query, the record counts what was judged ------------


def test_a_record_of_a_query_too_large_to_judge_counts_nothing_as_judged() -> None:
    records: list[DecisionRecord] = []
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=n, score=0.5) for n in NODES]),
        accepting_selector(records, mode=Mode.SHADOW),
        MetadataAcl(tenant_key="tenant", public_key="public"),
    )
    with runtime_context(ALICE):
        assert len(retriever.retrieve("What are the refund conditions? " * 3500)) == 1  # SHADOW serves
    (record,) = records
    assert record.reason.value == "QUERY_TOO_LARGE"
    assert (record.candidates, record.judged, record.scores) == (1, 0, {})


def test_a_judged_record_counts_every_answered_candidate() -> None:
    records: list[DecisionRecord] = []
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=n, score=0.5) for n in NODES]),
        accepting_selector(records),
        MetadataAcl(tenant_key="tenant", roles_key="roles", public_key="public"),
    )
    with runtime_context(SAM):
        retriever.retrieve(QUERY)
    (record,) = records
    assert (record.candidates, record.judged) == (2, 2)


# --- 9. a connection error names the server, not its path ---------------------------------------


def test_a_connection_error_names_the_host_and_port_it_could_not_reach() -> None:
    with SystemOneTestServer() as server:
        port = server.port  # free once the server stops
    client = JevClient(
        api_key=API_KEY, base_url=f"http://user:pw@127.0.0.1:{port}/tenant-secret", retry=RetryPolicy(max_retries=0)
    )
    with client, pytest.raises(JevConnectionError) as caught:
        client.system_one(_request())
    message = str(caught.value)
    assert message.startswith(
        f"could not connect to the System One server at http://127.0.0.1:{port} (ConnectError): is it running "
        "there, and are base_url / TYPESAFE_BASE_URL right?"
    )
    for secret in ("tenant-secret", "pw", API_KEY):
        assert secret not in message


async def test_an_async_connection_error_names_the_server_too() -> None:
    with SystemOneTestServer() as server:
        port = server.port
    async with JevClient(
        api_key=API_KEY, base_url=f"http://127.0.0.1:{port}", retry=RetryPolicy(max_retries=0)
    ) as client:
        with pytest.raises(JevConnectionError, match=f"at http://127.0.0.1:{port} "):
            await client.asystem_one(_request())


# --- 10. the missing-identity hint shows tenant_id when the ACL checks a tenant -----------------


def test_an_unbound_identity_is_told_to_bind_tenant_id_when_the_acl_checks_a_tenant() -> None:
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=POLICY, score=0.5)]),
        accepting_selector(),
        MetadataAcl(tenant_key="tenant", public_key="public"),
    )
    with pytest.raises(MissingRuntimeContextError) as caught:
        retriever.retrieve(QUERY)
    assert str(caught.value).startswith(
        "No RuntimeContext is bound: wrap the call in `with runtime_context(RuntimeContext(user_id=..., "
        "tenant_id=...)):` (the ACL checks a tenant key, so bind tenant_id too) or pass ctx= explicitly."
    )


def test_an_unbound_identity_without_a_tenant_key_is_shown_user_id_only() -> None:
    postprocessor = JevNodePostprocessor(accepting_selector(), MetadataAcl(public_key="public"))
    with pytest.raises(MissingRuntimeContextError) as caught:
        postprocessor.postprocess_nodes([NodeWithScore(node=POLICY, score=0.5)], query_str=QUERY)
    assert "`with runtime_context(RuntimeContext(user_id=...)):` or pass ctx=" in str(caught.value)
    assert "tenant_id" not in str(caught.value)


async def test_an_unbound_identity_on_async_retrieval_gets_the_same_tenant_hint() -> None:
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=POLICY, score=0.5)]),
        accepting_selector(),
        MetadataAcl(tenant_key="tenant", public_key="public"),
    )
    with pytest.raises(MissingRuntimeContextError, match=r"tenant_id=\.\.\."):
        await retriever.aretrieve(QueryBundle(QUERY))


def test_the_knowledge_tool_without_an_identity_says_to_bind_tenant_id_when_the_acl_checks_a_tenant() -> None:
    retriever = JevRetriever(
        FixedRetriever([NodeWithScore(node=POLICY, score=0.5)]),
        accepting_selector(),
        MetadataAcl(tenant_key="tenant", public_key="public"),
    )
    with pytest.raises(MissingRuntimeContextError) as caught:
        JevKnowledgeTool(retriever).search(QUERY)
    assert "bind it (with tenant_id: this ACL checks a tenant) before run() starts" in str(caught.value)
