"""Differential corpus: every query shape run whole and split, compared row by row, per engine.

For each shape the loader builds its plan; every partition's subquery is fetched the way the
loader fetches it (the backend's cursor, with the plan's parameters). The reference is the
engine itself: the whole query, plus a reference query giving each of its rows the key values
(``_g``, ``_r``: the key expressions over the query's result, which is what a partition key
means). Then, per key value:

- the partition holds exactly the whole query's rows with that key (same values);
- in the whole query's order. The corpus orders are total (every ORDER BY ends in a unique
  column), except the shapes marked ``ties``: their ORDER BY leaves ties, where the whole
  query's order is itself not unique, so those partitions are compared as the same runs of
  equal sort keys, with the same multiset of rows in each run; shapes without any order
  (a dynamic PIVOT without ORDER BY) are compared as multisets;
- the union of the partitions is the whole query's rows with non-NULL keys, and each
  partition's planned row count is its fetched row count.

A shape that cannot be split exactly must be refused with a ValueError naming the construct.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import re
import sqlite3
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pgserver
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader
from ddbloader._sql.fingerprint import strip_hash
from ddbloader._sql.parsing import parse_column_expression
from ddbloader._sql.query import UserQuery
from ddbloader.backends import connect

ROWS = 60


def tick_table() -> pa.Table:
    """``tk``: id unique; sym a/b/c; g 0..3; day 0..3; f a permutation of ids; h NULL every 7th."""
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "sym": pa.array([["a", "b", "c"][i % 3] for i in ids], pa.string()),
            "g": pa.array([i % 4 for i in ids], pa.int32()),
            "day": pa.array([i // 15 for i in ids], pa.int32()),
            "f": pa.array([(i * 37 % 61) * 0.5 for i in ids], pa.float64()),
            "h": pa.array([None if i % 7 == 0 else i % 2 for i in ids], pa.int32()),
            "MixedCase": pa.array([i % 5 for i in ids], pa.int32()),
            "y": pa.array([i + 0.25 for i in ids], pa.float64()),
        }
    )


SQLITE_DDL = (
    "CREATE TABLE tk (id INTEGER, sym TEXT, g INTEGER, day INTEGER, f REAL, h INTEGER, "
    '"MixedCase" INTEGER, y REAL)'
)


@dataclass
class Engine:
    """An engine holding ``tk``: the loader's source, and a cursor of the loader's backend."""

    name: str
    source: Any
    dialect: str
    fetch: Callable[..., pa.Table]


@contextlib.contextmanager
def engine_on(name: str, source: Any) -> Iterator[Engine]:
    backend = connect(source)
    cursor = backend.cursor()
    try:
        yield Engine(name, source, backend.dialect, lambda sql, params=(): cursor.fetch(sql, params))
    finally:
        cursor.close()
        backend.close()


@pytest.fixture(scope="module")
def duck() -> Iterator[Engine]:
    con = duckdb.connect()
    data = tick_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE tk AS SELECT * FROM data")
    with engine_on("duckdb", con) as made:
        yield made
    con.close()


@pytest.fixture(scope="module")
def postgres(pg_server: pgserver.PostgresServer) -> Iterator[Engine]:
    from adbc_driver_postgresql import dbapi

    admin = dbapi.connect(pg_server.uri, autocommit=True)
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS tk")
        cursor.adbc_ingest("tk", tick_table(), mode="create")
    with engine_on("postgres", pg_server.uri) as made:
        yield made
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE tk")
    admin.close()


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = str(tmp_path_factory.mktemp("split") / "split.sqlite")
    admin = sqlite3.connect(path)
    admin.execute(SQLITE_DDL)
    admin.executemany(
        "INSERT INTO tk VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [tuple(r.values()) for r in tick_table().to_pylist()],
    )
    admin.commit()
    admin.close()
    with engine_on("sqlite", functools.partial(sqlite3.connect, path)) as made:
        yield made


@pytest.fixture(scope="module")
def fusion() -> Iterator[Engine]:
    datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
    context = datafusion.SessionContext()
    context.register_record_batches("tk", [tick_table().to_batches()])
    with engine_on("datafusion", context) as made:
        yield made


@pytest.fixture(scope="module")
def clickhouse(chdb_uri: str) -> Iterator[Engine]:
    from adbc_driver_chdb import dbapi

    admin = dbapi.connect(chdb_uri)
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS tk")
        cursor.adbc_ingest("tk", tick_table(), mode="create")
    with engine_on("clickhouse", chdb_uri) as made:
        yield made
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE tk")
    admin.close()


ENGINES = ("duckdb", "postgres", "sqlite")
#: Engines with a row hash: the corpus runs there with verify=True.
VERIFIED = ("duckdb", "postgres", "clickhouse")
#: Engines the corpus's engine-neutral shapes also run on (their own SQL is not in the corpus).
MORE_ENGINES = ("datafusion", "clickhouse")
#: ClickHouse takes UNION only with DISTINCT or ALL (by default: union_default_mode is empty).
CLICKHOUSE_BARE_UNION = r"sql does not parse as clickhouse SQL: Expected DISTINCT or ALL for Union"
#: Refused on ClickHouse: its ORDER BY after UNION ALL (INTERSECT, EXCEPT) sorts the last branch
#: only, where every other engine (and a reader) sorts the whole result.
CLICKHOUSE_UNION_ORDER_REFUSED = (
    r"sql ends its (UNION|INTERSECT|EXCEPT) with ORDER BY \('ORDER BY 1(, 2)?'\), which ClickHouse applies"
)
CLICKHOUSE_UNION_ORDER = frozenset(
    {
        "union-all",
        "union-all-key-not-selected",
        "union-all-constant-key",
        "union-all-renamed-positions",
        "union-all-second-branch-alias",
        "intersect",
        "except",
    }
)
#: ClickHouse names a joined table's column after its table (b.y, b.g) where the other has one too.
CLICKHOUSE_JOINED_NAME = r"target_col names 'y', which is not a column of the query; .*'b\.y'"


def engine_named(request: pytest.FixtureRequest, name: str) -> Engine:
    fixture = {
        "duckdb": "duck",
        "postgres": "postgres",
        "sqlite": "lite",
        "datafusion": "fusion",
        "clickhouse": "clickhouse",
    }[name]
    made: Engine = request.getfixturevalue(fixture)
    return made


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Engine:
    return engine_named(request, request.param)


@dataclass(frozen=True)
class Shape:
    """One query shape and what splitting it must give.

    ``refused``: per engine (or ``"*"``), a regex the ValueError must match; ``ties``: the
    result columns of an ORDER BY that leaves ties (``()``: no order at all).
    """

    name: str
    sql: str
    group: str | None = None
    repartition: str | None = None
    engines: tuple[str, ...] = ENGINES
    refused: dict[str, str] = field(default_factory=dict)
    ties: tuple[str, ...] | None = None
    target: str = "y"


def refusal(name: str, sql: str, key: str, message: str) -> Shape:
    """A shape every engine must refuse with a ValueError matching ``message``."""
    return Shape(name, sql, key, refused={"*": message})


NOT_SELECTED = r"is not one of its result columns; select it"
SHAPES = [
    # --- injected: the predicate goes into the WHERE ---------------------------------------------
    Shape("plain", "SELECT id, sym, g, y FROM tk ORDER BY id", "g"),
    Shape("plain-two-keys-desc", "SELECT id, g, day, y FROM tk ORDER BY y DESC", "g", "day"),
    Shape(
        "key-not-selected",
        "SELECT id, y FROM tk ORDER BY id",
        "g",
        refused={"*": NOT_SELECTED},
    ),
    Shape(
        "keys-not-selected-two",
        "SELECT id, y FROM tk WHERE f < 20 ORDER BY f",
        "g",
        "day",
        refused={"*": NOT_SELECTED},
    ),
    Shape(
        "key-or-with-user-or",
        "SELECT id, g, day, y FROM tk WHERE f < 10 OR f > 25 ORDER BY id",
        "g = 1 OR day = 2",
    ),
    Shape("key-and", "SELECT id, g, day, y FROM tk ORDER BY id", "g = 1 AND day > 1"),
    Shape(
        "key-case",
        "SELECT id, f, y FROM tk ORDER BY id",
        "CASE WHEN f < 10 THEN 'low' WHEN f < 20 THEN 'mid' ELSE 'high' END",
    ),
    Shape("key-cast", "SELECT id, f, y FROM tk ORDER BY id", "CAST(f AS INTEGER) % 3"),
    Shape("key-function", "SELECT id, sym, y FROM tk ORDER BY id", "upper(sym)"),
    Shape("key-coalesce", "SELECT id, h, y FROM tk ORDER BY id", "coalesce(h, -1)"),
    Shape("key-arithmetic", "SELECT id, g, day, y FROM tk ORDER BY id", "g + day", "abs(g - 2)"),
    Shape("key-nullable", "SELECT id, h, g, y FROM tk ORDER BY id", "h", "g"),
    Shape("key-cast-text", "SELECT id, g, y FROM tk ORDER BY id", "CAST(g AS TEXT)"),
    Shape("quoted-mixed-case", 'SELECT id, "MixedCase", y FROM tk ORDER BY id', '"MixedCase"'),
    Shape(
        "quoted-mixed-case-not-selected",
        "SELECT id, y FROM tk ORDER BY id DESC",
        '"MixedCase"',
        refused={"*": NOT_SELECTED},
    ),
    Shape("cte", "WITH c AS (SELECT * FROM tk WHERE f > 5) SELECT id, g, y FROM c ORDER BY id", "g"),
    Shape(
        "cte-key-not-selected",
        "WITH c AS (SELECT * FROM tk WHERE f > 5) SELECT id, y FROM c ORDER BY y DESC",
        "day",
        refused={"*": NOT_SELECTED},
    ),
    Shape(
        "subquery-in-from",
        "SELECT s.id, s.g, s.y FROM (SELECT * FROM tk WHERE h IS NOT NULL) AS s ORDER BY s.id",
        "g",
    ),
    Shape(
        "limit-inside-subquery",
        "SELECT id, g, y FROM (SELECT * FROM tk ORDER BY f DESC, id LIMIT 25) AS s ORDER BY id",
        "g",
    ),
    Shape(
        "window-inside-subquery",
        "SELECT * FROM (SELECT id, g, f - lag(f) OVER (ORDER BY id) AS y FROM tk) AS s "
        "WHERE y IS NOT NULL ORDER BY id",
        "g",
    ),
    Shape(
        "union-all",
        "SELECT id, g, y FROM tk WHERE id < 30 "
        "UNION ALL SELECT id + 100, g, y * 2 FROM tk WHERE id % 3 = 0 ORDER BY 1",
        "g",
    ),
    Shape(
        "union-all-key-not-selected",
        "SELECT id, y FROM tk WHERE id < 30 UNION ALL SELECT id + 100, y FROM tk ORDER BY 1",
        "g",
        refused={"*": NOT_SELECTED},
    ),
    Shape(
        "join-qualified-key",
        "SELECT a.id, b.y FROM tk AS a JOIN tk AS b ON a.id = b.id + 1 ORDER BY a.id",
        "a.g",
        refused={"*": NOT_SELECTED},
    ),
    Shape(
        "group-by-keys",
        "SELECT g, day, count(*) AS n, sum(y) AS y FROM tk GROUP BY g, day ORDER BY g, day",
        "g",
        "day",
    ),
    Shape(
        "group-by-key-not-selected",
        "SELECT day, sum(y) AS y FROM tk GROUP BY day, g ORDER BY day, y",
        "g",
        refused={"*": NOT_SELECTED},
    ),
    Shape(
        "group-by-having",
        "SELECT g, sym, count(*) AS n, avg(y) AS y FROM tk GROUP BY g, sym "
        "HAVING count(*) > 4 ORDER BY g, sym",
        "g",
    ),
    Shape("group-by-key-function", "SELECT sym, sum(y) AS y FROM tk GROUP BY sym ORDER BY sym", "upper(sym)"),
    Shape("group-by-key-expression", "SELECT day, sum(y) AS y FROM tk GROUP BY day ORDER BY day", "day % 2"),
    Shape(
        "group-by-quoted",
        'SELECT "MixedCase", sum(y) AS y FROM tk GROUP BY "MixedCase" ORDER BY 1',
        '"MixedCase"',
    ),
    Shape(
        "window-partitioned-by-key",
        "SELECT id, g, y - lag(y) OVER (PARTITION BY g ORDER BY id) AS y FROM tk ORDER BY id",
        "g",
    ),
    Shape(
        "cte-aggregate",
        "WITH s AS (SELECT g, day, sum(y) AS y FROM tk GROUP BY g, day) SELECT * FROM s ORDER BY y",
        "g",
    ),
    # --- wrapped: the query runs whole and its result is filtered ------------------------------
    Shape(
        "window-not-partitioned-by-repartition",
        "SELECT id, g, day, y - lag(y) OVER (PARTITION BY g ORDER BY id) AS y FROM tk ORDER BY id",
        "g",
        "day",
    ),
    Shape("window-lag-over-all", "SELECT id, g, f - lag(f) OVER (ORDER BY id) AS y FROM tk ORDER BY id", "g"),
    Shape(
        "window-running-sum-key-or",
        "SELECT id, g, sum(f) OVER (ORDER BY id) AS y FROM tk ORDER BY id DESC",
        "g = 1 OR g = 2",
    ),
    Shape(
        "window-order-not-selected",
        "SELECT g, f - lag(f) OVER (ORDER BY id) AS y FROM tk ORDER BY id",
        "g",
    ),
    Shape(
        "window-named-ordinal-order",
        "SELECT id, g, rank() OVER (PARTITION BY day ORDER BY f) AS y FROM tk ORDER BY 2, 1",
        "g",
    ),
    Shape(
        "distinct",
        "SELECT DISTINCT g, day, CAST(day * 10 + g AS DOUBLE PRECISION) AS y FROM tk ORDER BY g, day",
        "g",
    ),
    Shape("limit", "SELECT id, g, f, y FROM tk ORDER BY f DESC, id LIMIT 20", "g"),
    Shape("limit-offset", "SELECT id, g, day, y FROM tk ORDER BY id LIMIT 30 OFFSET 10", "g", "day % 2 = 0"),
    Shape(
        "union-distinct",
        "SELECT g, day, 1.0 AS y FROM tk UNION SELECT g, day + 1, 2.0 FROM tk ORDER BY 1, 2, 3",
        "g",
        refused={"clickhouse": CLICKHOUSE_BARE_UNION},
    ),
    Shape(
        "intersect",
        "SELECT g, day, 1.0 AS y FROM tk WHERE id < 40 "
        "INTERSECT SELECT g, day, 1.0 FROM tk WHERE id > 20 ORDER BY 1, 2",
        "day",
    ),
    Shape(
        "except",
        "SELECT g, day, 1.0 AS y FROM tk "
        "EXCEPT SELECT g, day, 1.0 FROM tk WHERE sym = 'a' AND g = 1 ORDER BY 1, 2",
        "g",
    ),
    Shape(
        "aggregate-whole-query-grouped-by-other",
        "SELECT sym, g, max(y) AS y FROM tk GROUP BY GROUPING SETS ((sym, g), (g)) "
        "ORDER BY g, sym NULLS LAST",
        "g",
        engines=("duckdb", "postgres"),
    ),
    # --- ties and NULL ordering ------------------------------------------------------------------
    Shape("ties-nulls-first", "SELECT id, g, h, y FROM tk ORDER BY h NULLS FIRST, g", "g", ties=("h", "g")),
    Shape(
        "ties-nulls-last-desc", "SELECT id, h, day, y FROM tk ORDER BY h DESC NULLS LAST", "day", ties=("h",)
    ),
    Shape("nulls-last-total", "SELECT id, h, day, y FROM tk ORDER BY h DESC NULLS LAST, id", "day", "h"),
    Shape("order-by-expression", "SELECT id, g, y FROM tk ORDER BY g * 100 - id", "g"),
    Shape(
        "ties-wrapped",
        "SELECT id, g, day, y - lag(y) OVER (PARTITION BY g ORDER BY id) AS y FROM tk ORDER BY day",
        "g",
        "day",
        ties=("day",),
    ),
    # --- refused: the key is not a result column of a query that must be wrapped ----------------
    Shape(
        "refused-window",
        "SELECT id, y - lag(y) OVER (ORDER BY id) AS y FROM tk ORDER BY id",
        "g",
        refused={"*": NOT_SELECTED},
    ),
    refusal(
        "refused-aggregate",
        "SELECT count(*) AS n, sum(y) AS y FROM tk",
        "g",
        NOT_SELECTED,
    ),
    refusal(
        "refused-group-by-other",
        "SELECT day, sum(y) AS y FROM tk GROUP BY day ORDER BY day",
        "g",
        NOT_SELECTED,
    ),
    refusal(
        "refused-distinct",
        "SELECT DISTINCT day, 1.0 AS y FROM tk",
        "g",
        NOT_SELECTED,
    ),
    refusal(
        "refused-limit",
        "SELECT id, y FROM tk ORDER BY id LIMIT 5",
        "g",
        NOT_SELECTED,
    ),
    dataclasses.replace(
        refusal("refused-union", "SELECT id, y FROM tk UNION SELECT id, y FROM tk", "g", NOT_SELECTED),
        refused={"*": NOT_SELECTED, "clickhouse": CLICKHOUSE_BARE_UNION},
    ),
    refusal(
        "refused-qualified-key",
        "SELECT id, g, y FROM tk ORDER BY id LIMIT 10",
        "tk.g",
        r"'tk\.g' is not one of its result columns",
    ),
    refusal(
        "refused-qualified-join-key",
        "SELECT a.id, a.g, b.y FROM tk AS a JOIN tk AS b ON a.id = b.id",
        "a.g",
        NOT_SELECTED,
    ),
    refusal(
        "refused-ordered-by-expression-of-unselected",
        "SELECT id, y FROM tk ORDER BY id",
        "g % 2",
        NOT_SELECTED,
    ),
    # --- the key is the result column: shapes where the FROM has another column of its name -----
    Shape("alias-redefines-key", "SELECT id, g + 1 AS g, y FROM tk ORDER BY id", "g"),
    Shape("alias-renames-column", "SELECT id, day AS g, y FROM tk ORDER BY id", "g"),
    Shape("alias-swaps-columns", "SELECT id, g AS day, day AS g, y FROM tk ORDER BY id", "g", "day"),
    Shape("alias-shadows-in-expression", "SELECT id, sym AS g, y FROM tk ORDER BY id", "upper(g)"),
    Shape(
        "union-all-constant-key",
        "SELECT id, sym AS g, y FROM tk WHERE id < 30 "
        "UNION ALL SELECT id + 100, 'archive' AS g, y FROM tk WHERE id % 3 = 0 ORDER BY 1",
        "g",
    ),
    Shape(
        "union-all-renamed-positions",
        "SELECT id, g, day, y FROM tk WHERE id < 30 "
        "UNION ALL SELECT id + 100, day, g, y FROM tk WHERE id >= 30 ORDER BY 1",
        "g",
        "day",
    ),
    Shape(
        "union-all-second-branch-alias",
        "SELECT id, g, y FROM tk WHERE id < 20 UNION ALL SELECT id + 100, day AS g, y FROM tk ORDER BY 1",
        "g",
    ),
    Shape(
        "self-join",
        "SELECT a.id, a.g, b.g AS g2, b.y FROM tk AS a JOIN tk AS b ON a.id = b.id + 1 ORDER BY a.id",
        "g2",
        "g",
        refused={"clickhouse": CLICKHOUSE_JOINED_NAME},
    ),
    Shape(
        "qualified-window-other-table",
        "SELECT o.id, o.g, o.y - lag(o.y) OVER (PARTITION BY c.g ORDER BY o.id) AS y "
        "FROM tk AS o JOIN tk AS c ON c.id = (o.id * 7) % 60 ORDER BY o.id",
        "g",
    ),
    Shape(
        "qualified-group-by-other-table",
        "SELECT b.g, a.day, count(*) AS n, sum(a.y) AS y FROM tk AS a JOIN tk AS b "
        "ON b.id = (a.id * 7) % 60 GROUP BY b.g, a.day ORDER BY b.g, a.day",
        "g",
        "day",
        refused={"clickhouse": NOT_SELECTED},
    ),
    Shape(
        "order-by-qualified-expression", "SELECT s.id, s.g, s.y FROM tk AS s ORDER BY s.g * 100 - s.id", "g"
    ),
    Shape(
        "order-by-unselected-column",
        "SELECT g, y FROM tk ORDER BY id DESC",
        "g",
    ),
    Shape(
        "order-by-alias-shadowed-in-expression",
        "SELECT id, g + 1 AS g, y FROM tk ORDER BY g * 100 - id",
        "g",
        refused={
            "*": r"ORDER BY term 'g \* 100 - id' .*it reads 'g', which is both a column of the query's input"
        },
    ),
    # --- DuckDB only -------------------------------------------------------------------------------
    Shape(
        "qualify-partitioned-by-key",
        "SELECT id, g, y FROM tk QUALIFY row_number() OVER (PARTITION BY g ORDER BY id) <= 5 ORDER BY id",
        "g",
        engines=("duckdb",),
    ),
    Shape(
        "qualify-other-partition",
        "SELECT id, g, y FROM tk QUALIFY row_number() OVER (PARTITION BY sym ORDER BY f) <= 4 ORDER BY id",
        "g",
        engines=("duckdb",),
    ),
    Shape(
        "refused-qualify",
        "SELECT id, y FROM tk QUALIFY row_number() OVER (PARTITION BY sym ORDER BY f) <= 4 ORDER BY id",
        "g",
        engines=("duckdb",),
        refused={"duckdb": NOT_SELECTED},
    ),
    Shape(
        "pivot-order-by",
        "PIVOT tk ON sym IN ('a', 'b', 'c') USING sum(y) GROUP BY g, day ORDER BY g, day",
        "g",
        "day",
        engines=("duckdb",),
        target="a",
    ),
    Shape(
        "pivot-order-by-limit",
        "PIVOT tk ON sym IN ('a', 'b') USING sum(y) GROUP BY g, day ORDER BY g DESC, day LIMIT 6",
        "day",
        engines=("duckdb",),
        target="a",
    ),
    Shape(
        "pivot-dynamic-unordered",
        "PIVOT tk ON sym USING sum(y) GROUP BY g, day",
        "g",
        engines=("duckdb",),
        ties=(),
        target="a",
    ),
    Shape(
        "refused-pivot-not-grouped-by-key",
        "PIVOT tk ON sym IN ('a', 'b') USING sum(y) GROUP BY day ORDER BY day",
        "g",
        engines=("duckdb",),
        refused={"duckdb": NOT_SELECTED},
        target="a",
    ),
    Shape(
        "unnest",
        "SELECT id, g, unnest([y, y + 1]) AS y FROM tk ORDER BY id, y",
        "g",
        engines=("duckdb",),
    ),
    Shape(
        "refused-unnest",
        "SELECT id, unnest([y, y + 1]) AS y FROM tk ORDER BY id, y",
        "g",
        engines=("duckdb",),
        refused={"duckdb": NOT_SELECTED},
    ),
    Shape(
        "star-replace-key",
        "SELECT * REPLACE (substr(sym, 1, 1) || 'x' AS sym) FROM tk ORDER BY id",
        "sym",
        engines=("duckdb",),
    ),
    Shape(
        "star-replace-key-by-other-column",
        "SELECT * REPLACE (day AS g) FROM tk ORDER BY id",
        "g",
        engines=("duckdb",),
    ),
    Shape(
        "star-rename-key",
        "SELECT * RENAME (day AS dd, g AS day) FROM tk ORDER BY id",
        "day",
        engines=("duckdb",),
    ),
    Shape(
        "star-exclude",
        "SELECT * EXCLUDE (f) FROM tk ORDER BY id",
        "sym",
        "day",
        engines=("duckdb",),
    ),
    Shape(
        "group-by-all",
        "SELECT g, day, sum(y) AS y FROM tk GROUP BY ALL ORDER BY ALL",
        "g",
        engines=("duckdb",),
    ),
    # --- PostgreSQL only ----------------------------------------------------------------------------
    Shape(
        "generate-series",
        "SELECT id, g, generate_series(1, 2) * y AS y FROM tk ORDER BY id, y",
        "g",
        engines=("postgres",),
    ),
]


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in table.to_pylist()]


def _value(v: Any) -> Any:
    """A key value compared across queries: booleans and their SQLite 0/1 alike, floats exactly."""
    return int(v) if isinstance(v, bool) else v


def _reference_sql(shape: Shape) -> str:
    keys = ", ".join(f"({k}) AS {a}" for k, a in ((shape.group, "_g"), (shape.repartition, "_r")) if k)
    return f"SELECT _w.*, {keys} FROM ({shape.sql}) AS _w"


def _runs(
    rows: list[tuple[Any, ...]], positions: list[int]
) -> list[tuple[tuple[Any, ...], collections.Counter[Any]]]:
    """Consecutive rows with equal sort keys, as (sort key, multiset of rows)."""
    runs: list[tuple[tuple[Any, ...], collections.Counter[Any]]] = []
    for row in rows:
        key = tuple(row[p] for p in positions)
        if runs and runs[-1][0] == key:
            runs[-1][1][row] += 1
        else:
            runs.append((key, collections.Counter([row])))
    return runs


def check_split(engine: Engine, shape: Shape, **schemes: Any) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Build the plan, fetch every partition, compare with the whole query; return the partitions.

    On the engines with a row hash the loader verifies content (``verify=True``): an epoch runs
    through the real fetch paths (fetch units, partitions), and every partition's hashed subquery
    is checked against its planned fingerprint here too."""
    keys = {"group_col": shape.group, "repartition_col": shape.repartition}
    verify = engine.name in VERIFIED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NULL keys, unmatched values: checked where they matter
        loader = DDBDataLoader(
            engine.source,
            shape.sql,
            target_col=shape.target,
            input_col=[shape.target],
            verify=verify,
            **{k: v for k, v in keys.items() if v is not None},
            **schemes,
        )
        with loader:
            plan = loader.plan
            if verify:
                assert sum(len(x) for x, _ in loader) == plan.samples  # raises on a content mismatch
    whole = engine.fetch(shape.sql)
    names = whole.column_names
    width = len(names)
    reference = _rows(engine.fetch(_reference_sql(shape)))
    assert collections.Counter(r[:width] for r in reference) == collections.Counter(_rows(whole)), shape.name
    keyed: dict[tuple[Any, ...], list[Any]] = collections.defaultdict(list)
    for row in reference:
        keyed[row[:width]].append(tuple(_value(v) for v in row[width:]))
    assert all(len(set(k)) == 1 for k in keyed.values()), (
        "equal rows with different keys: make the shape's rows unique"
    )
    expected: dict[tuple[Any, ...], list[tuple[Any, ...]]] = collections.defaultdict(list)
    for row in _rows(whole):
        key = keyed[row][0]
        if None not in key:
            expected[key].append(row)
    got: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for group in plan.groups:
        for spec in group.partitions:
            key = tuple(_value(v) for v in (spec.group_value, spec.repartition_value) if v is not None)
            if not shape.group or not shape.repartition:
                key = key[:1]
            fetched = engine.fetch(spec.sql, spec.params)
            assert fetched.column_names == names, spec.describe()
            rows = _rows(fetched)
            assert len(rows) == spec.rows, spec.describe()
            assert (spec.fingerprint is not None) == verify, spec.describe()
            if spec.fingerprint is not None:
                hashed, content = strip_hash(engine.fetch(spec.fingerprint.sql, spec.params))
                assert collections.Counter(_rows(hashed)) == collections.Counter(rows), spec.describe()
                assert content == spec.fingerprint.content, spec.describe()
            assert key not in got, f"{key} split twice"
            got[key] = rows
    for group in plan.groups:  # discovered repartitions come in the engine's (here Python's) order
        repartitions = [s.repartition_value for s in group.partitions]
        if shape.repartition and "repartition_scheme" not in schemes and None not in repartitions:
            assert repartitions == sorted(repartitions), (shape.name, group.value)
    if schemes:
        return got
    assert set(got) == set(expected), shape.name
    for key, rows in got.items():
        if shape.ties is None:
            assert rows == expected[key], (shape.name, key)
        elif shape.ties == ():
            assert collections.Counter(rows) == collections.Counter(expected[key]), (shape.name, key)
        else:
            positions = [names.index(c) for c in shape.ties]
            assert _runs(rows, positions) == _runs(expected[key], positions), (shape.name, key)
    return got


