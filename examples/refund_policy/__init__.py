"""A small multi-tenant support knowledge base, searched through ``JevRetriever`` for different users.

Two steps, as in a real deployment:

- ``python -m examples.refund_policy.ingest`` builds the Qdrant collection once;
- ``python -m examples.refund_policy.query`` reopens it (no re-ingestion) and answers
  "What are the refund conditions?" for several users, in SHADOW and then ENFORCE mode.

``python -m examples.refund_policy`` does both: it ingests only if the collection is missing.
With ``DATABASE_URL=postgresql://...`` set, the same steps run on PostgreSQL + pgvector through
``llama_jev.stores.AclPGVectorStore`` (the ``postgres`` extra) instead of Qdrant.
"""

try:  # the example extra; without it the first import error would name a module, not the fix
    import llama_index.vector_stores.qdrant  # noqa: F401
    import qdrant_client  # noqa: F401
except ImportError as error:
    raise ModuleNotFoundError(
        f"the refund_policy example needs Qdrant ({error.name} is missing): install the example extra, "
        '`pip install -e ".[example]"` in the llama_jev clone'
    ) from error
