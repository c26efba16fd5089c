"""Re-tag in place: what it writes, what it leaves alone, what it refuses, and what it says when a store fails."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.vector_stores.simple import SimpleVectorStore

from llama_jev import RuntimeContext
from llama_jev.stores import GrantsError, RetagIncompleteError, RetagResult, aretag, checked_grants, retag
from llama_jev.stores.grants import Stored, retagged
from llama_jev.stores.retagging import _selection, retagger_for

from .retag_support import ACL, KINDS, built, chunks
from .support import HashEmbedding


def _stored(target: Any) -> dict[str, Stored]:
    """Every node as its store keeps it (``_node_content`` included), read through the store's own writer."""
    writer = retagger_for(target)
    ids = [stored.node_id for page in writer.scan(100) for stored in page]
    return {
        stored.node_id: stored for page in writer.pages(_selection(ids, None, "ref_doc_id"), 100) for stored in page
    }


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_grant_keys_change_text_embedding_and_other_keys_stay(
    kind: str, request: pytest.FixtureRequest
) -> None:
    nodes = chunks("doc-a", 3)
    with built(kind, nodes, request) as (target, index):
        before = _stored(target)
        result = retag(target, {"users": ["u1"], "public": True}, node_ids=[nodes[0].node_id], acl=ACL)
        assert (result.matched, result.changed, result.written) == (1, 1, (nodes[0].node_id,))
        after = _stored(target)
        for node_id, stored in after.items():
            old = dict(before[node_id].metadata)
            new = dict(stored.metadata)
            if node_id != nodes[0].node_id:
                assert new == old
                continue
            old_content, new_content = old.pop("_node_content", None), new.pop("_node_content", None)
            assert new == {**old, "users": ["u1"], "public": True}
            assert (old_content is None) is (kind == "memory")  # every other store keeps the serialized node
            if old_content is not None:  # its metadata follows, its text stays
                old_node, new_node = json.loads(old_content), json.loads(new_content)
                assert new_node["metadata"] == {**old_node["metadata"], "users": ["u1"], "public": True}
                assert {k: v for k, v in new_node.items() if k != "metadata"} == {
                    k: v for k, v in old_node.items() if k != "metadata"
                }
        hit = index.as_retriever(similarity_top_k=3).retrieve("refund policy part 0")
        got = {node.node.node_id: node.node for node in hit}[nodes[0].node_id]
        assert got.metadata["users"] == ["u1"]
        assert got.text == nodes[0].text


@pytest.mark.parametrize("kind", KINDS)
async def test_a_second_identical_retag_matches_and_changes_nothing(kind: str, request: pytest.FixtureRequest) -> None:
    with built(kind, [*chunks("doc-a", 3), *chunks("doc-b", 2, start=3)], request) as (target, _):
        first = retag(target, {"users": ["u1", "u2"]}, document_ids=["doc-a", "doc-gone"], acl=ACL, batch_size=2)
        assert (first.matched, first.changed, first.missing) == (3, 3, ("doc-gone",))
        again = await aretag(target, {"users": ["u1", "u2"]}, document_ids=["doc-a"], acl=ACL)
        assert again == RetagResult(matched=3, changed=0, atomic=kind.startswith("postgres"))


@pytest.mark.parametrize("kind", KINDS)
def test_revoking_every_user_with_an_empty_list_denies_them(kind: str, request: pytest.FixtureRequest) -> None:
    nodes = chunks("doc-a", 2)
    with built(kind, nodes, request) as (target, index):
        retag(target, {"users": ["u1"]}, document_ids=["doc-a"], acl=ACL)
        retag(target, {"users": []}, document_ids=["doc-a"], acl=ACL)
        ctx = RuntimeContext(user_id="u1", tenant_id="acme")
        assert all(not ACL(ctx, hit.node) for hit in index.as_retriever(similarity_top_k=5).retrieve("refund"))
        assert all(not ACL.allows(ctx, stored.metadata) for stored in _stored(target).values())


