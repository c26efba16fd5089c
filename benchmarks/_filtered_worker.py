"""One ``AclPGVectorStore`` for ``bench_filtered.py``, in a process of its own, driven by JSON lines.

Run by ``_filtered_pg.Worker`` with ``PYTHONPATH`` set to the checkout whose store is measured
(this branch, or a ``git worktree`` of ``--baseline``), so two versions of ``llama_jev`` answer
the same queries in one run. Only public API that both versions have is imported.

stdin, the first line: ``{"url", "async_url", "table", "dim", "jsonb", "k", "callers": {name:
{"user_id", "tenant_id", "roles", "acl": "tenant" | "grant"}}}``; then one ``{"caller",
"embedding"}`` per query. stdout: ``{"ready": true, "version"}``, then per query ``{"ids",
"seconds", "paths", "warnings"}`` (``paths``: the ``Plan.path`` of each store round, where the
store's module exposes ``run_sync``; ``warnings``: llama_jev's WARNING records in the query).
"""

# ruff: noqa: E402
from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import json
import logging
import sys
import time
import warnings
from typing import Any


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    warnings.filterwarnings("ignore")
    counter = _Count()
    jev_logger = logging.getLogger("llama_jev")
    jev_logger.addHandler(counter)
    jev_logger.propagate = False

    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import QueryBundle

    import llama_jev
    from llama_jev import (
        CandidateSelector,
        ExecutionOptions,
        JevRetriever,
        MetadataAcl,
        Mode,
        RuntimeContext,
        ScriptedJudge,
    )
    from llama_jev.stores import AclPGVectorStore
    from llama_jev.testing import HashEmbedding

    paths: list[str] = []
    try:  # the store's module: record which path each planned query took (a recorder, the plan unchanged)
        from llama_jev.stores.postgres import store as store_module
    except ImportError:
        store_module = None
    original = getattr(store_module, "run_sync", None)
    if original is not None:

        def recorded(steps: Any, connection: Any) -> Any:
            plan = original(steps, connection)
            paths.append(str(getattr(plan, "path", "?")))
            return plan

        store_module.run_sync = recorded

    tenant_acl = MetadataAcl(tenant_key="tenant", users_key="users", roles_key="roles", public_key="public")
    grant_acl = MetadataAcl(users_key="users", roles_key="roles", public_key="public")
    store = AclPGVectorStore(
        connection_string=spec["url"], async_connection_string=spec["async_url"], table_name=spec["table"],
        embed_dim=spec["dim"], use_jsonb=spec["jsonb"], acl_indexes=tenant_acl,
    )  # fmt: skip
    index = VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=spec["dim"]))
    selector = CandidateSelector(ScriptedJudge(lambda *_: 1.0), ExecutionOptions(mode=Mode.OFF))
    retrievers = {
        "tenant": JevRetriever.from_index(index, selector, tenant_acl, top_k=spec["k"]),
        "grant": JevRetriever.from_index(index, selector, grant_acl, top_k=spec["k"]),
    }
    callers = {
        name: (
            retrievers[c["acl"]],
            RuntimeContext(user_id=c["user_id"], tenant_id=c["tenant_id"], roles=set(c["roles"])),
        )
        for name, c in spec["callers"].items()
    }
    # The first query sets the store up (its ACL indexes, where missing): not timed.
    first = next(iter(callers.values()))
    first[0].retrieve(QueryBundle("set-up", embedding=[1.0] * spec["dim"]), ctx=first[1])
    print(json.dumps({"ready": True, "version": getattr(llama_jev, "__version__", "?")}), flush=True)
    for line in sys.stdin:
        asked = json.loads(line)
        retriever, ctx = callers[asked["caller"]]
        paths.clear()
        counter.count = 0
        bundle = QueryBundle("a question", embedding=asked["embedding"])
        begun = time.perf_counter()
        nodes = retriever.retrieve(bundle, ctx=ctx)
        seconds = time.perf_counter() - begun
        answer = {"ids": [n.node.node_id for n in nodes], "seconds": seconds, "paths": list(paths),
                  "warnings": counter.count}  # fmt: skip
        print(json.dumps(answer), flush=True)
    if store._engine is not None:
        store._engine.dispose()


if __name__ == "__main__":
    main()
