"""What makes one wave cheap keeps every guarantee: exact node copies, answers checked once but
never skipped, requests evened out within their limits, and a test server that refuses load
beyond its limit the way a production server does."""

from __future__ import annotations

import concurrent.futures
import threading

import httpx
import pytest
from llama_index.core.schema import MetadataMode, NodeRelationship, NodeWithScore, RelatedNodeInfo, TextNode

from llama_jev import CandidateSelector, ExecutionOptions, Mode, ScriptedJudge, Status
from llama_jev.engine import RELEVANCE_QUESTION, Candidate
from llama_jev.engine.pipeline import PROBABILITY_KEY, with_probability
from llama_jev.engine.selector import estimate_tokens, even_out, plan_batches
from llama_jev.errors import JevInvalidResponseError
from llama_jev.systemone import NoulAnswer, NoulQuestion, SystemOneRequest, SystemOneResult
from llama_jev.systemone.wire import check_result
from llama_jev.testing import SystemOneTestServer

from .support import marked_answer


def rich_node() -> NodeWithScore:
    node = TextNode(
        id_="doc-7",
        text="Refunds within seven days.",
        metadata={"tenant": "acme", "users": ["u1", "u2"], "nested": {"a": 1}},
        excluded_llm_metadata_keys=["tenant"],
        excluded_embed_metadata_keys=["users"],
        embedding=[0.1, 0.2, 0.3],
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="source-1")},
    )
    return NodeWithScore(node=node, score=0.42)


def test_the_probability_copy_is_exact_and_leaves_the_upstream_node_alone() -> None:
    upstream = rich_node()
    before = upstream.model_dump()
    copy = with_probability(upstream, 0.91)
    assert upstream.model_dump() == before  # nothing upstream changed, not even nested values
    assert type(copy.node) is TextNode
    assert copy.node is not upstream.node
    assert copy.score == 0.42
    assert copy.node.node_id == "doc-7"
    assert copy.node.embedding == [0.1, 0.2, 0.3]
    assert copy.node.relationships == upstream.node.relationships
    assert copy.node.metadata == {**upstream.node.metadata, PROBABILITY_KEY: 0.91}
    assert copy.node.metadata is not upstream.node.metadata
    assert copy.node.excluded_llm_metadata_keys == ["tenant", PROBABILITY_KEY]
    assert copy.node.excluded_embed_metadata_keys == ["users", PROBABILITY_KEY]
    assert copy.node.excluded_llm_metadata_keys is not upstream.node.excluded_llm_metadata_keys
    assert PROBABILITY_KEY not in copy.node.get_content(metadata_mode=MetadataMode.LLM)
    assert PROBABILITY_KEY not in copy.node.get_content(metadata_mode=MetadataMode.EMBED)
    # The copy is a normal node: later changes to it validate and never reach upstream.
    copy.node.metadata["extra"] = "x"
    assert "extra" not in upstream.node.metadata
    assert copy.node.model_dump()["metadata"][PROBABILITY_KEY] == 0.91


def one_question(*ids: str) -> SystemOneRequest:
    return SystemOneRequest(state="q", questions={i: NoulQuestion(instructions=f"text {i}") for i in ids})


def test_a_checked_result_is_still_checked_against_another_request() -> None:
    asked = one_question("item_0")
    result = ScriptedJudge(lambda *_: 0.5).system_one(asked)  # checked against `asked`
    assert check_result(asked, result) is result
    with pytest.raises(JevInvalidResponseError, match="missing"):
        check_result(one_question("item_0", "item_1"), result)


def test_a_copy_with_other_answers_is_checked_again() -> None:
    asked = one_question("item_0")
    result = ScriptedJudge(lambda *_: 0.5).system_one(asked)
    forged = result.model_copy(update={"answers": {"other": NoulAnswer(type="noul", noul=0.5)}})
    with pytest.raises(JevInvalidResponseError, match="unexpected"):
        check_result(asked, forged)


