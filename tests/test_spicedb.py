"""SpiceDBAcl against a real SpiceDB: the embedded library from the npm registry behind the standard gRPC API.

One SpiceDB per module (llama_jev.testing.spicedb), stopped however the module ends. The schema
is what teams share documents with: users, nested groups, folders whose viewers are inherited,
a wildcard for public folders, a ban that excludes, and a caveat (a grant that holds only under
a condition the caller cannot show, so SpiceDB answers "conditional": a denial here). With
``CI=1`` a missing library fails these tests rather than skipping them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("authzed")
pytest.importorskip("spicedb_embedded")

from llama_index.core.schema import BaseNode, NodeRelationship, RelatedNodeInfo, TextNode

from llama_jev import RuntimeContext
from llama_jev.acl import Ids, Nothing, SpiceDBAcl, Unknown
from llama_jev.errors import PermissionsUnavailableError
from llama_jev.testing.spicedb import BinaryUnavailableError, SpiceDBServer, spicedb_library, spicedb_server

SCHEMA = """
caveat clearance(level int, required int) {
  level >= required
}

definition user {}

definition group {
  relation member: user | group#member
}

definition folder {
  relation parent: folder
  relation viewer: user | group#member | user:*
  permission view = viewer + parent->view
}

definition document {
  relation folder: folder
  relation viewer: user | group#member | user with clearance
  relation banned: user
  permission view = (viewer + folder->view) - banned
}
"""

RELATIONSHIPS = [
    "group:leads#member@user:bob",
    "group:eng#member@user:alice",
    "group:eng#member@group:leads#member",
    "folder:root#viewer@group:eng#member",
    "folder:handbook#parent@folder:root",
    "folder:public#viewer@user:*",
    "document:handbook-1#folder@folder:handbook",
    "document:roadmap#folder@folder:root",
    "document:roadmap#banned@user:bob",
    "document:announce#folder@folder:public",
    "document:secret#viewer@user:carol",
    'document:classified#viewer@user:alice[clearance:{"required": 3}]',
]
# What each subject may read, by hand from the schema (the oracle below asks SpiceDB itself).
READS = {
    "alice": {"handbook-1", "roadmap", "announce"},
    "bob": {"handbook-1", "announce"},
    "carol": {"secret", "announce"},
    "dave": {"announce"},
}
DOCUMENTS = ["handbook-1", "roadmap", "announce", "secret", "classified"]
HOSTILE_IDS = [
    "*",
    "alice@example.com",
    "alice' OR 1=1 --",
    "$ne",
    '{"$ne": ""}',
    "",
    " ",
    "alice ",
    "user:alice",
    "alice#member",
    "alice\x00",
    "Zürich",
    "a" * 1025,
]


@contextlib.contextmanager
def running_spicedb(schema: str = SCHEMA, relationships: Sequence[str] = RELATIONSHIPS) -> Iterator[SpiceDBServer]:
    """A SpiceDB for one module; skipped when its library cannot be had, failed instead under ``CI=1``."""
    try:
        spicedb_library()
    except BinaryUnavailableError as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the embedded SpiceDB (.ci/run fetches it): {error}")
        pytest.skip(f"the embedded SpiceDB is not available: {error}")
    with spicedb_server(schema, relationships) as server:
        yield server


@pytest.fixture(scope="module")
def spicedb() -> Iterator[SpiceDBServer]:
    with running_spicedb() as server:
        yield server


@pytest.fixture(autouse=True)
def _healthy(spicedb: SpiceDBServer) -> Iterator[None]:
    """Every test starts and ends with a SpiceDB that answers promptly and completely."""
    spicedb.delay, spicedb.cut_lookups_after = 0.0, None
    yield
    spicedb.delay, spicedb.cut_lookups_after = 0.0, None


def make_acl(spicedb: SpiceDBServer, **options: Any) -> SpiceDBAcl:
    options.setdefault("document_id_key", "document")
    return SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, insecure=True, **options)


def chunks(documents: Sequence[str], per_document: int = 2) -> list[BaseNode]:
    """``per_document`` chunks of each document, sharing its id under ``document``."""
    return [
        TextNode(id_=f"{document}-chunk-{n}", text=f"chunk {n} of {document}", metadata={"document": document})
        for document in documents
        for n in range(per_document)
    ]


def allowed(acl: SpiceDBAcl, ctx: RuntimeContext, nodes: Sequence[BaseNode], *, use_async: bool) -> set[str]:
    if use_async:

        async def ask() -> set[str]:
            try:
                return await acl.aallowed(ctx, nodes)
            finally:
                await acl.aclose()

        return asyncio.run(ask())
    return acl.allowed(ctx, nodes)


def restriction(acl: SpiceDBAcl, ctx: RuntimeContext, *, use_async: bool) -> Any:
    if use_async:

        async def ask() -> Any:
            try:
                return await acl.arestriction(ctx)
            finally:
                await acl.aclose()

        return asyncio.run(ask())
    return acl.restriction(ctx)


both = pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


# -- pushdown: LookupResources --


@both
@pytest.mark.parametrize("user", sorted(READS))
def test_the_restriction_lists_the_documents_the_subject_may_read(
    spicedb: SpiceDBServer, user: str, use_async: bool
) -> None:
    found = restriction(make_acl(spicedb), RuntimeContext(user_id=user), use_async=use_async)
    assert isinstance(found, Ids)
    assert found.ids == READS[user]
    assert found.key == "document"
    assert found.token  # the lookup's ZedToken


def test_without_a_document_key_the_allow_list_is_of_node_ids(spicedb: SpiceDBServer) -> None:
    found = make_acl(spicedb, document_id_key=None).restriction(RuntimeContext(user_id="bob"))
    assert isinstance(found, Ids)
    assert found.key is None
    assert found.ids == READS["bob"]


@both
def test_a_subject_with_no_grant_gets_nothing(spicedb: SpiceDBServer, use_async: bool) -> None:
    groups = make_acl(spicedb, resource_type="group", permission="member")
    assert restriction(groups, RuntimeContext(user_id="dave"), use_async=use_async) == Nothing()


@both
def test_a_caveated_grant_is_not_in_the_allow_list(spicedb: SpiceDBServer, use_async: bool) -> None:
    found = restriction(make_acl(spicedb), RuntimeContext(user_id="alice"), use_async=use_async)
    assert isinstance(found, Ids)
    assert "classified" not in found.ids


@both
def test_past_max_ids_there_is_no_pushdown(spicedb: SpiceDBServer, use_async: bool) -> None:
    ctx = RuntimeContext(user_id="alice")
    # alice's lookup holds 4 results, the caveated one too: at most 4 is a list, more than 3 never.
    assert isinstance(restriction(make_acl(spicedb, max_ids=4), ctx, use_async=use_async), Ids)
    assert isinstance(restriction(make_acl(spicedb, max_ids=3), ctx, use_async=use_async), Unknown)


@both
def test_a_lookup_cut_short_is_never_read_as_complete(spicedb: SpiceDBServer, use_async: bool) -> None:
    spicedb.cut_lookups_after = 1
    found = restriction(make_acl(spicedb), RuntimeContext(user_id="alice"), use_async=use_async)
    assert isinstance(found, Unknown)


@both
def test_a_failed_lookup_is_no_pushdown(use_async: bool) -> None:
    acl = SpiceDBAcl(closed_port(), preshared_key=None, insecure=True, timeout=2)
    assert isinstance(restriction(acl, RuntimeContext(user_id="alice"), use_async=use_async), Unknown)


@both
def test_a_slow_lookup_is_no_pushdown(spicedb: SpiceDBServer, use_async: bool) -> None:
    spicedb.delay = 0.5
    found = restriction(make_acl(spicedb, timeout=0.1), RuntimeContext(user_id="alice"), use_async=use_async)
    assert isinstance(found, Unknown)


@pytest.fixture(scope="module")
def many_readers(spicedb: SpiceDBServer) -> dict[str, int]:
    """Subjects who may read 1,000 / 1,001 / 1,500 / 2,500 documents (pages of 1,000 at most)."""
    counts = {"reads-1000": 1000, "reads-1001": 1001, "reads-1500": 1500, "reads-2500": 2500}
    # Everyone reads "announce" (the public folder): one grant fewer each.
    spicedb.write(f"document:bulk-{n}#viewer@user:{user}" for user, count in counts.items() for n in range(count - 1))
    return counts


@pytest.mark.parametrize(
    ("user", "max_ids", "listed"),
    [
        ("reads-1000", 1000, True),
        ("reads-1001", 1000, False),
        ("reads-1500", 2000, True),
        ("reads-2500", 2000, False),
        ("reads-2500", 2500, True),
    ],
)
def test_the_lookup_pages_up_to_max_ids_and_never_past_it(
    spicedb: SpiceDBServer, many_readers: dict[str, int], user: str, max_ids: int, listed: bool
) -> None:
    found = make_acl(spicedb, max_ids=max_ids).restriction(RuntimeContext(user_id=user))
    if listed:
        assert isinstance(found, Ids)
        assert len(found.ids) == many_readers[user]
    else:
        assert isinstance(found, Unknown)


async def test_the_async_lookup_pages_too(spicedb: SpiceDBServer, many_readers: dict[str, int]) -> None:
    acl = make_acl(spicedb, max_ids=2000)
    try:
        found = await acl.arestriction(RuntimeContext(user_id="reads-1500"))
        assert isinstance(found, Ids)
        assert len(found.ids) == 1500
        assert isinstance(await acl.arestriction(RuntimeContext(user_id="reads-2500")), Unknown)
    finally:
        await acl.aclose()


# -- the final check: CheckBulkPermissions --


@both
@pytest.mark.parametrize("user", sorted(READS))
def test_every_chunk_of_a_permitted_document_is_allowed_and_no_other(
    spicedb: SpiceDBServer, user: str, use_async: bool
) -> None:
    nodes = chunks(DOCUMENTS, per_document=3)
    found = allowed(make_acl(spicedb), RuntimeContext(user_id=user), nodes, use_async=use_async)
    assert found == {node.node_id for node in nodes if node.metadata["document"] in READS[user]}


@both
def test_a_caveated_grant_is_a_denial(spicedb: SpiceDBServer, use_async: bool) -> None:
    nodes = chunks(["classified"])
    assert allowed(make_acl(spicedb), RuntimeContext(user_id="alice"), nodes, use_async=use_async) == set()


def test_a_caveat_satisfied_by_its_own_context_admits(spicedb: SpiceDBServer) -> None:
    # Not a conditional answer: the grant carries every value the caveat needs, and it holds.
    spicedb.write(['document:cleared#viewer@user:erin[clearance:{"required": 3, "level": 5}]'])
    assert make_acl(spicedb).allowed(RuntimeContext(user_id="erin"), chunks(["cleared"])) == {
        "cleared-chunk-0",
        "cleared-chunk-1",
    }


@both
@pytest.mark.parametrize(("level", "readable"), [(5, True), (3, True), (1, False)])
def test_the_callers_caveat_context_decides_a_caveated_grant(
    spicedb: SpiceDBServer, level: int, readable: bool, use_async: bool
) -> None:
    acl = make_acl(spicedb, caveat_context=lambda ctx: {"level": int(ctx.attributes["clearance"])})
    ctx = RuntimeContext(user_id="alice", attributes={"clearance": str(level)})
    found = allowed(acl, ctx, chunks(["classified"]), use_async=use_async)
    assert found == ({"classified-chunk-0", "classified-chunk-1"} if readable else set())
    listed = restriction(acl, ctx, use_async=use_async)
    assert isinstance(listed, Ids)
    assert ("classified" in listed.ids) is readable


@pytest.mark.parametrize("context", [{"level": float("nan")}, {"level": object()}, {1: 2}, ["level"]])
def test_a_caveat_context_spicedb_cannot_take_is_a_type_error(spicedb: SpiceDBServer, context: Any) -> None:
    acl = make_acl(spicedb, caveat_context=lambda ctx: context)
    with pytest.raises(TypeError, match="caveat_context"):
        acl.allowed(RuntimeContext(user_id="alice"), chunks(["classified"]))


@both
def test_the_documents_are_checked_in_batches_of_batch_size(spicedb: SpiceDBServer, use_async: bool) -> None:
    before = len(spicedb.calls)
    nodes = chunks(DOCUMENTS, per_document=4)
    found = allowed(make_acl(spicedb, batch_size=2), RuntimeContext(user_id="alice"), nodes, use_async=use_async)
    assert found == {node.node_id for node in nodes if node.metadata["document"] in READS["alice"]}
    bulk = [call for call in spicedb.calls[before:] if call.method == "CheckBulkPermissions"]
    # 5 distinct documents (never one item per chunk), 2 per request.
    assert sorted(call.items for call in bulk) == [1, 2, 2]


@pytest.mark.parametrize("key", ["ref_doc_id", "doc_id", "document_id"])
def test_the_source_document_keys_read_the_chunks_ref_doc_id(spicedb: SpiceDBServer, key: str) -> None:
    # LlamaIndex's stores write node.ref_doc_id under these three keys, whatever the metadata says.
    nodes = [
        TextNode(
            id_=f"{source}-{n}",
            text="x",
            metadata={key: "secret"},  # never read: the stores hold the source's id under this key
            relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=source)},
        )
        for source in ("roadmap", "secret")
        for n in range(2)
    ]
    nodes.append(TextNode(id_="orphan", text="x", metadata={key: "roadmap"}))  # no source: no document
    assert make_acl(spicedb, document_id_key=key).allowed(RuntimeContext(user_id="alice"), nodes) == {
        "roadmap-0",
        "roadmap-1",
    }


def test_nodes_without_a_nameable_document_are_denied_and_never_sent(spicedb: SpiceDBServer) -> None:
    metadata: list[dict[str, Any]] = [
        {},
        {"document": 42},
        {"document": ["announce"]},
        {"document": "*"},
        {"document": "announce "},
        {"document": "$ne"},
        {"document": "announce' OR 1=1 --"},
    ]
    nodes = [TextNode(id_=f"odd-{n}", text="x", metadata=item) for n, item in enumerate(metadata)]
    nodes.append(TextNode(id_="fine", text="x", metadata={"document": "announce"}))
    before = len(spicedb.calls)
    assert make_acl(spicedb).allowed(RuntimeContext(user_id="dave"), nodes) == {"fine"}
    assert [call.items for call in spicedb.calls[before:]] == [1]


def test_no_nodes_asks_nothing(spicedb: SpiceDBServer) -> None:
    before = len(spicedb.calls)
    assert make_acl(spicedb).allowed(RuntimeContext(user_id="alice"), []) == set()
    assert spicedb.calls[before:] == []


# -- fail closed --


@both
def test_spicedb_down_raises_and_allows_nothing(use_async: bool) -> None:
    acl = SpiceDBAcl(closed_port(), preshared_key=None, insecure=True, document_id_key="document", timeout=2)
    with pytest.raises(PermissionsUnavailableError) as raised:
        allowed(acl, RuntimeContext(user_id="alice"), chunks(DOCUMENTS), use_async=use_async)
    assert (raised.value.engine, raised.value.reason, raised.value.retryable) == ("spicedb", "UNREACHABLE", True)


@both
def test_a_slow_spicedb_raises_timeout(spicedb: SpiceDBServer, use_async: bool) -> None:
    spicedb.delay = 0.5
    with pytest.raises(PermissionsUnavailableError) as raised:
        allowed(make_acl(spicedb, timeout=0.1), RuntimeContext(user_id="alice"), chunks(DOCUMENTS), use_async=use_async)
    assert (raised.value.reason, raised.value.retryable) == ("TIMEOUT", True)


def test_spicedb_gone_mid_session_raises() -> None:
    with running_spicedb() as server:
        acl = make_acl(server)
        ctx = RuntimeContext(user_id="alice")
        assert acl.allowed(ctx, chunks(["roadmap"])) == {"roadmap-chunk-0", "roadmap-chunk-1"}
        server.stop()
        with pytest.raises(PermissionsUnavailableError) as raised:
            acl.allowed(ctx, chunks(["roadmap"]))
        assert raised.value.reason == "UNREACHABLE"
        acl.close()


@both
@pytest.mark.parametrize(
    "options",
    [{"preshared_key": "not-the-key"}, {"permission": "edit"}, {"resource_type": "invoice"}],
    ids=["wrong-key", "unknown-permission", "unknown-type"],
)
def test_a_refused_request_raises_refused(spicedb: SpiceDBServer, options: dict[str, Any], use_async: bool) -> None:
    acl = SpiceDBAcl(
        spicedb.target,
        insecure=True,
        document_id_key="document",
        **{"preshared_key": spicedb.preshared_key, **options},
    )
    with pytest.raises(PermissionsUnavailableError) as raised:
        allowed(acl, RuntimeContext(user_id="alice"), chunks(DOCUMENTS), use_async=use_async)
    assert (raised.value.reason, raised.value.retryable) == ("REFUSED", False)
    assert isinstance(restriction(acl, RuntimeContext(user_id="alice"), use_async=use_async), Unknown)


def test_a_tls_client_against_a_plaintext_spicedb_fails_closed(spicedb: SpiceDBServer) -> None:
    acl = SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, document_id_key="document", timeout=2)
    with pytest.raises(PermissionsUnavailableError) as raised:
        acl.allowed(RuntimeContext(user_id="alice"), chunks(DOCUMENTS))
    # A setting, not an outage: not retryable, and the message says what to change.
    assert (raised.value.reason, raised.value.retryable) == ("REFUSED", False)
    assert "plaintext server? pass insecure=True" in str(raised.value)
    assert spicedb.target in str(raised.value)


# -- consistency --


def test_without_a_token_both_reads_are_fully_consistent(spicedb: SpiceDBServer) -> None:
    acl, ctx = make_acl(spicedb), RuntimeContext(user_id="alice")
    before = len(spicedb.calls)
    acl.restriction(ctx)
    acl.allowed(ctx, chunks(DOCUMENTS))
    assert {call.consistency for call in spicedb.calls[before:]} == {"fully_consistent"}


def test_with_the_apps_token_both_reads_are_at_least_as_fresh(spicedb: SpiceDBServer) -> None:
    token = spicedb.write(["document:fresh#viewer@user:frank"])
    acl, ctx = make_acl(spicedb), RuntimeContext(user_id="frank", attributes={"spicedb_token": token})
    before = len(spicedb.calls)
    found = acl.restriction(ctx)
    assert isinstance(found, Ids)
    assert "fresh" in found.ids
    assert acl.allowed(ctx, chunks(["fresh"])) == {"fresh-chunk-0", "fresh-chunk-1"}
    assert {call.consistency for call in spicedb.calls[before:]} == {"at_least_as_fresh"}


@both
def test_a_revoked_grant_read_with_its_token_is_never_allowed(spicedb: SpiceDBServer, use_async: bool) -> None:
    acl = make_acl(spicedb)
    for trial in range(5):
        document = f"revoked-{int(use_async)}-{trial}"
        grant = f"document:{document}#viewer@user:grace"
        granted = RuntimeContext(user_id="grace", attributes={"spicedb_token": spicedb.write([grant])})
        # Read once while granted, so any cache holds the grant.
        assert allowed(acl, granted, chunks([document]), use_async=use_async) == {
            f"{document}-chunk-0",
            f"{document}-chunk-1",
        }
        revoked = RuntimeContext(user_id="grace", attributes={"spicedb_token": spicedb.write([grant], delete=True)})
        assert allowed(acl, revoked, chunks([document]), use_async=use_async) == set()
        found = restriction(acl, revoked, use_async=use_async)
        assert document not in (found.ids if isinstance(found, Ids) else set())


def test_an_unreadable_token_is_refused_not_ignored(spicedb: SpiceDBServer) -> None:
    ctx = RuntimeContext(user_id="alice", attributes={"spicedb_token": "not-a-zedtoken"})
    with pytest.raises(PermissionsUnavailableError) as raised:
        make_acl(spicedb).allowed(ctx, chunks(DOCUMENTS))
    assert raised.value.reason == "REFUSED"


def test_the_token_attribute_can_be_renamed(spicedb: SpiceDBServer) -> None:
    token = spicedb.write(["document:renamed#viewer@user:heidi"])
    acl = make_acl(spicedb, token_attribute="zedtoken")
    before = len(spicedb.calls)
    acl.allowed(RuntimeContext(user_id="heidi", attributes={"zedtoken": token}), chunks(["renamed"]))
    assert [call.consistency for call in spicedb.calls[before:]] == ["at_least_as_fresh"]


# -- identities SpiceDB cannot name --


@both
@pytest.mark.parametrize("user", HOSTILE_IDS, ids=range(len(HOSTILE_IDS)))
def test_a_hostile_subject_id_reads_nothing_and_is_never_sent(
    spicedb: SpiceDBServer, user: str, use_async: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    if user.strip():
        acl, ctx = make_acl(spicedb), RuntimeContext(user_id=user, attributes={"spicedb_token": "t"})
    else:  # RuntimeContext refuses a blank user id; an app's mapping may still produce one.
        acl, ctx = make_acl(spicedb, subject_id=lambda ctx: user), RuntimeContext(user_id="x")
    before = len(spicedb.calls)
    assert restriction(acl, ctx, use_async=use_async) == Nothing()
    assert allowed(acl, ctx, chunks(DOCUMENTS), use_async=use_async) == set()
    assert spicedb.calls[before:] == []
    if len(user.strip()) > 2:
        assert user not in caplog.text


def test_subject_id_maps_the_apps_user_ids(spicedb: SpiceDBServer) -> None:
    acl = make_acl(spicedb, subject_id=lambda ctx: ctx.user_id.split("@")[0])
    found = acl.restriction(RuntimeContext(user_id="bob@example.com"))
    assert isinstance(found, Ids)
    assert found.ids == READS["bob"]


def test_no_identity_or_document_id_in_errors_or_logs(spicedb: SpiceDBServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    spicedb.cut_lookups_after = 0
    acl, ctx = make_acl(spicedb, permission="edit"), RuntimeContext(user_id="alice")
    acl.restriction(ctx)
    with pytest.raises(PermissionsUnavailableError) as raised:
        acl.allowed(ctx, chunks(["roadmap"]))
    shown = caplog.text + str(raised.value) + repr(acl)
    for secret in ("alice", "roadmap", spicedb.preshared_key or "key"):
        assert secret not in shown


def test_event_loops_that_ended_leave_no_channel_behind(spicedb: SpiceDBServer) -> None:
    # asyncio.run per request (a sync app calling async code) must not keep a channel per loop.
    acl = make_acl(spicedb)
    for _ in range(4):
        assert asyncio.run(acl.aallowed(RuntimeContext(user_id="bob"), chunks(["announce"]))) == {
            "announce-chunk-0",
            "announce-chunk-1",
        }
    assert len(acl._async) == 1
    acl.close()
