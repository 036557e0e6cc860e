"""Differential corpus for the query's order: the loader's rows of each partition against the
query run whole in the same engine (the oracle is the engine's own ORDER BY).

Every shape is read with windows of :data:`WINDOW` rows, unshuffled and shuffled with a small
``fetch_bytes`` (so big partitions are read in range pieces where the engine allows): the
windows a partition yields must be exactly the runs of consecutive rows of that key in the
whole query's result, in its order. The orders end in a unique column, so they are total. A
shape that cannot be ordered exactly must be refused before iteration, naming the term. The
shapes of :data:`PIECES` must be cut into range pieces on every engine (the loader warns when it
cannot), except where a shape names the engine's reason to read front to back instead.

Only the public API is used (the loader's batches, warnings and errors; DuckDB's own query log),
so the corpus holds whatever the plan's internals become.
"""

from __future__ import annotations

import collections
import functools
import math
import sqlite3
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pgserver
import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp
from test_split import Engine, engine_on

from ddbloader import DDBDataLoader

ROWS = 480
WINDOW = 3
#: Two float columns of a row are 16 bytes: 20 rows fit, so every partition of 160 rows is cut into
#: pieces of the loader's least piece (64 rows): more than one fetch unit reads at once.
FETCH_BYTES = 20 * 16
#: The loader's warning that a partition larger than ``fetch_bytes`` is read front to back.
NOT_CUT = "cannot be cut into pieces"


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


@pytest.fixture(scope="module")
def duck() -> Iterator[Engine]:
    con = duckdb.connect()
    con.register("_incoming", order_table())
    con.execute("CREATE TABLE ob AS SELECT * FROM _incoming")
    with engine_on("duckdb", con) as made:
        yield made
    con.close()


