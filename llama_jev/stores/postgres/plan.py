"""How ``AclPGVectorStore`` answers a filtered dense query: by the size of what the filters admit.

PostgreSQL's planner walks the HNSW index for every filtered ``ORDER BY distance LIMIT k``,
even for a tenant of a few hundred rows of 100,000 (measured, pgvector 0.8): the scan then
visits candidates until its memory budget runs out and returns fewer than k rows, or the wrong
ones. So the store chooses, as Qdrant's query planner does:

1. **Size** the table (the planner's estimate of all its rows) and the filter (its row estimate,
   ``EXPLAIN``, no row read; with an index on the tenant expression it has that expression's
   statistics), each kept for :data:`ESTIMATE_SECONDS` so a caller's next queries skip them.
   The table's size sets the line (``llama_jev.stores.postgres.cost``: 3,000 rows up to 100,000,
   11,943 at 1,000,000, at most 20,000).
2. **Selective** (an estimate at most twice the line, or a blind estimate on a small table):
   read the admitted rows through the indexes, at most the line + 1 of them, in a
   ``MATERIALIZED`` CTE the HNSW index cannot serve, and rank them exactly. The CTE counts them
   too: when it held at most the line, its top k is the answer (the exact filtered top k), and
   the count, not a statistic, decided.
3. **Broad** (a larger estimate, or more rows than the line after all): HNSW with pgvector
   0.8's iterative scan in ``relaxed_order`` (set for this transaction only), ``ef_search`` and
   a window of ``2 k`` rows (at least 20) re-sorted exactly (``distance + 0``: on
   PostgreSQL 17+ a plain ``ORDER BY distance`` over the CTE plans no Sort). A walk shorter than
   ``k`` stopped on its budget: the admitted rows are ranked exactly instead (up to 20,000), and
   :attr:`Plan.complete` says whether the answer holds every admitted row.

Measured at 100,000 clustered 384-d rows (docs/stores-and-pushdown.md): the HNSW path alone
(``ef_search`` 100) reached recall@10 0.98 / 0.99 at 50 % / 5 % readable but 0.94 at 0.5 % (117 ms)
and 0.92 at 0.05 % (1.2 s); at 1,000,000 128-d rows (issue 40) the exact path costs about 5 us a
row and HNSW at 0.5-1 % gave recall 0.81-0.89.

The logic is written once, as a generator that yields statements and receives their rows, so
the sync (psycopg2) and async (asyncpg) paths run the same plan (:func:`run_sync`,
:func:`run_async`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Index, func, literal, select
from sqlalchemy.dialects.postgresql import TEXT
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement, ColumnElement
from sqlalchemy.sql.expression import Executable
from sqlalchemy.sql.visitors import InternalTraversal

from llama_jev.acl.rules import MetadataAcl
from llama_jev.stores.postgres import cost

__all__ = [
    "ESTIMATE_GATE",
    "ESTIMATE_SECONDS",
    "Estimates",
    "EXACT_ROWS",
    "EF_SEARCH",
    "WINDOW",
    "Plan",
    "Steps",
    "TABLE_KEY",
    "acl_indexes",
    "estimate_key",
    "plan_dense",
    "settings",
    "window",
    "run_async",
    "run_sync",
]

EXACT_ROWS = cost.EXACT_ROWS
"""The most admitted rows ranked exactly on a small table (``cost.exact_rows`` grows it with the table)."""

ESTIMATE_GATE = cost.GATE_FACTOR * EXACT_ROWS
"""On a small table, a planner estimate above this goes to HNSW without reading a row; at or below it
the exact path reads at most ``EXACT_ROWS + 1`` rows and its count has the last word."""

EF_SEARCH = cost.EF_SEARCH
WINDOW = cost.WINDOW
window = cost.window

# pgvector's settings for the HNSW path, set for the query's transaction only (set_config(..., true))
# before either path runs: the exact path's CTE has no ORDER BY for the HNSW index to serve, so they
# do not touch it. ef_search and max_scan_tuples follow the table's size: set before the walk.
ITERATIVE_SETTINGS = {
    "hnsw.iterative_scan": "relaxed_order",
    # The index keeps visiting candidates until max_scan_tuples or its memory budget
    # (scan_mem_multiplier x work_mem): the budget, not the tuples, stopped the scan (DESIGN.md Part 5).
    "hnsw.scan_mem_multiplier": "4",
}
_PLAN_SETTINGS = {
    # A prepared statement (asyncpg) must not get a generic plan: the tenant index serves a tenant value.
    "plan_cache_mode": "force_custom_plan",
    # Over the line a scan of the whole table and a sort is what the HNSW path avoids.
    "enable_seqscan": "off",
}
TABLE_KEY = ("llama_jev:table rows",)
"""The key of the whole table's estimate in :class:`Estimates` (no filter's key has this shape)."""
_OVER = 2**62  # remembered for a filter counted over the line: the next queries go straight to HNSW

Rows = Sequence[Any]
Steps = Generator[Executable, Rows, "Plan"]


@dataclass(frozen=True)
class Plan:
    """What one query did: ``rows`` (``id``, ``node_id``, ``text``, ``metadata_``, ``distance``), and how."""

    rows: list[Any]
    path: str
    """``"exact"`` (the admitted rows ranked exactly) or ``"hnsw"`` (the index, iterative scan)."""
    estimate: int
    """The planner's estimate of the admitted rows (or a count remembered from an earlier query)."""
    admitted: int | None
    """The admitted rows counted by the exact path (``limit + 1`` means "more"); ``None`` when it did not run."""
    complete: bool = True
    """Whether an answer shorter than ``k`` holds every admitted row (an exact read); ``False``: a walk
    stopped by its budget, the store may hold more."""
    limit: int = EXACT_ROWS
    """The most admitted rows this table's size lets the exact path rank (:func:`cost.exact_rows`)."""
    table_rows: int = 0
    """The planner's estimate of the whole table's rows."""
    blind: bool = False
    """Whether the estimate rested on no index (:func:`cost.blind`)."""

    @property
    def known(self) -> int:
        """What the next query of the same filter routes by: the count when one was taken, else the estimate."""
        if self.admitted is None:
            return self.estimate
        return self.admitted if self.admitted <= self.limit else _OVER


