"""What SpiceDBAcl's reads cost: LookupResources for 100 / 1,000 / 5,000 documents, CheckBulk for 20 and 1,024.

    python benchmarks/bench_spicedb.py [--repeat 10]

Starts the embedded SpiceDB of the tests (llama_jev.testing.spicedb: the npm registry's
``libspicedb.so`` 0.7.1, in-memory datastore, behind the standard gRPC API on 127.0.0.1) with
30,000 documents, a third of them in 100 folders shared with groups; subjects who may read
exactly 100, 1,000 and 5,000 documents (for 1,000 and 5,000: half granted directly, half through
folders shared with a group they are in); then times, interleaved, ``repeat`` times each:

- ``restriction``: ``SpiceDBAcl.restriction`` (LookupResources, paged by 1,000) with ``max_ids``
  above the subject's count (an id allow-list of every document), and with the default
  ``max_ids=1000`` (a 5,000-document subject stops after 1,001 results: no pushdown);
- ``allowed``: ``SpiceDBAcl.allowed`` (CheckBulkPermissions) over 20 and 1,024 chunks of distinct
  documents, at several ``batch_size`` (the batches concurrent);
- the same 1,024 items handed straight to the library (no gRPC), to show what the test server's
  Python gRPC hop adds: a ``spicedb serve`` has no such hop.

Reads are ``fully_consistent`` (no ZedToken), as SpiceDBAcl's default. Prints the machine's
load average and one table (median and 90th percentile, milliseconds). The in-memory datastore
is SpiceDB's test datastore: a PostgreSQL- or CockroachDB-backed SpiceDB with its caches warm
costs differently; measure yours with the same two calls.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from authzed.api.v1 import CheckBulkPermissionsRequest
from llama_index.core.schema import TextNode

from llama_jev import RuntimeContext
from llama_jev.acl import Ids, SpiceDBAcl
from llama_jev.acl.spicedb.wire import bulk_requests, consistency, subject
from llama_jev.testing.spicedb import spicedb_server

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
  relation viewer: user | group#member
  permission view = viewer + folder->view
}
"""
DOCUMENTS = 30_000
FOLDERS = 100  # 100 documents each: the first 10,000 documents
READERS = {"reads-100": 100, "reads-1000": 1_000, "reads-5000": 5_000}


def relationships() -> list[str]:
    rng = random.Random(35)
    out = [f"document:doc-{n}#folder@folder:folder-{n // 100}" for n in range(FOLDERS * 100)]
    out += [f"folder:folder-{f}#viewer@group:team-{f % 50}#member" for f in range(FOLDERS)]
    out += [f"group:team-{t}#member@user:staff-{s}" for t in range(50) for s in rng.sample(range(200), 10)]
    out += [f"document:doc-{n}#viewer@user:staff-{rng.randrange(200)}" for n in range(DOCUMENTS)]
    for user, count in READERS.items():
        # Half through folders (a group holding the reader), half granted directly.
        team = f"reader-team-{user}"
        out.append(f"group:{team}#member@user:{user}")
        folders = rng.sample(range(FOLDERS), count // 200)
        out += [f"folder:folder-{f}#viewer@group:{team}#member" for f in folders]
        via_folders = {n for f in folders for n in range(f * 100, f * 100 + 100)}
        direct = rng.sample(
            [n for n in range(FOLDERS * 100, DOCUMENTS) if n not in via_folders], count - len(via_folders)
        )
        out += [f"document:doc-{n}#viewer@user:{user}" for n in direct]
    return out


def timed(repeat: int, work: Callable[[], Any]) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    print(f"writing {DOCUMENTS:,} documents' relationships ...", flush=True)
    with spicedb_server(SCHEMA, relationships()) as server:

        def acl(**options: Any) -> SpiceDBAcl:
            return SpiceDBAcl(server.target, preshared_key=server.preshared_key, insecure=True, **options)

        cases: list[tuple[str, str, Callable[[], Any]]] = []
        for user, count in READERS.items():
            ctx = RuntimeContext(user_id=user)
            listed = acl(max_ids=10_000)
            assert isinstance(listed.restriction(ctx), Ids)
            assert len(listed.restriction(ctx).ids) == count  # type: ignore[union-attr]
            cases.append(("restriction, max_ids=10,000", f"{count:,} -> ids", lambda a=listed, c=ctx: a.restriction(c)))
        capped = acl()
        big = RuntimeContext(user_id="reads-5000")
        assert capped.restriction(big).kind == "none"
        cases.append(("restriction, max_ids=1,000", "5,000 -> none", lambda: capped.restriction(big)))

        reader = RuntimeContext(user_id="reads-1000")
        for size in (20, 1024):
            nodes = [TextNode(id_=f"chunk-{n}", text="x", metadata={"doc": f"doc-{n * 7}"}) for n in range(size)]
            for batch in sorted({100, 500, 1024} if size > 20 else {500}):
                checker = acl(document_id_key="doc", batch_size=batch)
                checker.allowed(reader, nodes)
                calls = -(-size // batch)
                label = f"{size:,} docs, batch_size={batch} ({calls} call{'s' if calls > 1 else ''})"
                cases.append(("allowed", label, lambda a=checker, n=nodes: a.allowed(reader, n)))
        raw = bulk_requests(
            [f"doc-{n * 7}" for n in range(1024)],
            resource_type="document",
            permission="view",
            who=subject("user", "reads-1000", None),
            read_at=consistency(None),
            batch_size=1024,
        )[0]
        payload = CheckBulkPermissionsRequest.SerializeToString(raw)
        cases.append(
            (
                "CheckBulk straight into the library",
                "1,024 docs (no gRPC)",
                lambda: server._ffi.spicedb_permissions_check_bulk_permissions(server._handle, payload),
            )
        )

        samples: dict[int, list[float]] = {index: [] for index in range(len(cases))}
        for _ in range(args.repeat):  # interleaved: noise hits every case alike
            for index, (_, _, work) in enumerate(cases):
                samples[index] += timed(1, work)

    print(f"\nload average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| read | subject / items | p50 ms | p90 ms |")
    print("|---|---|---:|---:|")
    for index, (read, label, _) in enumerate(cases):
        values = sorted(samples[index])
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(f"| {read} | {label} | {statistics.median(values):.1f} | {p90:.1f} |")


if __name__ == "__main__":
    main()
