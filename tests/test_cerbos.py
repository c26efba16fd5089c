"""CerbosAcl against the real PDP (the npm registry's cerbos 0.55.0 binary, the example policy).

One PDP serves the module (``pdp``); tests that stop or freeze a PDP start their own. Every test
runs over HTTP and gRPC where the transport matters.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from llama_jev.acl import CerbosAcl, Conditional, Everything, Nothing, Unknown, evaluate
from llama_jev.core.identity import RuntimeContext
from llama_jev.errors import PermissionsUnavailableError

from .cerbos_support import (
    POLICIES,
    node,
    principals,
    require_cerbos,
    resources,
    running_pdp,
    well_formed,
)

pytestmark = pytest.mark.slow

ACME = RuntimeContext(user_id="u1", tenant_id="acme")


@pytest.fixture(scope="module")
def pdp() -> Iterator[Any]:
    require_cerbos()
    from llama_jev.testing.cerbos import cerbos_server

    with cerbos_server(POLICIES) as server:
        yield server


@pytest.fixture(params=["http", "grpc"])
def url(request: pytest.FixtureRequest, pdp: Any) -> str:
    return str(pdp.url if request.param == "http" else pdp.grpc_address)


# A generous timeout where the timeout is not the subject: the machine running the tests may be busy.
PATIENT = 30.0


@pytest.fixture
def acl(url: str) -> Iterator[CerbosAcl]:
    with CerbosAcl(url, timeout=PATIENT) as acl:
        yield acl


def oracle(pdp: Any, ctx: RuntimeContext, nodes: list[Any]) -> set[str]:
    """What the PDP allows, asked through the official SDK's own client (not ours), 50 nodes a call."""
    from cerbos.sdk.client import CerbosClient
    from cerbos.sdk.model import Principal, Resource, ResourceList

    attributes = {**ctx.attributes, **({"tenant": ctx.tenant_id} if ctx.tenant_id else {})}
    principal = Principal(ctx.user_id, roles=set(ctx.roles or {"user"}), attr=attributes)
    allowed = set()
    with CerbosClient(pdp.url, timeout_secs=30) as client:
        for start in range(0, len(nodes), 50):
            asked = ResourceList()
            for item in nodes[start : start + 50]:
                asked.add(Resource(item.node_id, "document", attr=dict(item.metadata)), {"view"})
            answer = client.check_resources(principal, asked).raise_if_failed()
            for item in nodes[start : start + 50]:
                result = answer.get_resource(item.node_id)
                assert result is not None
                if result.is_allowed("view"):
                    allowed.add(item.node_id)
    return allowed


# -- restriction: the plan's kinds ------------------------------------------------------------------


def test_a_platform_admin_is_always_allowed(acl: CerbosAcl) -> None:
    assert acl.restriction(RuntimeContext(user_id="root", roles={"platform-admin"})) == Everything()


def test_a_caller_without_a_tenant_is_always_denied(acl: CerbosAcl) -> None:
    assert acl.restriction(RuntimeContext(user_id="u1")) == Nothing()


def test_a_tenant_member_gets_a_condition_over_tenant_users_roles_public_and_owner(acl: CerbosAcl) -> None:
    restriction = acl.restriction(RuntimeContext(user_id="u1", tenant_id="acme", roles={"support"}))
    assert isinstance(restriction, Conditional)
    assert evaluate(restriction.condition, "n", {"tenant": "acme", "allowed_roles": ["support"]})
    assert evaluate(restriction.condition, "n", {"tenant": "acme", "owner": "u1"})
    assert not evaluate(restriction.condition, "n", {"tenant": "globex", "public": True})


