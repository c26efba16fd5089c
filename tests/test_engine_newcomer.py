"""What a newcomer met with the engines (issue 43): mistakes said at construction, in the error, or in one warning.

Real engines: the Cerbos PDP and SpiceDB of ``llama_jev.testing`` (skipped outside CI when they
cannot be had, as in tests/test_cerbos.py and tests/test_spicedb.py).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("authzed")
pytest.importorskip("spicedb_embedded")

from llama_index.core.schema import TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.acl import CerbosAcl, SpiceDBAcl
from llama_jev.errors import PermissionsUnavailableError

from .cerbos_support import POLICIES, require_cerbos

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DENIED_ALL = "the engine denied every node of"
MATCHED_NOTHING = "the store holds no node matching the engine's pre-selection"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- construction: the address, the scheme, the key --------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://pdp:3592", "scheme 'ftp'"),
        ("http://pdp", "no port"),
        ("pdp", "no port"),
        ("grpc://pdp", "no port"),
        ("http://:3592", "no host"),
        (" http://pdp:3592", "spaces"),
        ("http://pdp:99999", "not an address"),
    ],
)
def test_a_cerbos_url_no_transport_can_use_is_refused_when_built(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        CerbosAcl(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:3592", "https://pdp.internal", "https://pdp:443"])
def test_a_cerbos_http_url_is_accepted(url: str) -> None:
    assert CerbosAcl(url).url == url


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("http://localhost:50051", "is a URL"),
        ("grpc://localhost:50051", "is a URL"),
        ("localhost", "a port is needed"),
        ("localhost:0", "a port is needed"),
        ("local host:50051", "not host:port"),
    ],
)
def test_a_spicedb_target_grpc_cannot_dial_is_refused_when_built(target: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SpiceDBAcl(target, preshared_key="key")


@pytest.mark.parametrize("target", ["localhost:50051", "[::1]:50051", "unix:///run/spicedb.sock", "dns:///s:50051"])
def test_a_spicedb_target_grpc_can_dial_is_accepted(target: str) -> None:
    assert SpiceDBAcl(target, preshared_key="key").target == target


def test_spicedb_without_a_preshared_key_is_refused_unless_none_is_said() -> None:
    with pytest.raises(ValueError, match="needs preshared_key"):
        SpiceDBAcl("localhost:50051")
    with pytest.raises(ValueError, match="non-blank"):
        SpiceDBAcl("localhost:50051", preshared_key=" ")
    assert SpiceDBAcl("localhost:50051", preshared_key=None).engine == "spicedb"


def test_a_cerbos_pdp_not_listening_is_named_in_the_error() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with CerbosAcl(url, timeout=5) as acl, pytest.raises(PermissionsUnavailableError) as raised:
        acl.restriction(RuntimeContext(user_id="u1", tenant_id="acme"))
    assert url in str(raised.value)
    assert "check url" in str(raised.value)
    assert raised.value.reason == "UNREACHABLE"


# -- the real Cerbos PDP ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pdp() -> Iterator[Any]:
    require_cerbos()
    from llama_jev.testing.cerbos import cerbos_server

    with cerbos_server(POLICIES) as server:
        yield server


def test_http_at_the_grpc_port_says_so_and_is_not_an_outage(pdp: Any) -> None:
    with CerbosAcl(f"http://{pdp.grpc_address}", timeout=30) as acl, pytest.raises(PermissionsUnavailableError) as e:
        acl.restriction(RuntimeContext(user_id="u1", tenant_id="acme"))
    assert (e.value.reason, e.value.retryable) == ("REFUSED", False)
    assert "gRPC port" in str(e.value)
    assert pdp.grpc_address in str(e.value)


def test_https_at_a_plaintext_pdp_says_so_and_is_not_an_outage(pdp: Any) -> None:
    url = f"https://127.0.0.1:{pdp.http_port}"
    with CerbosAcl(url, timeout=30) as acl, pytest.raises(PermissionsUnavailableError) as raised:
        acl.restriction(RuntimeContext(user_id="u1", tenant_id="acme"))
    assert (raised.value.reason, raised.value.retryable) == ("REFUSED", False)
    assert "a plaintext PDP? give http://" in str(raised.value)
    assert url in str(raised.value)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_batch_over_the_pdp_limit_names_batch_size(pdp: Any, transport: str) -> None:
    url = pdp.url if transport == "http" else pdp.grpc_address
    nodes = [TextNode(id_=f"n{i}", text="x", metadata={"tenant": "acme"}) for i in range(60)]
    with CerbosAcl(url, batch_size=60, timeout=30) as acl, pytest.raises(PermissionsUnavailableError) as raised:
        acl.allowed(RuntimeContext(user_id="u1", tenant_id="acme"), nodes)
    assert raised.value.reason == "REFUSED"
    assert "batch_size" in str(raised.value)
    assert "maxResourcesPerRequest" in str(raised.value)


def _cerbos_index() -> Any:
    from examples.cerbos_permissions import build_index

    return build_index()


@pytest.mark.parametrize("options", [{"resource_kind": "doc"}, {"action": "read"}], ids=["kind", "action"])
@pytest.mark.parametrize("prefilter", [True, False])
def test_a_kind_or_action_the_policy_lacks_is_warned_once(
    pdp: Any, options: dict[str, str], prefilter: bool, caplog: pytest.LogCaptureFixture
) -> None:
    selector = CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=Mode.OFF))
    with CerbosAcl(pdp.url, timeout=30, **options) as acl:
        search = JevRetriever.from_index(_cerbos_index(), selector, acl, top_k=4, prefilter=prefilter)
        with caplog.at_level(logging.WARNING, logger="llama_jev"):
            for _ in range(3):
                with runtime_context(RuntimeContext(user_id="alice", tenant_id="acme", roles={"support"})):
                    assert search.retrieve("What are the refund conditions?") == []
    said = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    name = next(iter(options))
    if prefilter:  # the plan says NO_MATCH: no store call, no node to deny
        assert len([line for line in said if "no policy rule" in line]) == 1, said
    else:
        assert len([line for line in said if DENIED_ALL in line]) == 1, said
    assert all(name in line for line in said if "no policy rule" in line or DENIED_ALL in line)
    assert not any("alice" in line or "acme" in line for line in said)


# -- the real SpiceDB ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spicedb() -> Iterator[Any]:
    from llama_jev.testing.npm import BinaryUnavailableError
    from llama_jev.testing.spicedb import spicedb_library, spicedb_server

    try:
        spicedb_library()
    except BinaryUnavailableError as error:
        if __import__("os").environ.get("CI"):
            pytest.fail(f"CI needs the SpiceDB library: {error}")
        pytest.skip(f"no SpiceDB library here: {error}")
    from examples.spicedb_permissions import RELATIONSHIPS, SCHEMA

    caveated = SCHEMA.replace("relation viewer: user | user:*", "relation viewer: user | user:* | user with office")
    caveated = "caveat office(user_ip ipaddress, cidr string) {\n  user_ip.in_cidr(cidr)\n}\n" + caveated
    grants = [*RELATIONSHIPS, 'document:payroll#viewer@user:carol[office:{"cidr": "10.0.0.0/8"}]']
    with spicedb_server(caveated, grants) as server:
        yield server


def test_the_spicedb_example_shows_each_user_what_they_read_and_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.spicedb_permissions"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("SpiceDB ready (127.0.0.1:")
    assert lines[0].endswith("6 relationships written")
    assert lines[1:] == [
        "alice: ids pushed down (3 documents)",
        "  holidays (1 chunk): shared with every user (user:*)",
        "  refund-escalation (1 chunk): shared with alice directly",
        "  refund-policy (2 chunks): in folder policies, viewable by group support, of which alice is a member",
        "bob: ids pushed down (2 documents)",
        "  bob-notes (1 chunk): shared with bob directly",
        "  holidays (1 chunk): shared with every user (user:*)",
    ]


@pytest.mark.parametrize("key", [None, "no_such_key"])
@pytest.mark.parametrize("prefilter", [True, False])
def test_document_ids_spicedb_does_not_hold_are_warned_once(
    spicedb: Any, key: str | None, prefilter: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from examples.spicedb_permissions import QUESTION, build_index

    acl = SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, insecure=True, document_id_key=key)
    selector = CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=Mode.OFF))
    search = JevRetriever.from_index(build_index(), selector, acl, top_k=4, prefilter=prefilter)
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        for user in ("alice", "bob", "alice"):
            with runtime_context(RuntimeContext(user_id=user)):
                assert search.retrieve(QUESTION) == []
    said = [record.getMessage() for record in caplog.records if DENIED_ALL in record.getMessage()
            or MATCHED_NOTHING in record.getMessage()]  # fmt: skip
    assert len(said) == 1, said
    assert "document_id_key" in said[0]
    assert not any(word in said[0] for word in ("alice", "bob", "refund-policy"))
    acl.close()


def test_the_async_path_warns_once_too(spicedb: Any, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from examples.spicedb_permissions import QUESTION, build_index

    acl = SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, insecure=True)
    selector = CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=Mode.OFF))
    search = JevRetriever.from_index(build_index(), selector, acl, top_k=4, prefilter=False)

    async def twice() -> None:
        for _ in range(2):
            with runtime_context(RuntimeContext(user_id="alice")):
                assert await search.aretrieve(QUESTION) == []
        await acl.aclose()

    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        asyncio.run(twice())
    assert len([record for record in caplog.records if DENIED_ALL in record.getMessage()]) == 1


def test_a_right_document_key_warns_nothing(spicedb: Any, caplog: pytest.LogCaptureFixture) -> None:
    from examples.spicedb_permissions import QUESTION, build_index

    acl = SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, insecure=True, document_id_key="ref_doc_id")
    selector = CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=Mode.OFF))
    search = JevRetriever.from_index(build_index(), selector, acl, top_k=4)
    with caplog.at_level(logging.WARNING, logger="llama_jev"), runtime_context(RuntimeContext(user_id="bob")):
        assert search.retrieve(QUESTION)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    acl.close()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"preshared_key": "not-the-key"}, "check preshared_key"),
        ({"resource_type": "invoice"}, "the schema lacks a name asked"),
    ],
)
def test_a_wrong_key_and_an_unknown_definition_get_different_advice(
    spicedb: Any, options: dict[str, str], says: str
) -> None:
    acl = SpiceDBAcl(spicedb.target, **{"preshared_key": spicedb.preshared_key, "insecure": True, **options})
    with pytest.raises(PermissionsUnavailableError) as raised:
        acl.allowed(RuntimeContext(user_id="alice"), [TextNode(id_="holidays", text="x")])
    assert says in str(raised.value)
    assert (raised.value.reason, raised.value.retryable) == ("REFUSED", False)
    acl.close()


def test_a_caveat_value_spicedb_cannot_read_fails_closed_naming_the_caveat_context(spicedb: Any) -> None:
    acl = SpiceDBAcl(
        spicedb.target, preshared_key=spicedb.preshared_key, insecure=True,
        caveat_context=lambda ctx: {"user_ip": ctx.attributes["ip"]},
    )  # fmt: skip
    ctx = RuntimeContext(user_id="carol", attributes={"ip": "not-an-ip"})
    with pytest.raises(PermissionsUnavailableError) as raised:
        acl.allowed(ctx, [TextNode(id_="payroll", text="x")])
    message = str(raised.value)
    assert "caveat_context" in message
    assert "not-an-ip" not in message
    assert "carol" not in message
    assert (raised.value.reason, raised.value.retryable) == ("REFUSED", False)
    # A readable address: SpiceDB decides (outside the office: denied; inside: allowed).
    assert (
        acl.allowed(
            RuntimeContext(user_id="carol", attributes={"ip": "192.168.1.1"}), [TextNode(id_="payroll", text="x")]
        )
        == set()
    )
    assert acl.allowed(
        RuntimeContext(user_id="carol", attributes={"ip": "10.1.2.3"}), [TextNode(id_="payroll", text="x")]
    ) == {"payroll"}
    acl.close()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_example_policy_reads_public_as_metadata_acl_does_for_true_and_the_string_true(
    pdp: Any, transport: str
) -> None:
    from llama_jev.acl import Conditional, MetadataAcl, evaluate

    flags: list[Any] = [True, "true", False, "false", "True", None, ["true"]]
    nodes = [
        TextNode(id_=f"n{i}", text="x", metadata={"tenant": "acme", "public": flag}) for i, flag in enumerate(flags)
    ]
    ctx = RuntimeContext(user_id="u9", tenant_id="acme")
    with CerbosAcl(pdp.url if transport == "http" else pdp.grpc_address, timeout=30) as acl:
        allowed = acl.allowed(ctx, nodes)
        plan = acl.restriction(ctx)
    assert allowed == {"n0", "n1"}
    assert isinstance(plan, Conditional)
    assert {node.node_id for node in nodes if evaluate(plan.condition, node.node_id, node.metadata)} == allowed
    metadata_acl = MetadataAcl(tenant_key="tenant", public_key="public")
    assert {node.node_id for node in nodes if metadata_acl(ctx, node)} == allowed


# -- the engine pages: every python block runs (tests/test_readme.py) or is complete as pasted --------


def _undefined_names(code: str) -> set[str]:
    """Names a block reads that it neither imports, assigns nor gets from builtins (Python's own symbol table)."""
    import builtins
    import symtable

    top = symtable.symtable(code, "<block>", "exec")
    defined = {symbol.get_name() for symbol in top.get_symbols() if symbol.is_assigned() or symbol.is_imported()}
    known = defined | set(dir(builtins))
    missing: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            free_here = symbol.is_global() or table is top
            if symbol.is_referenced() and free_here and symbol.get_name() not in known:
                missing.add(symbol.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    return missing


@pytest.mark.parametrize("page", ["permissions-cerbos.md", "permissions-spicedb.md"])
def test_every_python_block_of_the_engine_pages_is_complete_as_pasted(page: str) -> None:
    from .test_readme import blocks

    shown = [block for block in blocks(REPO / "docs" / page) if block.language == "python"]
    assert shown
    for block in shown:
        assert _undefined_names(block.code) == set(), block.name


def test_the_completeness_check_finds_a_name_the_block_does_not_import() -> None:
    assert _undefined_names("acl = SpiceDBAcl('x:1')\nprint(acl)\n") == {"SpiceDBAcl"}
    assert _undefined_names("from a import b\nprint([b(x) for x in range(3)])\n") == set()