# Only the engines whose SQL a shape is written in: a shape in another dialect tests nothing there.
@pytest.mark.parametrize(
    ("engine_name", "shape"),
    [
        pytest.param(e, s, id=f"{e}-{s.name}")
        for s in SHAPES
        for e in s.engines + (MORE_ENGINES if s.engines == ENGINES else ())
    ],
)
def test_split_matches_the_whole_query_or_is_refused(
    request: pytest.FixtureRequest, engine_name: str, shape: Shape
) -> None:
    engine = engine_named(request, engine_name)
    refused = shape.refused.get(engine.name, shape.refused.get("*"))
    if engine.name == "clickhouse" and shape.name in CLICKHOUSE_UNION_ORDER:
        refused = CLICKHOUSE_UNION_ORDER_REFUSED
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            check_split(engine, shape)
        return
    got = check_split(engine, shape)
    assert got, f"{shape.name} gave no partitions: the shape tests nothing"


def test_corpus_size() -> None:
    per_engine = {e: sum(e in s.engines for s in SHAPES) for e in ENGINES}
    assert len(SHAPES) >= 50
    assert per_engine["duckdb"] >= 50
    assert all(n >= 40 for n in per_engine.values()), per_engine


# --- scheme values compared by the engine ---------------------------------------------------------

