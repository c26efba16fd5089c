"""Hostile ACL data every store can hold, for the Chroma differential test and the adapters' equivalence test.

Well-formed in the sense every adapter claims exactness for: the tenant a string (or a value the
ACL denies: a number, a boolean, a list), users and roles a string or a non-empty list of strings,
the public flag any of the shapes below except the float ``1.0``. The strings are hostile: filter
operators (``$ne``, ``{"$ne": ""}``), quotes, SQL fragments, look-alikes of the public flag,
Unicode and blanks, in the data and in the callers' identities alike.
"""

from __future__ import annotations

import random
from typing import Any

from llama_jev import MetadataAcl, RuntimeContext

HOSTILE = [
    "$ne",
    '{"$ne": ""}',
    "$contains",
    "$and",
    "$in",
    "x' OR '1'='1",
    "o'brien",
    '"quoted"',
    "'",
    '"',
    "\\",
    "%",
    "Zürich ✓ 東京",
    "true",
    "True",
    "1",
    " acme",
    "acme ",
    "u1 ",
]
TENANTS = ["acme", "globex", *HOSTILE]
USERS = ["u1", "u2", "u10", *HOSTILE]
ROLES = ["support", "admin", "sales", *HOSTILE]
# Every public flag shape a store holds, bar 1.0 (see test_store_chroma.py): only "true", 1 and True are public.
PUBLIC_FLAGS: list[Any] = ["true", 1, True, False, "yes", "True", 0, "1", "false", 2, 1.5, ["true"], [True], [1]]
# A tenant the ACL denies whatever it is compared with: not a string.
DENIED_TENANTS: list[Any] = [42, ["acme"], True, 1.5, ["acme", "globex"]]
TOPICS = ["refund", "shipping", "$ne"]

FULL_ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
ACLS = [
    FULL_ACL,
    MetadataAcl(tenant_key="tenant"),
    MetadataAcl(users_key="users", roles_key="roles"),
    MetadataAcl(public_key="public"),
    MetadataAcl(tenant_key="tenant", roles_key="roles"),
    MetadataAcl(users_key="users"),
    MetadataAcl(tenant_key="tenant", public_key="public"),
]

_ABSENT = object()


def _grant(rng: random.Random, pool: list[str], *, lists: bool) -> Any:
    draw = rng.random()
    if draw < 0.2:
        return _ABSENT
    if draw < 0.55 or not lists:
        return rng.choice(pool)
    return rng.sample(pool, rng.randint(1, 3))


def acl_metadata(rng: random.Random, *, lists: bool = True, list_flags: bool = True) -> dict[str, Any]:
    """One node's metadata: each ACL key absent or hostile; lists only with ``lists``.

    (LlamaIndex's Chroma store refuses list values, so what it writes has none.) Without
    ``list_flags`` no tenant or public flag is a list: Qdrant matches a list's elements there,
    so only lists under users and roles are in every adapter's exact domain.
    """
    public = rng.choice([*PUBLIC_FLAGS, _ABSENT])
    if not (lists and list_flags) and isinstance(public, list):
        public = _ABSENT
    tenant = rng.choice(TENANTS) if rng.random() < 0.85 else rng.choice(DENIED_TENANTS)
    if not (lists and list_flags) and isinstance(tenant, list):
        tenant = "acme"
    values = {
        "tenant": tenant,
        "users": _grant(rng, USERS, lists=lists),
        "roles": _grant(rng, ROLES, lists=lists),
        "public": public,
        "topic": rng.choice(TOPICS),
    }
    return {key: value for key, value in values.items() if value is not _ABSENT}


def callers(count: int, *, seed: int = 11) -> list[RuntimeContext]:
    """``count`` identities drawn from the same hostile pools as the data (and some without a tenant or roles)."""
    rng = random.Random(seed)
    return [
        RuntimeContext(
            user_id=rng.choice(USERS),
            tenant_id=rng.choice([*TENANTS, None]),
            roles=frozenset(rng.sample(ROLES, rng.randint(0, 3))),
        )
        for _ in range(count)
    ]


def embedding(rng: random.Random, dimensions: int = 8) -> list[float]:
    return [rng.uniform(0.01, 1.0) for _ in range(dimensions)]


# --- conditions: every operator of the condition language, over fields beside the ACL's -----------

# The values a condition compares with, hostile: SQL, filter operators, LIKE wildcards, quotes, Unicode.
LABELS = ["acme' OR 1=1 --", "$ne", "%", "_", "a%b", "a_b", "o'brien", '"quoted"', "Zürich ✓ 東京", "plain", "1"]
# Scalars of every type, look-alikes across types: 1, 1.0 and True are three different things to a
# condition except that 1 equals 1.0 (evaluate compares numbers by value, never a bool with a number).
LEVELS: list[Any] = [1, 2, 1.0, 1.5, True, False, "1", "acme' OR 1=1 --", 0, -3]
DOCUMENTS = 40


def condition_metadata(rng: random.Random, index: int) -> dict[str, Any]:
    """The fields conditions test, for node ``index``: a document id shared by its chunks, a level, labels."""
    values: dict[str, Any] = {"doc": f"doc-{index % DOCUMENTS}"}
    if rng.random() < 0.85:
        values["level"] = rng.choice(LEVELS)
    draw = rng.random()
    if draw < 0.5:
        values["label"] = rng.choice(LABELS)
    elif draw < 0.8:
        values["label"] = rng.sample(LABELS, rng.randint(1, 3))  # a list of strings
    # Keys a store might read as more than a name: a path (Qdrant reads a.b as b inside a), a quote.
    if rng.random() < 0.6:
        values["org.unit"] = rng.choice(["x", "y", "acme' OR 1=1 --"])
    if rng.random() < 0.6:
        values['say "hi"'] = rng.choice(["x", "y"])
    return values
