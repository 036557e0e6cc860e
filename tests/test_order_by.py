"""Differential corpus for the query's order: the loader's rows of each partition against the
query run whole in the same engine (the oracle is the engine's own ORDER BY).

Every shape is read with windows of :data:`WINDOW` rows, unshuffled and shuffled with a small
``fetch_bytes`` (so big partitions are read in range pieces where the engine allows): the
windows a partition yields must be exactly the runs of consecutive rows of that key in the
whole query's result, in its order. The orders end in a unique column, so they are total. A
shape that cannot be ordered exactly must be refused before iteration, naming the term.
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
from test_split import Engine, engine_on

from ddbloader import DDBDataLoader

ROWS = 240
WINDOW = 3
#: Two float columns of a row are 16 bytes: 20 rows fit, so every partition is cut into pieces.
FETCH_BYTES = 20 * 16


def order_table() -> pa.Table:
    """``ob``: ``id`` unique; ``sym`` a/b/c; ``ts`` and ``event_ts`` two other permutations of the
    ids; ``k`` ties and NULLs; ``x`` floats with ties, -0.0 and 0.0 and NaN; ``y`` = id + 0.5."""
    ids = list(range(ROWS))
    x: list[float] = []
    for i in ids:
        value = float(i * 13 % 17) - 8.0
        x.append(math.nan if i % 19 == 0 else -0.0 if i % 23 == 5 else 0.0 if i % 23 == 6 else value)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "sym": pa.array([["a", "b", "c"][i % 3] for i in ids], pa.string()),
            "ts": pa.array([i * 7 % ROWS for i in ids], pa.int64()),  # 7 is prime to 240
            "event_ts": pa.array([(ROWS - 1 - i) * 11 % ROWS for i in ids], pa.int64()),
            "k": pa.array([None if i % 11 == 0 else i * 7 % 13 for i in ids], pa.int64()),
            "x": pa.array(x, pa.float64()),
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
    admin.execute(
        "CREATE TABLE ob (id INTEGER, sym TEXT, ts INTEGER, event_ts INTEGER, k INTEGER, x REAL, y REAL)"
    )
    admin.executemany(
        "INSERT INTO ob VALUES (?, ?, ?, ?, ?, ?, ?)", [tuple(r.values()) for r in order_table().to_pylist()]
    )
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
    (before iterating)."""

    name: str
    sql: str
    group: str | None = "sym"
    refused: str | None = None
    engines: tuple[str, ...] = ENGINES
    #: per engine, the error it raises itself on the loader's queries (an engine limitation)
    errors: dict[str, str] = field(default_factory=dict)


