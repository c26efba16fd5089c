"""ACLs: MetadataAcl's decisions, check_acl's strictness, and MetadataAcl.filters in real stores.

The store tests build real LlamaIndex indexes (Qdrant local mode and the default in-memory
store) with a deterministic offline embedding, and compare what the store returns under
``acl.filters(ctx)`` with what ``acl(ctx, node)`` decides, node by node.
"""

from __future__ import annotations

import dataclasses
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import BaseNode, TextNode
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import QdrantClient

from llama_jev.acl import Acl, MetadataAcl, check_acl
from llama_jev.core.context import RuntimeContext
from llama_jev.testing import HashEmbedding

# --- helpers -----------------------------------------------------------------------------------


def node(name: str, **metadata: Any) -> TextNode:
    # Qdrant point ids must be UUIDs; derive them from readable names.
    return TextNode(id_=str(uuid.uuid5(uuid.NAMESPACE_URL, name)), text=f"passage {name}", metadata=metadata)


def ctx(user_id: str = "alice", tenant_id: str | None = "acme", roles: frozenset[str] = frozenset()) -> RuntimeContext:
    return RuntimeContext(user_id=user_id, tenant_id=tenant_id, roles=roles)


FULL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")

# --- the decision table ------------------------------------------------------------------------

ALICE = ctx("alice", "acme", frozenset({"support"}))
TENANT = MetadataAcl(tenant_key="tenant")
USERS = MetadataAcl(users_key="users")
ROLES = MetadataAcl(roles_key="roles")
PUBLIC = MetadataAcl(public_key="public")
TENANT_USERS_ROLES = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles")

