"""Record fields that make decisions joinable and diagnosable: decision_id, retrieved, denied, query_key."""

from __future__ import annotations

import json

import pytest

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevRetriever,
    Mode,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.core.records import QUERY_KEY_SECRET_ENVIRONMENT, normalize_query, query_key
from llama_jev.engine import Candidate

from .corpus import ACL, ALICE, NOBODY, memory_index
from .support import marked_answer

QUERY = "What are the refund conditions?"


def _retriever(mode: Mode, records: list[DecisionRecord], **options: object) -> JevRetriever:
    selector = CandidateSelector(
        ScriptedJudge(marked_answer),
        ExecutionOptions(mode=mode, observer=lambda ctx, record: records.append(record), **options),  # type: ignore[arg-type]
    )
    return JevRetriever(memory_index().as_retriever(similarity_top_k=50), selector, ACL)


def test_every_record_has_a_unique_decision_id() -> None:
    records: list[DecisionRecord] = []
    selector = CandidateSelector(
        ScriptedJudge(lambda s, q, i: 0.9),
        ExecutionOptions(mode=Mode.SHADOW, observer=lambda ctx, record: records.append(record)),
    )
    for _ in range(20):
        selector.select(QUERY, "Relevant?", [Candidate("a", "text")])
    ids = {record.decision_id for record in records}
    assert len(ids) == 20
    assert all(isinstance(value, str) and len(value) >= 16 for value in ids)


@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
def test_record_counts_what_was_retrieved_and_what_the_acl_denied(mode: Mode) -> None:
    records: list[DecisionRecord] = []
    retriever = _retriever(mode, records)
    with runtime_context(ALICE):
        retriever.retrieve(QUERY)
    (record,) = records
    assert record.retrieved is not None
    assert record.denied is not None
    assert record.retrieved > record.denied > 0
    assert record.candidates == record.retrieved - record.denied


def test_everything_denied_is_told_apart_from_nothing_retrieved() -> None:
    records: list[DecisionRecord] = []
    retriever = _retriever(Mode.ENFORCE, records)
    with runtime_context(NOBODY):
        assert retriever.retrieve(QUERY) == []
    (record,) = records
    assert record.candidates == 0
    assert record.retrieved is not None
    assert record.retrieved > 0
    assert record.denied == record.retrieved


def test_direct_selector_records_leave_the_retrieval_counts_empty() -> None:
    records: list[DecisionRecord] = []
    selector = CandidateSelector(
        ScriptedJudge(lambda s, q, i: 0.9),
        ExecutionOptions(mode=Mode.SHADOW, observer=lambda ctx, record: records.append(record)),
    )
    selector.select(QUERY, "Relevant?", [Candidate("a", "text")])
    assert records[0].retrieved is None
    assert records[0].denied is None


def test_query_key_is_an_hmac_of_the_normalised_query_and_absent_without_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(QUERY_KEY_SECRET_ENVIRONMENT, raising=False)
    without: list[DecisionRecord] = []
    with runtime_context(ALICE):
        _retriever(Mode.SHADOW, without).retrieve(QUERY)
    assert without[0].query_key is None

    keyed: list[DecisionRecord] = []
    with runtime_context(ALICE):
        _retriever(Mode.SHADOW, keyed, query_key_secret="s3cret").retrieve("  what are the REFUND conditions?")
    assert keyed[0].query_key == query_key(QUERY, "s3cret")
    assert keyed[0].query_key != query_key(QUERY, "other")
    assert "refund" not in keyed[0].to_json().lower()


def test_query_key_secret_comes_from_the_environment_and_never_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(QUERY_KEY_SECRET_ENVIRONMENT, "env-secret-value")
    options = ExecutionOptions(mode=Mode.SHADOW)
    assert options.query_key(QUERY) == query_key(QUERY, "env-secret-value")
    assert "env-secret-value" not in repr(options)
    records: list[DecisionRecord] = []
    with runtime_context(ALICE):
        _retriever(Mode.SHADOW, records).retrieve(QUERY)
    assert "env-secret-value" not in json.dumps(records[0].model_dump(mode="json"))


def test_normalize_query_folds_case_width_and_whitespace() -> None:
    fullwidth = "\uff32\uff25\uff26\uff35\uff2e\uff24"  # "REFUND" in full-width letters
    assert normalize_query(f"  What\tare the {fullwidth}\nconditions? ") == "what are the refund conditions?"


def test_blank_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="query_key_secret"):
        ExecutionOptions(mode=Mode.SHADOW, query_key_secret="")


# --- engine, restriction and widening (issue 33 / 34) -----------------------------------------


@pytest.mark.parametrize("mode", [Mode.SHADOW, Mode.ENFORCE])
def test_record_names_the_engine_the_restriction_kind_and_the_widening(mode: Mode) -> None:
    records: list[DecisionRecord] = []
    retriever = _retriever(mode, records)
    with runtime_context(ALICE):
        retriever.retrieve(QUERY)
    (record,) = records
    assert (record.engine, record.restriction, record.pushdown) == ("metadata", "none", False)
    assert record.wanted == 50  # top_k 50; ENFORCE: max(candidate_limit 20, top_k 50)
    assert record.found == record.candidates
    assert record.rounds == 1  # the small store answered fewer than asked: exhausted at once


def test_records_without_the_new_fields_still_load_and_new_ones_round_trip(tmp_path: object) -> None:
    from pathlib import Path

    from llama_jev.calibration import load_records

    old = {
        "decision_id": "d" * 32,
        "purpose": "retrieval_relevance",
        "version": "v1",
        "mode": "shadow",
        "status": "decided",
        "reason": "CLASSIFIED",
        "elapsed_ms": 1.0,
        "candidates": 1,
        "requests": 1,
        "scores": {"a": 0.9},
    }
    before = DecisionRecord.model_validate(old)
    assert (before.engine, before.restriction, before.wanted, before.found, before.rounds) == (None,) * 5
    new = before.model_copy(
        update={"decision_id": "e" * 32, "engine": "cerbos", "restriction": "ids", "wanted": 5, "found": 4, "rounds": 3}
    )
    again = DecisionRecord.model_validate_json(new.to_json())
    assert again == new
    assert json.loads(new.to_json())["restriction"] == "ids"
    log = Path(str(tmp_path)) / "records.jsonl"
    log.write_text(json.dumps(old) + "\n" + new.to_json() + "\n", encoding="utf-8")
    assert [decision.scores for decision in load_records(log)] == [{"a": 0.9}, {"a": 0.9}]


def test_a_restriction_kind_outside_the_five_is_refused() -> None:
    with pytest.raises(ValueError, match="restriction"):
        DecisionRecord(
            purpose="p",
            version="v",
            mode=Mode.SHADOW,
            status="decided",  # type: ignore[arg-type]
            reason="CLASSIFIED",  # type: ignore[arg-type]
            elapsed_ms=1.0,
            candidates=0,
            requests=0,
            restriction="n001,n002",  # type: ignore[arg-type]  # ids never go into a record
        )
