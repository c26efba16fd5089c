"""``python -m examples.refund_policy``: ingest if the collection is missing, then run the queries."""

from examples.refund_policy.query import main

raise SystemExit(main(ingest_if_missing=True))
