"""The calibration contract as an outsider reads it (DESIGN Part 2 "Calibration"): found by an
independent audit, each test names the behaviour a user relies on."""

from __future__ import annotations

import csv
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevClient,
    JevRetriever,
    JsonlObserver,
    MetadataAcl,
    Mode,
    RuntimeContext,
)
from llama_jev.calibrate import main
from llama_jev.calibration import (
    CalibratedJudge,
    CalibrationInputError,
    GoldenQuery,
    InsufficientLabelsError,
    PlattMapping,
    calibrate,
    collect,
)
from llama_jev.engine.selector import Candidate
from llama_jev.systemone.judge import RELEVANCE_QUESTION
from llama_jev.testing import SystemOneTestServer

from .calibration_support import overconfident_log, write_jsonl
from .conftest import API_KEY
from .support import HashEmbedding, marked

ACL = MetadataAcl(tenant_key="tenant")
USER = RuntimeContext(user_id="qa", tenant_id="acme")


def test_collect_asks_the_question_the_retriever_was_built_with(
    jev_server: SystemOneTestServer, tmp_path: Path
) -> None:
    question = "Does this passage say how refunds are paid?"
    index = VectorStoreIndex(
        [TextNode(id_=f"doc{i}", text=marked(0.9, f"passage {i}"), metadata={"tenant": "acme"}) for i in range(3)],
        embed_model=HashEmbedding(),
    )
    judge = JevClient(api_key=API_KEY, base_url=jev_server.base_url)
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE))
    retriever = JevRetriever.from_index(index, selector, ACL, top_k=3, question=question)
    assert retriever.question == question

    collect(retriever, [GoldenQuery("how are refunds paid?", {"doc0"})], ctx=USER)

    asked = {
        item["instructions"]["question"]
        for request in jev_server.requests
        if request.json is not None
        for item in request.json["questions"].values()
    }
    assert asked == {question}


