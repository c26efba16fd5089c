"""How the Milvus pushdown reads the store's answer: few matching rows ranked exactly, a short answer explained.

Split from :mod:`llama_jev.stores.milvus` (the expression) by job: this is the query side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llama_jev.stores import completeness
from llama_jev.stores.milvus_probe import Probes, probing

__all__ = ["EXACT_ROWS", "CountedStore"]

# At most this many matching rows are read and ranked exactly (a filtered HNSW search may stop short).
EXACT_ROWS = 2048


class CountedStore:
    """``MilvusVectorStore`` as the retriever reads it: few matching rows ranked exactly, a short answer explained.

    A filtered query first asks the expression's ``count(*)`` (one round trip): when at most
    :data:`EXACT_ROWS` rows match, they are read and ranked exactly here, as PostgreSQL's
    small-set path does (the 2.3.5 server's filtered HNSW returned 0 of 5 for a caller reading 5
    of 10,000 rows, at every window, and recall 0.90 at 50 of 10,000). Otherwise the store's own
    search runs, and a short answer is complete only when it holds every match; else widening
    asks again. Everything else is the store's own.
    """

    def __init__(self, store: Any, expression: str, *, exact_index: bool = False, probes: Probes | None = None) -> None:
        self._store = store
        self._expression = expression
        self._exact_index = exact_index
        self._probes = probes  # searched over an exact index only: their answers are exact there alone

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def query(self, query: Any, **kwargs: Any) -> Any:
        if self._exact_index:  # a FLAT index ranks every match: its answer is exact, short or not
            if self._probes is not None and _dense(query):
                plan = probing(self._probes, query)
                try:
                    window, expression = next(plan)
                    while True:
                        result = self._store.query(window, **{**kwargs, "string_expr": expression})
                        window, expression = plan.send(result)
                except StopIteration as done:
                    if done.value is not None:
                        return done.value
            completeness.report_complete(True)
            return self._store.query(query, **kwargs)
        matching = self._count() if self._expression else None
        if self._exact_fits(query, matching):
            return self._exact(query, matching)  # type: ignore[arg-type]
        result = self._store.query(query, **self._searched(kwargs, query.similarity_top_k))
        return self._checked(result, query, matching)

    async def aquery(self, query: Any, **kwargs: Any) -> Any:
        if self._exact_index:
            if self._probes is not None and _dense(query):
                plan = probing(self._probes, query)
                try:
                    window, expression = next(plan)
                    while True:
                        result = await self._store.aquery(window, **{**kwargs, "string_expr": expression})
                        window, expression = plan.send(result)
                except StopIteration as done:
                    if done.value is not None:
                        return done.value
            completeness.report_complete(True)
            return await self._store.aquery(query, **kwargs)
        matching = self._count() if self._expression else None
        if self._exact_fits(query, matching):
            return self._exact(query, matching)  # type: ignore[arg-type]
        result = await self._store.aquery(query, **self._searched(kwargs, query.similarity_top_k))
        return self._checked(result, query, matching)

    def _count(self) -> int:
        store = self._store
        rows = store.client.query(store.collection_name, filter=self._expression, output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    @staticmethod
    def _exact_fits(query: Any, matching: int | None) -> bool:
        """Few enough rows match to rank them all here (a dense query of the default mode)."""
        return matching is not None and matching <= EXACT_ROWS and _dense(query)

    def _searched(self, kwargs: dict[str, Any], limit: int) -> dict[str, Any]:
        """``kwargs`` with an HNSW ``ef`` of at least ``limit`` (Milvus refuses ``ef < limit``; widening grows it)."""
        config = kwargs.get("milvus_search_config", getattr(self._store, "search_config", None)) or {}
        nested = isinstance(config.get("params"), dict)
        params = config["params"] if nested else config
        ef = params.get("ef")
        if not isinstance(ef, int) or ef >= limit:
            return kwargs
        raised = {**params, "ef": limit}
        return {**kwargs, "milvus_search_config": {**config, "params": raised} if nested else raised}

    def _checked(self, result: Any, query: Any, matching: int | None) -> Any:
        returned = len(result.ids or [])
        if returned < query.similarity_top_k:
            # Short: complete only when it holds every match (HNSW under a filter may stop short).
            completeness.report_complete(returned >= (self._count() if matching is None else matching))
        return result

    def _exact(self, query: Any, matching: int) -> Any:
        from llama_index.core.vector_stores.types import VectorStoreQueryResult

        store = self._store
        if matching == 0:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        rows = store.client.query(store.collection_name, filter=self._expression, output_fields=["*"], limit=matching)
        completeness.report_complete(True)  # every matching row is ranked
        vectors = [row.get(store.embedding_field) for row in rows]
        kept = [
            i for i, vector in enumerate(vectors) if vector is not None and len(vector) == len(query.query_embedding)
        ]
        if not kept:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        matrix = np.asarray([vectors[i] for i in kept], dtype=np.float64)
        asked = np.asarray(query.query_embedding, dtype=np.float64)
        metric = str(getattr(store, "similarity_metric", "IP")).upper()
        if metric == "L2":  # Milvus reports the squared distance, smaller first
            scores = ((matrix - asked) ** 2).sum(axis=1)
            order = np.argsort(scores, kind="stable")
        else:
            scores = matrix @ asked
            if metric == "COSINE":
                norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(asked)
                scores = np.divide(scores, norms, out=np.zeros_like(scores), where=norms > 0)
            order = np.argsort(-scores, kind="stable")
        hits = [
            {"id": rows[kept[i]]["id"], "distance": float(scores[i]), "entity": rows[kept[i]]}
            for i in order[: query.similarity_top_k]
        ]
        nodes, similarities, ids = store._parse_from_milvus_results([hits])
        return VectorStoreQueryResult(nodes=nodes, similarities=similarities, ids=ids)


def _dense(query: Any) -> bool:
    """A dense query of the default mode (what the exact read and the probes rank)."""
    return query.query_embedding is not None and getattr(query.mode, "value", query.mode) == "default"
