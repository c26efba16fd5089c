"""The engine-neutral ACL protocol: the condition language's meaning, MetadataAcl on it, batched checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from llama_index.core.schema import TextNode

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.acl import (
    And,
    BatchAcl,
    CallableAcl,
    Conditional,
    Equals,
    IdIn,
    Ids,
    In,
    Intersects,
    ListContains,
    Not,
    Nothing,
    Or,
    Unknown,
    acheck_allowed,
    batch_acl,
    checked_allowed,
    evaluate,
)
from llama_jev.acl.conditions import operators
from llama_jev.errors import PermissionsUnavailableError

ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
METADATA = [
    {},
    {"tenant": "acme"},
    {"tenant": "acme", "users": "u1"},
    {"tenant": "acme", "users": "u10"},
    {"tenant": "acme", "users": ["u2", "u1"]},
    {"tenant": "acme", "roles": ["support"]},
    {"tenant": "acme", "roles": "admin"},
    {"tenant": "acme", "public": "true"},
    {"tenant": "acme", "public": 1},
    {"tenant": "acme", "public": True},
    {"tenant": "acme", "public": "True"},
    {"tenant": "acme", "public": 1.0},
    {"tenant": "acme", "public": False},
    {"tenant": "other", "users": ["u1"]},
    {"tenant": ["acme"], "users": ["u1"]},
    {"tenant": "acme", "users": 1},
    {"tenant": "acme", "users": [1, "u1"]},
    {"tenant": "acme", "users": {"u1": True}},
    {"tenant": "acme", "users": None, "roles": ["support"]},
    {"tenant": "acme' OR 1=1 --", "users": ["$ne"]},
]
CALLERS = [
    RuntimeContext(user_id="u1", tenant_id="acme"),
    RuntimeContext(user_id="u2", tenant_id="acme", roles=frozenset({"support"})),
    RuntimeContext(user_id="u3", tenant_id="acme", roles=frozenset({"admin", "x"})),
    RuntimeContext(user_id="u1"),
    RuntimeContext(user_id="$ne", tenant_id="acme' OR 1=1 --"),
]


@pytest.mark.parametrize("ctx", CALLERS, ids=lambda ctx: f"{ctx.user_id}@{ctx.tenant_id}")
def test_metadata_acl_condition_admits_every_node_the_acl_admits(ctx: RuntimeContext) -> None:
    condition = ACL.condition(ctx)
    for index, metadata in enumerate(METADATA):
        if ACL.allows(ctx, metadata):
            assert condition is not None
            assert evaluate(condition, f"n{index}", metadata), metadata


@pytest.mark.parametrize("ctx", CALLERS, ids=lambda ctx: f"{ctx.user_id}@{ctx.tenant_id}")
def test_metadata_acl_condition_is_exact_on_well_formed_metadata(ctx: RuntimeContext) -> None:
    condition = ACL.condition(ctx)
    # Malformed grants (which the ACL denies) and a float public flag (numbers compare as numbers
    # in the condition language, as in the engines' plans) are where a store may admit more.
    looser = (
        {"tenant": "acme", "users": 1},
        {"tenant": "acme", "users": [1, "u1"]},
        {"tenant": "acme", "users": {"u1": True}},
        {"tenant": "acme", "public": 1.0},
    )
    for index, metadata in enumerate(METADATA):
        if metadata in looser:
            continue
        admitted = condition is not None and evaluate(condition, f"n{index}", metadata)
        assert admitted == ACL.allows(ctx, metadata), metadata


def test_a_caller_without_a_tenant_is_restricted_to_nothing() -> None:
    assert ACL.restriction(RuntimeContext(user_id="u1")) == Nothing()
    assert isinstance(ACL.restriction(CALLERS[0]), Conditional)


def test_a_string_grant_is_one_entry_never_a_substring() -> None:
    assert evaluate(ListContains("users", "u1"), "n", {"users": "u1"})
    assert not evaluate(ListContains("users", "u1"), "n", {"users": "u10"})
    assert not evaluate(ListContains("users", "1"), "n", {"users": 1})


def test_a_list_mixing_strings_with_other_values_holds_its_strings_as_an_engine_reads_it() -> None:
    # Cerbos's `"a" in R.attr.roles` finds "a" in ["a", 1]: a store must not drop such a node.
    assert evaluate(Intersects("roles", ("a",)), "n", {"roles": ["a", 1]})
    assert evaluate(ListContains("users", "u1"), "n", {"users": ["u1", 5, None]})
    assert not evaluate(ListContains("users", "u1"), "n", {"users": [5, {"u1": 1}]})


def test_equality_is_type_exact() -> None:
    assert not evaluate(Equals("public", 1), "n", {"public": True})
    assert not evaluate(Equals("public", True), "n", {"public": 1})
    assert not evaluate(Equals("level", "1"), "n", {"level": 1})
    assert evaluate(Equals("level", 1), "n", {"level": 1.0})
    assert not evaluate(In("public", ()), "n", {"public": "true"})


def test_id_in_reads_the_node_id_or_a_document_key_so_every_chunk_of_a_document_matches() -> None:
    allowed = frozenset({"doc-1"})
    assert evaluate(IdIn(allowed), "doc-1", {})
    assert evaluate(IdIn(allowed, key="document_id"), "chunk-7", {"document_id": "doc-1"})
    assert evaluate(IdIn(allowed, key="document_id"), "chunk-8", {"document_id": "doc-1"})
    assert not evaluate(IdIn(allowed, key="document_id"), "doc-1", {"document_id": ["doc-1"]})
    assert Ids(allowed, key="document_id").condition == IdIn(allowed, key="document_id")


def test_boolean_structure_and_operators() -> None:
    condition = And((Not(Equals("draft", True)), Or(())))
    assert not evaluate(condition, "n", {})
    assert evaluate(And(()), "n", {})
    assert evaluate(Not(Equals("draft", True)), "n", {})
    assert operators(condition) == {"and", "not", "equals", "or"}


def test_a_plain_callable_is_a_batch_acl_without_pushdown() -> None:
    acl = batch_acl(lambda ctx, node: node.metadata.get("owner") == ctx.user_id)
    assert isinstance(acl, CallableAcl)
    assert isinstance(acl, BatchAcl)
    nodes = [TextNode(id_="a", text="x", metadata={"owner": "u1"}), TextNode(id_="b", text="y")]
    assert checked_allowed(acl, CALLERS[0], nodes) == {"a"}
    assert isinstance(acl.restriction(CALLERS[0]), Unknown)
    assert batch_acl(ACL) is ACL


def test_a_callable_answering_a_non_bool_fails_the_check() -> None:
    acl = batch_acl(lambda ctx, node: 1)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="must return True or False"):
        checked_allowed(acl, CALLERS[0], [TextNode(id_="a", text="x")])


class _Liar:
    engine = "liar"

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def allowed(self, ctx: RuntimeContext, nodes: object) -> object:
        return self.answer

    async def aallowed(self, ctx: RuntimeContext, nodes: object) -> object:
        return self.answer

    def restriction(self, ctx: RuntimeContext) -> Unknown:
        return Unknown()

    async def arestriction(self, ctx: RuntimeContext) -> Unknown:
        return Unknown()


class _Id(str):
    """An id type of an engine's own: still a string, so its answer is read."""