@pytest.mark.parametrize(
    ("grants", "key", "rule"),
    [
        ({"users": "u1"}, "users", "not one string"),
        ({"users": ["u1", 3]}, "users", "list of strings"),
        ({"tenant": ["acme"]}, "tenant", "non-blank string"),
        ({"tenant": " "}, "tenant", "non-blank string"),
        ({"public": "yes"}, "public", "True, False, 'true' or 1"),
        ({"public": 1.0}, "public", "True, False, 'true' or 1"),
        ({"owner": "u1"}, "owner", "not a key the ACL reads"),
        ({"ref_doc_id": "x"}, "ref_doc_id", "LlamaIndex writes"),
        ({}, None, "non-empty mapping"),
    ],
)
@pytest.mark.parametrize("kind", ["memory", "postgres-jsonb"])
def test_bad_grants_name_the_key_and_the_rule_and_nothing_is_written(
    kind: str, grants: dict[str, Any], key: str | None, rule: str, request: pytest.FixtureRequest
) -> None:
    nodes = chunks("doc-a", 2)
    with built(kind, nodes, request) as (target, _):
        before = _stored(target)
        with pytest.raises(GrantsError, match=rule) as raised:
            retag(target, {"tenant": "acme", **grants} if grants else grants, document_ids=["doc-a"], acl=ACL)
        assert raised.value.key == key
        assert _stored(target) == before


def test_without_an_acl_values_must_still_be_ones_an_acl_can_read() -> None:
    assert checked_grants({"tenant": "acme", "roles": ("a",), "public": 1}) == {
        "tenant": "acme",
        "roles": ["a"],
        "public": 1,
    }
    for bad in (None, 1.5, {"a": 1}, ["a", None]):
        with pytest.raises(GrantsError, match="'k'"):
            checked_grants({"k": bad})


def test_an_error_never_carries_the_value() -> None:
    with pytest.raises(GrantsError) as raised:
        checked_grants({"users": "secret-user-id"}, acl=ACL)
    assert "secret-user-id" not in str(raised.value)


def test_the_selection_must_be_node_ids_or_document_ids() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        _selection(None, None, "ref_doc_id")
    with pytest.raises(ValueError, match="exactly one"):
        _selection(["a"], ["b"], "ref_doc_id")
    with pytest.raises(ValueError, match="not one string"):
        _selection("abc", None, "ref_doc_id")


def test_the_in_memory_store_alone_is_refused_it_needs_the_index() -> None:
    index = VectorStoreIndex(chunks("doc-a", 1), embed_model=HashEmbedding(dimensions=8))
    assert isinstance(index.vector_store, SimpleVectorStore)
    with pytest.raises(TypeError, match="needs the VectorStoreIndex"):
        retag(index.vector_store, {"users": ["u1"]}, document_ids=["doc-a"], acl=ACL)


def test_a_store_no_writer_speaks_is_a_type_error_naming_those_that_exist() -> None:
    with pytest.raises(TypeError, match="memory, qdrant, postgres, chroma"):
        retag(object(), {"users": ["u1"]}, node_ids=["a"])


def test_a_document_key_of_your_own_selects_its_chunks(request: pytest.FixtureRequest) -> None:
    nodes = chunks("doc-a", 3)
    for i, node in enumerate(nodes):
        node.metadata["source"] = "s1" if i < 2 else "s2"
    with built("qdrant", nodes, request) as (target, _):
        result = retag(target, {"public": True}, document_ids=["s1"], document_id_key="source", acl=ACL)
        assert (result.matched, result.changed) == (2, 2)
        with pytest.raises(GrantsError, match="'source'"):
            retag(target, {"source": "s2"}, document_ids=["s1"], document_id_key="source")


def _corrupt(target: Any, kind: str, node_id: str) -> None:
    """Break one stored node's serialized copy (``_node_content``) in the store itself, as a bad write would."""
    if kind == "qdrant":
        target._client.set_payload(target.collection_name, payload={"_node_content": "{not json"}, points=[node_id])
        return
    import sqlalchemy

    table = target._table_class.__table__
    with target._engine.begin() as connection:
        connection.execute(
            table.update()
            .where(table.c.node_id == node_id)
            .values(metadata_=sqlalchemy.func.jsonb_set(table.c.metadata_, "{_node_content}", '"{not json"'))
        )


