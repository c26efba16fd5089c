"""``AclPGVectorStore`` at scale (issue 40): the exact re-sort runs, the path follows the cost, the store says
whether a short answer is complete.

A table of 20,000 clustered 32-d rows with an HNSW index: half of it the tenant "big" (the broad
path), a grant of a few hundred rows spread thinly over every tenant (a user id in a JSON list).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llama_index.vector_stores.postgres")

import numpy as np
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.types import VectorStoreQuery
from llama_index.core.vector_stores.utils import node_to_metadata_dict

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.stores.postgres import AclPGVectorStore, acl_filters
from llama_jev.stores.postgres import plan as postgres_plan
from llama_jev.testing.postgres import PostgresServer

from .postgres_support import store_kwargs

pytestmark = pytest.mark.slow  # PostgreSQL

ROWS = 20_000
DIMENSIONS = 32
K = 10
GRANTED = 300  # rows whose users list holds "grantee", spread over every tenant (1.5 %)
TENANT_ACL = MetadataAcl(tenant_key="tenant")
GRANT_ACL = MetadataAcl(users_key="users", roles_key="roles")
BROAD = RuntimeContext(user_id="u1", tenant_id="big")
GRANTEE = RuntimeContext(user_id="grantee", roles={"nobody"})


class Table:
    """The rows as written (unit vectors, metadata) and the store's arguments."""

    def __init__(self, kwargs: dict[str, Any], vectors: np.ndarray, metadata: list[dict[str, Any]]) -> None:
        self.kwargs = kwargs
        self.vectors = vectors
        self.metadata = metadata
        rng = np.random.default_rng(5)
        picked = vectors[rng.choice(len(vectors), 8, replace=False)]
        self.queries = picked + 0.1 * rng.standard_normal(picked.shape).astype(np.float32)

    def top(self, acl: MetadataAcl, ctx: RuntimeContext, query: np.ndarray, k: int = K) -> list[str]:
        """The exact filtered top k (cosine over the admitted rows)."""
        rows = np.array([i for i, metadata in enumerate(self.metadata) if acl.allows(ctx, metadata)])
        scores = (self.vectors[rows] @ query) / np.linalg.norm(query)
        return [f"n{i}" for i in rows[np.argsort(-scores, kind="stable")[:k]]]


def write_table(server: PostgresServer, name: str, *, use_jsonb: bool = False) -> Table:
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((32, DIMENSIONS))
    vectors = centres[rng.integers(0, 32, ROWS)] + 0.6 * rng.standard_normal((ROWS, DIMENSIONS))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    granted = set(rng.choice(ROWS, GRANTED, replace=False).tolist())
    metadata = [
        {
            "tenant": "big" if i % 2 else f"t{i % 40}",
            "users": ["someone", "grantee"] if i in granted else ["someone"],
            "roles": ["staff"],
        }
        for i in range(ROWS)
    ]
    kwargs = store_kwargs(server, name, embed_dim=DIMENSIONS, use_jsonb=use_jsonb)
    store = AclPGVectorStore(**kwargs)
    store._initialize()
    table = store._table_class.__table__
    assert store._engine is not None
    with store._engine.begin() as connection:
        rows = []
        for i in range(ROWS):
            node = TextNode(id_=f"n{i}", text=f"passage {i}", metadata=metadata[i])
            rows.append(
                {
                    "node_id": node.node_id,
                    "text": node.text,
                    "metadata_": node_to_metadata_dict(node, remove_text=True, flat_metadata=False),
                    "embedding": vectors[i].tolist(),
                }
            )
        connection.execute(table.insert(), rows)
        connection.exec_driver_sql(f"CREATE INDEX ON data_{name} USING hnsw (embedding vector_cosine_ops)")
        connection.exec_driver_sql(f"ANALYZE data_{name}")
    store._engine.dispose()
    return Table(kwargs, vectors, metadata)


@pytest.fixture(scope="module")
def table(postgres_server: PostgresServer) -> Table:
    return write_table(postgres_server, "scale_json")


def _query(table: Table, q: int, acl: MetadataAcl, ctx: RuntimeContext, k: int = K) -> VectorStoreQuery:
    return VectorStoreQuery(query_embedding=table.queries[q].tolist(), similarity_top_k=k, filters=acl_filters(acl, ctx))


def _run(store: AclPGVectorStore, query: VectorStoreQuery) -> tuple[postgres_plan.Plan, list[Any], Any]:
    """The plan of ``query`` as the store runs it, the statements it ran, and the connection's transaction."""
    store._initialize()
    assert store._engine is not None
    statements: list[Any] = []
    with store._engine.begin() as connection:
        steps = store._plan_steps(query.query_embedding, query.similarity_top_k, query.filters)
        try:
            statement = next(steps)
            while True:
                statements.append(statement)
                statement = steps.send(connection.execute(statement).all())
        except StopIteration as done:
            plan = done.value
        # In the same transaction (the same settings): the last statement's plan, and its window in scan order.
        last = statements[-1]
        explained = json.dumps(connection.execute(postgres_plan._Explain(last)).scalar_one())
        window = connection.execute(last.limit(None).order_by(None)).all()
    return plan, window, explained


def _own_statement(statement: Any, table: Any, **kwargs: Any) -> Any:
    return statement  # a customize_query_fn: the store keeps its own statement, the HNSW path only


@pytest.mark.parametrize(("acl", "ctx"), [(TENANT_ACL, BROAD), (GRANT_ACL, GRANTEE)], ids=["broad", "selective"])
def test_the_hnsw_path_sorts_its_window_exactly(table: Table, acl: MetadataAcl, ctx: RuntimeContext) -> None:
    # PostgreSQL 17+ carried the CTE's order up: no Sort, the first k rows of the scan's loose order.
    store = AclPGVectorStore(**table.kwargs, customize_query_fn=_own_statement)
    loose = 0
    for q in range(len(table.queries)):
        plan, window, explained = _run(store, _query(table, q, acl, ctx))
        assert plan.path == "hnsw"
        assert '"Node Type": "Sort"' in explained, explained
        assert len(window) >= 2 * K
        exact = sorted(window, key=lambda row: row.distance)[:K]
        assert [row.node_id for row in plan.rows] == [row.node_id for row in exact]
        distances = [row.distance for row in window]
        loose += distances != sorted(distances)
    if ctx is GRANTEE:
        assert loose  # a selective filter: the iterative scan's loose order is not the exact order
