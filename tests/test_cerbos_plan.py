"""CerbosAcl without the PDP binary: the plan's translation operator by operator, what is sent, and
answers the real PDP never gives (served by a programmed HTTP server on 127.0.0.1)."""

from __future__ import annotations

from typing import Any

import pytest

from llama_jev.acl import (
    And,
    Conditional,
    Equals,
    Everything,
    IdIn,
    In,
    Intersects,
    ListContains,
    Not,
    Nothing,
    Or,
    Unknown,
    evaluate,
)
from llama_jev.acl.cerbos.plan import InvalidPlanError, restriction_from_plan, translate
from llama_jev.acl.cerbos.wire import InvalidAnswerError, allowed_ids, principal_of, resources_of
from llama_jev.core.identity import RuntimeContext
from llama_jev.errors import PermissionsUnavailableError

from .cerbos_support import ProgrammedPdp, node

R = "request.resource.attr."


def var(name: str) -> dict[str, Any]:
    return {"variable": name}


def val(value: Any) -> dict[str, Any]:
    return {"value": value}


def op(operator: str, *operands: dict[str, Any]) -> dict[str, Any]:
    return {"expression": {"operator": operator, "operands": list(operands)}}


@pytest.mark.parametrize(
    ("plan", "condition"),
    [
        (op("eq", var(R + "tenant"), val("acme")), Equals("tenant", "acme")),
        (op("eq", val("acme"), var(R + "tenant")), Equals("tenant", "acme")),
        (op("eq", var(R + "public"), val(True)), Equals("public", True)),
        (op("eq", var(R + "level"), val(2.0)), Equals("level", 2.0)),
        (op("ne", var(R + "state"), val("draft")), Not(Equals("state", "draft"))),
        (op("in", val("u1"), var(R + "allowed_users")), ListContains("allowed_users", "u1")),
        (op("in", var(R + "region"), val(["eu", "us"])), In("region", ("eu", "us"))),
        (op("hasIntersection", var(R + "roles"), val(["a", "b"])), Intersects("roles", ("a", "b"))),
        (op("hasIntersection", val(["a"]), var(R + "roles")), Intersects("roles", ("a",))),
        (op("eq", var("request.resource.id"), val("n1")), IdIn(frozenset({"n1"}))),
        (op("in", var("request.resource.id"), val(["n1", "n2"])), IdIn(frozenset({"n1", "n2"}))),
        (op("eq", var("request.resource.id"), val(5)), Or(())),
        (var(R + "public"), Equals("public", True)),
        (val(True), And(())),
        (val(False), Or(())),
        (
            op("and", op("eq", var(R + "tenant"), val("acme")), op("not", op("eq", var(R + "x"), val(1)))),
            And((Equals("tenant", "acme"), Not(Equals("x", 1)))),
        ),
        (op("or", op("eq", var("R.attr.a"), val("b"))), Or((Equals("a", "b"),))),
    ],
)
def test_each_operator_maps_to_its_condition(plan: dict[str, Any], condition: Any) -> None:
    assert translate(plan) == condition


@pytest.mark.parametrize(
    ("plan", "operator"),
    [
        (op("le", var(R + "level"), val(2)), "le"),
        (op("startsWith", var(R + "title"), val("draft")), "startsWith"),
        (op("eq", var(R + "a"), var(R + "b")), "eq"),
        (op("eq", var(R + "a"), val(None)), "eq"),
        (op("eq", var(R + "a"), val(["x"])), "eq"),
        (op("in", val(5), var(R + "users")), "in"),
        (op("hasIntersection", var(R + "roles"), val(["a", 1])), "hasIntersection"),
        (op("eq", var(R + "tags[0]"), val("x")), "eq"),
        (op("eq", var("request.principal.attr.x"), val("x")), "eq"),
        (op("or", op("eq", var(R + "a"), val("b")), op("size", var(R + "c"))), "size"),
        (val("a string"), "a constant"),
    ],
)
def test_an_operator_that_cannot_be_stated_is_unknown_naming_it(plan: dict[str, Any], operator: str) -> None:
    refused = translate(plan)
    assert isinstance(refused, Unknown)
    assert repr(operator) in refused.reason


def test_renamed_keys_and_a_document_id_key_are_read_back() -> None:
    plan = op("and", op("eq", var(R + "tenant"), val("acme")), op("eq", var("request.resource.id"), val("d1")))
    assert translate(plan, lambda name: {"tenant": "org"}.get(name, name), "doc") == And(
        (Equals("org", "acme"), IdIn(frozenset({"d1"}), "doc"))
    )