def test_report_html_holds_no_url_at_all() -> None:
    records, labels = overconfident_log(60, seed=5)
    page = calibrate(records, labels).to_html()
    assert "<svg" in page
    assert "<script" not in page.lower()
    assert re.search(r"https?://", page) is None  # not even an xmlns: nothing a strict checker could fetch


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("contract")
    records, labels = overconfident_log(40, seed=9)
    return write_jsonl(folder / "records.jsonl", records), write_jsonl(folder / "labels.jsonl", labels)


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_an_empty_records_file_exits_2_naming_the_file(log: tuple[Path, Path], tmp_path: Path) -> None:
    empty = tmp_path / "decisions.jsonl"
    empty.write_text("\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "llama_jev.calibrate", "--records", str(empty), "--labels", str(log[1])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert f"{empty}: no decision records" in result.stderr


def test_labels_saved_with_a_byte_order_mark_read_like_any_other(log: tuple[Path, Path], tmp_path: Path) -> None:
    records, labels = log
    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8-sig")
    sheet = tmp_path / "labels.csv"  # what a spreadsheet's "CSV UTF-8" writes
    with sheet.open("w", encoding="utf-8-sig", newline="") as handle:
        writer = csv.DictWriter(handle, ["decision_id", "node_id", "p", "relevant", "text"])
        writer.writeheader()
        writer.writerows(
            {**row, "p": "", "relevant": "TRUE" if row["relevant"] else "FALSE", "text": ""} for row in rows
        )
    expected = calibrate(records, labels).to_json()
    assert calibrate(records, jsonl).to_json() == expected
    assert calibrate(records, sheet).to_json() == expected


def test_a_byte_that_is_not_utf8_is_reported_at_its_line(log: tuple[Path, Path], tmp_path: Path) -> None:
    records, labels = log
    lines = labels.read_bytes().splitlines()
    broken = tmp_path / "labels.jsonl"
    broken.write_bytes(b"\n".join([*lines[:99], lines[99].replace(b"node_id", b"node\xffid"), *lines[100:]]))
    with pytest.raises(CalibrationInputError) as raised:
        calibrate(records, broken)
    assert (raised.value.path, raised.value.line) == (str(broken), 100)


def test_a_label_without_relevant_exits_2_at_its_line(
    capsys: pytest.CaptureFixture[str], log: tuple[Path, Path], tmp_path: Path
) -> None:
    records, labels = log
    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    del rows[6]["relevant"]
    broken = write_jsonl(tmp_path / "labels.jsonl", rows)
    code, _, err = cli(capsys, "--records", records, "--labels", broken)
    assert code == 2
    assert f"{broken}:7:" in err
    assert "'relevant' is missing" in err


@pytest.mark.parametrize("number", [1, 0])
def test_a_jsonl_label_with_relevant_as_a_number_exits_2_at_its_line(
    capsys: pytest.CaptureFixture[str], log: tuple[Path, Path], tmp_path: Path, number: int
) -> None:
    # DESIGN: {"node_id": str, "relevant": bool}; JSON has booleans, so 1 / 0 is refused like "yes"
    records, labels = log
    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    rows[4]["relevant"] = number
    broken = write_jsonl(tmp_path / "labels.jsonl", rows)
    code, _, err = cli(capsys, "--records", records, "--labels", broken)
    assert code == 2
    assert f"{broken}:5:" in err
    assert f"'relevant' must be true or false (a JSON boolean; null: not labelled yet), got {number}" in err


def test_rows_not_labelled_yet_are_counted_in_the_summary(
    capsys: pytest.CaptureFixture[str], log: tuple[Path, Path], tmp_path: Path
) -> None:
    records, labels = log
    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    for row in rows[:3]:
        row["relevant"] = None  # a sheet row nobody has filled in
    partial = write_jsonl(tmp_path / "labels.jsonl", rows)
    code, out, _ = cli(capsys, "--records", records, "--labels", partial)
    assert code in (0, 1)
    assert "rows with no relevant value yet: 3" in out


def test_json_of_a_refusal_has_every_contract_key(
    capsys: pytest.CaptureFixture[str], log: tuple[Path, Path], tmp_path: Path
) -> None:
    records, labels = log
    few = tmp_path / "labels.jsonl"
    few.write_text("\n".join(labels.read_text(encoding="utf-8").splitlines()[:49]) + "\n", encoding="utf-8")
    code, out, _ = cli(capsys, "--records", records, "--labels", few, "--json")
    assert code == 2
    data = json.loads(out)
    assert {"labels", "recommended", "reason", "holdout", "ece", "brier", "thresholds"} <= set(data)
    assert data["labels"] == 49
    assert (data["recommended"], data["holdout"], data["thresholds"]) == (None, None, [])
    assert "49 joined labels" in data["reason"]


def test_the_calibrate_function_keeps_its_arguments_beside_the_cli_module() -> None:
    import llama_jev.calibrate
    import llama_jev.calibration

    assert not callable(llama_jev.calibrate)  # the command's module is not the function
    assert llama_jev.calibration.calibrate is calibrate
    assert list(inspect.signature(llama_jev.calibration.calibrate).parameters)[2:6] == [
        "target_precision",
        "min_npv",
        "holdout",
        "seed",
    ]


def test_a_seed_that_is_not_an_int_is_a_type_error(log: tuple[Path, Path]) -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        calibrate(*log, seed="0")  # type: ignore[arg-type]


def test_a_report_that_cannot_be_written_still_answers_json(
    capsys: pytest.CaptureFixture[str], log: tuple[Path, Path], tmp_path: Path
) -> None:
    records, labels = log
    target = tmp_path / "missing-folder" / "report.html"
    code, out, err = cli(capsys, "--records", records, "--labels", labels, "--report", target, "--json")
    assert code == 2
    assert f"cannot write the report {target}" in err
    data = json.loads(out)
    assert data["recommended"] is None
    assert data["labels"] == 320


def test_labels_from_a_single_decision_are_too_little_data(log: tuple[Path, Path]) -> None:
    records, _ = log
    first = json.loads(records.read_text(encoding="utf-8").splitlines()[0])
    scores = {f"n{i}": i / 99 for i in range(100)}
    record = {**first, "scores": scores}
    rows = [{"decision_id": first["decision_id"], "node_id": node, "relevant": p > 0.5} for node, p in scores.items()]
    with pytest.raises(InsufficientLabelsError, match="one query or decision") as raised:
        calibrate([record], rows)  # split by decision: nothing could be held out to measure the choice
    assert raised.value.labels == 100


def test_labels_by_query_under_the_wrong_secret_say_so(tmp_path: Path) -> None:
    records, labels = overconfident_log(40, seed=4, by_query=True)
    with pytest.raises(InsufficientLabelsError, match="secret the records were written with") as raised:
        calibrate(records, labels, query_key_secret="not-the-secret")
    assert raised.value.labels == 0
    assert "calibration-test-secret" not in str(raised.value)


def test_records_mixing_raw_and_calibrated_judge_probabilities_are_refused(
    capsys: pytest.CaptureFixture[str], jev_server: SystemOneTestServer, tmp_path: Path
) -> None:
    decisions, labels = tmp_path / "decisions.jsonl", tmp_path / "labels.jsonl"
    raw = JevClient(api_key=API_KEY, base_url=jev_server.base_url)
    rows = []
    for judge in (raw, CalibratedJudge(raw, PlattMapping(slope=2.0, intercept=-1.0))):  # same version "v1"
        selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.SHADOW, observer=JsonlObserver(decisions)))
        for q in range(6):
            candidates = [Candidate(f"n{i}", marked(round(i / 10, 1), "passage")) for i in range(10)]
            decision = selector.select(f"question {q}", RELEVANCE_QUESTION, candidates, ctx=USER)
            rows += [
                {"decision_id": decision.record.decision_id, "node_id": f"n{i}", "relevant": i > 5} for i in range(10)
            ]
    labels.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    code, _, err = cli(capsys, "--records", decisions, "--labels", labels)
    assert code == 2
    assert "mix raw and mapped probabilities" in err
    assert "jev-test-1+platt" in err


def test_the_best_precision_bound_in_the_reason_never_reads_as_meeting_the_target() -> None:
    records, labels = overconfident_log(40, seed=0)  # its best lower bound is 0.88084...
    report = calibrate(records, labels, target_precision=0.8809)
    assert report.recommended is None
    assert "the best is 0.880 " in str(report.reason)  # not 0.881, which would look like it met 0.8809
