"""Getting labelled data: a golden set through a real JevRetriever in SHADOW (collect / acollect),
and a labelling sheet sampled from SHADOW records with text from the user's own index."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import QdrantClient

from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevClient,
    JevRetriever,
    MetadataAcl,
    Mode,
    RetryPolicy,
    RuntimeContext,
    Status,
)
from llama_jev.calibration import (
    GoldenQuery,
    acollect,
    calibrate,
    collect,
    write_label_sheet,
)
from llama_jev.testing import SystemOneTestServer

from .calibration_support import record, write_jsonl
from .conftest import API_KEY
from .support import HashEmbedding, marked

ROOT = Path(__file__).resolve().parents[1]
ACL = MetadataAcl(tenant_key="tenant")
USER = RuntimeContext(user_id="qa", tenant_id="acme")
# Twelve passages with scripted probabilities; the even ones are the truly relevant ones.
PASSAGES = [(f"doc{i}", 0.95 - 0.08 * i, f"passage {i} about topic {i % 3}") for i in range(12)]
RELEVANT = frozenset(node_id for index, (node_id, _, _) in enumerate(PASSAGES) if index % 2 == 0)


def nodes(tenant: str = "acme") -> list[TextNode]:
    return [
        TextNode(id_=node_id, text=marked(round(p, 2), text), metadata={"tenant": tenant})
        for node_id, p, text in PASSAGES
    ]


def shadow_retriever(server: SystemOneTestServer, mode: Mode = Mode.ENFORCE, observer=None) -> JevRetriever:
    index = VectorStoreIndex(nodes(), embed_model=HashEmbedding())
    judge = JevClient(api_key=API_KEY, base_url=server.base_url, retry=RetryPolicy(initial_backoff=0.01))
    options = ExecutionOptions(mode=mode, version="golden-v1", observer=observer)
    return JevRetriever.from_index(index, CandidateSelector(judge, options), ACL, top_k=12)


def golden(count: int = 6) -> list[GoldenQuery]:
    return [GoldenQuery(f"question {i} about topic {i % 3}", RELEVANT) for i in range(count)]


def test_collect_runs_every_golden_query_in_shadow_and_labels_every_judged_node(
    jev_server: SystemOneTestServer,
) -> None:
    own: list[DecisionRecord] = []
    retriever = shadow_retriever(jev_server, Mode.ENFORCE, observer=lambda ctx, r: own.append(r))
    collected = collect(retriever, golden(), ctx=USER)
    assert len(collected.records) == 6
    assert all(record.mode is Mode.SHADOW for record in collected.records)
    assert all(record.version == "golden-v1" for record in collected.records)
    assert own == collected.records  # the retriever's own observer still sees them
    assert len(collected.labels) == 72
    first = collected.labels[0]
    assert set(first) == {"decision_id", "node_id", "relevant"}
    assert {label["node_id"] for label in collected.labels if label["relevant"]} == RELEVANT
    assert collected.missed == 0
    assert retriever.selector.mode is Mode.ENFORCE  # the user's retriever is left as it was


def test_collected_data_calibrates(jev_server: SystemOneTestServer, tmp_path: Path) -> None:
    collected = collect(shadow_retriever(jev_server), golden(), ctx=USER)
    collected.write(tmp_path / "records.jsonl", tmp_path / "labels.jsonl")
    report = calibrate(tmp_path / "records.jsonl", tmp_path / "labels.jsonl", target_precision=0.5, min_npv=0.5)
    assert report.labels == 72
    assert report.log.version == "golden-v1"


async def test_acollect_gives_the_same_labels(jev_server: SystemOneTestServer) -> None:
    retriever = shadow_retriever(jev_server)
    collected = await acollect(retriever, golden(3), ctx=USER)
    expected = collect(retriever, golden(3), ctx=USER)
    strip = [{k: v for k, v in label.items() if k != "decision_id"} for label in collected.labels]
    assert strip == [{k: v for k, v in label.items() if k != "decision_id"} for label in expected.labels]


def test_collect_counts_relevant_nodes_the_retriever_never_returned(jev_server: SystemOneTestServer) -> None:
    query = GoldenQuery("question", {"doc0", "not-in-the-index"})
    collected = collect(shadow_retriever(jev_server), [query], ctx=USER)
    assert collected.missed == 1


def test_collect_needs_an_identity(jev_server: SystemOneTestServer) -> None:
    with pytest.raises(ValueError, match="needs an identity"):
        collect(shadow_retriever(jev_server), golden(1))


def test_golden_query_refuses_a_string_as_the_relevant_set() -> None:
    with pytest.raises(TypeError, match="not one string"):
        GoldenQuery("q", "doc0")  # type: ignore[arg-type]


# --- the labelling sheet ----------------------------------------------------------------------


def sheet_records() -> list[DecisionRecord]:
    records = [record(f"d{i}", {"doc0": 0.9, f"doc{i + 1}": 0.3}) for i in range(5)]
    records.append(record("err", {"doc0": 0.5}, status=Status.ERROR))
    records.append(record("skip", {}, status=Status.SKIPPED))
    return records


def test_sheet_samples_decisions_and_fetches_text_from_the_index(tmp_path: Path) -> None:
    index = VectorStoreIndex(nodes(), embed_model=HashEmbedding())
    sheet = write_label_sheet(sheet_records(), index, tmp_path / "sheet.jsonl", sample=3, seed=1)
    rows = [json.loads(line) for line in (tmp_path / "sheet.jsonl").read_text().splitlines()]
    assert (sheet.decisions, sheet.rows, sheet.missing_text) == (3, 6, 0)
    assert {row["decision_id"] for row in rows} <= {f"d{i}" for i in range(5)}  # never ERROR / SKIPPED
    assert rows[0]["text"] == index.docstore.get_node("doc0").get_content()
    assert rows[0]["relevant"] is None
    assert write_label_sheet(sheet_records(), index, tmp_path / "again.jsonl", sample=3, seed=1) == sheet.__class__(
        path=tmp_path / "again.jsonl", decisions=3, rows=6, missing_text=0
    )
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "sheet.jsonl").read_text()


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
def test_sheet_text_comes_from_a_qdrant_collection_when_the_docstore_is_empty(tmp_path: Path) -> None:
    # Qdrant point ids are UUIDs; the text lives in the collection, not in a docstore.
    ids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"sheet/{i}")) for i in range(3)]
    client = QdrantClient(location=":memory:")
    try:
        store = QdrantVectorStore(collection_name="sheet", client=client)
        VectorStoreIndex(
            [TextNode(id_=node_id, text=f"qdrant passage {i}") for i, node_id in enumerate(ids)],
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=HashEmbedding(),
        )
        reopened = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding())
        records = [record("d0", {ids[0]: 0.9, ids[1]: 0.2}), record("d1", {ids[2]: 0.6})]
        sheet = write_label_sheet(records, reopened, tmp_path / "sheet.csv", sample=5)
    finally:
        client.close()
    assert (sheet.rows, sheet.missing_text) == (3, 0)
    with (tmp_path / "sheet.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["text"] for row in rows} == {"qdrant passage 0", "qdrant passage 1", "qdrant passage 2"}
    assert set(rows[0]) == {"decision_id", "node_id", "p", "relevant", "text"}


def test_a_filled_sheet_reads_back_as_labels_and_empty_rows_count_as_unlabelled(tmp_path: Path) -> None:
    records = [record(f"d{i}", {f"n{i}": i / 80}) for i in range(80)]
    sheet = write_label_sheet(records, lambda node_id: f"text of {node_id}", tmp_path / "sheet.csv", sample=80)
    with (tmp_path / "sheet.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for number, row in enumerate(rows):
        if number < 70:  # a person labelled 70 rows and stopped
            row["relevant"] = "true" if float(row["p"]) > 0.5 else "false"
    with (tmp_path / "filled.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    report = calibrate(records, tmp_path / "filled.csv", target_precision=0.5, min_npv=0.5)
    assert sheet.rows == 80
    assert report.labels == 70
    assert report.unlabelled == 10


def test_sheet_rows_without_text_are_counted(tmp_path: Path) -> None:
    sheet = write_label_sheet(sheet_records(), lambda node_id: None, tmp_path / "sheet.jsonl", sample=2)
    assert sheet.missing_text == sheet.rows == 4


@pytest.mark.slow
def test_label_sheet_cli_reads_a_persisted_index(tmp_path: Path) -> None:
    index = VectorStoreIndex(nodes(), embed_model=HashEmbedding())
    index.storage_context.persist(persist_dir=str(tmp_path / "storage"))
    records = write_jsonl(tmp_path / "records.jsonl", sheet_records())
    result = subprocess.run(
        [sys.executable, "-m", "llama_jev.label_sheet", "--records", str(records), "--persist-dir",
         str(tmp_path / "storage"), "--out", str(tmp_path / "sheet.csv"), "--sample", "4"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "wrote 8 rows from 4 decisions" in result.stdout
    assert "passage 0" in (tmp_path / "sheet.csv").read_text()
    # the records themselves never held the text
    assert "passage 0" not in records.read_text()


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
def test_label_sheet_cli_reads_text_from_a_qdrant_local_collection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llama_jev import label_sheet

    ids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"cli-sheet/{i}")) for i in range(2)]
    client = QdrantClient(path=str(tmp_path / "qdrant"))
    try:
        VectorStoreIndex(
            [TextNode(id_=node_id, text=f"qdrant cli passage {i}") for i, node_id in enumerate(ids)],
            storage_context=StorageContext.from_defaults(vector_store=QdrantVectorStore("kb", client=client)),
            embed_model=HashEmbedding(),
        )
    finally:
        client.close()  # local mode: one client per folder at a time
    records = write_jsonl(tmp_path / "records.jsonl", [record("d0", {ids[0]: 0.9, ids[1]: 0.1})])
    code = label_sheet.main(
        ["--records", str(records), "--qdrant-path", str(tmp_path / "qdrant"), "--collection", "kb",
         "--out", str(tmp_path / "sheet.csv")]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "qdrant cli passage 1" in (tmp_path / "sheet.csv").read_text()


def test_label_sheet_cli_on_a_folder_without_a_docstore_points_to_the_qdrant_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llama_jev import label_sheet

    records = write_jsonl(tmp_path / "records.jsonl", sheet_records())
    (tmp_path / "not-a-storage").mkdir()
    code = label_sheet.main(
        ["--records", str(records), "--persist-dir", str(tmp_path / "not-a-storage"), "--out", str(tmp_path / "s.csv")]
    )
    assert code == 2
    assert "--qdrant-path" in capsys.readouterr().err