def test_an_answer_of_str_subclass_ids_is_read_as_ids() -> None:
    nodes = [TextNode(id_="a", text="x"), TextNode(id_="b", text="y")]
    assert checked_allowed(_Liar(frozenset({_Id("a")})), CALLERS[0], nodes) == {"a"}  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [["a"], {"a", "zzz"}, {1}, {"a", 1}, None, True])
async def test_an_engine_answer_that_is_not_a_set_of_asked_ids_fails_closed(answer: object) -> None:
    nodes = [TextNode(id_="a", text="x")]
    acl = _Liar(answer)
    with pytest.raises(PermissionsUnavailableError) as caught:
        checked_allowed(acl, CALLERS[0], nodes)  # type: ignore[arg-type]
    assert caught.value.engine == "liar"
    assert caught.value.reason == "INVALID_RESPONSE"
    assert "zzz" not in str(caught.value)
    with pytest.raises(PermissionsUnavailableError):
        await acheck_allowed(acl, CALLERS[0], nodes)  # type: ignore[arg-type]


async def test_metadata_acl_allowed_matches_the_per_node_check() -> None:
    nodes = [TextNode(id_=f"n{index}", text="x", metadata=metadata) for index, metadata in enumerate(METADATA)]
    for ctx in CALLERS:
        expected = {node.node_id for node in nodes if ACL(ctx, node)}
        assert checked_allowed(ACL, ctx, nodes) == expected
        assert await acheck_allowed(ACL, ctx, nodes) == expected


class _NoDrafts(MetadataAcl):
    """A stricter rule written the 0.2 way: an override of ``__call__``."""

    def __call__(self, ctx: RuntimeContext, node: TextNode) -> bool:  # type: ignore[override]
        return node.metadata.get("draft") is not True and super().__call__(ctx, node)


async def test_a_metadata_acl_subclass_overriding_call_stays_the_final_check() -> None:
    acl = _NoDrafts(tenant_key="tenant")
    nodes = [
        TextNode(id_="ok", text="x", metadata={"tenant": "acme"}),
        TextNode(id_="draft", text="y", metadata={"tenant": "acme", "draft": True}),
    ]
    assert checked_allowed(acl, CALLERS[0], nodes) == {"ok"}
    assert await acheck_allowed(acl, CALLERS[0], nodes) == {"ok"}


class _NoDraftsByMetadata(MetadataAcl):
    """A stricter rule as an override of ``allows``: the batched check's fast path must not skip it."""

    def allows(self, ctx: RuntimeContext, metadata: Mapping[str, Any]) -> bool:
        return metadata.get("draft") is not True and super().allows(ctx, metadata)


class _Truthy(MetadataAcl):
    """An ``allows`` answering a non-bool: the batched check reads it as an error, not a grant."""

    def allows(self, ctx: RuntimeContext, metadata: Mapping[str, Any]) -> bool:
        return 1  # type: ignore[return-value]


async def test_a_metadata_acl_subclass_overriding_allows_stays_the_final_check() -> None:
    nodes = [
        TextNode(id_="ok", text="x", metadata={"tenant": "acme"}),
        TextNode(id_="draft", text="y", metadata={"tenant": "acme", "draft": True}),
    ]
    acl = _NoDraftsByMetadata(tenant_key="tenant")
    assert checked_allowed(acl, CALLERS[0], nodes) == {"ok"}
    assert await acheck_allowed(acl, CALLERS[0], nodes) == {"ok"}
    with pytest.raises(TypeError, match="returned int"):
        checked_allowed(_Truthy(tenant_key="tenant"), CALLERS[0], nodes)
