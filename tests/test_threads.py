"""The single-batch hand-off (``call_within``) and the cheap model copy the judged retrieval uses."""

from __future__ import annotations

import threading

import pytest
from llama_index.core.schema import NodeWithScore, TextNode
from pydantic import BaseModel, PrivateAttr

from llama_jev.core.models import copies_with, copy_with
from llama_jev.engine.pipeline import PROBABILITY_KEY, with_probability
from llama_jev.systemone import threads
from llama_jev.systemone.threads import call_within
from llama_jev.systemone.wire import NoulQuestion


def test_call_within_returns_the_result_from_another_thread() -> None:
    assert call_within(lambda: threading.get_ident(), timeout=5.0) != threading.get_ident()


def test_call_within_raises_what_the_call_raised() -> None:
    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        call_within(fail, timeout=5.0)
    assert call_within(lambda: "next", timeout=5.0) == "next"  # the worker survived it


def test_call_within_returns_at_the_timeout_while_the_call_is_still_blocked() -> None:
    release, finished = threading.Event(), threading.Event()

    def blocked() -> None:
        release.wait(10)
        finished.set()

    try:
        with pytest.raises(TimeoutError, match="budget gone"):
            call_within(blocked, timeout=0.05, expired="budget gone")
        assert not finished.is_set()
        # The blocked thread is not handed another call meanwhile.
        assert call_within(lambda: 7, timeout=5.0) == 7
    finally:
        release.set()
    assert finished.wait(5)


def test_call_within_waits_in_the_shared_pool_when_every_worker_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_worker_count", threads.EXECUTOR_THREADS)
    monkeypatch.setattr(threads, "_idle_workers", [])
    # The pool's threads are named llama-jev-judge_N; the hand-off's workers llama-jev-judge-call.
    assert call_within(lambda: threading.current_thread().name, timeout=5.0).startswith("llama-jev-judge_")
    release = threading.Event()
    try:
        with pytest.raises(TimeoutError):
            call_within(lambda: release.wait(10), timeout=0.05)
    finally:
        release.set()


def test_copy_with_is_model_copy_with_an_update() -> None:
    node = TextNode(id_="a", text="x", metadata={"k": 1}, excluded_llm_metadata_keys=["k"])
    update = {"metadata": {"k": 2}, "excluded_llm_metadata_keys": ["k", "j"]}
    copied, expected = copy_with(node, update), node.model_copy(update=update)
    assert type(copied) is TextNode
    assert copied == expected
    assert copied.__pydantic_fields_set__ == expected.__pydantic_fields_set__
    assert node.metadata == {"k": 1}
    assert node.excluded_llm_metadata_keys == ["k"]
    question = NoulQuestion(instructions={"question": "q", "candidate": ""})
    assert copy_with(question, {"instructions": "c"}) == question.model_copy(update={"instructions": "c"})


def test_copies_with_are_copy_with_each_value() -> None:
    question = NoulQuestion(instructions={"question": "q", "candidate": ""})
    values = [{"question": "q", "candidate": text} for text in ("a", "b")]
    copies = copies_with(question, "instructions", values)
    assert copies == [question.model_copy(update={"instructions": value}) for value in values]
    assert [c.__pydantic_fields_set__ for c in copies] == [{"instructions"}] * 2
    # A mutable model's copies do not share the set an assignment adds to.
    node = TextNode(id_="a", text="x")
    first, second = copies_with(node, "text", ["y", "z"])
    first.metadata = {"k": 1}
    assert "metadata" in first.__pydantic_fields_set__
    assert "metadata" not in second.__pydantic_fields_set__
    assert (first.text, second.text, node.text) == ("y", "z", "x")


def test_copies_with_keep_private_attributes_as_model_copy_does() -> None:
    class Held(BaseModel):
        value: str
        _count: int = PrivateAttr()  # no default: pydantic keeps an empty private dict

    held = Held(value="a")
    (copied,) = copies_with(held, "value", ["b"])
    assert copied == held.model_copy(update={"value": "b"})
    assert not hasattr(copied, "_count")


def test_with_probability_leaves_the_shared_node_untouched() -> None:
    node = NodeWithScore(node=TextNode(id_="a", text="x", metadata={"k": 1}), score=0.5)
    copied = with_probability(node, 0.9)
    assert copied.node.metadata == {"k": 1, PROBABILITY_KEY: 0.9}
    assert PROBABILITY_KEY in copied.node.excluded_llm_metadata_keys
    assert PROBABILITY_KEY in copied.node.excluded_embed_metadata_keys
    assert (copied.score, copied.node.node_id) == (0.5, "a")
    assert node.node.metadata == {"k": 1}
    assert PROBABILITY_KEY not in node.node.excluded_llm_metadata_keys