SCHEME_SQL = "SELECT id, g, y FROM tk ORDER BY id"
SCHEME_VALUES = st.one_of(
    st.integers(-1, 4),
    st.integers(-1, 4).map(str),
    st.integers(0, 4).map(lambda i: f"0{i}"),
    st.integers(-1, 4).map(lambda i: i + 0.5),
    st.integers(-1, 4).map(float),
    st.sampled_from(["x", "", "`1", "2020.01.02"]),
)


def matched_ids(engine: Engine, value: Any) -> list[int] | None:
    """The ids ``g = value`` selects when the engine compares them one value at a time (None: error)."""
    key = parse_column_expression("g", "group_col", engine.dialect)
    sql = UserQuery(SCHEME_SQL, engine.dialect).filtered([key])
    try:
        return [r[0] for r in _rows(engine.fetch(sql, (value,)))]
    except Exception:  # the engine cannot compare the value with the column: the plan must fail too
        return None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheme=st.lists(SCHEME_VALUES, min_size=1, max_size=5, unique=True))
def test_explicit_schemes_count_what_the_engine_compares(engine: Engine, scheme: list[Any]) -> None:
    matched = [matched_ids(engine, v) for v in scheme]
    shape = Shape("scheme", SCHEME_SQL, "g")
    if any(m is None for m in matched):
        with pytest.raises(Exception):  # noqa: B017 -- the engine's own error, whatever its type
            check_split(engine, shape, group_scheme=scheme)
        return
    ids = [set(m or ()) for m in matched]
    equal = [(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids)) if ids[i] & ids[j]]
    if equal:
        with pytest.raises(ValueError, match=r"group_scheme values \[.*\] are equal in SQL"):
            check_split(engine, shape, group_scheme=scheme)
        return
    unmatched = [v for v, m in zip(scheme, matched, strict=True) if not m]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if len(unmatched) == len(scheme):  # a loader that can make no sample is refused
            with pytest.raises(ValueError, match=r"can make no sample: the query \(with its schemes\)"):
                DDBDataLoader(
                    engine.source, SCHEME_SQL, "y", input_col=["y"], group_col="g", group_scheme=scheme
                )
            return
        with DDBDataLoader(
            engine.source, SCHEME_SQL, "y", input_col=["y"], group_col="g", group_scheme=scheme
        ) as loader:
            plan = loader.plan
    messages = [str(w.message) for w in caught]
    assert any(
        m.startswith(f"group_scheme value(s) {unmatched[:10]!r} match no rows") for m in messages
    ) == bool(unmatched), messages
    assert [g.rows for g in plan.groups] == [len(m or ()) for m in matched]
    for group, expected in zip(plan.groups, matched, strict=True):
        got = [r[0] for spec in group.partitions for r in _rows(engine.fetch(spec.sql, spec.params))]
        assert got == expected


