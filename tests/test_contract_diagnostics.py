"""Contract audit of DESIGN Part 2 "Diagnosable by default", written as an outsider would test it.

None of these tests resets the package's once-only warnings: a test written from the contract
knows only that a misconfiguration is logged "once per key set, not per query", so every new
retriever must say it again, whatever ran before in the process.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import QdrantClient

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    JevNodePostprocessor,
    JevRetriever,
    MetadataAcl,
    Mode,
    RetryPolicy,
    RuntimeContext,
    runtime_context,
)
from llama_jev.testing import SystemOneTestServer

from .conftest import API_KEY
from .support import HashEmbedding

QUERY = "What are the refund conditions?"
ALICE = RuntimeContext(user_id="alice", tenant_id="acme")
NODE_TEXT = "[p=0.9] Refunds within seven days CONTRACT-NODE-TEXT."


def selector(server: SystemOneTestServer, records: list[DecisionRecord] | None = None) -> CandidateSelector:
    observer = None if records is None else (lambda ctx, record: records.append(record))
    client = JevClient(api_key=API_KEY, base_url=server.base_url, retry=RetryPolicy(max_retries=0))
    return CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=5.0, observer=observer))


def acl_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("llama_jev") and record.levelno == logging.WARNING
    ]


def node(name: str, metadata: dict[str, Any]) -> TextNode:
    return TextNode(id_=str(uuid.uuid5(uuid.NAMESPACE_URL, f"contract/{name}")), text=NODE_TEXT, metadata=metadata)


def qdrant_index(path: Path, nodes: list[TextNode]) -> tuple[VectorStoreIndex, QdrantClient]:
    qclient = QdrantClient(path=str(path))
    store = QdrantVectorStore(collection_name="kb", client=qclient)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        index = VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=HashEmbedding()
        )
    return index, qclient


# --- once per key set: per retriever, not once per process ------------------------------------


@pytest.mark.parametrize("pushdown", [False, True])
def test_every_new_retriever_warns_once_about_a_missing_acl_key(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture, pushdown: bool
) -> None:
    index = VectorStoreIndex(
        [node(f"misspelled-{n}", {"tenant": "acme", "allowed_users": ["alice"]}) for n in range(3)],
        embed_model=HashEmbedding(),
    )
    acl = MetadataAcl(tenant_key="tenant", users_key="users")
    caplog.set_level(logging.WARNING, logger="llama_jev")
    for _ in range(2):  # a second retriever, as a corrected deployment or the next test builds one
        caplog.clear()
        retriever = JevRetriever.from_index(index, selector(jev_server), acl, top_k=5, prefilter=pushdown)
        with runtime_context(ALICE):
            assert retriever.retrieve(QUERY) == []
            assert retriever.retrieve(QUERY) == []  # not per query
        logged = acl_warnings(caplog)
        assert len(logged) == 1, logged
        assert "'users'" in logged[0]


def test_every_new_retriever_warns_once_about_a_caller_without_a_tenant(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    index = VectorStoreIndex([node("tenant-doc", {"tenant": "acme", "users": ["alice"]})], embed_model=HashEmbedding())
    caplog.set_level(logging.WARNING, logger="llama_jev")
    for _ in range(2):
        caplog.clear()
        retriever = JevRetriever(
            index.as_retriever(similarity_top_k=5),
            selector(jev_server),
            MetadataAcl(tenant_key="tenant", users_key="users"),
        )
        with runtime_context(RuntimeContext(user_id="alice")):
            assert retriever.retrieve(QUERY) == []
            assert retriever.retrieve(QUERY) == []
        logged = acl_warnings(caplog)
        assert len(logged) == 1, logged
        assert "tenant_id" in logged[0]


async def test_every_new_retriever_over_a_sync_only_qdrant_store_warns_once(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    index, qclient = qdrant_index(tmp_path / "q", [node("q-doc", {"tenant": "acme", "users": ["alice"]})])
    caplog.set_level(logging.WARNING, logger="llama_jev")
    try:
        for _ in range(2):
            caplog.clear()
            retriever = JevRetriever.from_index(
                index, selector(jev_server), MetadataAcl(tenant_key="tenant", users_key="users"), top_k=5
            )
            with runtime_context(ALICE):
                assert len(await retriever.aretrieve(QUERY)) == 1
                assert len(await retriever.aretrieve(QUERY)) == 1
            logged = acl_warnings(caplog)
            assert len(logged) == 1, logged
            assert "AsyncQdrantClient" in logged[0]
    finally:
        qclient.close()


# --- a legitimate schema is not a misconfiguration --------------------------------------------


@pytest.mark.parametrize("store", ["post-filter", "memory-pushdown", "qdrant-pushdown"])
def test_a_grant_key_no_node_holds_is_named_once_even_when_the_caller_simply_lacks_access(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture, tmp_path: Path, store: str
) -> None:
    # The ACL allows users, roles and a public flag; this data grants by user lists only. Issue 18:
    # a configured key no node holds is named whichever other keys are right, since a misspelled
    # one (is_public for public) looks exactly like this. Alice's "no" is legitimate; bob still reads.
    nodes = [node(f"users-only-{n}", {"tenant": "acme", "users": ["bob"]}) for n in range(3)]
    acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
    qclient = None
    if store == "qdrant-pushdown":
        index, qclient = qdrant_index(tmp_path / "q", nodes)
    else:
        index = VectorStoreIndex(nodes, embed_model=HashEmbedding())
    retriever = JevRetriever.from_index(index, selector(jev_server), acl, top_k=5, prefilter=store != "post-filter")
    caplog.set_level(logging.WARNING, logger="llama_jev")
    try:
        with runtime_context(ALICE):
            assert retriever.retrieve(QUERY) == []
        with runtime_context(RuntimeContext(user_id="bob", tenant_id="acme")):
            assert len(retriever.retrieve(QUERY)) == 3  # the data is readable: the grants that exist work
    finally:
        if qclient is not None:
            qclient.close()
    (logged,) = acl_warnings(caplog)
    assert "holds the configured metadata key(s) 'roles', 'public'" in logged
    assert "'roles', 'public' grant nothing" in logged
    assert "or drop from MetadataAcl a grant key the data does not use" in logged
    assert "'users' grant" not in logged


# --- a value the ACL cannot read is never a silent denial -------------------------------------

UNREADABLE = [
    ("users", {"tenant": "acme", "users": 7}, "int"),
    ("users", {"tenant": "acme", "users": ["alice", 5]}, "list holding int"),
    ("roles", {"tenant": "acme", "roles": True}, "bool"),
    ("tenant", {"tenant": ["acme"], "users": ["alice"]}, "list"),
    ("public", {"tenant": "acme", "public": "yes"}, "str"),
    ("public", {"tenant": "acme", "public": 1.0}, "float"),
]


@pytest.mark.parametrize("pushdown", [False, True], ids=["post-filter", "memory-pushdown"])
@pytest.mark.parametrize(("key", "metadata", "type_name"), UNREADABLE, ids=[str(m) for _, m, _ in UNREADABLE])
def test_an_acl_value_of_the_wrong_type_is_denied_loudly_naming_the_key_and_type(
    jev_server: SystemOneTestServer,
    caplog: pytest.LogCaptureFixture,
    pushdown: bool,
    key: str,
    metadata: dict[str, Any],
    type_name: str,
) -> None:
    index = VectorStoreIndex([node("unreadable", metadata)], embed_model=HashEmbedding())
    acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
    records: list[DecisionRecord] = []
    retriever = JevRetriever.from_index(index, selector(jev_server, records), acl, top_k=5, prefilter=pushdown)
    caplog.set_level(logging.DEBUG, logger="llama_jev")
    with runtime_context(RuntimeContext(user_id="alice", tenant_id="acme", roles=frozenset({"support"}))):
        assert retriever.retrieve(QUERY) == []
        assert retriever.retrieve(QUERY) == []
    # This one-node store also lacks some configured keys, which is a warning of its own (issue 18).
    logged = [message for message in acl_warnings(caplog) if "holds the configured metadata key" not in message]
    assert len(logged) == 1, logged  # once, not per query
    assert f"{key!r}" in logged[0]
    assert f"of type {type_name}" in logged[0]
    for value in ("alice", "CONTRACT-NODE-TEXT", "'yes'"):
        assert value not in logged[0]
    assert [(r.retrieved, r.denied) for r in records] == ([(1, 1)] * 2 if not pushdown else [(0, 0)] * 2)


def test_the_postprocessor_also_says_a_value_is_unreadable(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    from llama_index.core.schema import NodeWithScore

    postprocessor = JevNodePostprocessor(
        selector(jev_server), MetadataAcl(tenant_key="tenant", users_key="users"), top_n=3
    )
    caplog.set_level(logging.WARNING, logger="llama_jev")
    readable = NodeWithScore(node=node("fine", {"tenant": "acme", "users": ["alice"]}), score=0.5)
    broken = NodeWithScore(node=node("broken", {"tenant": "acme", "users": ["alice", "bob", 3]}), score=0.4)
    with runtime_context(ALICE):
        kept = postprocessor.postprocess_nodes([readable, broken], query_str=QUERY)
    assert [n.node.node_id for n in kept] == [readable.node.node_id]
    logged = acl_warnings(caplog)
    assert len(logged) == 1, logged
    assert "'users'" in logged[0]
    assert "list holding int" in logged[0]


# --- "logged once at WARNING on the llama_jev logger" -----------------------------------------


def test_a_shadow_judge_failure_is_one_warning_on_exactly_the_llama_jev_logger(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    from llama_jev import DraftReviewer
    from llama_jev.testing import Fault

    index = VectorStoreIndex([node("shadow-doc", {"tenant": "acme", "users": ["alice"]})], embed_model=HashEmbedding())
    client = JevClient(api_key=API_KEY, base_url=jev_server.base_url, retry=RetryPolicy(max_retries=0))
    shadow = ExecutionOptions(mode=Mode.SHADOW, budget=5.0)
    retriever = JevRetriever.from_index(
        index, CandidateSelector(client, shadow), MetadataAcl(tenant_key="tenant", users_key="users"), top_k=5
    )
    reviewer = DraftReviewer(judge=client, options=shadow)
    jev_server.inject_always(Fault.status(401))
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        served = retriever.retrieve(QUERY)
        outcome = reviewer.review(query=QUERY, draft="Refunds within seven days.", evidence=served)
    assert len(served) == 1
    assert outcome.text == "Refunds within seven days."
    tuples = [(name, level) for name, level, _ in caplog.record_tuples]
    assert tuples == [("llama_jev", logging.WARNING)] * 2
    for _, _, message in caplog.record_tuples:
        assert "JevAuthenticationError" in message
        assert "401" in message
        assert "CALL_OR_RESPONSE_ERROR" in message
        assert QUERY not in message
        assert "CONTRACT-NODE-TEXT" not in message
        assert API_KEY not in message


def test_acl_misconfiguration_warnings_are_on_exactly_the_llama_jev_logger(
    jev_server: SystemOneTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    acl = MetadataAcl(tenant_key="tenant", users_key="users")
    misspelled = VectorStoreIndex(
        [node("logger-misspelled", {"tenant": "acme", "allowed_users": ["alice"]})], embed_model=HashEmbedding()
    )
    unreadable = VectorStoreIndex(
        [node("logger-unreadable", {"tenant": "acme", "users": 7})], embed_model=HashEmbedding()
    )
    caplog.set_level(logging.WARNING, logger="llama_jev")
    with runtime_context(ALICE):
        assert JevRetriever.from_index(misspelled, selector(jev_server), acl, top_k=5).retrieve(QUERY) == []
        assert JevRetriever.from_index(unreadable, selector(jev_server), acl, top_k=5).retrieve(QUERY) == []
    clean = VectorStoreIndex(
        [node("logger-clean", {"tenant": "acme", "users": ["alice"]})], embed_model=HashEmbedding()
    )
    with runtime_context(RuntimeContext(user_id="alice")):
        assert JevRetriever.from_index(clean, selector(jev_server), acl, top_k=5).retrieve(QUERY) == []
    assert [(name, level) for name, level, _ in caplog.record_tuples] == [("llama_jev", logging.WARNING)] * 3
    messages = [message for _, _, message in caplog.record_tuples]
    assert "'users'" in messages[0]
    assert "of type int" in messages[1]
    assert "tenant_id" in messages[2]