def test_a_store_failing_part_way_names_exactly_the_nodes_written(request: pytest.FixtureRequest) -> None:
    nodes = chunks("doc-a", 5)
    with built("qdrant", nodes, request) as (target, _):
        _corrupt(target, "qdrant", nodes[3].node_id)  # on the second page of two
        with pytest.raises(RetagIncompleteError, match="after 2 nodes were written") as raised:
            retag(target, {"public": True}, node_ids=[node.node_id for node in nodes], acl=ACL, batch_size=2)
        assert raised.value.written == (nodes[0].node_id, nodes[1].node_id)
        assert raised.value.uncertain == ()
        stored = _flat(target)
        assert [stored[node.node_id]["public"] for node in nodes] == [True, True, False, False, False]


def test_postgres_writes_all_or_nothing(request: pytest.FixtureRequest) -> None:
    nodes = chunks("doc-a", 5)
    with built("postgres-jsonb", nodes, request) as (target, _):
        _corrupt(target, "postgres", nodes[3].node_id)  # the first page is written before it is read
        with pytest.raises(RetagIncompleteError) as raised:
            retag(target, {"public": True}, document_ids=["doc-a"], acl=ACL, batch_size=2)
        assert raised.value.written == ()
        assert raised.value.uncertain == ()
        assert [metadata["public"] for metadata in _flat(target).values()] == [False] * 5


def _flat(target: Any) -> dict[str, Any]:
    return {stored.node_id: stored.metadata for page in retagger_for(target).scan(100) for stored in page}


def test_retagged_is_none_when_nothing_changes_and_typed_otherwise() -> None:
    stored = Stored("n", {"public": 1, "users": ["u1"]})
    assert retagged(stored, {"users": ["u1"]}) is None
    assert retagged(stored, {"public": True}) is not None  # 1 and True: one flag to the ACL, not to every filter


def test_a_qdrant_node_id_that_is_no_uuid_is_missing_not_an_error(request: pytest.FixtureRequest) -> None:
    nodes = chunks("doc-a", 1)
    with built("qdrant", nodes, request) as (target, _):
        result = retag(target, {"public": True}, node_ids=["not-a-uuid", nodes[0].node_id], acl=ACL)
        assert (result.matched, result.changed, result.missing) == (1, 1, ("not-a-uuid",))


def test_every_store_pushdown_speaks_can_be_retagged() -> None:
    """A store adapter added to the package fails this until its Retagger is listed in retagging._BUILT_IN."""
    from llama_jev.stores import adapters
    from llama_jev.stores.retagging import retaggers

    built_in = {adapter.name for adapter in adapters() if adapter.__module__.startswith("llama_jev.stores.")}
    assert built_in <= {writer.name for writer in retaggers()}


def test_postgres_rows_sharing_a_node_id_are_each_written(request: pytest.FixtureRequest) -> None:
    nodes = chunks("doc-a", 1)
    with built("postgres-jsonb", nodes, request) as (target, _):
        # PGVectorStore keeps a second row for the same id.
        target.add([node.model_copy(update={"embedding": [0.1] * 8}) for node in nodes])
        result = retag(target, {"public": True}, node_ids=[nodes[0].node_id], acl=ACL)
        assert (result.matched, result.changed) == (2, 2)
        rows = [stored for page in retagger_for(target).scan(10) for stored in page]
        assert [stored.metadata["public"] for stored in rows] == [True, True]


def test_a_key_chroma_would_read_as_an_operator_is_refused_before_writing(request: pytest.FixtureRequest) -> None:
    with built("chroma", chunks("doc-a", 1), request) as (target, _):
        with pytest.raises(GrantsError, match="operator") as raised:
            retag(target, {"$users": ["u1"]}, document_ids=["doc-a"])
        assert raised.value.key == "$users"