class _Explain(Executable, ClauseElement):
    """``EXPLAIN (FORMAT JSON) <select>``, its values bound as the select's are (the recipe of SQLAlchemy's wiki)."""

    inherit_cache = True  # compiled once per statement shape, as the select it wraps
    _traverse_internals = [("statement", InternalTraversal.dp_clauseelement)]  # noqa: RUF012 - SQLAlchemy's
    _all_selected_columns: tuple[Any, ...] = ()  # a cached compile maps the result by these: none

    def __init__(self, statement: Any) -> None:
        self.statement = statement


@compiles(_Explain, "postgresql")
def _compile_explain(element: _Explain, compiler: SQLCompiler, **kw: Any) -> str:
    return "EXPLAIN (FORMAT JSON) " + compiler.process(element.statement, **kw)


def _settings(values: dict[str, str]) -> Executable:
    # set_config(name, value, is_local => true): SET LOCAL with bound values (SET takes none).
    return select(*(func.set_config(literal(name, TEXT), literal(value, TEXT), True) for name, value in values.items()))


def _explained(rows: Rows) -> dict[str, Any]:
    plan = rows[0][0]
    if isinstance(plan, str):  # asyncpg hands json over as text, psycopg2 parsed
        plan = json.loads(plan)
    return typing.cast("dict[str, Any]", plan[0]["Plan"])


def _estimate(rows: Rows) -> int:
    """The largest row estimate of any node of the plan: the tenant index's own, where one is used.

    The top node's estimate multiplies the tenant's (from the index's statistics) by default
    selectivities for the grant checks (a half for the JSON column's ``EXISTS``), which the data
    need not follow; the index scan's estimate is what the planner knows.
    """
    return _largest(_explained(rows))


def _largest(node: dict[str, Any]) -> int:
    children = [child for child in node.get("Plans", ()) if child.get("Parent Relationship") != "SubPlan"]
    return max([int(node.get("Plan Rows", 0)), *(_largest(child) for child in children)])


ESTIMATE_SECONDS = 30.0
"""How long a filter's estimate is reused: a caller's next queries skip the ``EXPLAIN`` (about a
tenth of a broad query's time), and a tenant that grows or shrinks is re-estimated within this."""

_ESTIMATES_KEPT = 4096


class Estimates:
    """The planner's estimates of recent filters, by the filter's SQL and values; thread-safe enough.

    A routing hint only: the exact path counts the admitted rows itself. Keys hold the filter's
    bound values (identity values among them) in this process's memory, never written anywhere.
    """

    def __init__(self) -> None:
        self._known: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable | None) -> int | None:
        if key is None:
            return None
        with self._lock:
            found = self._known.get(key)
            if found is None or time.monotonic() - found[0] > ESTIMATE_SECONDS:
                return None
            self._known.move_to_end(key)
            return found[1]

    def put(self, key: Hashable | None, estimate: int) -> None:
        if key is None:
            return
        with self._lock:
            self._known[key] = (time.monotonic(), estimate)
            self._known.move_to_end(key)
            while len(self._known) > _ESTIMATES_KEPT:
                self._known.popitem(last=False)


