"""The opt-in labelling sample (LabelSampler through ExecutionOptions, and collect(samples=...)) and
the blind, stratified sheet drawn from it (python -m llama_jev.label_sheet --samples)."""

from __future__ import annotations

import csv
import json
import logging
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.calibration import GoldenQuery, LabelSampler, collect, read_samples, write_sample_sheet
from llama_jev.engine import RELEVANCE_QUESTION, Candidate

from .support import HashEmbedding, marked, marked_answer

ROOT = Path(__file__).resolve().parents[1]
ACL = MetadataAcl(tenant_key="tenant")
ACME = RuntimeContext(user_id="qa", tenant_id="acme")


def index() -> VectorStoreIndex:
    nodes = [
        TextNode(
            id_=f"acme{i}", text=marked(round(0.05 + 0.09 * i, 2), f"acme passage {i}"), metadata={"tenant": "acme"}
        )
        for i in range(10)
    ]
    nodes += [TextNode(id_="globex0", text=marked(0.9, "globex secret"), metadata={"tenant": "globex"})]
    return VectorStoreIndex(nodes, embed_model=HashEmbedding())


def retriever(options: ExecutionOptions) -> JevRetriever:
    selector = CandidateSelector(ScriptedJudge(marked_answer), options)
    return JevRetriever.from_index(index(), selector, ACL, top_k=11, candidate_limit=11)