@pytest.fixture(scope="module")
def postgres(pg_server: pgserver.PostgresServer) -> Iterator[Engine]:
    from adbc_driver_postgresql import dbapi

    admin = dbapi.connect(pg_server.uri, autocommit=True)
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS ob")
        cursor.adbc_ingest("ob", order_table(), mode="create")
    with engine_on("postgres", pg_server.uri) as made:
        yield made
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE ob")
    admin.close()


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = str(tmp_path_factory.mktemp("order") / "order.sqlite")
    admin = sqlite3.connect(path)
    columns = (
        "id INTEGER, sym TEXT, ts INTEGER, event_ts INTEGER, k INTEGER, x REAL, z REAL, name TEXT, y REAL"
    )
    admin.execute(f"CREATE TABLE ob ({columns})")
    rows = [tuple(r.values()) for r in order_table().to_pylist()]
    admin.executemany("INSERT INTO ob VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    admin.commit()
    admin.close()
    with engine_on("sqlite", functools.partial(sqlite3.connect, path)) as made:
        yield made


@pytest.fixture(scope="module")
def fusion() -> Iterator[Engine]:
    datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
    context = datafusion.SessionContext()
    context.register_record_batches("ob", [order_table().to_batches()])
    with engine_on("datafusion", context) as made:
        yield made


@pytest.fixture(scope="module")
def clickhouse(chdb_uri: str) -> Iterator[Engine]:
    from adbc_driver_chdb import dbapi

    admin = dbapi.connect(chdb_uri)
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS ob")
        cursor.adbc_ingest("ob", order_table(), mode="create")
    with engine_on("clickhouse", chdb_uri) as made:
        yield made
    with admin.cursor() as cursor:
        cursor.execute("DROP TABLE ob")
    admin.close()


ENGINES = ("duckdb", "postgres", "sqlite", "datafusion", "clickhouse")
_FIXTURES = {
    "duckdb": "duck",
    "postgres": "postgres",
    "sqlite": "lite",
    "datafusion": "fusion",
    "clickhouse": "clickhouse",
}


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


def _windows_of(rows: list[tuple[int, Any]]) -> collections.Counter[tuple[int, ...]]:
    """The windows of one partition's ids, in order: WINDOW ids of x and the id of its y row."""
    ids = [i for i, _ in rows]
    return collections.Counter(tuple(ids[s : s + WINDOW + 1]) for s in range(len(ids) - WINDOW))


def expected_windows(engine: Engine, shape: Shape) -> collections.Counter[tuple[int, ...]]:
    whole = engine.fetch(shape.sql).to_pylist()
    assert len(whole) == shape.rows, shape.name
    by_key: dict[Any, list[tuple[int, Any]]] = collections.defaultdict(list)
    for row in whole:
        by_key[row[shape.group] if shape.group else None].append((int(row["id"]), row))
    expected: collections.Counter[tuple[int, ...]] = collections.Counter()
    for rows in by_key.values():
        expected += _windows_of(rows)
    return expected


def loader_windows(
    source: Any, shape: Shape, *, shuffle: bool
) -> tuple[collections.Counter[tuple[int, ...]], list[str]]:
    """The windows the loader serves, by the ids of their x rows and their y row, and the warnings
    it raised; shuffled, the partitions are read in range pieces where the engine can cut them."""
    pieces = {"fetch_bytes": FETCH_BYTES, "seed": 5} if shuffle else {}
    group = {"group_col": shape.group} if shape.group else {}
    got: collections.Counter[tuple[int, ...]] = collections.Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # streamed pieces, NULL keys: recorded, judged by the caller
        with DDBDataLoader(
            source,
            shape.sql,
            "y",
            input_col=["id"],
            window_size=WINDOW,
            batch_size=16,
            shuffle=shuffle,
            **group,
            **pieces,
        ) as loader:
            for x, y, *_ in loader:
                for window, target in zip(x[:, :, 0].tolist(), y[:, 0, 0].tolist(), strict=True):
                    got[(*(int(v) for v in window), int(target - 0.5))] += 1
    return got, [str(w.message) for w in caught]


@pytest.mark.parametrize(
    ("engine_name", "shape"),
    [
        # DuckDB's legs are the fast tier's; the other engines' run with the slow tests (CI)
        pytest.param(e, s, id=f"{e}-{s.name}", marks=() if e == "duckdb" else pytest.mark.slow)
        for s in SHAPES
        for e in s.engines
    ],
)
def test_each_partition_holds_the_whole_querys_rows_of_its_key_in_order(
    request: pytest.FixtureRequest, engine_name: str, shape: Shape
) -> None:
    engine: Engine = request.getfixturevalue(_FIXTURES[engine_name])
    if shape.refused is not None:
        with pytest.raises(ValueError, match=shape.refused):
            loader_windows(engine.source, shape, shuffle=False)
        return
    if engine.name in shape.errors:
        with pytest.raises(Exception, match=shape.errors[engine.name]):
            loader_windows(engine.source, shape, shuffle=False)
        return
    expected = expected_windows(engine, shape)
    assert sum(expected.values()) > shape.rows // 2, "the shape makes too few windows to test anything"
    assert loader_windows(engine.source, shape, shuffle=False)[0] == expected
    served, warned = loader_windows(engine.source, shape, shuffle=True)
    assert served == expected
    if shape.pieces:
        not_cut = [w for w in warned if NOT_CUT in w]
        if engine.name in shape.streamed:
            assert not_cut and shape.streamed[engine.name] in not_cut[0], warned
        else:
            assert not not_cut, f"{shape.name}: not cut into range pieces on {engine.name}: {not_cut}"


@pytest.mark.parametrize(
    "settings",
    [
        ("SET default_order = 'DESC'",),
        ("SET default_null_order = 'NULLS_FIRST'",),
        ("SET default_order = 'DESC'", "SET default_null_order = 'NULLS_FIRST_ON_ASC_LAST_ON_DESC'"),
        ("SET default_collation = 'noaccent.nocase'",),
    ],
    ids=["default-desc", "nulls-first", "desc-nulls-first-on-asc", "collation"],
)
@pytest.mark.parametrize(
    "shape",
    [
        s
        for s in SHAPES
        if s.name
        in {"nulls-implicit", "nulls-desc-last", "alias-swap", "not-selected-whole", "multi-term-whole"}
        | {"text-mixed-case"}
    ],
    ids=lambda s: s.name,
)
def test_duckdb_session_defaults_order_the_split_as_the_whole_query(
    settings: tuple[str, ...], shape: Shape
) -> None:
    con = duckdb.connect()
    con.register("_incoming", order_table())
    con.execute("CREATE TABLE ob AS SELECT * FROM _incoming")
    for statement in settings:
        con.execute(statement)
    with engine_on("duckdb", con) as engine:
        expected = expected_windows(engine, shape)
    assert loader_windows(con, shape, shuffle=False)[0] == expected
    assert loader_windows(con, shape, shuffle=True)[0] == expected
    con.close()


def _partition_reads(con: duckdb.DuckDBPyConnection) -> list[exp.Expr]:
    """The queries of DuckDB's query log that read a partition's rows (``y``, under a filter),
    not the planning queries (a schema's LIMIT 0, counts, rankings)."""
    reads = []
    for (message,) in con.execute("SELECT message FROM duckdb_logs WHERE type = 'QueryLog'").fetchall():
        tree = sqlglot.parse_one(message, dialect="duckdb")
        if not isinstance(tree, exp.Select) or tree.args.get("limit") is not None:
            continue
        if tree.find(exp.Count, exp.Window) or not tree.find(exp.Where):
            continue
        if any(column.name == "y" for column in tree.find_all(exp.Column)) or tree.is_star:
            reads.append(tree)
    return reads


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_term_the_query_does_not_select_is_sorted_after_the_key_filter(shuffle: bool) -> None:
    """``ORDER BY`` a column the query does not select: each partition's query sorts the rows of
    its key, not the whole table before the key filter (95b8d61 kept the ORDER BY inside the
    filtered subquery, 1.7x slower than selecting the column), and the carried column is no
    feature."""
    con = duckdb.connect()
    con.register("_incoming", order_table())
    con.execute("CREATE TABLE ob AS SELECT * FROM _incoming")
    con.execute("CALL enable_logging('QueryLog')")
    sql = "SELECT sym, id, y FROM ob ORDER BY event_ts"
    options: dict[str, Any] = {"shuffle": shuffle, "seed": 5, "batch_size": 64}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shuffled: the partitions are not cut by a carried term
        with DDBDataLoader(con, sql, "y", exclude_col=["y"], group_col="sym", **options) as loader:
            widths = {x.shape[1] for x, _ in loader}
    assert widths == {1}  # id: neither the key sym nor the carried event_ts
    reads = _partition_reads(con)
    assert reads, "no partition query in DuckDB's query log"
    for tree in reads:
        for order in tree.find_all(exp.Order):
            sorted_select = order.parent
            assert isinstance(sorted_select, exp.Select)
            assert sorted_select.find(exp.Where) is not None, f"sorted before the key filter: {tree.sql()}"
    con.close()


def test_corpus_size() -> None:
    assert sum(len(s.engines) for s in SHAPES) >= 205