def test_an_operator_no_store_states_is_unknown_naming_it_in_one_warning(
    acl: CerbosAcl, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        for user in ("u1", "u2", "u3"):
            restriction = acl.restriction(RuntimeContext(user_id=user, tenant_id="acme", roles={"auditor"}))
            assert isinstance(restriction, Unknown)
    assert "'le'" in restriction.reason
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert "'le'" in warning
    for text in (restriction.reason, warning):
        assert "u3" not in text
        assert "acme" not in text


async def test_arestriction_answers_as_restriction(acl: CerbosAcl) -> None:
    for ctx in principals()[::7]:
        assert await acl.arestriction(ctx) == acl.restriction(ctx)


def test_renamed_metadata_keys_are_read_back_in_the_plan(url: str) -> None:
    with CerbosAcl(url, attribute_keys={"tenant": "org"}, timeout=PATIENT) as renamed:
        restriction = renamed.restriction(ACME)
        assert isinstance(restriction, Conditional)
        assert evaluate(restriction.condition, "n", {"org": "acme", "public": True})
        assert not evaluate(restriction.condition, "n", {"tenant": "acme", "public": True})
        allowed = renamed.allowed(ACME, [node("a", org="acme", public=True), node("b", tenant="acme", public=True)])
        assert allowed == {"a"}


# -- the plan's translation against CheckResources --------------------------------------------------


def test_the_translation_never_excludes_a_node_the_pdp_allows_and_is_exact_on_well_formed_metadata(
    pdp: Any,
) -> None:
    nodes = resources()
    with CerbosAcl(pdp.grpc_address, timeout=PATIENT) as acl:
        conditional = 0
        for ctx in principals():
            restriction = acl.restriction(ctx)
            allowed = oracle(pdp, ctx, nodes)
            if isinstance(restriction, Everything):
                continue
            if isinstance(restriction, Nothing):
                assert allowed == set()
                continue
            if isinstance(restriction, Unknown):
                continue
            conditional += 1
            admitted = {item.node_id for item in nodes if evaluate(restriction.condition, item.node_id, item.metadata)}
            assert allowed <= admitted, "the plan's condition excluded a node the PDP allows"
            assert {n for n in admitted if well_formed(n)} == {n for n in allowed if well_formed(n)}
        assert conditional >= 40


# -- allowed: batched, concurrent, order-independent ----------------------------------------------


def many(count: int = 137) -> list[Any]:
    rng = random.Random(34)
    return [
        node(
            f"n{index}",
            tenant=rng.choice(["acme", "globex"]),
            allowed_users=rng.sample(["u1", "u2", "u3"], rng.randint(0, 2)),
            public=rng.random() < 0.2,
        )
        for index in range(count)
    ]


def test_allowed_asks_in_batches_of_the_pdp_limit_and_matches_one_check_per_node(acl: CerbosAcl, pdp: Any) -> None:
    nodes = many()
    expected = oracle(pdp, ACME, nodes)
    assert 0 < len(expected) < len(nodes)
    assert acl.allowed(ACME, nodes) == expected
    shuffled = list(nodes)
    random.Random(1).shuffle(shuffled)
    assert acl.allowed(ACME, shuffled) == expected


def test_smaller_batches_and_one_at_a_time_give_the_same_answer(url: str, pdp: Any) -> None:
    nodes = many(60)
    expected = oracle(pdp, ACME, nodes)
    for batch_size, concurrency in ((7, 3), (1, 1), (50, 1)):
        with CerbosAcl(url, batch_size=batch_size, max_concurrency=concurrency, timeout=PATIENT) as acl:
            assert acl.allowed(ACME, nodes) == expected


async def test_aallowed_answers_as_allowed(acl: CerbosAcl) -> None:
    nodes = many()
    assert await acl.aallowed(ACME, nodes) == acl.allowed(ACME, nodes)


async def test_concurrent_async_callers_each_get_their_own_answer(acl: CerbosAcl, pdp: Any) -> None:
    nodes = many(80)
    callers = [RuntimeContext(user_id=user, tenant_id="acme") for user in ("u1", "u2", "u3")]
    answers = await asyncio.gather(*(acl.aallowed(ctx, nodes) for ctx in callers))
    assert answers == [oracle(pdp, ctx, nodes) for ctx in callers]


def test_the_pdp_refuses_more_than_its_limit_per_request(url: str) -> None:
    with CerbosAcl(url, batch_size=51, timeout=PATIENT) as acl, pytest.raises(PermissionsUnavailableError) as raised:
        acl.allowed(ACME, many(60))
    assert raised.value.reason == "REFUSED"


def test_every_chunk_of_a_permitted_document_is_kept(url: str) -> None:
    chunks = [node(f"c{i}", doc="d1", tenant="acme", allowed_users=["u1"]) for i in range(120)]
    chunks += [node("x1", doc="d2", tenant="acme"), node("x2", tenant="acme", allowed_users=["u1"])]
    with CerbosAcl(url, document_id_key="doc", timeout=PATIENT) as acl:
        # Identical chunks are one resource, asked once; a chunk without a document id is denied.
        assert acl.allowed(ACME, chunks) == {f"c{i}" for i in range(120)}
    with CerbosAcl(url, timeout=PATIENT) as acl:
        assert acl.allowed(ACME, chunks) == {f"c{i}" for i in range(120)} | {"x2"}


def test_no_nodes_asks_nothing(acl: CerbosAcl) -> None:
    assert acl.allowed(ACME, []) == set()


# -- hostile values match nothing -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ctx",
    [
        RuntimeContext(user_id="u9", tenant_id="acme' OR 1=1 --"),
        RuntimeContext(user_id="$ne", tenant_id="$ne"),
        RuntimeContext(user_id="u9", tenant_id='acme" || true || "', roles={"' OR ''='"}),
        RuntimeContext(user_id="u9", tenant_id="acme", attributes={"tenant": "globex"}),
    ],
    ids=["sql", "mongo-operator", "quotes", "attribute-named-tenant"],
)
def test_hostile_principal_values_match_nothing(acl: CerbosAcl, ctx: RuntimeContext) -> None:
    nodes = [item for item in resources() if item.metadata.get("tenant") != "acme' OR 1=1 --"]
    nodes = [item for item in nodes if item.metadata.get("tenant") != "acme" or ctx.tenant_id != "acme"]
    restriction = acl.restriction(ctx)
    assert isinstance(restriction, Conditional)
    assert not [item for item in nodes if evaluate(restriction.condition, item.node_id, item.metadata)]
    assert acl.allowed(ctx, nodes) == set()