# --- regressions: what issue 12 saw ----------------------------------------------------------------


def test_or_key_keeps_the_users_or_filter(duck: Engine) -> None:
    sql = "SELECT id, g, y FROM tk WHERE f < 10 OR f > 25 ORDER BY id"
    with DDBDataLoader(duck.source, sql, "y", input_col=["y"], group_col="g = 1 OR g = 2") as loader:
        rows = [
            r for g in loader.plan.groups for s in g.partitions for r in _rows(duck.fetch(s.sql, s.params))
        ]
    whole = _rows(duck.fetch(sql))
    # Unparenthesised, `... OR f > 25 AND g = 1 OR g = 2 = $1` loaded rows outside the filter, some twice.
    assert sorted(rows) == sorted(whole)
    assert len(rows) == len(whole) == 30


def test_null_rows_keep_the_users_or_filter(duck: Engine) -> None:
    sql = "SELECT id, h, f, y FROM tk WHERE f < 10 OR f > 25"
    nulls = duck.fetch(f"SELECT count(*) AS n FROM ({sql}) AS s WHERE h IS NULL").column("n")[0].as_py()
    assert 0 < nulls < 9  # of 9 NULL h in the table: the user's filter must still apply
    with pytest.warns(UserWarning, match=rf"^{nulls} rows have NULL group_col 'h = 1 OR f > 1000'"):
        DDBDataLoader(duck.source, sql, "y", input_col=["y"], group_col="h = 1 OR f > 1000").close()


