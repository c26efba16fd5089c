"""What the Cerbos tests share: the real PDP (skipped outside CI when it cannot be had), the example
policy, a corpus of nodes with well-formed and malformed metadata, principals, and a PDP that
answers what a test programs (for unreadable answers the real PDP never gives)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.schema import TextNode

from llama_jev.core.identity import RuntimeContext

POLICIES = Path(__file__).resolve().parent.parent / "examples" / "cerbos" / "policies"


def require_cerbos() -> None:
    """Skip (outside CI) or fail (``CI=1``) when the SDK or the PDP binary cannot be had."""
    from llama_jev.testing.cerbos import cerbos_published
    from llama_jev.testing.npm import BinaryUnavailableError, linux_cpu

    if not cerbos_published():
        # Not a missing install CI could fix: the registry has no PDP for this CPU (say so, even under CI=1).
        pytest.skip(f"the npm registry publishes no Cerbos PDP for linux-{linux_cpu()} (only x64)")
    try:
        import cerbos.sdk  # noqa: F401

        from llama_jev.testing.cerbos import cerbos_binary

        cerbos_binary()
    except (ImportError, BinaryUnavailableError) as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the Cerbos SDK and PDP (.ci/run installs npm and fetches it): {error}")
        pytest.skip(f"no Cerbos PDP here: {error}")


@contextlib.contextmanager
def running_pdp() -> Iterator[Any]:
    """A fresh PDP with the example policy (for tests that stop or freeze it)."""
    require_cerbos()
    from llama_jev.testing.cerbos import cerbos_server

    with cerbos_server(POLICIES) as pdp:
        yield pdp


def node(node_id: str, **metadata: Any) -> TextNode:
    return TextNode(id_=node_id, text=f"text of {node_id}", metadata=metadata)


TENANTS = ["acme", "globex", "acme' OR 1=1 --"]
USERS = ["u1", "u2", "u3", "$ne", 'o"brien']
ROLE_SETS: list[frozenset[str]] = [
    frozenset(),
    frozenset({"support"}),
    frozenset({"sales", "support"}),
    frozenset({"admin' --"}),
]


def resources() -> list[TextNode]:
    """Nodes covering every rule of the example policy, and metadata a store may hold malformed."""
    nodes = []
    index = 0
    for tenant in ["acme", "globex"]:
        for users in [["u1"], ["u2", "u3"], [], ["$ne"]]:
            for roles in [["support"], ["sales"], []]:
                for public in [True, False]:
                    for owner in ["u1", "u3", None]:
                        metadata: dict[str, Any] = {"tenant": tenant, "allowed_users": users, "allowed_roles": roles}
                        metadata["public"] = public
                        if owner is not None:
                            metadata["owner"] = owner
                        nodes.append(node(f"w{index}", **metadata))
                        index += 1
    malformed = [
        {},  # nothing at all
        {"allowed_users": ["u1"], "public": True},  # no tenant
        {"tenant": 7, "public": True},  # a tenant that is a number
        {"tenant": "ACME", "public": True},  # another case
        {"tenant": "acme", "allowed_users": "u1"},  # a string where a list was meant
        {"tenant": "acme", "allowed_users": "u10"},
        {"tenant": "acme", "allowed_roles": "support"},
        {"tenant": "acme", "public": "true"},  # the string, not the bool
        {"tenant": "acme", "public": 1},
        {"tenant": "acme", "owner": ["u1"]},
        {"tenant": "acme", "owner": None, "allowed_users": None},
        {"tenant": "acme' OR 1=1 --", "public": True},
        {"tenant": "acme", "allowed_users": ["u1' OR '1'='1"]},
        {"tenant": "acme", "level": 1},
        {"tenant": "acme", "level": "1"},
    ]
    nodes.extend(node(f"m{index}", **metadata) for index, metadata in enumerate(malformed))
    return nodes


def well_formed(node_id: str) -> bool:
    return node_id.startswith("w")


def principals() -> list[RuntimeContext]:
    """Callers across tenants, users and roles, hostile values included, and a caller without a tenant."""
    found = [
        RuntimeContext(user_id=user, tenant_id=tenant, roles=roles)
        for tenant in TENANTS
        for user in USERS
        for roles in ROLE_SETS
    ]
    found.append(RuntimeContext(user_id="u1"))
    return found


class ProgrammedPdp:
    """An HTTP server on 127.0.0.1 answering every POST with the status and JSON body a test sets.

    It stands in for a PDP that misbehaves (answers the real one never gives); requests are recorded.
    """

    def __init__(self) -> None:
        self.status = 200
        self.body: Any = {}
        self.requests: list[Any] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                owner.requests.append(json.loads(self.rfile.read(length) or b"null"))
                body = owner.body(owner.requests[-1]) if callable(owner.body) else owner.body
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(owner.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    # A client that gave up (its other batch failed) may have closed already.
                    self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> ProgrammedPdp:
        self.thread.start()
        return self

    def __exit__(self, *args: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
