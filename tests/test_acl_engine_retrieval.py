"""The final check through the ACL protocol: any BatchAcl in the retriever, the postprocessor and the tool.

An engine's answer decides which nodes are kept (order preserved, every allowed id kept); an
engine that cannot decide, or answers nonsense, fails the retrieval in every mode, sync and
async, and no node is returned. The async paths await the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle, TextNode

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevKnowledgeTool,
    JevNodePostprocessor,
    JevRetriever,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.errors import PermissionsUnavailableError

from .acl_support import AllowListAcl, DownAcl, GarbageAcl
from .corpus import ALICE, DOCS, memory_index, names
from .support import marked_answer

QUERY = "What are the refund conditions?"
MODES = [Mode.OFF, Mode.SHADOW, Mode.ENFORCE]


def _selector(mode: Mode, records: list[DecisionRecord] | None = None) -> CandidateSelector:
    observer = None if records is None or mode is Mode.OFF else (lambda ctx, record: records.append(record))
    return CandidateSelector(ScriptedJudge(marked_answer), ExecutionOptions(mode=mode, observer=observer))


def _ids(*doc_names: str) -> set[str]:
    return {doc.id for doc in DOCS if doc.name in doc_names}


class Fixed(BaseRetriever):
    """A retriever returning the same nodes, in the same order, whatever is asked."""

    def __init__(self, nodes: Sequence[NodeWithScore]) -> None:
        super().__init__()
        self.nodes = list(nodes)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return list(self.nodes)


async def _retrieve(retriever: JevRetriever, sync: bool) -> list[NodeWithScore]:
    with runtime_context(ALICE):
        return retriever.retrieve(QUERY) if sync else await retriever.aretrieve(QUERY)


# --- the engine's verdict decides --------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW])
async def test_a_batch_acl_keeps_exactly_the_ids_it_allows_in_the_store_order(mode: Mode, sync: bool) -> None:
    inner = memory_index().as_retriever(similarity_top_k=len(DOCS))
    plain = [node.node.node_id for node in inner.retrieve(QUERY)]
    acl = AllowListAcl(_ids("acme-refund", "acme-hours", "globex-pricing", "acme-shipping"))
    nodes = await _retrieve(JevRetriever(inner, _selector(mode), acl), sync)
    assert [node.node.node_id for node in nodes] == [node_id for node_id in plain if node_id in acl.ids]
    # One batched question per retrieval, on the path that was taken.
    assert (acl.sync_calls, acl.async_calls) == ((1, 0) if sync else (0, 1))


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_enforce_judges_only_what_the_engine_allows_and_records_the_engine(sync: bool) -> None:
    records: list[DecisionRecord] = []
    acl = AllowListAcl(_ids("acme-refund", "acme-compensation", "globex-refund"))
    retriever = JevRetriever(
        memory_index().as_retriever(similarity_top_k=len(DOCS)), _selector(Mode.ENFORCE, records), acl
    )
    nodes = await _retrieve(retriever, sync)
    assert set(names(nodes)) == {"acme-refund", "acme-compensation", "globex-refund"}
    (record,) = records
    assert record.engine == "allow-list"
    assert (record.candidates, record.denied) == (3, len(DOCS) - 3)


def test_every_chunk_of_an_allowed_document_is_kept() -> None:
    chunks = [
        NodeWithScore(node=TextNode(id_=f"doc-1#{i}", text=f"chunk {i}", metadata={"doc_id": "doc-1"}), score=1.0)
        for i in range(4)
    ]
    acl = AllowListAcl({"doc-1#0", "doc-1#1", "doc-1#2", "doc-1#3"})
    retriever = JevRetriever(Fixed(chunks), _selector(Mode.OFF), acl)
    with runtime_context(ALICE):
        assert [node.node.node_id for node in retriever.retrieve(QUERY)] == [f"doc-1#{i}" for i in range(4)]


def test_two_nodes_sharing_an_id_are_each_decided_on_their_own_metadata() -> None:
    # Two stores fused: the same id, one readable node and one that is not. An answer of ids
    # cannot tell them apart, so each is asked about on its own.
    readable = NodeWithScore(node=TextNode(id_="same", text="a", metadata={"owner": "alice"}), score=1.0)
    foreign = NodeWithScore(node=TextNode(id_="same", text="b", metadata={"owner": "gina"}), score=0.9)
    post = JevNodePostprocessor(_selector(Mode.OFF), lambda ctx, node: node.metadata["owner"] == ctx.user_id)
    with runtime_context(ALICE):
        assert [node.node.text for node in post.postprocess_nodes([foreign, readable], query_str=QUERY)] == ["a"]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_the_postprocessor_and_the_tool_take_a_batch_acl(sync: bool) -> None:
    acl = AllowListAcl(_ids("acme-refund"))
    post = JevNodePostprocessor(_selector(Mode.ENFORCE), acl, top_n=3)
    retrieved = memory_index().as_retriever(similarity_top_k=len(DOCS)).retrieve(QUERY)
    tool = JevKnowledgeTool(JevRetriever(memory_index().as_retriever(similarity_top_k=5), _selector(Mode.OFF), acl))
    with runtime_context(ALICE):
        if sync:
            kept = post.postprocess_nodes(retrieved, query_str=QUERY)
            passages = tool.search(QUERY)
        else:
            kept = await post.apostprocess_nodes(retrieved, query_str=QUERY)
            passages = await tool.asearch(QUERY)
    assert names(kept) == ["acme-refund"]
    assert [passage["id"] for passage in passages] == [doc.id for doc in DOCS if doc.name == "acme-refund"]


# --- an engine that cannot decide fails the retrieval ------------------------------------------


def _garbage_answers() -> list[Any]:
    return [
        lambda nodes: [node.node_id for node in nodes],  # a list, not a set
        lambda nodes: None,
        lambda nodes: {node.node_id for node in nodes} | {"never-asked"},  # ids nobody asked about
        lambda nodes: {1, 2},
        lambda nodes: "everything",
    ]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
async def test_an_engine_that_is_down_fails_the_retrieval_in_every_mode(mode: Mode, sync: bool) -> None:
    records: list[DecisionRecord] = []
    acl = DownAcl()
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=5), _selector(mode, records), acl)
    with pytest.raises(PermissionsUnavailableError) as raised:
        await _retrieve(retriever, sync)
    assert raised.value is acl.error  # unchanged: the engine's own error, reason and retry hint
    assert records == []  # nothing judged, nothing served


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("answer", _garbage_answers(), ids=["list", "none", "unasked-id", "ints", "str"])
async def test_an_engine_answering_garbage_fails_the_retrieval_in_every_mode(
    mode: Mode, sync: bool, answer: Any
) -> None:
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=5), _selector(mode), GarbageAcl(answer))
    with pytest.raises(PermissionsUnavailableError) as raised:
        await _retrieve(retriever, sync)
    assert (raised.value.engine, raised.value.reason) == ("garbage", "INVALID_RESPONSE")


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
async def test_the_postprocessor_and_the_tool_fail_closed_too(mode: Mode, sync: bool) -> None:
    acl = DownAcl()
    post = JevNodePostprocessor(_selector(mode), acl)
    tool = JevKnowledgeTool(JevRetriever(memory_index().as_retriever(similarity_top_k=5), _selector(mode), acl))
    retrieved = memory_index().as_retriever(similarity_top_k=5).retrieve(QUERY)

    async def postprocess() -> object:
        if sync:
            return post.postprocess_nodes(retrieved, query_str=QUERY)
        return await post.apostprocess_nodes(retrieved, query_str=QUERY)

    async def search() -> object:
        return tool.search(QUERY) if sync else await tool.asearch(QUERY)

    with runtime_context(ALICE):
        with pytest.raises(PermissionsUnavailableError):
            await postprocess()
        with pytest.raises(PermissionsUnavailableError):
            await search()


async def test_the_async_path_never_calls_the_engine_synchronously() -> None:
    class AsyncOnly(AllowListAcl):
        def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
            raise AssertionError("the async retrieval blocked the loop on the sync engine call")

    acl = AsyncOnly(_ids("acme-refund"))
    retriever = JevRetriever(memory_index().as_retriever(similarity_top_k=5), _selector(Mode.SHADOW), acl)
    nodes = await _retrieve(retriever, sync=False)
    assert names(nodes) == ["acme-refund"]
    assert acl.async_calls == 2  # two rounds (5, then 10: the store's seven), each awaited


def test_an_acl_that_is_neither_callable_nor_a_batch_acl_is_refused() -> None:
    with pytest.raises(TypeError, match="BatchAcl"):
        JevRetriever(memory_index().as_retriever(), _selector(Mode.OFF), object())  # type: ignore[arg-type]