def test_lag_over_a_series_is_computed_on_the_whole_series(duck: Engine) -> None:
    # The case: f - lag(f) per symbol, split by symbol and day, gave NaN at each day's start.
    sql = "SELECT sym, day, id, f - lag(f) OVER (PARTITION BY sym ORDER BY id) AS y FROM tk ORDER BY sym, id"
    with DDBDataLoader(
        duck.source, sql, "y", input_col=["y"], group_col="sym", repartition_col="day"
    ) as loader:
        assert len(loader.plan.groups) == 3
        nulls = [
            r[2]
            for g in loader.plan.groups
            for s in g.partitions
            for r in _rows(duck.fetch(s.sql, s.params))
            if r[3] is None
        ]
    assert nulls == [0, 1, 2]  # the first row of each symbol only


@pytest.mark.parametrize(
    ("scheme", "equal"),
    [([0, 1, "1", 2], [1, "1"]), (["0", "1", "01", "2"], ["1", "01"])],
    ids=["int-and-text", "text-with-leading-zero"],
)
def test_sql_equal_scheme_values_are_refused_by_name(
    engine: Engine, scheme: list[Any], equal: list[Any]
) -> None:
    if engine.name == "postgres":  # PostgreSQL does not compare int4 with text: its error instead
        with pytest.raises(Exception, match=r"operator does not exist: integer = text"):
            DDBDataLoader(engine.source, SCHEME_SQL, "y", input_col=["y"], group_col="g", group_scheme=scheme)
        return
    message = re.escape(f"group_scheme values {equal!r} are equal in SQL") + ".*group_col 'g' = 1"
    with pytest.raises(ValueError, match=message):
        DDBDataLoader(engine.source, SCHEME_SQL, "y", input_col=["y"], group_col="g", group_scheme=scheme)


