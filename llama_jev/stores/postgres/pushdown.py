"""The adapter: the ACL as one bound SQL clause of ``AclPGVectorStore``.

LlamaIndex's stock ``PGVectorStore`` pastes ``MetadataFilter`` values into its SQL text, so the
ACL is never handed to it as filters (a tenant ``x' OR 1=1 --`` returned every row of a 10,000-row
table). Instead the retriever's query carries :class:`AclFilters`, which only
:class:`AclPGVectorStore` understands: it turns them into SQLAlchemy expressions with every value
bound (``llama_jev.stores.postgres.sql``), AND-ed with the caller's own filters.

``AclPGVectorStore`` needs the ``postgres`` extra; this module does not, so ``llama_jev``
imports without it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from llama_index.core.base.base_retriever import BaseRetriever

from llama_jev.acl.conditions import Everything, Restriction, Unknown
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import CannotState, KeyCensus, Pushdown, condition_of, restrict_filters, vector_store_of
from llama_jev.stores.postgres.sql import acl_filters, condition_filters

__all__ = ["PostgresPushdown", "is_acl_store", "is_plain_pgvector"]

_STORE_MODULE = "llama_jev.stores.postgres.store"


def is_acl_store(store: Any) -> bool:
    """Whether ``store`` is an ``AclPGVectorStore`` (one can exist only once its module is loaded)."""
    module = sys.modules.get(_STORE_MODULE)
    return module is not None and isinstance(store, module.AclPGVectorStore)


def is_plain_pgvector(store: Any) -> bool:
    """Whether ``store`` is LlamaIndex's ``PGVectorStore`` (or a subclass) but not an ``AclPGVectorStore``."""
    if store is None or is_acl_store(store):
        return False
    return any(
        cls.__name__ == "PGVectorStore" and cls.__module__.startswith("llama_index.vector_stores.postgres")
        for cls in type(store).__mro__
    )


class PostgresPushdown(Pushdown):
    """The ACL as :class:`AclFilters` AND-ed with the retriever's own ``filters``, for ``AclPGVectorStore``."""

    name: ClassVar[str] = "postgres"

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return is_acl_store(vector_store_of(retriever)) and hasattr(retriever, "_filters")

    @classmethod
    def advice(cls, retriever: BaseRetriever) -> str | None:
        if not is_plain_pgvector(vector_store_of(retriever)):
            return None
        return (
            "the ACL is applied after retrieval only over a plain PGVectorStore: denied nodes take top-k slots and "
            "the wrapped retriever's events carry them. The stock store pastes filter values into its SQL, so the "
            "ACL is not pushed into it. Wrap the same table with llama_jev.stores.AclPGVectorStore "
            "(same constructor and from_params, no re-ingestion) to push it down as bound parameters."
        )

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """``restriction`` as :class:`AclFilters` AND the caller's filters: exact for every operator.

        A ``MetadataAcl``'s own restriction is its exact clause (:func:`acl_filters`, which also
        denies malformed users / roles values); any other is :func:`condition_filters`.
        """
        if isinstance(restriction, (Unknown, Everything)):
            return isinstance(restriction, Everything)
        if isinstance(self.acl, MetadataAcl) and restriction == self.acl.restriction(ctx):
            restrict_filters(self.retriever, upstream, acl_filters(self.acl, ctx))
            return True
        try:
            filters = condition_filters(condition_of(restriction), ctx)
        except CannotState as refused:
            return self.refuse(refused.operator, refused.why)
        restrict_filters(self.retriever, upstream, filters)
        return True

    @classmethod
    def census(cls, retriever: BaseRetriever, keys: Sequence[str]) -> KeyCensus | None:
        """One ``LIMIT 1`` query per configured key asks whether any row holds it. Names keys only."""
        census: KeyCensus = vector_store_of(retriever).key_census(keys)
        return census