def estimate_key(where: ColumnElement[bool]) -> Hashable | None:
    """The filter's statement shape and bound values (``None``: not cacheable, always ``EXPLAIN``)."""
    key = where._generate_cache_key()
    if key is None:
        return None
    return (key.key, tuple(repr(bind.effective_value) for bind in key.bindparams))


def settings(k: int, *, iterative: bool, ef_search: int = 0) -> dict[str, str]:
    """The settings of one planned query, before its path is known: ``iterative`` where pgvector has
    iterative scans (0.8+); ``ef_search`` the caller's floor (the HNSW path sets its own, by the table's size).
    """
    return {
        **_PLAN_SETTINGS,
        **(ITERATIVE_SETTINGS if iterative else {}),
        "hnsw.ef_search": str(min(cost.EF_SEARCH_MAX, max(cost.EF_SEARCH, window(k), ef_search))),
    }


def _walk_settings(k: int, table_rows: int, values: dict[str, str], *, selective: bool) -> dict[str, str]:
    """``ef_search`` (and the tuple budget) of the HNSW walk, by the table's size; the floor in ``values`` kept."""
    floor = int(values.get("hnsw.ef_search", "0"))
    walk = {
        "hnsw.ef_search": str(cost.ef_search(table_rows, k, floor=floor, selective=selective)),
        # The walk is chosen by the plan's cost (too many admitted rows to rank): the planner must not
        # read them all and sort them instead, as it does over a JSONB column whose filter it prices
        # cheap (a 50 % tenant: 50,000 rows sorted at 10**5, measured). Its re-sort of the window is
        # the one Sort every alternative has.
        "enable_sort": "off",
    }
    if "hnsw.iterative_scan" in values:
        walk["hnsw.max_scan_tuples"] = str(cost.MAX_SCAN_TUPLES)  # read here, so a test can tighten it
    return walk


def plan_dense(
    table: Any,
    embedding: Sequence[float],
    k: int,
    where: ColumnElement[bool],
    hnsw_query: Callable[[int], Any],
    *,
    values: dict[str, str],
    exact: bool = True,
    known: int | None = None,
    table_rows: int | None = None,
) -> Steps:
    """The statements of one filtered dense query, in order; yields each, receives its rows.

    ``table`` is the store's table class, ``where`` the filters as one condition (ACL and the
    caller's own), ``hnsw_query(window)`` the stock store's ``SELECT ... ORDER BY distance
    LIMIT window`` under those filters, ``values`` the settings (:func:`settings`).
    ``exact=False`` skips the selective path (a store with a ``customize_query_fn`` must keep
    its own statement). ``known``: a recent estimate (or count) of the same filter, ``table_rows``
    a recent estimate of the whole table (no ``EXPLAIN`` for either then).

    1. the table's size gives the line (:func:`cost.exact_rows`) and the planner's estimate of
       the filter decides whether to try the exact path (at most :func:`cost.gate`; a blind
       estimate on a small table too);
    2. the exact path counts the admitted rows up to the line + 1: at most the line, its top k
       is the answer, complete;
    3. else the HNSW walk (``ef_search`` by the table's size, twice that for a caller
       counted over the line); a walk shorter than ``k`` stopped on its budget: the admitted rows
       are then ranked exactly up to :data:`cost.EXACT_ROWS_MAX` (the filter is evidently
       selective), and only a complete exact read makes the answer complete.
    """
    yield _settings(values)
    if table_rows is None:
        table_rows = _largest(_explained((yield _Explain(select(table.id)))))
    limit = cost.exact_rows(table_rows)
    blind = False
    if known is not None:
        estimate = known
    else:
        explained = _explained((yield _Explain(select(table.id).where(where))))
        estimate, blind = _largest(explained), cost.blind(explained)
    admitted: int | None = None
    tried = estimate <= cost.gate(table_rows) or (blind and table_rows <= cost.BLIND_TABLE_ROWS)
    if exact and tried:
        rows = list((yield _exact(table, embedding, k, where, limit)))
        admitted = int(rows[0].admitted) if rows else 0
        if admitted <= limit:
            return Plan(rows, "exact", estimate, admitted, True, limit, table_rows, blind)
    selective = admitted is not None or estimate == _OVER  # counted over the line: selective, yet too many
    yield _settings(_walk_settings(k, table_rows, values, selective=selective))
    size = window(k)
    rows = list((yield _resorted(hnsw_query(size), k)))
    if len(rows) >= k:
        return Plan(rows, "hnsw", estimate, admitted, True, limit, table_rows, blind)
    # Shorter than k: the walk stopped on its budget, or the filter admits fewer than k rows.
    bound = cost.EXACT_ROWS_MAX
    if not exact or (admitted is not None and limit >= bound):
        return Plan(rows, "hnsw", estimate, admitted, False, limit, table_rows, blind)
    yield _settings({"enable_sort": "on"})
    ranked = list((yield _exact(table, embedding, k, where, bound)))
    counted = int(ranked[0].admitted) if ranked else 0
    if counted <= bound:
        return Plan(ranked, "exact", estimate, counted, True, bound, table_rows, blind)
    return Plan(rows, "hnsw", estimate, admitted, False, limit, table_rows, blind)