DECISIONS = [
    # tenant
    pytest.param(TENANT, ALICE, {"tenant": "acme"}, True, id="tenant-match"),
    pytest.param(TENANT, ALICE, {"tenant": "globex"}, False, id="tenant-mismatch"),
    pytest.param(TENANT, ALICE, {}, False, id="tenant-missing"),
    pytest.param(TENANT, ALICE, {"tenant": None}, False, id="tenant-none"),
    pytest.param(TENANT, ctx(tenant_id=None), {"tenant": "acme"}, False, id="caller-no-tenant"),
    pytest.param(TENANT, ALICE, {"tenant": ["acme"]}, False, id="tenant-list-denied"),
    pytest.param(TENANT, ALICE, {"tenant": "ACME"}, False, id="tenant-case-sensitive"),
    # users
    pytest.param(USERS, ALICE, {"users": "alice"}, True, id="users-str"),
    pytest.param(USERS, ALICE, {"users": ["bob", "alice"]}, True, id="users-list"),
    pytest.param(USERS, ALICE, {"users": "bob"}, False, id="users-str-other"),
    pytest.param(USERS, ALICE, {"users": ["bob"]}, False, id="users-list-other"),
    pytest.param(USERS, ALICE, {"users": "alice2"}, False, id="users-no-substring"),
    pytest.param(USERS, ALICE, {"users": []}, False, id="users-empty-list"),
    pytest.param(USERS, ALICE, {}, False, id="users-missing"),
    # roles
    pytest.param(ROLES, ALICE, {"roles": "support"}, True, id="roles-str"),
    pytest.param(ROLES, ALICE, {"roles": ["admin", "support"]}, True, id="roles-list"),
    pytest.param(ROLES, ALICE, {"roles": ["admin"]}, False, id="roles-other"),
    pytest.param(ROLES, ctx(roles=frozenset()), {"roles": ["admin"]}, False, id="caller-no-roles"),
    pytest.param(ROLES, ALICE, {}, False, id="roles-missing"),
    # public flag forms
    pytest.param(PUBLIC, ALICE, {"public": "true"}, True, id="public-str-true"),
    pytest.param(PUBLIC, ALICE, {"public": 1}, True, id="public-int-1"),
    pytest.param(PUBLIC, ALICE, {"public": True}, True, id="public-bool-true"),
    pytest.param(PUBLIC, ALICE, {"public": "True"}, False, id="public-str-True-not-public"),
    pytest.param(PUBLIC, ALICE, {"public": "yes"}, False, id="public-yes-not-public"),
    pytest.param(PUBLIC, ALICE, {"public": "1"}, False, id="public-str-1-not-public"),
    pytest.param(PUBLIC, ALICE, {"public": 1.0}, False, id="public-float-not-public"),
    pytest.param(PUBLIC, ALICE, {"public": 2}, False, id="public-int-2-not-public"),
    pytest.param(PUBLIC, ALICE, {"public": False}, False, id="public-false"),
    pytest.param(PUBLIC, ALICE, {"public": "false"}, False, id="public-str-false"),
    pytest.param(PUBLIC, ALICE, {"public": ["true"]}, False, id="public-list-not-public"),
    pytest.param(PUBLIC, ALICE, {}, False, id="public-missing"),
    # combined: grants are an OR, the tenant an AND
    pytest.param(FULL, ALICE, {"tenant": "acme", "users": ["alice"]}, True, id="full-by-user"),
    pytest.param(FULL, ALICE, {"tenant": "acme", "roles": ["support"]}, True, id="full-by-role"),
    pytest.param(FULL, ALICE, {"tenant": "acme", "public": "true"}, True, id="full-by-public"),
    pytest.param(FULL, ALICE, {"tenant": "acme", "users": ["bob"], "public": "true"}, True, id="full-public-overrides"),
    pytest.param(FULL, ALICE, {"tenant": "acme", "users": ["bob"], "roles": ["admin"]}, False, id="full-no-grant"),
    pytest.param(FULL, ALICE, {"tenant": "acme"}, False, id="full-lacks-all-grant-keys"),
    pytest.param(FULL, ALICE, {"tenant": "globex", "public": "true"}, False, id="full-public-other-tenant"),
    pytest.param(FULL, ALICE, {"users": ["alice"]}, False, id="full-tenant-missing"),
    pytest.param(
        FULL, ALICE, {"tenant": "acme", "public": "no", "users": "alice"}, True, id="full-not-public-but-user"
    ),
    pytest.param(TENANT_USERS_ROLES, ALICE, {"tenant": "acme", "users": ["alice"]}, True, id="lacks-roles-uses-users"),
    # malformed values deny the node, whatever else would grant
    pytest.param(USERS, ALICE, {"users": {"alice": True}}, False, id="users-dict"),
    pytest.param(USERS, ctx("7"), {"users": 7}, False, id="users-int-not-coerced"),
    pytest.param(USERS, ALICE, {"users": ["alice", 3]}, False, id="users-list-with-int"),
    pytest.param(ROLES, ALICE, {"roles": {"support"}}, False, id="roles-set"),
    pytest.param(FULL, ALICE, {"tenant": "acme", "users": 42, "public": "true"}, False, id="bad-users-beats-public"),
    pytest.param(FULL, ALICE, {"tenant": "acme", "users": "alice", "roles": 5}, False, id="bad-roles-beats-user"),
    # keys that are not configured are not checked
    pytest.param(USERS, ALICE, {"users": "alice", "tenant": "globex"}, True, id="tenant-unchecked"),
    pytest.param(TENANT, ALICE, {"tenant": "acme", "users": ["bob"]}, True, id="users-unchecked"),
]


@pytest.mark.parametrize(("acl", "caller", "metadata", "expected"), DECISIONS)
def test_metadata_acl_decision(
    acl: MetadataAcl, caller: RuntimeContext, metadata: dict[str, Any], expected: bool
) -> None:
    assert acl(caller, node("n", **metadata)) is expected


def test_metadata_acl_is_an_acl_and_passes_check_acl() -> None:
    acl: Acl = FULL
    assert check_acl(acl, ALICE, node("n", tenant="acme", users="alice")) is True
    assert check_acl(acl, ALICE, node("n", tenant="acme", users="bob")) is False


def test_metadata_acl_without_any_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MetadataAcl()


