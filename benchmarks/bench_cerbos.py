"""What asking a Cerbos PDP costs: start, PlanResources, CheckResources for 20 and 1,024 nodes.

    python benchmarks/bench_cerbos.py [--repeat 30] [--starts 5]

Starts the PDP of the npm registry's ``@cerbos/cerbos-linux-x64`` 0.55.0 with the example policy
(``examples/cerbos/policies``) on 127.0.0.1 (``llama_jev.testing.cerbos``) and times, per
transport (HTTP and gRPC) and per path (sync and async), through ``CerbosAcl`` itself:

- ``start``: ``cerbos server`` launched until its health check says SERVING (``--starts`` times);
- ``PlanResources``: ``acl.restriction(ctx)`` for a tenant member (a conditional plan read into
  a condition);
- ``CheckResources 20``: ``acl.allowed(ctx, nodes)`` for 20 nodes (one request);
- ``CheckResources 1,024``: for 1,024 chunks (21 requests of at most 50, 4 in flight).

Each cell: median and 90th percentile over ``--repeat`` calls after two warm-up calls, in ms.
The async path opens its client per call (it belongs to the running loop), so its figure
includes the connection.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llama_index.core.schema import TextNode

from llama_jev.acl import CerbosAcl
from llama_jev.core.identity import RuntimeContext
from llama_jev.testing.cerbos import CERBOS_VERSION, cerbos_server

POLICIES = Path(__file__).resolve().parent.parent / "examples" / "cerbos" / "policies"
CTX = RuntimeContext(user_id="u1", tenant_id="acme", roles={"support"})


def nodes(count: int, seed: int = 1) -> list[TextNode]:
    """``count`` chunks, four per document; a document's chunks share its grant."""
    rng = random.Random(seed)
    grants = [
        {
            "tenant": rng.choice(["acme", "globex"]),
            "allowed_users": rng.sample(["u1", "u2", "u3", "u4"], 2),
            "allowed_roles": rng.sample(["support", "sales", "admin"], 1),
            "public": rng.random() < 0.1,
            "owner": rng.choice(["u1", "u2", "u3"]),
            "doc": f"d{doc}",
        }
        for doc in range((count + 3) // 4)
    ]
    return [TextNode(id_=f"n{i}", text="chunk", metadata=dict(grants[i // 4])) for i in range(count)]


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, float]:
    for _ in range(2):
        call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.9 * len(samples)))]


def cells(acl: CerbosAcl, loop: asyncio.AbstractEventLoop, twenty: list[TextNode], chunks: list[TextNode]) -> list:
    return [
        ("PlanResources", "sync", lambda: acl.restriction(CTX)),
        ("PlanResources", "async", lambda: loop.run_until_complete(acl.arestriction(CTX))),
        ("CheckResources 20", "sync", lambda: acl.allowed(CTX, twenty)),
        ("CheckResources 20", "async", lambda: loop.run_until_complete(acl.aallowed(CTX, twenty))),
        ("CheckResources 1,024", "sync", lambda: acl.allowed(CTX, chunks)),
        ("CheckResources 1,024", "async", lambda: loop.run_until_complete(acl.aallowed(CTX, chunks))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()

    starts = []
    for _ in range(args.starts):
        with cerbos_server(POLICIES) as pdp:
            starts.append(pdp.started_in * 1000)
    print(f"Cerbos {CERBOS_VERSION} PDP, example policy, {args.repeat} calls per cell after 2 warm-up calls")
    print(f"start (launch to SERVING): median {statistics.median(starts):.0f} ms, max {max(starts):.0f} ms "
          f"over {args.starts} starts")  # fmt: skip
    print()
    print(f"{'call':<24} {'transport':<9} {'path':<6} {'p50 ms':>8} {'p90 ms':>8}")
    twenty, chunks = nodes(20), nodes(1024)
    with cerbos_server(POLICIES) as pdp:
        for transport, url in (("HTTP", pdp.url), ("gRPC", pdp.grpc_address)):
            with CerbosAcl(url, timeout=30.0) as acl:
                loop = asyncio.new_event_loop()
                for name, path, call in cells(acl, loop, twenty, chunks):
                    p50, p90 = timed(call, args.repeat)
                    print(f"{name:<24} {transport:<9} {path:<6} {p50:>8.1f} {p90:>8.1f}")
                loop.close()
        with CerbosAcl(pdp.grpc_address, timeout=30.0, document_id_key="doc") as acl:
            p50, p90 = timed(lambda: acl.allowed(CTX, chunks), args.repeat)
            print(f"{'CheckResources 1,024':<24} {'gRPC':<9} {'sync':<6} {p50:>8.1f} {p90:>8.1f}"
                  "  (document_id_key: 256 documents of 4 chunks, asked once each)")  # fmt: skip


if __name__ == "__main__":
    main()