def _resorted(window_query: Any, k: int) -> Executable:
    """The first ``k`` of the HNSW window, re-sorted exactly by distance.

    The window is a ``MATERIALIZED`` CTE, read in the iterative scan's loose (``relaxed_order``)
    order. On PostgreSQL 17 and later the planner carries the CTE's ``ORDER BY distance`` up to
    the outer query and plans no Sort for ``ORDER BY distance``: the caller got the scan's order
    (the first k rows it handed over, not the nearest k of the window). Ordering by
    ``distance + 0``, pgvector's own remedy, is an expression the CTE is not sorted by, so the
    Sort node stays (tested with ``EXPLAIN``).
    """
    rows_read = window_query.cte("window").prefix_with("MATERIALIZED")
    return select(rows_read).order_by(rows_read.c.distance + 0).limit(k)


def _exact(
    table: Any, embedding: Sequence[float], k: int, where: ColumnElement[bool], limit: int = EXACT_ROWS
) -> Executable:
    """The admitted rows (at most ``limit + 1``), ranked exactly; each row says how many were admitted.

    The distance is computed in a ``MATERIALIZED`` CTE without ``ORDER BY``: the HNSW index
    cannot serve it, so the rows come through the filters' own indexes (the tenant's B-tree).
    The count is a window over all admitted rows, taken before the ``LIMIT``.
    """
    admitted = (
        select(table.id.label("id"), table.embedding.cosine_distance(embedding).label("distance"))
        .where(where)
        .limit(limit + 1)
        .cte("admitted")
        .prefix_with("MATERIALIZED")
    )
    best = (
        select(admitted.c.id, admitted.c.distance, func.count().over().label("admitted"))
        .order_by(admitted.c.distance, admitted.c.id)
        .limit(k)
        .subquery("best")
    )
    return (
        select(table.id, table.node_id, table.text, table.metadata_, best.c.distance, best.c.admitted)
        .join_from(best, table, table.id == best.c.id)
        .order_by(best.c.distance, best.c.id)
    )


def run_sync(steps: Steps, connection: Any) -> Plan:
    """Run ``steps`` on a sync SQLAlchemy ``Connection`` or ``Session`` (one transaction)."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(connection.execute(statement).all())
    except StopIteration as done:
        return typing.cast(Plan, done.value)


async def run_async(steps: Steps, connection: Any) -> Plan:
    """Run ``steps`` on an ``AsyncConnection`` or ``AsyncSession`` (one transaction)."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send((await connection.execute(statement)).all())
    except StopIteration as done:
        return typing.cast(Plan, done.value)


def acl_indexes(table: Any, acl: MetadataAcl, *, jsonb: bool) -> list[Index]:
    """The indexes the ACL clause of ``llama_jev.stores.postgres.sql`` can use, for ``acl``'s keys.

    - the tenant: a B-tree on ``metadata_ ->> '<tenant_key>'``, the expression the clause
      compares (JSON and JSONB alike); with it, a tenant's rows are read without a table scan
      and the planner has that expression's statistics for its estimate;
    - users and roles: a GIN index on ``metadata_ -> '<key>'`` (``?|``), on a JSONB column only:
      over a JSON column (the store's default) the clause checks the grants on a JSONB copy of
      the row that no index can serve, after the tenant has narrowed the rows down;
    - the public flag: a B-tree on ``metadata_ -> '<public_key>'``, on a JSONB column only. The
      grants are OR-ed: the planner reads a grant list through its GIN index only when every arm
      of the OR has an index, the flag's too (else it reads the whole table).

    Names are ``<table>_acl_<hash of the key>_<kind>``: a key is any text, never put in a name.
    """
    column = table.__table__.c.metadata_
    name = table.__tablename__

    def index_name(key: str, kind: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return f"{name[:40]}_acl_{digest}_{kind}"

    found: list[Index] = []
    if acl.tenant_key is not None:
        found.append(Index(index_name(acl.tenant_key, "btree"), column.op("->>")(literal(acl.tenant_key, TEXT))))
    if jsonb:
        for key in (acl.users_key, acl.roles_key):
            if key is not None:
                found.append(Index(index_name(key, "gin"), column.op("->")(literal(key, TEXT)), postgresql_using="gin"))
        if acl.public_key is not None:
            found.append(Index(index_name(acl.public_key, "flag"), column.op("->")(literal(acl.public_key, TEXT))))
    return found