@pytest.mark.parametrize("field", ["tenant_key", "users_key", "roles_key", "public_key"])
@pytest.mark.parametrize("blank", ["", "  "])
def test_metadata_acl_with_a_blank_key_is_rejected(field: str, blank: str) -> None:
    with pytest.raises(ValueError, match="must not be blank"):
        MetadataAcl(**{field: blank})


def test_metadata_acl_with_a_non_string_key_is_rejected() -> None:
    with pytest.raises(TypeError, match="users_key"):
        MetadataAcl(users_key=1)  # type: ignore[arg-type]


def test_metadata_acl_with_one_key_used_twice_is_rejected() -> None:
    with pytest.raises(ValueError, match="different"):
        MetadataAcl(users_key="acl", roles_key="acl")


def test_metadata_acl_accepts_positional_keys_in_contract_order() -> None:
    assert MetadataAcl("t", "u", "r", "p") == MetadataAcl(tenant_key="t", users_key="u", roles_key="r", public_key="p")


def test_metadata_acl_is_frozen_and_hashable() -> None:
    acl = MetadataAcl(tenant_key="tenant")
    with pytest.raises(dataclasses.FrozenInstanceError):
        acl.tenant_key = None  # type: ignore[misc]
    assert hash(acl) == hash(MetadataAcl(tenant_key="tenant"))


# --- check_acl ---------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [True, False])
def test_check_acl_returns_a_bool_answer(answer: bool) -> None:
    assert check_acl(lambda c, n: answer, ALICE, node("n")) is answer


@pytest.mark.parametrize("answer", [1, 0, None, "yes", "", [], [True]])
def test_check_acl_rejects_a_non_bool_answer(answer: object) -> None:
    with pytest.raises(TypeError, match="must return True or False"):
        check_acl(lambda c, n: answer, ALICE, node("n"))  # type: ignore[arg-type, return-value]


def test_check_acl_error_names_the_node_but_not_its_text() -> None:
    secret = node("n")
    secret.text = "the secret merger plan"
    with pytest.raises(TypeError) as raised:
        check_acl(lambda c, n: 1, ALICE, secret)  # type: ignore[arg-type, return-value]
    assert secret.node_id in str(raised.value)
    assert "merger" not in str(raised.value)


def test_an_acl_that_raises_propagates_unchanged() -> None:
    failure = KeyError("acl backend down")

    def acl(c: RuntimeContext, n: BaseNode) -> bool:
        raise failure

    with pytest.raises(KeyError) as raised:
        check_acl(acl, ALICE, node("n"))
    assert raised.value is failure


# --- filters: shape ----------------------------------------------------------------------------


def _leaves(filters: MetadataFilters) -> Iterator[MetadataFilter]:
    for item in filters.filters:
        if isinstance(item, MetadataFilters):
            yield from _leaves(item)
        else:
            yield item


def test_filters_for_an_unknown_store_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown store"):
        FULL.filters(ALICE, store="chroma")  # type: ignore[arg-type]


def test_filters_require_a_runtime_context() -> None:
    with pytest.raises(TypeError, match="RuntimeContext"):
        FULL.filters("alice")  # type: ignore[arg-type]


@pytest.mark.parametrize("store", ["qdrant", "simple"])
def test_filters_carry_a_boolean_only_as_the_qdrant_public_true_match(store: str) -> None:
    # LlamaIndex validation refuses booleans; the one boolean leaf is Qdrant's native `public == True`.
    acl = FULL if store == "qdrant" else MetadataAcl(users_key="users", roles_key="roles", public_key="public")
    booleans = []
    for leaf in _leaves(acl.filters(ALICE, store=store)):  # type: ignore[arg-type]
        values = leaf.value if isinstance(leaf.value, list) else [leaf.value]
        booleans += [(leaf.key, leaf.operator.value, value) for value in values if isinstance(value, bool)]
    assert booleans == ([("public", "==", True)] if store == "qdrant" else [])