def test_requests_with_non_finite_numbers_are_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="finite"):
        SystemOneRequest(state={"threshold": float("nan")}, questions={"item_0": NoulQuestion(instructions="x")})


def test_packed_requests_are_evened_out_within_the_limits() -> None:
    candidates = [Candidate(f"n{i}", "word " * 50) for i in range(1024)]
    packed = plan_batches(candidates, fixed_tokens=20, batch_size=1024, max_request_tokens=30_000)
    even = even_out(packed, fixed_tokens=20, batch_size=1024, max_request_tokens=30_000)
    assert len(even) == len(packed) > 1
    assert [c for batch in even for c in batch] == candidates  # same candidates, same order
    sizes = [len(batch) for batch in even]
    assert max(sizes) - min(sizes) <= 1
    assert max(len(b) for b in packed) - min(len(b) for b in packed) > 1


def test_evening_out_never_breaks_a_limit() -> None:
    # One large candidate among small ones: an even split by cost would overflow a request.
    candidates = [Candidate("big", "x" * 2_900), *(Candidate(f"s{i}", "y") for i in range(10))]
    packed = plan_batches(candidates, fixed_tokens=10, batch_size=6, max_request_tokens=1_100)
    even = even_out(packed, fixed_tokens=10, batch_size=6, max_request_tokens=1_100)
    for batch in even:
        assert len(batch) <= 6
        assert 10 + sum(estimate_tokens(c.text) + 16 for c in batch) <= 1_100
    assert [c for batch in even for c in batch] == candidates


def test_the_test_server_refuses_requests_beyond_its_in_flight_limit() -> None:
    body = {"state": "q", "questions": {"item_0": {"type": "noul", "instructions": "x"}}}
    # Long enough that all four requests overlap even on a loaded machine.
    with SystemOneTestServer(latency=1.5, in_flight_limit=2, limit_retry_after=0.25) as server:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda _: httpx.post(server.url, json=body, timeout=5), range(4)))
        statuses = sorted(response.status_code for response in responses)
        assert statuses == [200, 200, 429, 429]
        assert {r.headers.get("retry-after") for r in responses if r.status_code == 429} == {"0.25"}
        assert server.rate_limited_count == 2
        assert server.max_in_flight == 2  # refused requests were never being handled
        server.reset()
        assert httpx.post(server.url, json=body).status_code == 200  # the limit is about load, not a ban


def test_the_in_flight_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="in_flight_limit"):
        SystemOneTestServer(in_flight_limit=0)


def test_checking_a_result_does_not_change_its_equality() -> None:
    asked = one_question("item_0")
    checked = ScriptedJudge(marked_answer).system_one(asked)
    fresh = SystemOneResult.model_validate(checked.model_dump())
    assert checked == fresh
    assert check_result(asked, checked) is checked


def test_a_structured_state_is_still_validated_once_before_sending() -> None:
    judge = ScriptedJudge(marked_answer)
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE))
    with pytest.raises(ValueError, match="finite"):
        selector.select({"query": "refunds", "weight": float("inf")}, RELEVANCE_QUESTION, [Candidate("a", "x")])
    assert judge.requests == []
    decision = selector.select({"query": "refunds", "weight": 2.0}, RELEVANCE_QUESTION, [Candidate("a", "[p=0.9]")])
    assert decision.status is Status.DECIDED


def test_sync_judgements_share_their_threads() -> None:
    seen: list[threading.Thread] = []

    def answer(state: object, question_id: str, instructions: object) -> float:
        seen.append(threading.current_thread())
        return 0.9

    selector = CandidateSelector(ScriptedJudge(answer), ExecutionOptions(mode=Mode.ENFORCE))
    before = set(threading.enumerate())
    for _ in range(20):
        selector.select("q", RELEVANCE_QUESTION, [Candidate("a", "x")])
    assert len(seen) == 20
    assert threading.main_thread() not in seen  # the budget holds for a judge ignoring its timeout
    assert len(set(seen) - before) <= 1  # an existing thread reused, not a new pool per judgement
