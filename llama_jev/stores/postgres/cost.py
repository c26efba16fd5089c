"""What a filtered dense query of ``AclPGVectorStore`` may cost, by the table's size: pure functions, no I/O.

``llama_jev.stores.postgres.plan`` runs the plan; this module says where its lines are. Two paths:

- **exact**: the admitted rows read through the filters' indexes and ranked exactly. It costs
  about :data:`EXACT_US_PER_ROW` per admitted row (measured at 1,000,000 128-d rows: 33-59 ms for
  5,000-10,000 rows), whatever the table's size, and its answer is the exact filtered top k.
- **hnsw**: the HNSW index with pgvector's iterative scan. Under a filter admitting a share ``s``
  of the table the walk visits about ``window / s`` candidates, so it grows slow and lossy as the
  share shrinks, and it loses recall as the table grows (recall@10 without any filter: 0.910 at
  ``ef_search`` 80 on 1,000,000 rows, 0.973 at 400, issue 40).

So the line between them (:func:`exact_rows`) grows with the table: by time alone it would grow
as the square root of the table's size (exact ∝ admitted rows, HNSW ∝ table / admitted); it
grows a little faster (exponent :data:`EXACT_GROWTH`) because the exact path's recall is 1.0
and the HNSW path's falls with the share, and it is capped at :data:`EXACT_ROWS_MAX` rows
(about 100 ms). ``ef_search`` grows with the table too (:func:`ef_search`); the window the walk
re-sorts does not (:func:`window`: measured, a wider one bought no recall).

A caller near the line gets the same answers whichever side statistics put it: the planner's
estimate only decides whether to *try* the exact path (up to :data:`GATE_FACTOR` times the
line); the exact path counts the admitted rows (up to the line + 1) and that count, not a
statistic, decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BLIND_TABLE_ROWS",
    "EF_SEARCH",
    "EF_SEARCH_GROWTH",
    "EF_SEARCH_MAX",
    "EXACT_GROWTH",
    "EXACT_ROWS",
    "EXACT_ROWS_MAX",
    "EXACT_US_PER_ROW",
    "GATE_FACTOR",
    "MAX_SCAN_TUPLES",
    "SMALL_TABLE",
    "WINDOW",
    "blind",
    "ef_search",
    "exact_rows",
    "gate",
    "window",
]

SMALL_TABLE = 100_000
"""Up to this many rows the lines below are those measured at 100,000 rows (0.3's, unchanged)."""

EXACT_ROWS = 3_000
"""The most admitted rows ranked exactly on a table of at most :data:`SMALL_TABLE` rows.

Measured at 100,000 clustered 384-d rows (docs/stores-and-pushdown.md): the exact path costs
15-35 us per admitted row there (the ACL's checks and the vector read), so 3,000 rows stay near
100 ms while every share below 3 % is ranked exactly."""

EXACT_ROWS_MAX = 20_000
"""The most admitted rows ranked exactly on any table: about 100 ms at :data:`EXACT_US_PER_ROW`."""

EXACT_US_PER_ROW = 5.0
"""The exact read's cost per admitted row at 1,000,000 128-d rows (issue 40: 33-59 ms for 5,000-10,000 rows)."""

EXACT_GROWTH = 0.6
""":func:`exact_rows` grows as the table's size to this power from :data:`SMALL_TABLE` on.

0.5 is the break-even by time alone (exact ∝ admitted rows, HNSW ∝ table / admitted rows); 0.6
puts the line at 11,900 rows on 1,000,000, so a 0.5-1 % tenant (5,000-10,000 rows: 33-59 ms
exact, recall 1.0) is ranked exactly where HNSW gave recall 0.81-0.89 in 43-79 ms."""

GATE_FACTOR = 2
"""The exact path is tried while the planner's estimate is at most this many times the line.

An estimate moves with ``ANALYZE``'s sample (a 3 % tenant flipped between paths at 100,000 rows
as autovacuum ran): within this factor the exact path's own count decides, so the answer does
not depend on the statistics of the moment. A count over the line costs one read of line + 1
rows, remembered for ``ESTIMATE_SECONDS``."""

BLIND_TABLE_ROWS = 20_000
"""A filter whose estimate rests on no index (a grant list over the JSON column: the planner
says "half the table") is tried exactly on a table of at most this many rows.

Reading such a filter's rows means reading the whole table (no index serves it): measured at
20,000 rows, 360 ms for a grant of 300 rows over the JSON column on a loaded 2-core machine
(about 18 us a row), 1.4 ms with ``use_jsonb=True`` and its GIN index (whose statistics give the
planner the true count). Past this size, store the metadata as JSONB with the ACL's indexes."""

EF_SEARCH = 80
"""``hnsw.ef_search`` of the HNSW path on a table of at most :data:`SMALL_TABLE` rows.

The smallest value that kept recall@10 at 0.95 or more at 50 % and 5 % readable of 100,000
clustered rows over 100 queries (0.955 / 0.974; 60 gave 0.932 at 50 %, 100 gave 0.962)."""

EF_SEARCH_GROWTH = 0.7
""":func:`ef_search` grows as the table's size to this power: 80 at 100,000 rows, 400 at 1,000,000.

Measured on 1,000,000 128-d rows with no filter (issue 40): recall@10 0.910 at ``ef_search``
80 (2 of 30 queries never reached their own cluster), 0.973 at 400, at no measurable cost."""

EF_SEARCH_MAX = 1_000
"""pgvector refuses more; past it the iterative scan fills the window."""

WINDOW = 20
"""Rows the HNSW path reads (at least ``2 k``) and re-sorts exactly, whatever the table's size.

With ``relaxed_order`` the index hands rows over nearly in order, and every row past k costs the
ACL's checks and a vector read (a window of 100 cost 15 % more at 50 % readable, for no recall).
Nor does a wider window pay on a larger table: at 1,000,000 rows (JSON column, ``ef_search`` 401,
30 queries) a window of 40 gave recall@10 0.980 / 0.983 at 5 % / 3 % readable against 0.980 /
0.980 with 20, at 1.4-2.6x the latency (32 / 58 ms against 21-23 / 22-29 ms); at 100,000 rows a
doubled window for a selective walk, 0.993 both ways at 1.4x the time."""

MAX_SCAN_TUPLES = 40_000
"""``hnsw.max_scan_tuples`` of the HNSW path (pgvector's default is 20,000): the walk's tuple budget.

The memory budget (``scan_mem_multiplier`` x ``work_mem``) usually stops the walk first (DESIGN.md
Part 5). A walk stopped by either comes back shorter than asked: the plan then ranks exactly."""

SELECTIVE_BOOST = 2
"""``ef_search`` of a caller counted over the line (selective, yet too many rows to rank exactly) is
this many times the table's own: such a walk crosses many rows it may not read."""


def _growth(table_rows: int, power: float) -> float:
    return float(max(1.0, max(table_rows, 1) / SMALL_TABLE) ** power)


def exact_rows(table_rows: int) -> int:
    """The most admitted rows ranked exactly on a table of ``table_rows`` rows.

    Example:
        >>> exact_rows(100_000), exact_rows(1_000_000), exact_rows(100_000_000)
        (3000, 11943, 20000)
    """
    return min(EXACT_ROWS_MAX, round(EXACT_ROWS * _growth(table_rows, EXACT_GROWTH)))


def gate(table_rows: int) -> int:
    """The largest planner estimate for which the exact path is tried (its count decides)."""
    return GATE_FACTOR * exact_rows(table_rows)


def ef_search(table_rows: int, k: int, *, floor: int = 0, selective: bool = False) -> int:
    """``hnsw.ef_search`` of the HNSW path: grows with the table, at least the window and ``floor``.

    Example:
        >>> ef_search(50_000, 10), ef_search(1_000_000, 10), ef_search(1_000_000, 10, selective=True)
        (80, 401, 802)
    """
    grown = round(EF_SEARCH * _growth(table_rows, EF_SEARCH_GROWTH)) * (SELECTIVE_BOOST if selective else 1)
    return min(EF_SEARCH_MAX, max(grown, window(k), floor))


def window(k: int) -> int:
    """The rows the HNSW path reads for a top ``k``: at least ``2 k``.

    Example:
        >>> window(10), window(300)
        (20, 600)
    """
    return max(WINDOW, 2 * k)


def blind(plan: Mapping[str, Any]) -> bool:
    """Whether an ``EXPLAIN (FORMAT JSON)`` plan's row estimate rests on no index (default selectivities).

    Over the JSON column a grant list is checked on a JSONB copy of each row, which no index and
    no statistic serves: the planner's estimate is a default share of the table, whatever the
    data hold. A plan that reads an index (the tenant's B-tree, a GIN index on a JSONB column)
    has that index's statistics.
    """
    if "Index" in str(plan.get("Node Type", "")):
        return False
    return all(blind(child) for child in plan.get("Plans", ()) if child.get("Parent Relationship") != "SubPlan")