def test_date_and_its_iso_text_are_refused_as_equal(duck: Engine) -> None:
    import datetime

    sql = "SELECT id, DATE '2024-01-01' + CAST(day AS INTEGER) AS d, y FROM tk ORDER BY id"
    scheme = [datetime.date(2024, 1, 2), "2024-01-02"]
    with pytest.raises(
        ValueError, match=r"group_scheme values \[datetime\.date\(2024, 1, 2\), '2024-01-02'\]"
    ):
        DDBDataLoader(duck.source, sql, "y", input_col=["y"], group_col="d", group_scheme=scheme)


@pytest.mark.parametrize("engine_name", ["duckdb", "sqlite"])
def test_nocase_values_are_refused_as_equal(tmp_path: Path, engine_name: str) -> None:
    if engine_name == "duckdb":
        source: Any = duckdb.connect()
        source.execute(
            "CREATE TABLE n AS SELECT i AS id, (['a', 'A', 'b'][i % 3 + 1]) COLLATE NOCASE AS s, "
            "i * 1.0 AS y FROM range(9) t(i)"
        )
    else:
        path = str(tmp_path / "nocase.sqlite")
        with sqlite3.connect(path) as admin:
            admin.execute("CREATE TABLE n (id INTEGER, s TEXT COLLATE NOCASE, y REAL)")
            admin.executemany(
                "INSERT INTO n VALUES (?, ?, ?)", [(i, "aAb"[i % 3], i * 1.0) for i in range(9)]
            )
        source = functools.partial(sqlite3.connect, path)
    with pytest.raises(ValueError, match=r"group_scheme values \['a', 'A'\] are equal in SQL"):
        DDBDataLoader(
            source,
            "SELECT id, s, y FROM n ORDER BY id",
            "y",
            input_col=["y"],
            group_col="s",
            group_scheme=["a", "A", "b"],
        )