def test_filters_are_the_same_for_the_same_caller() -> None:
    caller = ctx(roles=frozenset({"r3", "r1", "r2", "r0"}))
    same = RuntimeContext(user_id="alice", tenant_id="acme", roles=frozenset({"r0", "r2", "r1", "r3"}))
    assert FULL.filters(caller) == FULL.filters(same)


@pytest.mark.parametrize(
    "acl",
    [
        FULL,
        MetadataAcl(tenant_key="tenant", public_key="public"),
        MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles"),
    ],
)
def test_simple_store_refuses_configurations_that_need_nesting(acl: MetadataAcl) -> None:
    with pytest.raises(ValueError, match="rejects nested filters"):
        acl.filters(ALICE, store="simple")


def test_simple_store_refusal_does_not_depend_on_the_caller() -> None:
    acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles")
    with pytest.raises(ValueError, match="rejects nested filters"):
        acl.filters(ctx(roles=frozenset()), store="simple")  # one grant condition, still refused


# --- filters: real stores ----------------------------------------------------------------------

# Well-formed ACL metadata: string tenant; users / roles as a string or a list of strings; public
# flag as "true" or 1 (or anything not public).
WELL_FORMED = [
    node("acme-alice-str", tenant="acme", users="alice"),
    node("acme-alice-bob-list", tenant="acme", users=["alice", "bob"]),
    node("acme-bob", tenant="acme", users=["bob"]),
    node("acme-alicia", tenant="acme", users=["alicia"]),
    node("acme-support-str", tenant="acme", roles="support"),
    node("acme-support-admin", tenant="acme", roles=["support", "admin"]),
    node("acme-admin", tenant="acme", roles=["admin"]),
    node("acme-public-str", tenant="acme", public="true"),
    node("acme-public-int", tenant="acme", public=1),
    node("acme-public-false", tenant="acme", public="false"),
    node("acme-public-zero", tenant="acme", public=0),
    node("acme-public-yes", tenant="acme", public="yes"),
    node("acme-empty-lists", tenant="acme", users=[], roles=[]),
    node("acme-no-grant", tenant="acme"),
    node("acme-carol-not-public", tenant="acme", users=["carol"], public="false"),
    node("acme-dave-admin-public", tenant="acme", users=["dave"], roles=["admin"], public="true"),
    node("globex-alice", tenant="globex", users=["alice"]),
    node("globex-public", tenant="globex", public="true"),
    node("globex-support", tenant="globex", roles=["support"]),
    node("untenanted-alice", users=["alice"]),
    node("untenanted-public", public="true"),
    node("untenanted-support", roles="support"),
    node("bare"),
]

# Malformed ACL metadata: always denied by the ACL; a store may or may not return them.
MALFORMED = [
    node("acme-users-int-public", tenant="acme", users=42, public="true"),
    node("acme-users-dict", tenant="acme", users={"alice": "yes"}),
    node("acme-users-mixed-list", tenant="acme", users=["alice", 3]),
    node("tenant-list", tenant=["acme", "globex"], users=["alice"]),
]

CALLERS = [
    ctx("alice", "acme"),
    ctx("bob", "acme", frozenset({"support"})),
    ctx("carol", "acme", frozenset({"admin", "auditor"})),
    ctx("ali", "acme"),  # a prefix of "alice": must not match it
    ctx("alice", "globex", frozenset({"support"})),
    ctx("alice", None, frozenset({"support"})),
    ctx("eve", "initech", frozenset({"support", "admin"})),
]

QDRANT_ACLS = [
    FULL,
    MetadataAcl(tenant_key="tenant"),
    MetadataAcl(tenant_key="tenant", users_key="users"),
    MetadataAcl(tenant_key="tenant", roles_key="roles"),
    MetadataAcl(tenant_key="tenant", public_key="public"),
    MetadataAcl(users_key="users", roles_key="roles", public_key="public"),
    MetadataAcl(roles_key="roles"),
    MetadataAcl(public_key="public"),
]

