"""Mode x outcome matrix over real LlamaIndex indexes (in-memory and Qdrant local mode), judged
over HTTP by the System One test server."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    JevRetriever,
    Mode,
    RetrievalInconclusiveError,
    RetrievalUnavailableError,
    RetryPolicy,
    RuntimeContext,
    runtime_context,
)
from llama_jev.engine import PROBABILITY_KEY
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .corpus import (
    ACL,
    ALICE,
    BY_ID,
    DOCS,
    NOBODY,
    SAM,
    async_qdrant_index,
    memory_index,
    names,
    qdrant_index,
    readable,
)
from .support import marked_answer

QUERY = "What are the refund conditions?"
TOP_K = 10  # larger than the corpus: OFF and SHADOW return every readable document


class UpstreamDown(RuntimeError):
    pass


class BrokenRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise UpstreamDown("vector store unreachable")


def constant(p: float) -> Callable[..., float]:
    return lambda state, question_id, instructions: p


# scenario -> how the judge behaves
SCENARIOS: dict[str, Callable[[SystemOneTestServer], None]] = {
    "all_relevant": lambda server: server.set_answer(constant(0.97)),
    "mixed": lambda server: server.set_answer(marked_answer),
    "all_irrelevant": lambda server: server.set_answer(constant(0.03)),
    "all_uncertain": lambda server: server.set_answer(constant(0.5)),
    "judge_timeout": lambda server: server.set_latency(3.0),
    "judge_http_error": lambda server: server.inject_always(Fault.status(500)),
    "judge_invalid_response": lambda server: server.inject_always(Fault.probability(math.nan)),
    "upstream_error": lambda server: server.set_answer(marked_answer),
    "no_authorized_candidates": lambda server: server.set_answer(marked_answer),
}

# what ENFORCE gives alice: a list of names, or the exception type
ENFORCE_EXPECTED: dict[str, Any] = {
    "all_relevant": None,  # every readable doc, ordered by p (all equal) then node id
    "mixed": ["acme-refund", "acme-alice-note"],
    "all_irrelevant": [],
    "all_uncertain": RetrievalInconclusiveError,
    "judge_timeout": RetrievalUnavailableError,
    "judge_http_error": RetrievalUnavailableError,
    "judge_invalid_response": RetrievalUnavailableError,
    "upstream_error": UpstreamDown,
    "no_authorized_candidates": [],
}
JUDGE_FAILURES = {
    "judge_timeout": "TIMEOUT",
    "judge_http_error": "CALL_OR_RESPONSE_ERROR",
    "judge_invalid_response": "CALL_OR_RESPONSE_ERROR",
}


class Harness:
    def __init__(self, index: Any, server: SystemOneTestServer) -> None:
        self.index = index
        self.server = server
        self.records: list[DecisionRecord] = []

    def retriever(self, mode: Mode, *, broken: bool = False) -> JevRetriever:
        client = JevClient(
            api_key=API_KEY,
            base_url=self.server.base_url,
            timeout=2.0,
            retry=RetryPolicy(max_retries=1, initial_backoff=0.01, max_backoff=0.02),
        )
        options = ExecutionOptions(mode=mode, budget=1.5, observer=lambda ctx, record: self.records.append(record))
        inner = BrokenRetriever() if broken else self.index.as_retriever(similarity_top_k=TOP_K)
        return JevRetriever(inner, CandidateSelector(client, options), ACL, top_k=TOP_K)

    async def retrieve(self, retriever: JevRetriever, ctx: RuntimeContext, use_async: bool) -> list[NodeWithScore]:
        with runtime_context(ctx):
            if use_async:
                return await retriever.aretrieve(QUERY)
            return retriever.retrieve(QUERY)

    async def upstream(self, use_async: bool) -> list[NodeWithScore]:
        inner = self.index.as_retriever(similarity_top_k=TOP_K)
        return await inner.aretrieve(QUERY) if use_async else inner.retrieve(QUERY)


@pytest.fixture(params=["memory", "qdrant"])
async def harness(
    request: pytest.FixtureRequest, jev_server: SystemOneTestServer, tmp_path: Path, use_async: bool
) -> AsyncIterator[Harness]:
    if request.param == "memory":
        yield Harness(memory_index(), jev_server)
    elif use_async:
        index, aclient = await async_qdrant_index(tmp_path / "qdrant")
        yield Harness(index, jev_server)
        await aclient.close()
    else:
        index, client = qdrant_index(tmp_path / "qdrant")
        yield Harness(index, jev_server)
        client.close()


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def use_async(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def _caller(scenario: str) -> RuntimeContext:
    return NOBODY if scenario == "no_authorized_candidates" else ALICE


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW])
async def test_off_and_shadow_return_the_acl_filtered_upstream_order(
    harness: Harness, use_async: bool, mode: Mode, scenario: str
) -> None:
    SCENARIOS[scenario](harness.server)
    ctx = _caller(scenario)
    retriever = harness.retriever(mode, broken=scenario == "upstream_error")
    if scenario == "upstream_error":
        with pytest.raises(UpstreamDown):
            await harness.retrieve(retriever, ctx, use_async)
        assert harness.records == []
        return
    nodes = await harness.retrieve(retriever, ctx, use_async)
    expected = [name for name in names(await harness.upstream(use_async)) if name in readable(ctx)]
    assert names(nodes) == expected
    assert all(PROBABILITY_KEY not in node.node.metadata for node in nodes)
    if mode is Mode.OFF:
        assert harness.server.request_count == 0
        assert harness.records == []
    else:
        assert len(harness.records) == 1
        expected_status = {
            "judge_timeout": "error",
            "judge_http_error": "error",
            "judge_invalid_response": "error",
            "all_uncertain": "inconclusive",
            "no_authorized_candidates": "skipped",
        }
        assert harness.records[0].status.value == expected_status.get(scenario, "decided")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_enforce_outcomes(harness: Harness, use_async: bool, scenario: str) -> None:
    SCENARIOS[scenario](harness.server)
    ctx = _caller(scenario)
    retriever = harness.retriever(Mode.ENFORCE, broken=scenario == "upstream_error")
    expected = ENFORCE_EXPECTED[scenario]
    if isinstance(expected, type):
        with pytest.raises(expected) as caught:
            await harness.retrieve(retriever, ctx, use_async)
        if scenario in JUDGE_FAILURES:
            assert caught.value.reason == JUDGE_FAILURES[scenario]  # type: ignore[attr-defined]
            assert [record.reason.value for record in harness.records] == [JUDGE_FAILURES[scenario]]
        if scenario == "all_uncertain":
            assert {BY_ID[i].name for i in caught.value.uncertain} == readable(ALICE)  # type: ignore[attr-defined]
        return
    nodes = await harness.retrieve(retriever, ctx, use_async)
    if expected is None:
        expected = [BY_ID[doc_id].name for doc_id in sorted(d.id for d in DOCS if d.name in readable(ctx))]
    assert names(nodes) == expected
    if scenario == "no_authorized_candidates":
        assert harness.server.request_count == 0
    for node in nodes:
        assert node.node.metadata[PROBABILITY_KEY] >= 0.8
    assert len(harness.records) == (0 if scenario == "upstream_error" else 1)


async def test_support_staff_see_the_private_rule_customers_do_not(harness: Harness, use_async: bool) -> None:
    harness.server.set_answer(marked_answer)
    retriever = harness.retriever(Mode.ENFORCE)
    assert names(await harness.retrieve(retriever, SAM, use_async)) == ["acme-refund", "acme-compensation"]
    assert "acme-compensation" not in names(await harness.retrieve(retriever, ALICE, use_async))
