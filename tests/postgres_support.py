"""Data for the PostgreSQL tests: ACL metadata and callers, well-formed, malformed and hostile."""

from __future__ import annotations

import random
from typing import Any

from llama_index.core.schema import TextNode

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.testing.postgres import PostgresServer

# Values that broke the stock store's pasted SQL, plus look-alikes that must stay distinct.
HOSTILE = [
    "x' OR '1'='1",
    "x' OR 1=1 --",
    "o'brien",
    ":x",
    "42",
    "nan",
    "a\\b",
    "\\'",
    "%",
    "_",
    "Zürich ✓ 東京",
    "true",
    "True",
    "1",
    " acme",
    "acme ",
    '"quoted"',
]
TENANTS = ["acme", "globex", *HOSTILE]
USERS = ["u1", "u2", "u3", *HOSTILE]
ROLES = ["support", "admin", "sales", *HOSTILE]
# Every public flag shape: only "true", 1 and true are public.
PUBLIC_FLAGS: list[Any] = ["true", 1, True, False, "yes", 1.0, "True", 0, "1", None, [True], 2, "false", 1.5]
MALFORMED_USERS: list[Any] = [3, {"u": "u1"}, ["u1", 3], [None], True, ["u1", ["u2"]]]
MALFORMED_ROLES: list[Any] = [7, {"r": "admin"}, ["admin", 1], [None], False]
MALFORMED_TENANTS: list[Any] = [42, ["acme"], True, None, {"t": "acme"}, 1.5]
TOPICS = ["refund", "shipping", "x' OR '1'='1"]

FULL_ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
# Every way to configure the ACL: each drops to its own SQL shape.
ACLS = [
    FULL_ACL,
    MetadataAcl(tenant_key="tenant"),
    MetadataAcl(users_key="users", roles_key="roles"),
    MetadataAcl(public_key="public"),
    MetadataAcl(tenant_key="tenant", roles_key="roles"),
    MetadataAcl(users_key="users"),
]

_ABSENT = object()


def _grant_list(rng: random.Random, pool: list[str], malformed: list[Any]) -> Any:
    draw = rng.random()
    if draw < 0.15:
        return _ABSENT
    if draw < 0.2:
        return None
    if draw < 0.5:
        return rng.choice(pool)
    if draw < 0.85:
        return rng.sample(pool, rng.randint(0, 3))
    return rng.choice(malformed)


def acl_metadata(rng: random.Random) -> dict[str, Any]:
    """One node's metadata: each ACL key absent, null, well-formed, malformed or hostile."""
    values = {
        "tenant": rng.choice(TENANTS) if rng.random() < 0.8 else rng.choice([*MALFORMED_TENANTS, _ABSENT]),
        "users": _grant_list(rng, USERS, MALFORMED_USERS),
        "roles": _grant_list(rng, ROLES, MALFORMED_ROLES),
        "public": rng.choice([*PUBLIC_FLAGS, _ABSENT]),
        "topic": rng.choice(TOPICS),
    }
    return {key: value for key, value in values.items() if value is not _ABSENT}


def acl_nodes(count: int, *, seed: int = 7, dimensions: int = 8) -> list[TextNode]:
    """``count`` nodes with random ACL metadata; texts share words so text search finds them all."""
    rng = random.Random(seed)
    return [
        TextNode(
            id_=f"node-{i:04d}",
            text=f"refund policy paragraph {i}",
            embedding=[rng.uniform(0.01, 1.0) for _ in range(dimensions)],
            metadata=acl_metadata(rng),
        )
        for i in range(count)
    ]


def callers(count: int, *, seed: int = 11) -> list[RuntimeContext]:
    """``count`` identities, tenants, users and roles drawn from the same hostile pools as the data."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        tenant = rng.choice([*TENANTS, None])
        found.append(
            RuntimeContext(
                user_id=rng.choice(USERS),
                # RuntimeContext refuses blank ids; " acme" is not blank.
                tenant_id=tenant,
                roles=frozenset(rng.sample(ROLES, rng.randint(0, 3))),
            )
        )
    return found


def store_kwargs(server: PostgresServer, table: str, **extra: Any) -> dict[str, Any]:
    """Constructor arguments for a (Acl)PGVectorStore on ``table`` of the test server."""
    return {
        "connection_string": server.url,
        "async_connection_string": server.async_url,
        "table_name": table,
        **extra,
    }