def test_the_plan_kinds() -> None:
    assert restriction_from_plan({"filter": {"kind": "KIND_ALWAYS_ALLOWED"}}) == Everything()
    assert restriction_from_plan({"filter": {"kind": "KIND_ALWAYS_DENIED"}}) == Nothing()
    conditional = {"filter": {"kind": "KIND_CONDITIONAL", "condition": op("eq", var(R + "a"), val("b"))}}
    assert restriction_from_plan(conditional) == Conditional(Equals("a", "b"))


@pytest.mark.parametrize(
    "response",
    [
        {},
        {"filter": {"kind": "KIND_SOMETHING_NEW"}},
        {"filter": {"kind": "KIND_CONDITIONAL"}},
        {"filter": {"kind": "KIND_ALWAYS_ALLOWED"}, "validationErrors": [{"message": "x"}]},
    ],
)
def test_an_unreadable_plan_is_refused(response: dict[str, Any]) -> None:
    with pytest.raises(InvalidPlanError):
        restriction_from_plan(response)


def test_ne_and_not_stay_a_superset_where_the_attribute_is_missing() -> None:
    # CEL errs on a missing attribute and the rule does not grant; our Not admits the node, which
    # the final check then removes: extra, never missing.
    condition = translate(op("ne", var(R + "state"), val("draft")))
    assert isinstance(condition, Not)
    assert evaluate(condition, "n", {})


# -- what is sent -----------------------------------------------------------------------------------


def test_the_principal_is_the_context_with_its_tenant_and_a_default_role() -> None:
    ctx = RuntimeContext(user_id="u1", tenant_id="acme", attributes={"team": "billing", "tenant": "globex"})
    assert principal_of(ctx, default_roles=("user",)) == {
        "id": "u1",
        "roles": ["user"],
        "attr": {"team": "billing", "tenant": "acme"},
    }
    assert principal_of(RuntimeContext(user_id="u1", roles={"b", "a"}), default_roles=("user",))["roles"] == ["a", "b"]
    assert (
        "tenant"
        not in principal_of(RuntimeContext(user_id="u1", attributes={"tenant": "x"}), default_roles=("u",))["attr"]
    )


def test_a_resource_is_the_node_metadata_never_its_text() -> None:
    nodes = [node("a", tenant="acme", org="o1"), node("b", tenant="acme", bad={1, 2})]
    sent, decides = resources_of(nodes, kind="document", attribute_keys={"owner_org": "org"}, document_id_key=None)
    assert sent == [{"kind": "document", "id": "a", "attr": {"tenant": "acme", "owner_org": "o1"}}]
    assert decides == [["a"]]
    assert "text of" not in repr(sent)


def test_chunks_sharing_a_document_are_asked_once_and_all_kept() -> None:
    chunks = [node("c1", doc="d1", t="x"), node("c2", doc="d1", t="x"), node("c3", doc="d1", t="y"), node("c4")]
    sent, decides = resources_of(chunks, kind="document", attribute_keys={}, document_id_key="doc")
    assert [item["id"] for item in sent] == ["d1", "d1"]
    assert decides == [["c1", "c2"], ["c3"]]
    answer = {"results": [{"resource": {"id": "d1"}, "actions": {"view": "EFFECT_ALLOW"}}] * 2}
    assert allowed_ids(answer, sent, decides, "view") == {"c1", "c2", "c3"}


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"results": []}, "number"),
        ({}, "number"),
        ({"results": [{"resource": {"id": "other"}, "actions": {"view": "EFFECT_ALLOW"}}]}, "another resource"),
        ({"results": [{"resource": {"id": "a"}, "actions": {"view": "EFFECT_MAYBE"}}]}, "effect"),
        ({"results": [{"resource": {"id": "a"}, "actions": {}}]}, "effect"),
        (
            {"results": [{"resource": {"id": "a"}, "actions": {"view": "EFFECT_ALLOW"}, "validationErrors": [{}]}]},
            "valid",
        ),
        ({"results": ["a"]}, "object"),
    ],
)
def test_an_unreadable_check_answer_is_refused(answer: dict[str, Any], problem: str) -> None:
    asked = [{"kind": "document", "id": "a", "attr": {}}]
    with pytest.raises(InvalidAnswerError, match=problem):
        allowed_ids(answer, asked, [["a"]], "view")


# -- a PDP answering what the real one never does -----------------------------------------------------