UNRESOLVED = r"the ORDER BY term {} cannot be resolved against the query's result columns exactly"
SHAPES = [
    # result columns renamed or swapped: ORDER BY names the result column, not the input's
    Shape("alias-swap", "SELECT sym, ts AS ingest_ts, event_ts AS ts, id, y FROM ob ORDER BY sym, ts"),
    Shape(
        "alias-swap-desc",
        "SELECT sym, event_ts AS ts, ts AS event_ts, id, y FROM ob ORDER BY ts DESC",
        engines=("duckdb", "postgres", "sqlite", "datafusion"),
    ),
    Shape(
        "alias-cycle-clickhouse",
        "SELECT sym, event_ts AS ts, ts AS event_ts, id, y FROM ob ORDER BY ts DESC",
        refused=UNRESOLVED.format("'ts'") + ": ClickHouse substitutes aliases",
        engines=("clickhouse",),
    ),
    Shape("alias-rename", "SELECT sym, event_ts AS e, id, y FROM ob ORDER BY e"),
    Shape(
        "alias-swap-whole", "SELECT ts AS ingest_ts, event_ts AS ts, id, y FROM ob ORDER BY ts", group=None
    ),
    # ordinals and expressions
    Shape("ordinal", "SELECT sym, ts AS ingest_ts, event_ts AS ts, id, y FROM ob ORDER BY 1, 3 DESC"),
    Shape("expression", "SELECT sym, id, y FROM ob ORDER BY ts % 7, id"),
    Shape("expression-over-result", "SELECT sym, k, id, y FROM ob ORDER BY k % 5 DESC, id"),
    Shape("qualified-over-result", "SELECT o.sym, o.ts, o.id, o.y FROM ob AS o ORDER BY o.ts DESC"),
    Shape(
        "qualified",
        "SELECT o.sym, o.event_ts AS ts, o.id, o.y FROM ob AS o ORDER BY o.ts",
        # DataFusion's planner refuses the carried o.ts next to the alias ts
        errors={
            "datafusion": "qualified field name o.ts and unqualified field name ts which would be ambiguous"
        },
    ),
    # a term the query does not select: carried as a hidden column
    Shape("not-selected", "SELECT sym, id, y FROM ob ORDER BY event_ts"),
    Shape("not-selected-whole", "SELECT id, y FROM ob ORDER BY event_ts DESC", group=None),
    # direction and NULL placement, explicit and implicit; several terms
    Shape("nulls-implicit", "SELECT sym, k, id, y FROM ob ORDER BY k, id"),
    Shape("nulls-desc-implicit", "SELECT sym, k, id, y FROM ob ORDER BY k DESC, id"),
    Shape("nulls-first", "SELECT sym, k, id, y FROM ob ORDER BY k NULLS FIRST, id"),
    Shape("nulls-desc-last", "SELECT sym, k, id, y FROM ob ORDER BY k DESC NULLS LAST, id"),
    Shape("multi-term", "SELECT sym, k, ts, id, y FROM ob ORDER BY k DESC, ts"),
    Shape("multi-term-whole", "SELECT k, event_ts AS ts, id, y FROM ob ORDER BY k, ts DESC", group=None),
    # float keys with NaN, -0.0 and 0.0 (SQLite stores NaN as NULL)
    Shape("float-nan-zero", "SELECT sym, x, id, y FROM ob ORDER BY x, id"),
    Shape("float-nan-zero-desc", "SELECT sym, x, id, y FROM ob ORDER BY x DESC, id"),
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


#: Shapes whose leading ORDER BY term is a result column: DuckDB must cut them into range pieces
#: (a carried term is not one the pieces can be cut by: those partitions are streamed).
PIECES = frozenset(
    {"alias-swap", "alias-swap-desc", "alias-rename", "alias-swap-whole", "ordinal", "nulls-implicit"}
    | {"nulls-desc-implicit", "nulls-first", "nulls-desc-last", "multi-term", "multi-term-whole"}
    | {"float-nan-zero", "float-nan-zero-desc", "qualified-over-result"}
)


def _windows_of(rows: list[tuple[int, Any]]) -> collections.Counter[tuple[int, ...]]:
    """The windows of one partition's ids, in order: WINDOW ids of x and the id of its y row."""
    ids = [i for i, _ in rows]
    return collections.Counter(tuple(ids[s : s + WINDOW + 1]) for s in range(len(ids) - WINDOW))


def expected_windows(engine: Engine, shape: Shape) -> collections.Counter[tuple[int, ...]]:
    whole = engine.fetch(shape.sql).to_pylist()
    assert len(whole) == ROWS, shape.name
    by_key: dict[Any, list[tuple[int, Any]]] = collections.defaultdict(list)
    for row in whole:
        by_key[row[shape.group] if shape.group else None].append((int(row["id"]), row))
    expected: collections.Counter[tuple[int, ...]] = collections.Counter()
    for rows in by_key.values():
        expected += _windows_of(rows)
    return expected


def loader_windows(
    source: Any, shape: Shape, *, shuffle: bool, cut_required: bool = False
) -> collections.Counter[tuple[int, ...]]:
    """The windows the loader serves, by the ids of their x rows and their y row; shuffled, the
    partitions are read in range pieces where the engine can cut them (``cut_required``: they
    must be)."""
    pieces = {"fetch_bytes": FETCH_BYTES, "seed": 5} if shuffle else {}
    group = {"group_col": shape.group} if shape.group else {}
    got: collections.Counter[tuple[int, ...]] = collections.Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # streamed pieces, NULL keys: the windows are what counts
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
            cut = any(p.ranges is not None for g in loader.plan.groups for p in g.partitions)
            if cut_required:
                assert cut, f"{shape.name}: no range pieces, so the shuffled run tests no piece"
            for x, y, *_ in loader:
                for window, target in zip(x[:, :, 0].tolist(), y[:, 0, 0].tolist(), strict=True):
                    got[(*(int(v) for v in window), int(target - 0.5))] += 1
    return got


@pytest.mark.parametrize(
    ("engine_name", "shape"),
    [pytest.param(e, s, id=f"{e}-{s.name}") for s in SHAPES for e in s.engines],
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
    assert sum(expected.values()) > ROWS // 2, "the shape makes too few windows to test anything"
    assert loader_windows(engine.source, shape, shuffle=False) == expected
    cut = engine.name == "duckdb" and shape.name in PIECES
    assert loader_windows(engine.source, shape, shuffle=True, cut_required=cut) == expected


@pytest.mark.parametrize(
    "settings",
    [
        ("SET default_order = 'DESC'",),
        ("SET default_null_order = 'NULLS_FIRST'",),
        ("SET default_order = 'DESC'", "SET default_null_order = 'NULLS_FIRST_ON_ASC_LAST_ON_DESC'"),
    ],
    ids=["default-desc", "nulls-first", "desc-nulls-first-on-asc"],
)
@pytest.mark.parametrize(
    "shape",
    [
        s
        for s in SHAPES
        if s.name in {"nulls-implicit", "nulls-desc-last", "alias-swap", "not-selected-whole"}
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
    assert loader_windows(con, shape, shuffle=False) == expected
    assert loader_windows(con, shape, shuffle=True) == expected
    con.close()


def test_a_hidden_order_column_is_not_read_as_a_feature(duck: Engine) -> None:
    sql = "SELECT sym, id, y FROM ob ORDER BY event_ts"
    with DDBDataLoader(duck.source, sql, "y", exclude_col=["y"], group_col="sym") as loader:
        x, _ = next(iter(loader))
        layout = loader.plan.layout
        partition = loader.plan.groups[0].partitions[0]
    assert layout.x_names == ("id",) and x.shape[1] == 1  # neither the key nor the carried event_ts
    assert "_ddb_order1" in partition.sql and "_ddb_order1" not in layout.result_names


def test_corpus_size() -> None:
    assert sum(len(s.engines) for s in SHAPES) >= 90
