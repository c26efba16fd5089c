"""The drift check: who may read each node as stored, against a source of truth; the library and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.stores import check_drift, retag
from llama_jev.stores.drift import _admits_beyond, _readers
from llama_jev.stores.grants import Stored

from .drift_truth import expected_grants
from .retag_support import ACL, built, chunks
from .support import HashEmbedding

ROOT = Path(__file__).resolve().parent.parent
FULL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")


def _widens(stored: dict[str, Any], expected: dict[str, Any], acl: MetadataAcl = FULL) -> bool:
    return _admits_beyond(_readers(acl, stored), _readers(acl, expected))


@pytest.mark.parametrize(
    ("stored", "expected", "widens", "narrows"),
    [
        ({"tenant": "a", "users": ["u1", "u2"]}, {"tenant": "a", "users": ["u2", "u1"]}, False, False),
        ({"tenant": "a", "users": "u1"}, {"tenant": "a", "users": ["u1"]}, False, False),  # one reader either way
        ({"tenant": "a", "users": ["u1", "u2"]}, {"tenant": "a", "users": ["u1"]}, True, False),
        ({"tenant": "a", "users": ["u1"]}, {"tenant": "a", "users": ["u1", "u2"]}, False, True),
        ({"tenant": "a", "public": True}, {"tenant": "a", "users": ["u1"]}, True, False),
        ({"tenant": "a", "public": 1, "users": ["u9"]}, {"tenant": "a", "public": "true"}, False, False),
        ({"tenant": "a", "roles": ["x"]}, {"tenant": "a", "public": True}, False, True),
        ({"tenant": "b", "users": ["u1"]}, {"tenant": "a", "users": ["u1"]}, True, True),
        ({"tenant": "a", "users": ["u1", 3]}, {"tenant": "a", "users": ["u1"]}, False, True),  # malformed: nobody
        ({"tenant": "a", "users": ["u1"]}, {}, True, False),  # the source admits nobody
        ({"tenant": 7, "public": True}, {"tenant": "a", "public": True}, False, True),
        ({"tenant": "a", "users": [], "public": False}, {"tenant": "a"}, False, False),  # nobody either way
    ],
)
def test_drift_compares_who_may_read_not_the_bytes(
    stored: dict[str, Any], expected: dict[str, Any], widens: bool, narrows: bool
) -> None:
    assert _widens(stored, expected) is widens
    assert _widens(expected, stored) is narrows


def test_the_reader_sets_agree_with_the_acl_on_every_caller() -> None:
    """``widens`` is exact: a witness caller exists exactly when it says so (checked over a grid of callers)."""
    values = [{"tenant": "a"}, {"tenant": "b"}, {"tenant": 1}]
    grants = [{}, {"users": ["u1"]}, {"users": ["u1", "u2"]}, {"roles": ["r1"]}, {"public": True}, {"users": [1]}]
    metadatas = [{**tenant, **grant} for tenant in values for grant in grants]
    callers = [
        RuntimeContext(user_id=user, tenant_id=tenant, roles=frozenset(roles))
        for user in ("u1", "u2", "u3")
        for tenant in ("a", "b")
        for roles in ((), ("r1",), ("r2",))
    ]
    for stored in metadatas:
        for expected in metadatas:
            witness = any(FULL.allows(ctx, stored) and not FULL.allows(ctx, expected) for ctx in callers)
            assert _widens(stored, expected) is witness, (stored, expected)


@pytest.mark.parametrize(
    "kind", ["memory", "qdrant", *(pytest.param(kind, marks=pytest.mark.slow) for kind in ("postgres-jsonb", "chroma"))]
)
def test_a_scan_counts_widening_and_narrowing_nodes_page_by_page(kind: str, request: pytest.FixtureRequest) -> None:
    with built(kind, [*chunks("doc-a", 3), *chunks("doc-b", 2, start=3)], request) as (target, _):
        retag(target, {"users": ["u1"]}, document_ids=["doc-a"], acl=ACL)  # as the source says
        retag(target, {"users": ["u1"]}, document_ids=["doc-b"], acl=ACL)  # the source also lists u2: narrower
        seen: list[tuple[int, int | None]] = []
        report = check_drift(target, ACL, expected_grants, page_size=2, progress=lambda n, t: seen.append((n, t)))
        assert (report.scanned, report.total, report.widen, report.narrow) == (5, 5, 0, 2)
        assert seen == [(2, 5), (4, 5), (5, 5)]
        node = chunks("doc-a", 1)[0].node_id
        retag(target, {"public": True}, node_ids=[node], acl=ACL)
        report = check_drift(target, ACL, expected_grants)
        assert (report.widen, report.narrow) == (1, 2)
        assert [(d.node_id, d.widens, d.keys) for d in report.drifted if d.widens] == [(node, True, ("public",))]


def test_a_sample_compares_that_many_nodes_and_keep_bounds_the_list() -> None:
    nodes = chunks("doc-x", 40)  # no truth for doc-x: every granted node widens
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding(dimensions=8))
    retag(index, {"users": ["u1"]}, document_ids=["doc-x"], acl=ACL)
    report = check_drift(index, ACL, expected_grants, sample=10, seed=3, keep=4)
    assert (report.scanned, report.total, report.sampled, report.widen) == (10, 40, True, 10)
    assert len(report.drifted) == 4
    again = check_drift(index, ACL, expected_grants, sample=10, seed=3, keep=4)
    assert [d.node_id for d in again.drifted] == [d.node_id for d in report.drifted]


def test_an_engine_is_asked_through_the_acl_protocol_for_the_callers_given() -> None:
    """The source of truth here is an ACL reading other keys (a real BatchAcl, as an engine is one)."""
    nodes = chunks("doc-a", 3)
    for node, truth in zip(nodes, (["u1"], ["u2"], []), strict=True):
        node.metadata["truth_users"] = truth
        node.metadata["truth_tenant"] = "acme"
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding(dimensions=8))
    retag(index, {"users": ["u1"]}, document_ids=["doc-a"], acl=ACL)
    engine = MetadataAcl(tenant_key="truth_tenant", users_key="truth_users")
    callers = [RuntimeContext(user_id=user, tenant_id="acme") for user in ("u1", "u2")]
    report = check_drift(index, ACL, engine, callers=callers)
    by_id = {d.node_id: (d.widens, d.narrows) for d in report.drifted}
    assert by_id == {nodes[1].node_id: (True, True), nodes[2].node_id: (True, False)}
    with pytest.raises(TypeError, match="callers"):
        check_drift(index, ACL, engine)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llama_jev.drift", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )


@pytest.fixture
def qdrant_folder(tmp_path: Path) -> Path:
    """A Qdrant local folder holding doc-a (3 chunks, granted as the truth says) and doc-b (2, narrower)."""
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(path=str(tmp_path / "qdrant"))
    try:
        store = QdrantVectorStore(client=client, collection_name="docs")
        VectorStoreIndex(
            [*chunks("doc-a", 3), *chunks("doc-b", 2, start=3)],
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=HashEmbedding(dimensions=8),
        )
        retag(store, {"users": ["u1"]}, document_ids=["doc-a", "doc-b"], acl=ACL)
    finally:
        client.close()
    return tmp_path / "qdrant"


KEYS = ["--tenant-key", "tenant", "--users-key", "users", "--public-key", "public"]


@pytest.mark.slow  # a subprocess
def test_the_cli_exits_0_when_nothing_would_widen_and_reports_narrowing(qdrant_folder: Path) -> None:
    done = _cli(
        "--qdrant-path", str(qdrant_folder), "--collection", "docs", *KEYS,
        "--expected", "tests.drift_truth:expected_grants", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["scanned"], report["would_widen"], report["would_narrow"]) == (5, 0, 2)
    assert "scanned 5 of 5 nodes" in done.stderr


@pytest.mark.slow  # a subprocess
def test_the_cli_exits_1_when_any_node_would_widen(qdrant_folder: Path) -> None:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(path=str(qdrant_folder))
    try:
        retag(QdrantVectorStore(client=client, collection_name="docs"), {"public": True}, document_ids=["doc-a"])
    finally:
        client.close()
    done = _cli(
        "--qdrant-path", str(qdrant_folder), "--collection", "docs", *KEYS,
        "--expected", "tests.drift_truth:expected_grants", "--quiet",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "would widen access: 3" in done.stdout
    assert done.stderr == ""


@pytest.mark.slow  # a subprocess
def test_the_cli_reads_a_postgres_table(request: pytest.FixtureRequest) -> None:
    with built("postgres-json", [*chunks("doc-a", 2), *chunks("doc-b", 1, start=2)], request) as (store, _):
        retag(store, {"users": ["u1"], "public": True}, document_ids=["doc-a"], acl=ACL)
        server = request.getfixturevalue("postgres_server")
        done = _cli(
            "--postgres", server.url, "--table", store.table_name, *KEYS,
            "--expected", "tests.drift_truth:expected_grants", "--json", "--quiet",
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["scanned"], report["would_widen"], report["would_narrow"]) == (3, 2, 1)


@pytest.mark.slow  # a subprocess
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expected", "tests.drift_truth:nowhere"], "has no attribute"),
        (["--expected", "tests.drift_truth"], "MODULE:FUNCTION"),
        (["--expected", "tests.drift_truth:not_a_mapping"], "not a mapping"),
        (["--expected", "tests.drift_truth:expected_grants", "--collection", "nope"], "no collection"),
    ],
)
def test_the_cli_exits_2_on_bad_input(qdrant_folder: Path, args: list[str], message: str) -> None:
    base = ["--qdrant-path", str(qdrant_folder), *KEYS]
    if "--collection" not in args:
        base += ["--collection", "docs"]
    done = _cli(*base, *args)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.slow  # a subprocess
def test_the_cli_needs_an_acl_key_and_one_store() -> None:
    assert (
        _cli("--expected", "tests.drift_truth:expected_grants", "--qdrant-path", "x", "--collection", "c").returncode
        == 2
    )
    done = _cli("--expected", "tests.drift_truth:expected_grants", *KEYS)
    assert done.returncode == 2
    assert "name one store" in done.stderr


def test_stored_is_what_the_function_receives() -> None:
    assert expected_grants(Stored("n", {"ref_doc_id": "doc-a"}))["users"] == ["u1"]
