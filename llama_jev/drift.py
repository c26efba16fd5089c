"""``python -m llama_jev.drift``: find nodes whose stored grants differ from your source of truth.

One store, one ACL, one function giving each node's expected grants::

    python -m llama_jev.drift --qdrant-path ./qdrant --collection docs \\
        --tenant-key tenant --users-key users --public-key public \\
        --expected myapp.permissions:expected_grants [--sample 10000] [--json]

The store is one of ``--qdrant-path DIR --collection NAME`` (Qdrant local),
``--chroma-path DIR --collection NAME`` (Chroma persistent), or ``--postgres URL --table NAME
[--schema S] [--jsonb]`` (the ``table_name`` you gave LlamaIndex's ``PGVectorStore``, which
prefixes ``data_``). ``--expected module:function`` names a function taking a
:class:`~llama_jev.stores.grants.Stored` (``.node_id``, ``.metadata``) and returning the grants
that node should hold (metadata key -> value).

It reads the store page by page (``--page-size``), prints progress to stderr (``--quiet`` turns it
off), then a summary, or a JSON report with ``--json``: counts of nodes that would widen access
and would narrow it, and the first ``--keep`` node ids (never a grant value). Exit status: 0 when
no node would widen access, 1 when any would (narrowing alone is reported but exits 0), 2 on bad
input (arguments, the function, the store).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from llama_jev.acl.rules import MetadataAcl
from llama_jev.stores.drift import DriftReport, Expected, check_drift

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llama_jev.drift",
        description="Compare the grants a store holds with a source of truth; exit 1 if any node would widen access.",
    )
    store = parser.add_argument_group("store (one of)")
    store.add_argument("--qdrant-path", help="a Qdrant local folder")
    store.add_argument("--chroma-path", help="a Chroma persistent folder")
    store.add_argument("--postgres", metavar="URL", help="a PostgreSQL URL (postgresql+psycopg2://...)")
    store.add_argument("--collection", help="the Qdrant / Chroma collection")
    store.add_argument("--table", help="the PGVectorStore table_name (LlamaIndex adds the data_ prefix)")
    store.add_argument("--schema", default="public", help="the PostgreSQL schema (default public)")
    store.add_argument("--jsonb", action="store_true", help="the table's metadata_ column is JSONB")
    acl = parser.add_argument_group("the ACL (MetadataAcl keys; at least one)")
    for name in ("tenant", "users", "roles", "public"):
        acl.add_argument(f"--{name}-key", help=f"the metadata key of the {name} grant")
    parser.add_argument("--expected", required=True, metavar="MODULE:FUNCTION", help="node -> expected grants")
    parser.add_argument("--sample", type=int, help="compare a random sample of this many nodes")
    parser.add_argument("--seed", type=int, help="the sample's random seed")
    parser.add_argument("--page-size", type=int, default=500, help="nodes read per page (default 500)")
    parser.add_argument("--keep", type=int, default=1000, help="drifted node ids listed (default 1000)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def _expected(path: str) -> Expected:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--expected must be MODULE:FUNCTION, not {path!r}")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--expected {path}: {error}") from error
    if not callable(found):
        raise ValueError(f"--expected {path} is not callable")
    expected: Expected = found
    return expected


def _store(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The vector store the arguments name, and what to close after."""
    chosen = [name for name in ("qdrant_path", "chroma_path", "postgres") if getattr(args, name)]
    if len(chosen) != 1:
        raise ValueError("name one store: --qdrant-path, --chroma-path or --postgres")
    if args.postgres:
        if not args.table:
            raise ValueError("--postgres needs --table")
        import sqlalchemy
        from llama_index.vector_stores.postgres import PGVectorStore

        url = sqlalchemy.make_url(args.postgres)
        store = PGVectorStore(
            connection_string=url,
            # The store builds an async engine too (unused here, never connected): same server, asyncpg.
            async_connection_string=url.set(drivername="postgresql+asyncpg"),
            table_name=args.table,
            schema_name=args.schema,
            use_jsonb=args.jsonb,
            perform_setup=False,
        )
        return store, [lambda: store._engine.dispose() if store._engine is not None else None]
    if not args.collection:
        raise ValueError("--qdrant-path and --chroma-path need --collection")
    if args.qdrant_path:
        from llama_index.vector_stores.qdrant import QdrantVectorStore
        from qdrant_client import QdrantClient

        client = QdrantClient(path=args.qdrant_path)
        if not client.collection_exists(args.collection):
            client.close()
            raise ValueError(f"no collection {args.collection!r} in the Qdrant folder")
        return QdrantVectorStore(client=client, collection_name=args.collection), [client.close]
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    try:
        collection = chromadb.PersistentClient(path=args.chroma_path).get_collection(args.collection)
    except Exception as error:  # chromadb raises its own NotFoundError / ValueError by version
        raise ValueError(f"no collection {args.collection!r} in the Chroma folder ({type(error).__name__})") from error
    return ChromaVectorStore(chroma_collection=collection), []


def _progress(quiet: bool) -> Any:
    if quiet:
        return None
    last = [0.0]

    def show(scanned: int, total: int | None) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0 or scanned == total:  # at most one line a second on a long scan
            last[0] = now
            of = f" of {total:,}" if total is not None else ""
            print(f"scanned {scanned:,}{of} nodes", file=sys.stderr, flush=True)

    return show


def _summary(report: DriftReport) -> str:
    kind = "sampled" if report.sampled else "scanned"
    lines = [
        f"{kind} {report.scanned:,} nodes" + (f" of {report.total:,}" if report.total is not None else ""),
        f"would widen access: {report.widen:,}",
        f"would narrow access: {report.narrow:,}",
    ]
    lines += [
        f"  {item.node_id}: {'widens' if item.widens else ''}{' ' if item.widens and item.narrows else ''}"
        f"{'narrows' if item.narrows else ''} ({', '.join(item.keys) or 'grants'})"
        for item in report.drifted
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the drift check; the exit status (0 clean or narrowing only, 1 widening found, 2 bad input)."""
    parser = _parser()
    args = parser.parse_args(argv)  # exits 2 on bad arguments
    closers: list[Any] = []
    try:
        keys = {f"{name}_key": getattr(args, f"{name}_key") for name in ("tenant", "users", "roles", "public")}
        acl = MetadataAcl(**keys)
        expected = _expected(args.expected)
        store, closers = _store(args)
        report = check_drift(
            store,
            acl,
            expected,
            sample=args.sample,
            seed=args.seed,
            page_size=args.page_size,
            keep=args.keep,
            progress=_progress(args.quiet),
        )
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # the store unreachable, the function failing: not "no drift", not "widens"
        print(f"error: the drift check failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    finally:
        for close in closers:
            close()
    print(json.dumps(report.as_dict(), indent=2) if args.json else _summary(report))
    return 1 if report.widen else 0


if __name__ == "__main__":
    sys.exit(main())