# What the one-level in-memory store can express.
SIMPLE_ACLS = [
    MetadataAcl(tenant_key="tenant"),
    MetadataAcl(tenant_key="tenant", users_key="users"),
    MetadataAcl(tenant_key="tenant", roles_key="roles"),
    MetadataAcl(users_key="users", roles_key="roles", public_key="public"),
    MetadataAcl(users_key="users"),
    MetadataAcl(roles_key="roles"),
    MetadataAcl(public_key="public"),
]


def _as_lists(nodes: list[TextNode]) -> list[TextNode]:
    """The same nodes with users / roles always lists: the form the in-memory store filters exactly."""
    converted = []
    for original in nodes:
        metadata = dict(original.metadata)
        for key in ("users", "roles"):
            if isinstance(metadata.get(key), str):
                metadata[key] = [metadata[key]]
        converted.append(TextNode(id_=original.node_id, text=original.text, metadata=metadata))
    return converted


def _allowed(acl: MetadataAcl, caller: RuntimeContext, nodes: list[TextNode]) -> set[str]:
    return {n.node_id for n in nodes if acl(caller, n)}


def _retrieve(index: VectorStoreIndex, filters: MetadataFilters) -> set[str]:
    retriever = index.as_retriever(similarity_top_k=50, filters=filters)
    return {result.node.node_id for result in retriever.retrieve("passage acme alice")}


def _label(caller: RuntimeContext) -> str:
    return f"{caller.user_id}@{caller.tenant_id}{sorted(caller.roles)}"


def _qdrant_index(client: QdrantClient, collection: str, nodes: list[TextNode]) -> VectorStoreIndex:
    store = QdrantVectorStore(client=client, collection_name=collection)
    with warnings.catch_warnings():
        # The store asks for payload indexes, which local mode ignores (and says so); filtering
        # works without them.
        warnings.filterwarnings("ignore", "Payload indexes have no effect", UserWarning)
        return VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=HashEmbedding()
        )


@pytest.fixture(scope="module")
def qdrant_index() -> Iterator[VectorStoreIndex]:
    client = QdrantClient(location=":memory:")
    yield _qdrant_index(client, "acl_nodes", WELL_FORMED + MALFORMED)
    client.close()


@pytest.fixture(scope="module")
def simple_index() -> VectorStoreIndex:
    return VectorStoreIndex(_as_lists(WELL_FORMED), embed_model=HashEmbedding())


def test_unfiltered_retrieval_returns_every_node(
    qdrant_index: VectorStoreIndex, simple_index: VectorStoreIndex
) -> None:
    # Guards the tests below: with no filter, every node comes back (top_k is not the limiter).
    assert _retrieve(qdrant_index, MetadataFilters(filters=[])) == {n.node_id for n in WELL_FORMED + MALFORMED}
    assert _retrieve(simple_index, MetadataFilters(filters=[])) == {n.node_id for n in WELL_FORMED}


@pytest.mark.parametrize("acl", QDRANT_ACLS, ids=repr)
@pytest.mark.parametrize("caller", CALLERS, ids=_label)
def test_qdrant_prefilter_admits_exactly_what_the_acl_admits(
    qdrant_index: VectorStoreIndex, acl: MetadataAcl, caller: RuntimeContext
) -> None:
    retrieved = _retrieve(qdrant_index, acl.filters(caller, store="qdrant"))
    well_formed_ids = {n.node_id for n in WELL_FORMED}
    assert retrieved & well_formed_ids == _allowed(acl, caller, WELL_FORMED)


@pytest.mark.parametrize("acl", QDRANT_ACLS, ids=repr)
@pytest.mark.parametrize("caller", CALLERS, ids=_label)
def test_qdrant_prefilter_then_acl_loses_no_authorized_node_even_with_malformed_metadata(
    qdrant_index: VectorStoreIndex, acl: MetadataAcl, caller: RuntimeContext
) -> None:
    by_id = {n.node_id: n for n in WELL_FORMED + MALFORMED}
    retrieved = _retrieve(qdrant_index, acl.filters(caller, store="qdrant"))
    assert {i for i in retrieved if acl(caller, by_id[i])} == _allowed(acl, caller, WELL_FORMED + MALFORMED)


