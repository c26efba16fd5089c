"""A small two-tenant knowledge base with ACL metadata, built into real LlamaIndex indexes."""

from __future__ import annotations

import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import TextNode
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import AsyncQdrantClient, QdrantClient

from llama_jev import MetadataAcl, RuntimeContext

from .support import HashEmbedding, marked

ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")

ALICE = RuntimeContext(user_id="alice", tenant_id="acme")
SAM = RuntimeContext(user_id="sam", tenant_id="acme", roles=frozenset({"support"}))
GINA = RuntimeContext(user_id="gina", tenant_id="globex")
NOBODY = RuntimeContext(user_id="nina", tenant_id="initech")


@dataclass(frozen=True)
class Doc:
    name: str
    p: float
    text: str
    tenant: str
    public: bool = False
    users: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        # Qdrant point ids must be UUIDs; derive them from the readable names.
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"llama-jev-test/{self.name}"))

    def node(self) -> TextNode:
        metadata: dict[str, object] = {"tenant": self.tenant, "name": self.name, "acl_note": f"ACLFIELD-{self.name}"}
        if self.public:
            metadata["public"] = "true"
        if self.users:
            metadata["users"] = list(self.users)
        if self.roles:
            metadata["roles"] = list(self.roles)
        return TextNode(id_=self.id, text=marked(self.p, self.text), metadata=metadata)


DOCS = (
    Doc(
        "acme-refund", 0.95, "Refund policy: refunds for unused items returned within seven days.", "acme", public=True
    ),
    Doc("acme-shipping", 0.1, "Shipping policy: parcels leave the warehouse in two days.", "acme", public=True),
    Doc("acme-hours", 0.05, "Office hours: the refund desk opens at nine.", "acme", public=True),
    Doc("acme-compensation", 0.9, "PRIVATE-COMPENSATION refund goodwill voucher rule.", "acme", roles=("support",)),
    Doc("acme-alice-note", 0.85, "ALICE-ONLY note about her refund case.", "acme", users=("alice",)),
    Doc("globex-refund", 0.95, "GLOBEX-REFUND policy: thirty day refunds.", "globex", public=True),
    Doc("globex-pricing", 0.3, "GLOBEX-PRICING refund fees table.", "globex", public=True),
)
BY_ID = {doc.id: doc for doc in DOCS}


def readable(ctx: RuntimeContext) -> set[str]:
    """Names of the documents ``ctx`` may read, by the ACL itself."""
    return {doc.name for doc in DOCS if ACL(ctx, doc.node())}


def names(nodes: object) -> list[str]:
    return [BY_ID[node.node.node_id].name for node in nodes]  # type: ignore[attr-defined]


def memory_index(docs: tuple[Doc, ...] = DOCS) -> VectorStoreIndex:
    return VectorStoreIndex([doc.node() for doc in docs], embed_model=HashEmbedding())


def qdrant_index(path: Path, docs: tuple[Doc, ...] = DOCS) -> tuple[VectorStoreIndex, QdrantClient]:
    """An index over Qdrant local mode (on disk); the caller closes the client."""
    client = QdrantClient(path=str(path))
    store = QdrantVectorStore(collection_name="kb", client=client)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # local mode warns that payload indexes have no effect
        index = VectorStoreIndex(
            [doc.node() for doc in docs],
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=HashEmbedding(),
        )
    return index, client


async def async_qdrant_index(path: Path, docs: tuple[Doc, ...] = DOCS) -> tuple[VectorStoreIndex, AsyncQdrantClient]:
    """Async retrieval on Qdrant local mode needs an async client (and its own storage folder)."""
    client = AsyncQdrantClient(path=str(path))
    store = QdrantVectorStore(collection_name="kb", aclient=client)
    index = VectorStoreIndex(
        [],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(),
        use_async=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await index.ainsert_nodes([doc.node() for doc in docs])
    return index, client
