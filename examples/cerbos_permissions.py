"""Permissions kept in Cerbos: two users ask the same question and get what the policy lets each read.

    python -m examples.cerbos_permissions

Starts the Cerbos PDP on 127.0.0.1 with the policy in ``examples/cerbos/policies/document.yaml``,
builds a small in-memory index of chunked documents, and retrieves through
``JevRetriever.from_index`` with a ``CerbosAcl``: the PDP's plan is pushed into the store
(PlanResources), and every node returned is checked (CheckResources). For each user it prints
what they see and the policy rule that lets them.

The first run fetches the PDP: the npm registry's ``@cerbos/cerbos-linux-x64`` (a 96 MB binary
once unpacked), with ``npm pack``, into ``~/.cache/llama_jev/cerbos/`` (``llama_jev.testing.cerbos``;
npm must be installed). Later runs use the cache and send nothing off the machine; no API key
is needed (OFF mode: no judge is asked).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from llama_index.core import VectorStoreIndex
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
from llama_jev.acl import CerbosAcl
from llama_jev.testing import HashEmbedding, cerbos_server

POLICIES = Path(__file__).resolve().parent / "cerbos" / "policies"
QUESTION = "What are the refund conditions?"

# (document, chunks, grant): the grant is each chunk's metadata, what the policy reads as R.attr.
# "public" is the string "true" on one and the boolean on the other: the policy reads both.
DOCUMENTS = [
    ("acme/refund-policy", ["Refund conditions: within 30 days.", "Refund conditions for damaged goods."],
     {"tenant": "acme", "allowed_roles": ["support"]}),
    ("acme/refund-escalation", ["Refund conditions above 500 EUR need a manager."],
     {"tenant": "acme", "allowed_users": ["alice"]}),
    ("acme/holidays", ["Refund desk closed on public holidays."], {"tenant": "acme", "public": "true"}),
    ("acme/bob-notes", ["Bob's notes on refund conditions."], {"tenant": "acme", "owner": "bob"}),
    ("globex/refund-policy", ["Globex refund conditions: 14 days."], {"tenant": "globex", "public": True}),
]  # fmt: skip

# The rule of document.yaml that admits each document (every rule also needs the caller's tenant).
WHY = {
    "acme/refund-policy": "rule listed-role: the caller's role support is in allowed_roles",
    "acme/refund-escalation": "rule listed-user: the caller is in allowed_users",
    "acme/holidays": 'rule public: public is true or "true"',
    "acme/bob-notes": "rule owner: the caller is the owner",
    "globex/refund-policy": 'rule public: public is true or "true" (tenant globex)',
}

USERS = {
    "alice": RuntimeContext(user_id="alice", tenant_id="acme", roles={"support"}),
    "bob": RuntimeContext(user_id="bob", tenant_id="acme"),
}


def build_index() -> VectorStoreIndex:
    """The chunks in LlamaIndex's in-memory store (ids ``<document>#<n>``), embedded offline."""
    nodes = [
        TextNode(id_=f"{name}#{number}", text=text, metadata={**grant, "document": name})
        for name, chunks, grant in DOCUMENTS
        for number, text in enumerate(chunks)
    ]
    return VectorStoreIndex(nodes, embed_model=HashEmbedding(dimensions=64))


def retriever(index: VectorStoreIndex, acl: CerbosAcl) -> JevRetriever:
    selector = CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=Mode.OFF))
    return JevRetriever.from_index(index, selector, acl, top_k=4)


def main() -> None:
    index = build_index()
    with cerbos_server(POLICIES) as pdp, CerbosAcl(pdp.url) as acl:
        print(f"Cerbos PDP ready ({pdp.url})")
        search = retriever(index, acl)
        for name, ctx in USERS.items():
            with runtime_context(ctx):
                found = search.retrieve(QUESTION)
            roles = ", ".join(sorted(ctx.roles)) if ctx.roles else f"{', '.join(acl.default_roles)} (default_roles)"
            plan = acl.restriction(ctx).kind
            print(f"{name} (tenant {ctx.tenant_id}, roles {roles}; the plan, a {plan}, pushed down):")
            for node_id in sorted(hit.node.node_id for hit in found):
                print(f"  {node_id}: {WHY[node_id.split('#')[0]]}")
        # The same over the async path, for bob.
        with runtime_context(USERS["bob"]):
            found = asyncio.run(search.aretrieve(QUESTION))
        print(f"bob, async: {sorted(hit.node.node_id for hit in found)}")


if __name__ == "__main__":
    main()