def _acl(url: str, **options: Any) -> Any:
    from llama_jev.acl import CerbosAcl  # the HTTP API needs no extra

    return CerbosAcl(url, **options)


def _check_answer(request: dict[str, Any], effect: str = "EFFECT_ALLOW", drop: int = 0) -> dict[str, Any]:
    results = [
        {"resource": {"id": entry["resource"]["id"], "kind": "document"}, "actions": {"view": effect}}
        for entry in request["resources"]
    ]
    return {"requestId": "r", "results": results[drop:]}


async def test_nodes_are_asked_in_batches_of_batch_size_and_every_allowed_one_kept() -> None:
    with ProgrammedPdp() as fake:
        fake.body = _check_answer
        nodes = [node(f"n{i}", tenant="acme") for i in range(70)]
        ctx = RuntimeContext(user_id="u1", tenant_id="acme")
        assert _acl(fake.url).allowed(ctx, nodes) == {f"n{i}" for i in range(70)}
        assert sorted(len(request["resources"]) for request in fake.requests) == [20, 50]
        assert await _acl(fake.url, batch_size=30).aallowed(ctx, nodes) == {f"n{i}" for i in range(70)}
        assert sorted(len(request["resources"]) for request in fake.requests[2:]) == [10, 30, 30]


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (200, lambda request: _check_answer(request, drop=1), "INVALID_RESPONSE"),
        (200, lambda request: _check_answer(request, effect="EFFECT_NO_MATCH"), "INVALID_RESPONSE"),
        (200, b"<html>not json</html>", "INVALID_RESPONSE"),
        (500, {"code": 13, "message": "boom"}, "UNREACHABLE"),
        (400, {"code": 3, "message": "bad"}, "REFUSED"),
    ],
    ids=["a-missing-result", "an-unknown-effect", "not-json", "http-500", "http-400"],
)
async def test_a_pdp_answering_something_unreadable_fails_closed(status: int, body: Any, reason: str) -> None:
    with ProgrammedPdp() as fake:
        fake.status, fake.body = status, body
        acl = _acl(fake.url)
        nodes = [node(f"n{i}", tenant="acme") for i in range(70)]
        ctx = RuntimeContext(user_id="user-secret", tenant_id="acme")
        with pytest.raises(PermissionsUnavailableError) as raised:
            acl.allowed(ctx, nodes)
        assert (raised.value.engine, raised.value.reason) == ("cerbos", reason)
        assert "user-secret" not in str(raised.value)
        assert "n1" not in str(raised.value)
        # The batch not yet sent when one failed is cancelled: one or both were asked.
        assert 1 <= len(fake.requests) <= 2
        with pytest.raises(PermissionsUnavailableError) as raised:
            await acl.aallowed(ctx, nodes)
        assert raised.value.reason == reason


@pytest.mark.parametrize(
    "plan",
    [
        {"requestId": "r", "action": "view", "resourceKind": "document", "policyVersion": "default",
         "filter": {"kind": "KIND_CONDITIONAL"}},
        {"requestId": "r", "action": "view", "resourceKind": "document", "policyVersion": "default",
         "filter": {"kind": "KIND_ALWAYS_ALLOWED"},
         "validationErrors": [{"message": "m", "source": "SOURCE_PRINCIPAL"}]},
        {"requestId": "r", "action": "view", "resourceKind": "document", "policyVersion": "default",
         "filter": {"kind": "KIND_NEW"}},
    ],
    ids=["conditional-without-condition", "validation-errors", "unknown-kind"],
)  # fmt: skip
async def test_an_unreadable_plan_from_the_pdp_fails_closed(plan: dict[str, Any]) -> None:
    with ProgrammedPdp() as fake:
        fake.body = plan
        acl = _acl(fake.url)
        with pytest.raises(PermissionsUnavailableError) as raised:
            acl.restriction(RuntimeContext(user_id="u1", tenant_id="acme"))
        assert raised.value.reason == "INVALID_RESPONSE"
        with pytest.raises(PermissionsUnavailableError):
            await acl.arestriction(RuntimeContext(user_id="u1", tenant_id="acme"))


def test_the_options_are_checked_when_built() -> None:
    for options in (
        {"batch_size": 0},
        {"batch_size": True},
        {"timeout": 0},
        {"max_concurrency": 0},
        {"default_roles": ()},
        {"default_roles": (" ",)},
        {"resource_kind": ""},
    ):
        with pytest.raises(ValueError, match=next(iter(options))):
            _acl("http://127.0.0.1:1", **options)
    with pytest.raises(ValueError, match="url"):
        _acl(" ")
