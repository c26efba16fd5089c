"""PostgreSQL + pgvector: everything the package says to it, in one folder.

- ``store``: :class:`AclPGVectorStore`, LlamaIndex's ``PGVectorStore`` with the ACL as bound SQL
  (needs the ``postgres`` extra, loaded on first access);
- ``sql``: the ACL and the caller's filters as SQLAlchemy expressions, every value bound;
- ``plan``: how a filtered dense query is answered (exact by the indexes, or HNSW);
- ``pushdown``: the adapter ``JevRetriever`` asks (``PostgresPushdown``);
- ``row_security``: row-level security as a floor under the filter (``row_security_ddl``).

``from llama_jev.stores.postgres import AclPGVectorStore, acl_filters, condition_filters`` works
as in 0.2; ``from llama_jev.stores import AclPGVectorStore`` is the path apps use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llama_jev.stores.postgres.pushdown import PostgresPushdown
from llama_jev.stores.postgres.row_security import row_security_ddl
from llama_jev.stores.postgres.sql import AclFilters, acl_filters, condition_filters

if TYPE_CHECKING:
    from llama_jev.stores.postgres.store import AclPGVectorStore

__all__ = [
    "AclFilters",
    "AclPGVectorStore",
    "PostgresPushdown",
    "acl_filters",
    "condition_filters",
    "row_security_ddl",
]


def __getattr__(name: str) -> Any:
    # PEP 562: the store (and the postgres extra) loads only when asked for; the ImportError names the extra.
    if name == "AclPGVectorStore":
        from llama_jev.stores.postgres.store import AclPGVectorStore

        return AclPGVectorStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