def test_nothing_identifying_is_logged(acl: CerbosAcl, caplog: pytest.LogCaptureFixture) -> None:
    secret_user, secret_tenant = "user-7f3a9c2e", "tenant-1b2c3d"
    ctx = RuntimeContext(user_id=secret_user, tenant_id=secret_tenant)
    with caplog.at_level(logging.DEBUG):
        acl.restriction(ctx)
        acl.allowed(ctx, [node("node-5e6f7a", tenant=secret_tenant, owner=secret_user)])
    for value in (secret_user, secret_tenant, "node-5e6f7a", "text of"):
        assert value not in caplog.text


# -- fail closed -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("scheme", ["http", "grpc"])
async def test_a_port_with_nothing_listening_is_unreachable(scheme: str) -> None:
    require_cerbos()
    port = _free_port()
    url = f"http://127.0.0.1:{port}" if scheme == "http" else f"127.0.0.1:{port}"
    with CerbosAcl(url, timeout=2.0) as acl:
        for call in (lambda: acl.restriction(ACME), lambda: acl.allowed(ACME, many(3))):
            with pytest.raises(PermissionsUnavailableError) as raised:
                call()
            assert (raised.value.engine, raised.value.reason, raised.value.retryable) == ("cerbos", "UNREACHABLE", True)
        with pytest.raises(PermissionsUnavailableError, match="reach"):
            await acl.aallowed(ACME, many(3))
        with pytest.raises(PermissionsUnavailableError, match="reach"):
            await acl.arestriction(ACME)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
async def test_a_pdp_stopped_mid_test_fails_closed(scheme: str) -> None:
    with running_pdp() as own:
        url = own.url if scheme == "http" else own.grpc_address
        with CerbosAcl(url, timeout=PATIENT) as acl:
            nodes = many(120)
            assert acl.allowed(ACME, nodes)
            own.stop()
            with pytest.raises(PermissionsUnavailableError) as raised:
                acl.allowed(ACME, nodes)
            assert raised.value.reason == "UNREACHABLE"
            with pytest.raises(PermissionsUnavailableError):
                acl.restriction(ACME)
            with pytest.raises(PermissionsUnavailableError):
                await acl.aallowed(ACME, nodes)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
async def test_a_pdp_slower_than_the_timeout_fails_closed_with_timeout(scheme: str) -> None:
    with running_pdp() as own:
        url = own.url if scheme == "http" else own.grpc_address
        with CerbosAcl(url, timeout=1.0) as acl:
            own.pause()
            try:
                for call in (lambda: acl.restriction(ACME), lambda: acl.allowed(ACME, many(120))):
                    with pytest.raises(PermissionsUnavailableError) as raised:
                        call()
                    assert (raised.value.reason, raised.value.retryable) == ("TIMEOUT", True)
                with pytest.raises(PermissionsUnavailableError) as raised:
                    await acl.aallowed(ACME, many(120))
                assert raised.value.reason == "TIMEOUT"
            finally:
                own.resume()
            # Nothing was cached while it hung: the answer after it resumes is the PDP's own (asked
            # again while the PDP catches up: a busy machine may take longer than 1 s right after).
            answers: list[set[str] | str] = []
            while len(answers) < 10 and set not in map(type, answers):
                try:
                    answers.append(acl.allowed(ACME, [node("a", tenant="acme", public=True), node("b", tenant="acme")]))
                except PermissionsUnavailableError as error:
                    answers.append(error.reason)
            assert answers[-1] == {"a"}
            assert set(answers[:-1]) <= {"TIMEOUT"}
