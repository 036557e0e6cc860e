"""Differential corpus for the query's order: the loader's rows of each partition against the
query run whole in the same engine (the oracle is the engine's own ORDER BY).

Every shape is read with windows of :data:`WINDOW` rows, unshuffled and shuffled with a small
``fetch_bytes`` (so big partitions are read in range pieces where the engine allows): the
windows a partition yields must be exactly the runs of consecutive rows of that key in the
whole query's result, in its order. The orders end in a unique column, so they are total. A
shape that cannot be ordered exactly must be refused before iteration, naming the term. The
shapes marked ``pieces`` must be cut into range pieces on every engine (the loader warns when it
cannot), except where a shape names the engine's reason to read front to back instead. The
table and the shapes are in tests/order_corpus.py.

Only the public API is used (the loader's batches, warnings and errors; DuckDB's own query log),
so the corpus holds whatever the plan's internals become.
"""

from __future__ import annotations

import collections
import functools
import sqlite3
import warnings
from collections.abc import Iterator
from typing import Any

import duckdb
import pgserver
import pytest
import sqlglot
from order_corpus import SHAPES, Shape, order_table
from sqlglot import exp
from test_split import Engine, engine_on

from ddbloader import DDBDataLoader

WINDOW = 3
#: Two float columns of a row are 16 bytes: 20 rows fit, so every partition of 160 rows is cut into
#: pieces of the loader's least piece (64 rows): more than one fetch unit reads at once.
FETCH_BYTES = 20 * 16
#: The loader's warning that a partition larger than ``fetch_bytes`` is read front to back.
NOT_CUT = "cannot be cut into pieces"


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


_FIXTURES = {
    "duckdb": "duck",
    "postgres": "postgres",
    "sqlite": "lite",
    "datafusion": "fusion",
    "clickhouse": "clickhouse",
}


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
    assert sum(len(s.engines) for s in SHAPES) >= 213
