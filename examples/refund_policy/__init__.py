"""A small multi-tenant support knowledge base, searched through ``JevRetriever`` for different users.

Two steps, as in a real deployment:

- ``python -m examples.refund_policy.ingest`` builds the Qdrant collection once;
- ``python -m examples.refund_policy.query`` reopens it (no re-ingestion) and answers
  "What are the refund conditions?" for several users, in SHADOW and then ENFORCE mode.

``python -m examples.refund_policy`` does both: it ingests only if the collection is missing.
"""
