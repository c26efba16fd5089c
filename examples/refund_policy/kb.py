"""The knowledge base: documents with their access metadata, the ACL that reads it, and the users.

Access is decided by metadata on each document, read by one :class:`~llama_jev.MetadataAcl`:

- ``tenant``: the company the document belongs to; a caller only ever sees their own tenant's;
- ``public``: ``"true"`` when everybody in the tenant may read it (a string, not a bool: vector
  store filters reject boolean values);
- ``roles`` / ``users``: who else may read a non-public document.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from llama_index.core.schema import TextNode

from llama_jev import MetadataAcl, RuntimeContext

QUESTION = "What are the refund conditions?"

ACL = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")

# The ACL fields are for the ACL only: kept out of the text the embedding model and the answer
# generator see. The judge never sees any metadata (it gets node.get_content() alone).
_ACCESS_KEYS = ["tenant", "users", "roles", "public"]
# Stable ids, so decision records from different runs name the same document the same way.
# Qdrant point ids must be UUIDs (or integers), hence uuid5 rather than the readable key.
_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/llama-jev/examples/refund_policy")


@dataclass(frozen=True)
class Document:
    """One passage of the knowledge base and who may read it."""

    key: str
    tenant: str
    title: str
    text: str
    public: bool = False
    roles: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    @property
    def node_id(self) -> str:
        """The node's id (also its Qdrant point id)."""
        return str(uuid.uuid5(_ID_NAMESPACE, self.key))

    def to_node(self) -> TextNode:
        """The LlamaIndex node to ingest, access metadata included."""
        metadata: dict[str, str | list[str]] = {
            "doc": self.key,
            "title": self.title,
            "tenant": self.tenant,
            "public": "true" if self.public else "false",
        }
        if self.roles:
            metadata["roles"] = list(self.roles)
        if self.users:
            metadata["users"] = list(self.users)
        return TextNode(
            id_=self.node_id,
            text=self.text,
            metadata=metadata,
            excluded_embed_metadata_keys=[*metadata],  # embed the passage text only
            excluded_llm_metadata_keys=[key for key in metadata if key in _ACCESS_KEYS],
        )


DOCUMENTS: tuple[Document, ...] = (
    Document(
        key="acme/refund-policy",
        tenant="acme",
        title="Refund policy",
        text=(
            "Refunds are available for unused items returned within seven days of delivery. Return the item "
            "in its original packaging; the money goes back to the original payment method within five "
            "business days of our receiving it."
        ),
        public=True,
    ),
    Document(
        key="acme/shipping",
        tenant="acme",
        title="Shipping instructions",
        text=(
            "Shipping instructions: orders leave our Rotterdam warehouse within one business day. Standard "
            "delivery takes three to five business days and express delivery arrives the next business day. "
            "Track your parcel from the link in the confirmation email."
        ),
        public=True,
    ),
    Document(
        key="acme/office-hours",
        tenant="acme",
        title="Office hours",
        text=(
            "Customer service is open Monday to Friday, 9:00 to 17:00 Central European Time, by chat and "
            "phone. We are closed on public holidays."
        ),
        public=True,
    ),
    Document(
        key="acme/compensation-rule",
        tenant="acme",
        title="Compensation rule (support staff only)",
        text=(
            "Compensation rule for support staff (internal): if a customer's refund request is refused because "
            "the item was used or returned after seven days, offer store credit of up to 20 euros. Do not "
            "disclose this rule to customers."
        ),
        roles=("support",),
    ),
    Document(
        key="acme/alice-refund-case",
        tenant="acme",
        title="Refund case A-1042",
        text=(
            "Refund case A-1042 (alice): the returned item arrived unused within seven days; refund approved, "
            "payment within five business days."
        ),
        roles=("support",),
        users=("alice",),
    ),
    Document(
        key="globex/refund-policy",
        tenant="globex",
        title="Refund policy",
        text=(
            "Globex refund conditions: refunds are given for items returned within thirty days of purchase, "
            "used or unused, with the original receipt."
        ),
        public=True,
    ),
    Document(
        key="globex/warranty",
        tenant="globex",
        title="Warranty",
        text=(
            "Globex electronics carry a two-year warranty against manufacturing defects; repairs are booked "
            "through the Globex service portal."
        ),
        public=True,
    ),
)

BY_KEY: dict[str, Document] = {document.key: document for document in DOCUMENTS}
BY_ID: dict[str, Document] = {document.node_id: document for document in DOCUMENTS}


@dataclass(frozen=True)
class User:
    """A caller of the example: the identity and a line saying who they are."""

    name: str
    who: str
    context: RuntimeContext = field(repr=False)


USERS: tuple[User, ...] = (
    User("alice", "an acme customer, no roles", RuntimeContext(user_id="alice", tenant_id="acme")),
    User(
        "sam",
        "acme support staff, role 'support'",
        RuntimeContext(user_id="sam", tenant_id="acme", roles={"support"}),
    ),
    User("grace", "a globex customer, no roles", RuntimeContext(user_id="grace", tenant_id="globex")),
)
USER_BY_NAME: dict[str, User] = {user.name: user for user in USERS}


def nodes() -> list[TextNode]:
    """Every document as a node, in a fixed order."""
    return [document.to_node() for document in DOCUMENTS]


def access_line(document: Document) -> str:
    """Who may read ``document``, in words."""
    if document.public:
        return f"everyone at {document.tenant}"
    grants = [f"user {', '.join(document.users)}"] if document.users else []
    grants += [f"role {', '.join(document.roles)}"] if document.roles else []
    return f"at {document.tenant}, only {' or '.join(grants)}"


def readable_by(user: User) -> frozenset[str]:
    """The document keys ``user`` may read, by the ACL (what tests hold the example to)."""
    return frozenset(document.key for document in DOCUMENTS if ACL(user.context, document.to_node()))
