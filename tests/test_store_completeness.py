"""A store says whether its short answer is complete; widening reads "short" as "exhausted" only then.

The store here is LlamaIndex's in-memory store whose answer is cut as a filtered HNSW scan cuts
it when its budget runs out: at most ``cap(k)`` of the rows its filter admits. It reports that
through ``llama_jev.stores.completeness.report_complete``, as ``AclPGVectorStore`` and the Milvus
adapter do. Read as "the store holds no more", the cut answer would silently leave the caller
short (main before Part 6: 7 of 10).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import QueryBundle, TextNode
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryResult

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.retrieval.widening import MAX_RECALL, Widening
from llama_jev.stores.completeness import StoreAnswer, listening, report_complete

from .support import HashEmbedding

DIMENSIONS = 4
ACL = MetadataAcl(tenant_key="tenant")
ALICE = RuntimeContext(user_id="alice", tenant_id="acme")
READABLE = 10
FOREIGN = 30


class BudgetedStore(SimpleVectorStore):
    """The in-memory store with a scan budget: at most ``cap(k)`` admitted rows per answer.

    When the budget cuts the answer it says so (``report_complete(False)``); when every admitted
    row fit, the answer is complete.
    """

    def __init__(self, cap: Callable[[int], int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cap = cap

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        result = super().query(query, **kwargs)
        cap = self._cap(query.similarity_top_k)
        ids = list(result.ids or [])
        report_complete(len(ids) <= cap)
        return VectorStoreQueryResult(ids=ids[:cap], similarities=list(result.similarities or [])[:cap], nodes=None)


def _nodes() -> list[TextNode]:
    nodes = [
        TextNode(
            id_=f"foreign-{i:03d}", text="refund", embedding=[1.0, 0.01 * i, 0.0, 0.0], metadata={"tenant": "globex"}
        )
        for i in range(FOREIGN)
    ]
    nodes += [
        TextNode(
            id_=f"acme-{i:03d}", text="refund", embedding=[1.0, 0.5 + 0.01 * i, 0.0, 0.0], metadata={"tenant": "acme"}
        )
        for i in range(READABLE)
    ]
    return nodes


def _retriever(cap: Callable[[int], int], records: list[DecisionRecord], mode: Mode = Mode.SHADOW) -> JevRetriever:
    store = BudgetedStore(cap)
    index = VectorStoreIndex(
        _nodes(),
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=DIMENSIONS),
    )
    options = ExecutionOptions(mode=mode, observer=lambda _ctx, record: records.append(record))
    selector = CandidateSelector(ScriptedJudge(lambda *_: 0.9), options)
    retriever = JevRetriever.from_index(index, selector, ACL, top_k=10)
    assert retriever.prefilter
    return retriever


def _bundle() -> QueryBundle:
    return QueryBundle("refund", embedding=[1.0, 0.0, 0.0, 0.0])


def test_a_short_answer_the_store_calls_incomplete_is_asked_again() -> None:
    records: list[DecisionRecord] = []
    # The budget admits three quarters of the window: 7 of 10 at first, all 10 at a window of 20.
    retriever = _retriever(lambda k: k * 3 // 4, records)
    nodes = retriever.retrieve(_bundle(), ctx=ALICE)
    assert len(nodes) == READABLE
    assert {n.node.metadata["tenant"] for n in nodes} == {"acme"}
    assert records[-1].rounds == 2
    assert records[-1].shortfall is None


async def test_async_reads_the_store_s_report_too() -> None:
    records: list[DecisionRecord] = []
    retriever = _retriever(lambda k: k * 3 // 4, records)
    nodes = await retriever.aretrieve(_bundle(), ctx=ALICE)
    assert len(nodes) == READABLE
    assert records[-1].rounds == 2


def test_a_complete_short_answer_ends_the_rounds() -> None:
    records: list[DecisionRecord] = []
    retriever = _retriever(lambda k: k * 100, records)  # never cut: the store holds no more
    retriever.top_k = 20
    nodes = retriever.retrieve(_bundle(), ctx=ALICE)
    assert len(nodes) == READABLE
    assert records[-1].rounds == 1
    assert records[-1].shortfall is None


@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW, Mode.ENFORCE])
def test_a_budget_that_never_grows_is_warned_and_recorded(mode: Mode, caplog: pytest.LogCaptureFixture) -> None:
    records: list[DecisionRecord] = []
    retriever = _retriever(lambda _k: 4, records, mode)  # the scan never finds more than 4
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        nodes = retriever.retrieve(_bundle(), ctx=ALICE)
        retriever.retrieve(_bundle(), ctx=ALICE)
    assert len(nodes) == 4
    warnings = [r.getMessage() for r in caplog.records if "fewer nodes than wanted" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per retriever and cause
    assert "stopped before reading all" in warnings[0]
    assert "acme" not in warnings[0]  # counts only, never a value
    if mode is not Mode.OFF:
        assert records[-1].shortfall == "incomplete"
        assert records[-1].found == 4


def test_widening_reads_complete_false_as_more_to_ask() -> None:
    plan = Widening(wanted=10, widen=True, pushdown=True)
    assert plan.next_window() == 10
    plan.add(plan.fresh([], complete=False), [])
    assert not plan.exhausted
    assert plan.next_window() == 20
    plan.add(plan.fresh([], complete=True), [])
    assert plan.exhausted
    assert plan.next_window() is None
    assert plan.shortfall() is None  # the store said it holds no more


def test_widening_stops_at_the_bound_and_names_the_cause() -> None:
    plan = Widening(wanted=10, widen=True, pushdown=True)
    while (window := plan.next_window()) is not None:
        assert window <= MAX_RECALL
        plan.add(plan.fresh([], complete=False), [])
    shortfall = plan.shortfall()
    assert shortfall is not None
    assert shortfall[0] == "incomplete"


def test_reports_of_one_round_combine_and_need_a_listener() -> None:
    report_complete(False)  # nobody listens: nothing happens
    with listening() as answer:
        assert answer.reads_complete(True) is True
        report_complete(True)
        report_complete(False)
    assert answer == StoreAnswer(complete=False)
    assert answer.reads_complete(True) is False