@pytest.mark.parametrize("acl", SIMPLE_ACLS, ids=repr)
@pytest.mark.parametrize("caller", CALLERS, ids=_label)
def test_simple_store_prefilter_admits_exactly_what_the_acl_admits(
    simple_index: VectorStoreIndex, acl: MetadataAcl, caller: RuntimeContext
) -> None:
    nodes = _as_lists(WELL_FORMED)
    assert _retrieve(simple_index, acl.filters(caller, store="simple")) == _allowed(acl, caller, nodes)


def test_caller_without_tenant_gets_nothing_from_either_store(
    qdrant_index: VectorStoreIndex, simple_index: VectorStoreIndex
) -> None:
    untenanted = ctx("alice", None, frozenset({"support"}))
    assert _retrieve(qdrant_index, FULL.filters(untenanted, store="qdrant")) == set()
    assert _retrieve(simple_index, MetadataAcl(tenant_key="tenant").filters(untenanted, store="simple")) == set()


def test_roles_only_caller_without_roles_gets_nothing_from_either_store(
    qdrant_index: VectorStoreIndex, simple_index: VectorStoreIndex
) -> None:
    acl = MetadataAcl(tenant_key="tenant", roles_key="roles")
    no_roles = ctx("alice", "acme", frozenset())
    assert _retrieve(qdrant_index, acl.filters(no_roles, store="qdrant")) == set()
    assert _retrieve(simple_index, acl.filters(no_roles, store="simple")) == set()


def test_a_boolean_true_flag_is_public_in_the_check_and_in_either_store() -> None:
    # Plain LlamaIndex code writes {"public": True}: the check, the in-memory filter and the Qdrant
    # filter all admit it, and all refuse False.
    flagged, unflagged = node("bool-public", public=True), node("bool-private", public=False)
    acl = MetadataAcl(tenant_key="tenant", public_key="public")
    tenant_flagged = node("bool-public-acme", tenant="acme", public=True)
    assert acl(ALICE, tenant_flagged) is True
    assert MetadataAcl(public_key="public")(ALICE, flagged) is True
    assert MetadataAcl(public_key="public")(ALICE, unflagged) is False
    simple = VectorStoreIndex([flagged, unflagged], embed_model=HashEmbedding())
    assert _retrieve(simple, MetadataAcl(public_key="public").filters(ALICE, store="simple")) == {flagged.node_id}
    client = QdrantClient(location=":memory:")
    try:
        qdrant = _qdrant_index(client, "bool_flag", [flagged, unflagged, tenant_flagged])
        assert _retrieve(qdrant, MetadataAcl(public_key="public").filters(ALICE, store="qdrant")) == {
            flagged.node_id,
            tenant_flagged.node_id,
        }
        assert _retrieve(qdrant, acl.filters(ALICE, store="qdrant")) == {tenant_flagged.node_id}
    finally:
        client.close()


def test_simple_store_matches_string_users_as_substrings_documented_limitation() -> None:
    # With plain string values the in-memory store's CONTAINS is a substring test, so the
    # pre-filter over-admits; it never under-admits, and the ACL removes the extra node.
    nodes = [node("alice-str", users="alice"), node("alicia-str", users="alicia"), node("bob-str", users="bob")]
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding())
    acl = MetadataAcl(users_key="users")
    for caller in (ctx("alice"), ctx("bob"), ctx("ali")):
        retrieved = _retrieve(index, acl.filters(caller, store="simple"))
        assert retrieved >= _allowed(acl, caller, nodes)
    assert _retrieve(index, acl.filters(ctx("ali"), store="simple")) == {nodes[0].node_id, nodes[1].node_id}
    assert _allowed(acl, ctx("ali"), nodes) == set()


def test_simple_store_raises_on_a_number_under_a_users_key_documented_limitation() -> None:
    index = VectorStoreIndex([node("users-int", users=42)], embed_model=HashEmbedding())
    with pytest.raises(TypeError):
        _retrieve(index, MetadataAcl(users_key="users").filters(ctx(), store="simple"))
