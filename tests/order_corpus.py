"""The differential corpus of the query's order: table ``ob`` and the query shapes that
tests/test_order_by.py reads on every engine (see there for how each is checked).

Each shape's ORDER BY ends in a unique column, so the whole query's order is total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow as pa

ROWS = 480
ENGINES = ("duckdb", "postgres", "sqlite", "datafusion", "clickhouse")

#: Stems of ``name``: equal under a case- or accent-insensitive collation, unequal in bytes.
_NAMES = ("b", "B", "a", "A", "é", "E", "z", "Ä", "ab", "AB", "aB", "_")


def order_table() -> pa.Table:
    """``ob``: ``id`` unique; ``sym`` a/b/c; ``ts`` and ``event_ts`` two other permutations of the
    ids; ``k`` ties and NULLs; ``x`` floats with ties, -0.0 and 0.0 and NaN; ``z`` the same without
    NaN; ``name`` text of mixed case and accents with ties; ``y`` = id + 0.5."""
    ids = list(range(ROWS))
    x: list[float] = []
    for i in ids:
        value = float(i * 13 % 17) - 8.0
        x.append(math.nan if i % 19 == 0 else -0.0 if i % 23 == 5 else 0.0 if i % 23 == 6 else value)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "sym": pa.array([["a", "b", "c"][i % 3] for i in ids], pa.string()),
            "ts": pa.array([i * 7 % ROWS for i in ids], pa.int64()),  # 7 and 11 are prime to 960
            "event_ts": pa.array([(ROWS - 1 - i) * 11 % ROWS for i in ids], pa.int64()),
            "k": pa.array([None if i % 11 == 0 else i * 7 % 13 for i in ids], pa.int64()),
            "x": pa.array(x, pa.float64()),
            "z": pa.array([1.5 if math.isnan(v) else v for v in x], pa.float64()),
            "name": pa.array([_NAMES[i % len(_NAMES)] + str(i % 5) for i in ids], pa.string()),
            "y": pa.array([i + 0.5 for i in ids], pa.float64()),
        }
    )


@dataclass(frozen=True)
class Shape:
    """A query and its partition key; ``refused``: the ValueError the loader must raise instead
    (before iterating); ``pieces``: whether the shuffled run must cut its partitions into range
    pieces (the leading terms are result columns)."""

    name: str
    sql: str
    group: str | None = "sym"
    refused: str | None = None
    engines: tuple[str, ...] = ENGINES
    pieces: bool = False
    #: how many rows the whole query returns
    rows: int = ROWS
    #: per engine, the error it raises itself on the loader's queries (an engine limitation)
    errors: dict[str, str] = field(default_factory=dict)
    #: per engine, why its partitions of a ``pieces`` shape are read front to back instead (the
    #: loader's warning must say so)
    streamed: dict[str, str] = field(default_factory=dict)


UNRESOLVED = r"the ORDER BY term {} cannot be resolved against the query's result columns exactly"
#: The loader's reason to read a partition front to back where the engine's comparisons of NaN or
#: -0.0 disagree with its own ORDER BY (DataFusion's, ClickHouse's).
DISAGREES = "do not agree with its own ORDER BY"
FLOAT_DISAGREES = dict.fromkeys(("datafusion", "clickhouse"), DISAGREES)
#: DataFusion's comparisons disagree with its ORDER BY on -0.0 and 0.0 alone; ClickHouse's agree.
ZEROS_DISAGREE = {"datafusion": DISAGREES}
SHAPES = [
    # result columns renamed or swapped: ORDER BY names the result column, not the input's
    Shape(
        "alias-swap",
        "SELECT sym, ts AS ingest_ts, event_ts AS ts, id, y FROM ob ORDER BY sym, ts",
        pieces=True,
    ),
    Shape(
        "alias-swap-desc",
        "SELECT sym, event_ts AS ts, ts AS event_ts, id, y FROM ob ORDER BY ts DESC",
        engines=("duckdb", "postgres", "sqlite", "datafusion"),
        pieces=True,
    ),
    Shape(
        "alias-cycle-clickhouse",
        "SELECT sym, event_ts AS ts, ts AS event_ts, id, y FROM ob ORDER BY ts DESC",
        refused=UNRESOLVED.format("'ts'") + ": ClickHouse substitutes aliases",
        engines=("clickhouse",),
    ),
    Shape("alias-rename", "SELECT sym, event_ts AS e, id, y FROM ob ORDER BY e", pieces=True),
    Shape(
        "alias-swap-whole",
        "SELECT ts AS ingest_ts, event_ts AS ts, id, y FROM ob ORDER BY ts",
        group=None,
        pieces=True,
    ),
    Shape(
        "alias-swap-multi-term",
        "SELECT sym, k AS kk, event_ts AS k, id, y FROM ob ORDER BY kk DESC, k",
        engines=("duckdb", "postgres", "sqlite", "datafusion"),  # ClickHouse: kk would read alias k
        pieces=True,
    ),
    # ordinals and expressions
    Shape(
        "ordinal",
        "SELECT sym, ts AS ingest_ts, event_ts AS ts, id, y FROM ob ORDER BY 1, 3 DESC",
        pieces=True,
    ),
    Shape("expression", "SELECT sym, id, y FROM ob ORDER BY ts % 7, id"),
    Shape("expression-over-result", "SELECT sym, k, id, y FROM ob ORDER BY k % 5 DESC, id", pieces=True),
    Shape(
        "qualified-over-result", "SELECT o.sym, o.ts, o.id, o.y FROM ob AS o ORDER BY o.ts DESC", pieces=True
    ),
    Shape(
        "qualified",
        "SELECT o.sym, o.event_ts AS ts, o.id, o.y FROM ob AS o ORDER BY o.ts",
        # DataFusion's planner refuses the carried o.ts next to the alias ts
        errors={
            "datafusion": "qualified field name o.ts and unqualified field name ts which would be ambiguous"
        },
    ),
    # terms the query does not select: carried as hidden columns
    Shape("not-selected", "SELECT sym, id, y FROM ob ORDER BY event_ts"),
    Shape("not-selected-whole", "SELECT id, y FROM ob ORDER BY event_ts DESC", group=None),
    Shape("not-selected-multi-term", "SELECT sym, id, y FROM ob ORDER BY k DESC NULLS LAST, event_ts"),
    Shape("not-selected-after-selected", "SELECT sym, k, id, y FROM ob ORDER BY k, event_ts DESC"),
    # direction and NULL placement, explicit and implicit; several terms
    Shape("nulls-implicit", "SELECT sym, k, id, y FROM ob ORDER BY k, id", pieces=True),
    Shape("nulls-desc-implicit", "SELECT sym, k, id, y FROM ob ORDER BY k DESC, id", pieces=True),
    Shape("nulls-first", "SELECT sym, k, id, y FROM ob ORDER BY k NULLS FIRST, id", pieces=True),
    Shape("nulls-desc-last", "SELECT sym, k, id, y FROM ob ORDER BY k DESC NULLS LAST, id", pieces=True),
    Shape("multi-term", "SELECT sym, k, ts, id, y FROM ob ORDER BY k DESC, ts", pieces=True),
    Shape(
        "multi-term-whole",
        "SELECT k, event_ts AS ts, id, y FROM ob ORDER BY k, ts DESC",
        group=None,
        pieces=True,
    ),
    Shape(
        "multi-term-three",
        "SELECT sym, k, z, id, y FROM ob ORDER BY k NULLS FIRST, z DESC, id",
        pieces=True,
        streamed=ZEROS_DISAGREE,
    ),
    # float keys with NaN, -0.0 and 0.0 (SQLite stores NaN as NULL); z: ±0 and no NaN
    Shape(
        "float-nan-zero", "SELECT sym, x, id, y FROM ob ORDER BY x, id", pieces=True, streamed=FLOAT_DISAGREES
    ),
    Shape(
        "float-nan-zero-desc",
        "SELECT sym, x, id, y FROM ob ORDER BY x DESC, id",
        pieces=True,
        streamed=FLOAT_DISAGREES,
    ),
    Shape(
        "float-nan-zero-whole",
        "SELECT x, id, y FROM ob ORDER BY x DESC NULLS LAST, id",
        group=None,
        pieces=True,
        streamed=FLOAT_DISAGREES,
    ),
    Shape(
        "float-signed-zeros",
        "SELECT sym, z, id, y FROM ob ORDER BY z, id",
        pieces=True,
        streamed=ZEROS_DISAGREE,
    ),
    Shape(
        "float-then-int",
        "SELECT sym, z, k, id, y FROM ob ORDER BY z DESC, k, id",
        pieces=True,
        streamed=ZEROS_DISAGREE,
    ),
    # the query's own shape: LIMIT and OFFSET, CTEs, subqueries, DISTINCT, window functions, CASE,
    # text keys (DataFusion's string_view), the partition key among the ORDER BY terms
    Shape("limit", "SELECT sym, ts, id, y FROM ob ORDER BY ts LIMIT 300", pieces=True, rows=300),
    Shape(
        "limit-offset-not-selected",
        "SELECT sym, id, y FROM ob ORDER BY event_ts DESC LIMIT 300 OFFSET 50",
        rows=300,
    ),
    Shape(
        "cte",
        "WITH s AS (SELECT sym, event_ts AS ts, id, y FROM ob) SELECT sym, ts, id, y FROM s ORDER BY ts DESC",
        pieces=True,
    ),
    Shape(
        "subquery-alias-swap",
        "SELECT * FROM (SELECT sym, ts AS ingest_ts, event_ts AS ts, id, y FROM ob) AS q ORDER BY ts",
        pieces=True,
    ),
    Shape("distinct", "SELECT DISTINCT sym, ts, id, y FROM ob ORDER BY ts", pieces=True),
    Shape(
        "window-function",
        "SELECT sym, id, y, LAG(id) OVER (ORDER BY ts) AS prev FROM ob ORDER BY prev NULLS FIRST, id",
        pieces=True,
    ),
    Shape(
        "case",
        "SELECT sym, id, y, CASE WHEN k IS NULL THEN -1 ELSE k END AS kk FROM ob ORDER BY kk DESC, id",
        pieces=True,
    ),
    Shape(
        "text-key",
        "SELECT sym, CAST(event_ts AS VARCHAR) AS e, id, y FROM ob ORDER BY e DESC, id",
        pieces=True,
    ),
    Shape(
        "group-by",
        "SELECT sym, k, COUNT(*) AS n, MIN(id) AS id, MIN(y) AS y FROM ob GROUP BY sym, k ORDER BY n DESC, k",
        rows=42,
    ),
    Shape(
        "group-by-aggregates-not-selected",
        "SELECT sym, k, MIN(id) AS id, MIN(y) AS y FROM ob GROUP BY sym, k ORDER BY COUNT(*) DESC, MAX(ts)",
        rows=42,
    ),
    Shape(
        "group-by-alias-swap",
        "SELECT sym, MIN(ts) AS k, k AS kk, MIN(id) AS id, MIN(y) AS y FROM ob GROUP BY sym, k "
        "ORDER BY k DESC",
        rows=42,
        engines=("duckdb", "postgres", "sqlite", "datafusion"),  # ClickHouse refuses the query
    ),
    Shape(
        "text-mixed-case",
        "SELECT sym, name, id, y FROM ob ORDER BY name DESC, id",
        pieces=True,
    ),
    # collations: the engine's comparisons of the pieces' bounds follow the term's collation
    Shape(
        "collate-c",
        'SELECT sym, name, id, y FROM ob ORDER BY name COLLATE "C" DESC, id',
        engines=("postgres",),
        pieces=True,
    ),
    Shape(
        "collate-nocase",
        "SELECT sym, name, id, y FROM ob ORDER BY name COLLATE NOCASE, id",
        engines=("duckdb", "sqlite"),
        pieces=True,
    ),
    Shape("lower", "SELECT sym, name, id, y FROM ob ORDER BY LOWER(name) DESC, id", pieces=True),
    Shape("group-key-between-terms", "SELECT sym, k, id, y FROM ob ORDER BY k, sym, id", pieces=True),
    Shape("group-key-descending", "SELECT sym, ts, id, y FROM ob ORDER BY sym DESC, ts", pieces=True),
    # refused by name
    Shape(
        "alias-inside-expression",
        "SELECT sym, event_ts AS ts, id, y FROM ob ORDER BY ts % 7, id",
        refused=UNRESOLVED.format("'ts % 7'") + r": it reads 'ts', which is both",
    ),
    Shape(
        "union-expression",
        "SELECT sym, id, y FROM ob UNION ALL SELECT sym, id + 1000, y FROM ob ORDER BY id + 1",
        refused=UNRESOLVED.format("'id \\+ 1'") + ": a set operation is ordered by its result columns only",
        engines=("duckdb", "datafusion"),  # PostgreSQL and SQLite refuse the query itself
    ),
]