def test_a_sampled_retrieval_keeps_the_query_and_only_what_the_caller_may_read(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    records: list[DecisionRecord] = []
    options = ExecutionOptions(
        mode=Mode.SHADOW,
        observer=lambda ctx, record: records.append(record),
        label_sampler=LabelSampler(samples, rate=1.0),
    )
    with runtime_context(ACME):
        retriever(options).retrieve("what are the refund conditions?")
    assert stat.S_IMODE(samples.stat().st_mode) == 0o600
    (line,) = [json.loads(text) for text in samples.read_text(encoding="utf-8").splitlines()]
    assert set(line) == {"decision_id", "purpose", "version", "query", "candidates", "created_at"}
    assert line["decision_id"] == records[0].decision_id
    assert line["query"] == "what are the refund conditions?"
    assert {c["node_id"] for c in line["candidates"]} == {f"acme{i}" for i in range(10)}  # no globex0
    assert all(c["p"] == records[0].scores[c["node_id"]] for c in line["candidates"])
    assert "globex secret" not in samples.read_text(encoding="utf-8")


@pytest.mark.parametrize("use_async", [False, True], ids=["select", "aselect"])
async def test_a_selector_called_directly_samples_too(tmp_path: Path, use_async: bool) -> None:
    samples = tmp_path / "samples.jsonl"
    records: list[DecisionRecord] = []
    options = ExecutionOptions(
        mode=Mode.SHADOW,
        observer=lambda ctx, record: records.append(record),
        label_sampler=LabelSampler(samples, rate=1.0),
    )
    selector = CandidateSelector(ScriptedJudge(marked_answer), options)
    candidates = [Candidate("a", marked(0.9, "refunds within 14 days")), Candidate("b", marked(0.1, "opening hours"))]
    if use_async:
        await selector.aselect("can I get a refund?", RELEVANCE_QUESTION, candidates, ctx=ACME)
    else:
        selector.select("can I get a refund?", RELEVANCE_QUESTION, candidates, ctx=ACME)
    (line,) = [json.loads(text) for text in samples.read_text(encoding="utf-8").splitlines()]
    assert line["decision_id"] == records[0].decision_id
    assert line["query"] == "can I get a refund?"
    assert [(c["node_id"], c["p"]) for c in line["candidates"]] == [("a", 0.9), ("b", 0.1)]


def test_a_retrieval_is_sampled_once(tmp_path: Path) -> None:
    sampler = LabelSampler(tmp_path / "samples.jsonl", rate=1.0)
    with runtime_context(ACME):
        retriever(ExecutionOptions(mode=Mode.SHADOW, label_sampler=sampler)).retrieve("refunds")
    assert sampler.written == 1
    assert len((tmp_path / "samples.jsonl").read_text(encoding="utf-8").splitlines()) == 1


def test_the_rate_samples_a_share_of_retrievals(tmp_path: Path) -> None:
    sampler = LabelSampler(tmp_path / "samples.jsonl", rate=0.25, seed=3)
    engine = retriever(ExecutionOptions(mode=Mode.SHADOW, label_sampler=sampler))
    with runtime_context(ACME):
        for q in range(200):
            engine.retrieve(f"question {q}")
    assert 30 <= sampler.written <= 70
    assert len(list(read_samples(tmp_path / "samples.jsonl"))) == 10 * sampler.written


def test_mode_off_samples_nothing(tmp_path: Path) -> None:
    sampler = LabelSampler(tmp_path / "samples.jsonl", rate=1.0)
    with runtime_context(ACME):
        retriever(ExecutionOptions(mode=Mode.OFF, label_sampler=sampler)).retrieve("anything")
    assert sampler.written == 0
    assert not (tmp_path / "samples.jsonl").exists()


class BrokenSampler:
    def offer(self, record: DecisionRecord, query: str, candidates: Any) -> None:
        raise OSError("disk full")


def test_a_sampler_that_raises_never_changes_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    with runtime_context(ACME):
        expected = retriever(ExecutionOptions(mode=Mode.ENFORCE)).retrieve("refunds")
        with caplog.at_level(logging.ERROR):
            got = retriever(ExecutionOptions(mode=Mode.ENFORCE, label_sampler=BrokenSampler())).retrieve("refunds")
    assert [n.node.node_id for n in got] == [n.node.node_id for n in expected]
    assert "label sampler raised" in caplog.text


def test_a_label_sampler_without_offer_is_refused() -> None:
    with pytest.raises(TypeError, match="label_sampler"):
        ExecutionOptions(mode=Mode.SHADOW, label_sampler=object())  # type: ignore[arg-type]


def test_collect_writes_the_samples_of_every_golden_query(tmp_path: Path) -> None:
    samples = tmp_path / "samples.jsonl"
    golden = [GoldenQuery(f"question {q}", frozenset({"acme1"})) for q in range(3)]
    collected = collect(retriever(ExecutionOptions(mode=Mode.ENFORCE)), golden, ctx=ACME, samples=samples)
    lines = [json.loads(text) for text in samples.read_text(encoding="utf-8").splitlines()]
    assert [line["decision_id"] for line in lines] == [record.decision_id for record in collected.records]
    assert stat.S_IMODE(samples.stat().st_mode) == 0o600


def _samples(path: Path, pairs: int = 400) -> Path:
    lines = []
    for d in range(pairs // 10):
        # most pairs are clear cases (p near 0 or 1), few sit in the middle band
        ps = [0.01, 0.02, 0.03, 0.04, 0.05, 0.96, 0.97, 0.98, 0.99, 0.3 + 0.4 * (d % 5) / 5]
        lines.append(
            {
                "decision_id": f"d{d}",
                "purpose": "retrieval_relevance",
                "version": "v1",
                "query": f"question {d}",
                "candidates": [{"node_id": f"n{d}-{i}", "text": f"passage {d}-{i}", "p": p} for i, p in enumerate(ps)],
                "created_at": "2026-12-03T00:00:00+00:00",
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_the_sheet_is_blind_shuffled_and_covers_the_middle_band(tmp_path: Path) -> None:
    sheet = write_sample_sheet(_samples(tmp_path / "samples.jsonl"), tmp_path / "sheet.csv", size=60, seed=1)
    with (tmp_path / "sheet.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["decision_id", "node_id", "question", "passage", "relevant"]
    assert len(rows) == sheet.rows == 60
    assert all(row["relevant"] == "" for row in rows)
    assert all(row["question"] == f"question {row['decision_id'][1:]}" for row in rows)
    # 6 bands of p hold pairs: 10 rows each, and what the thin middle bands lack goes to the others.
    # A plain random draw would give the middle (0.3-0.7, 40 of 400 pairs) about 6 rows, not 36.
    assert sheet.strata == (12, 0, 0, 12, 8, 8, 8, 0, 0, 12)
    assert rows != sorted(rows, key=lambda row: row["decision_id"])  # shuffled
    again = write_sample_sheet(tmp_path / "samples.jsonl", tmp_path / "again.csv", size=60, seed=1)
    assert (tmp_path / "again.csv").read_text() == (tmp_path / "sheet.csv").read_text()
    assert again.strata == sheet.strata


@pytest.mark.slow
def test_label_sheet_cli_from_samples(tmp_path: Path) -> None:
    samples = _samples(tmp_path / "samples.jsonl")
    result = subprocess.run(
        [sys.executable, "-m", "llama_jev.label_sheet", "--samples", str(samples), "--out", str(tmp_path / "s.csv"),
         "--size", "25", "--seed", "2"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "wrote 25 pairs (of 400 sampled)" in result.stdout
    assert "python -m llama_jev.label " in result.stdout
    assert stat.S_IMODE((tmp_path / "s.csv").stat().st_mode) == 0o600