def test_unmatched_and_dolphindb_style_values_warn_by_name(duck: Engine) -> None:
    with pytest.warns(UserWarning) as caught:
        loader = DDBDataLoader(
            duck.source,
            "SELECT id, sym, y FROM tk",
            "y",
            input_col=["y"],
            group_col="sym",
            group_scheme=["a", "`b", "2020.01.02", "zz"],
        )
    loader.close()
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(
        "group_scheme value(s) ['`b', '2020.01.02', 'zz'] match no rows of group_col 'sym'"
    )
    assert "'`b' is DolphinDB symbol syntax: elsewhere write 'b'" in message
    assert "'2020.01.02' is a DolphinDB temporal literal: elsewhere write '2020-01-02'" in message
    assert [g.rows for g in loader.plan.groups] == [20, 0, 0, 0]


def test_pivot_with_group_by_and_order_by_parses_and_keeps_its_order(duck: Engine) -> None:
    shape = next(s for s in SHAPES if s.name == "pivot-order-by")
    got = check_split(duck, shape)
    assert list(got) == [(g, d) for g in range(4) for d in range(4)]


def test_explicit_scheme_of_4000_values_is_counted_in_one_query(duck: Engine) -> None:
    queries: list[str] = []
    backend = connect(duck.source)

    class Counting:
        dialect = backend.dialect
        engine = backend.engine

        def cursor(self) -> Any:
            inner = backend.cursor()

            class Cursor:
                def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
                    queries.append(sql)
                    return inner.fetch(sql, params)

                def interrupt(self) -> None:
                    inner.interrupt()

                def close(self) -> None:
                    inner.close()

            return Cursor()

        def close(self) -> None:
            backend.close()

    scheme = list(range(4000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DDBDataLoader(
            Counting(), SCHEME_SQL, "y", input_col=["y"], group_col="id", group_scheme=scheme
        )
    loader.close()
    assert sum("_ddb_group_scheme" in q for q in queries) == 1
    assert len(queries) <= 3, queries
    assert [g.rows for g in loader.plan.groups] == [1] * ROWS + [0] * (4000 - ROWS)
