"""The backend contract, run by the real DDBDataLoader against every reachable engine.

Engines: embedded DuckDB, a throwaway PostgreSQL server through ADBC (tests/pgserver.py),
sqlite3 through the plain DB-API fallback and a throwaway Spark Connect server
(tests/sparkserver.py). Each engine must give the same batches as DuckDB
for the same plan and seed, cover every window exactly once, keep the query's ORDER BY, map
types and nulls as documented, select exactly the rows equal to hostile scheme values without
changing anything, and name the query and parameters when the engine fails.
"""

from __future__ import annotations

import functools
import importlib.util
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pgserver
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import servers
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from planned import views
from resume_check import assert_resumes_exactly

from ddbloader import DDBDataLoader
from ddbloader.backends import (
    ADBCBackend,
    DBAPIBackend,
    DolphinDBBackend,
    DuckDBBackend,
    FlightSQLBackend,
    connect,
    redact_uri,
)
from ddbloader.backends.dbapi import bind_parameters
from tests.conftest import make_series

ENGINES = ("duckdb", "postgres", "sqlite", "spark", "datafusion", "clickhouse", "flightsql")
SERIES_SQL = "SELECT gid, part, pos, rid, f0, f1, y FROM series ORDER BY gid, pos"
PARTS = [[10, 7, 12], [15, 6], [8, 9, 11, 10]]


def series_table(parts: list[list[int]]) -> pa.Table:
    """Group g has partitions of ``parts[g][p]`` rows; ``rid = gid * 1e6 + pos`` names each row."""
    rows = [
        (gid, part, pos)
        for gid, sizes in enumerate(parts)
        for part, pos in zip(
            [p for p, size in enumerate(sizes) for _ in range(size)], range(sum(sizes)), strict=True
        )
    ]
    rid = [g * 1_000_000 + pos for g, _, pos in rows]
    return pa.table(
        {
            "gid": pa.array([r[0] for r in rows], pa.int32()),
            "part": pa.array([r[1] for r in rows], pa.int32()),
            "pos": pa.array([r[2] for r in rows], pa.int64()),
            "rid": pa.array(rid, pa.int64()),
            "f0": pa.array([float(r) for r in rid], pa.float64()),
            "f1": pa.array([-float(r) for r in rid], pa.float64()),
            "y": pa.array([r + 0.5 for r in rid], pa.float64()),
        }
    )


class Engine:
    """A real engine with helpers to create tables, read them back, and hand the loader a source."""

    name: str

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        raise NotImplementedError

    def execute(self, sql: str) -> None:
        raise NotImplementedError

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def source(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class DuckEngine(Engine):
    name = "duckdb"

    def __init__(self) -> None:
        self.con = duckdb.connect()

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.con.execute(f"DROP TABLE IF EXISTS {table}")
        self.con.register("_incoming", data)
        if ddl:
            self.con.execute(ddl)
            self.con.execute(f"INSERT INTO {table} SELECT * FROM _incoming")
        else:
            self.con.execute(f"CREATE TABLE {table} AS SELECT * FROM _incoming")
        self.con.unregister("_incoming")

    def execute(self, sql: str) -> None:
        self.con.execute(sql)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.con.execute(sql).fetchall()

    def source(self) -> Any:
        return self.con

    def close(self) -> None:
        self.con.close()


class PostgresEngine(Engine):
    name = "postgres"

    def __init__(self, uri: str) -> None:
        from adbc_driver_postgresql import dbapi

        self.uri = uri
        self.admin = dbapi.connect(uri, autocommit=True)

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.execute(f"DROP TABLE IF EXISTS {table}")
        if not ddl:
            with self.admin.cursor() as cursor:
                cursor.adbc_ingest(table, data, mode="create")
            return
        # COPY cannot write every Arrow type into every column type (double into numeric):
        # stage the data, then let INSERT ... SELECT apply PostgreSQL's assignment casts.
        self.execute(ddl)
        with self.admin.cursor() as cursor:
            cursor.adbc_ingest("_staging", data, mode="replace")
        self.execute(f"INSERT INTO {table} SELECT * FROM _staging")
        self.execute("DROP TABLE _staging")

    def execute(self, sql: str) -> None:
        with self.admin.cursor() as cursor:
            cursor.execute(sql)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self.admin.cursor() as cursor:
            cursor.execute(sql)
            return [tuple(r.values()) for r in cursor.fetch_arrow_table().to_pylist()]

    def source(self) -> Any:
        return self.uri

    def close(self) -> None:
        self.execute("DROP SCHEMA public CASCADE")
        self.execute("CREATE SCHEMA public")
        self.admin.close()


_SQLITE_TYPES = {"int32": "INTEGER", "int64": "INTEGER", "double": "REAL", "string": "TEXT"}


class SqliteEngine(Engine):
    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / "contract.sqlite")
        self.admin = sqlite3.connect(self.path)

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.execute(f"DROP TABLE IF EXISTS {table}")
        columns = ", ".join(f"{f.name} {_SQLITE_TYPES[str(f.type)]}" for f in data.schema)
        self.execute(ddl or f"CREATE TABLE {table} ({columns})")
        marks = ", ".join("?" * data.num_columns)
        self.admin.executemany(
            f"INSERT INTO {table} VALUES ({marks})", [tuple(r.values()) for r in data.to_pylist()]
        )
        self.admin.commit()

    def execute(self, sql: str) -> None:
        self.admin.execute(sql)
        self.admin.commit()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.admin.execute(sql).fetchall()

    def source(self) -> Any:
        return functools.partial(sqlite3.connect, self.path)

    def close(self) -> None:
        self.admin.close()


class SparkEngine(Engine):
    """Tables in the warehouse of the test server: visible to every session, dropped on close."""

    name = "spark"

    def __init__(self, uri: str) -> None:
        from pyspark.sql import SparkSession

        self.uri = uri
        self.admin = SparkSession.builder.remote(uri).create()
        self.tables: set[str] = set()

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.execute(f"DROP TABLE IF EXISTS {table}")
        self.tables.add(table)
        frame = self.admin.createDataFrame(data)
        if ddl:
            self.execute(ddl)
            frame.write.insertInto(table)
        else:
            frame.write.saveAsTable(table)

    def execute(self, sql: str) -> None:
        self.admin.sql(sql).collect()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self.admin.sql(sql).collect()]

    def source(self) -> Any:
        return self.uri

    def close(self) -> None:
        for table in self.tables:
            self.execute(f"DROP TABLE IF EXISTS {table}")
        self.admin.stop()


class DataFusionEngine(Engine):
    """Tables in one DataFusion SessionContext, which is the loader's source."""

    name = "datafusion"

    def __init__(self) -> None:
        from datafusion import SessionContext

        self.ctx = SessionContext()

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.execute(f"DROP TABLE IF EXISTS {table}")
        if not ddl:
            self.ctx.register_record_batches(table, [data.to_batches()])
            return
        self.execute(ddl)
        self.ctx.register_record_batches("_incoming", [data.to_batches()])
        self.execute(f"INSERT INTO {table} SELECT * FROM _incoming")
        self.ctx.deregister_table("_incoming")

    def execute(self, sql: str) -> None:
        self.ctx.sql(sql).collect()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in self.ctx.sql(sql).to_arrow_table().to_pylist()]

    def source(self) -> Any:
        return self.ctx

    def close(self) -> None:
        """Nothing to release: the context goes with the engine."""


class ADBCAdminEngine(Engine):
    """An engine set up through an ADBC connection of its own; the tables it made dropped on close."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin
        self.tables: set[str] = set()

    def execute(self, sql: str) -> None:
        self.rows(sql)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self.admin.cursor() as cursor:
            cursor.execute(sql)
            return [tuple(r.values()) for r in cursor.fetch_arrow_table().to_pylist()]

    def close(self) -> None:
        for table in self.tables:
            self.execute(f"DROP TABLE IF EXISTS {table}")
        self.admin.close()


class ClickHouseEngine(ADBCAdminEngine):
    """MergeTree tables in the run's one chDB database (chDB holds one per process)."""

    name = "clickhouse"

    def __init__(self, uri: str) -> None:
        from adbc_driver_chdb import dbapi

        super().__init__(dbapi.connect(uri))
        self.uri = uri

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.execute(f"DROP TABLE IF EXISTS {table}")
        self.tables.add(table)
        if ddl:
            self.execute(ddl)
        with self.admin.cursor() as cursor:
            cursor.adbc_ingest(table, data, mode="append" if ddl else "create")

    def source(self) -> Any:
        return self.uri


class FlightSQLEngine(ADBCAdminEngine):
    """Parquet tables of a Sail Flight SQL server (Spark SQL), written here by pyarrow.

    Sail takes no bulk ingestion through Flight SQL, and writing rows as SQL literals would
    test the loader's literal builder with itself: the data goes in as Parquet files.
    """

    name = "flightsql"

    def __init__(self, uri: str, directory: Path) -> None:
        from adbc_driver_flightsql import dbapi

        super().__init__(dbapi.connect(uri, autocommit=True))
        self.uri = uri
        self.directory = directory

    def create(self, table: str, data: pa.Table, ddl: str | None = None) -> None:
        self.execute(f"DROP TABLE IF EXISTS {table}")
        self.tables.add(table)
        staged = "_staging" if ddl else table
        location = self.directory / f"{staged}-{len(list(self.directory.iterdir()))}"
        location.mkdir()
        pq.write_table(data, location / "part-0.parquet")
        self.execute(f"CREATE TABLE {staged} USING parquet LOCATION '{location}'")
        if ddl:  # its files in the test's directory, not in Sail's warehouse (the working directory)
            self.execute(f"{ddl} LOCATION '{self.directory / table}'")
            self.execute(f"INSERT INTO {table} SELECT * FROM _staging")
            self.execute("DROP TABLE _staging")

    def source(self) -> Any:
        return FlightSQLBackend(self.uri, dialect="spark")


#: Spark answers a query in 0.1-1 s (more on a busy machine): its tests get longer to run.
SPARK_TIMEOUT = pytest.mark.timeout(300)
#: The engines whose property tests run every example; a property example costs ~10 queries, so
#: Spark's run apart with fewer.
FAST_ENGINES = [e for e in ENGINES if e != "spark"]


@pytest.fixture(params=[pytest.param(e, marks=SPARK_TIMEOUT) if e == "spark" else e for e in ENGINES])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "duckdb":
        made: Engine = DuckEngine()
    elif request.param == "postgres":
        made = PostgresEngine(request.getfixturevalue("pg_server").uri)
    elif request.param == "spark":
        made = SparkEngine(request.getfixturevalue("spark_server").uri)
    elif request.param == "datafusion":
        if importlib.util.find_spec("datafusion") is None:
            servers.unavailable("datafusion is not installed", "DataFusion", "pyproject.toml's dev extra")
        made = DataFusionEngine()
    elif request.param == "clickhouse":
        made = ClickHouseEngine(request.getfixturevalue("chdb_uri"))
    elif request.param == "flightsql":
        made = FlightSQLEngine(request.getfixturevalue("flight_sql_uri"), tmp_path)
    else:
        made = SqliteEngine(tmp_path)
    yield made
    made.close()


@pytest.fixture
def pg(pg_server: pgserver.PostgresServer) -> Iterator[PostgresEngine]:
    made = PostgresEngine(pg_server.uri)
    yield made
    made.close()


def batches(loader: DDBDataLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with loader:
        return list(loader)


def reference(sql: str, data: pa.Table, **kwargs: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same loader over DuckDB: what every engine must reproduce batch for batch."""
    duck = DuckEngine()
    try:
        duck.create("series", data)
        return batches(DDBDataLoader(duck.source(), sql, **kwargs))
    finally:
        duck.close()


def resumes_exactly(engine: Engine, make_loader: Callable[[], DDBDataLoader]) -> None:
    """DuckDB's leg cuts two epochs everywhere (tests/resume_check.py: the loader's counting, the
    same on every engine); the other engines' resume once, mid-epoch: the resumed loader's queries
    on that engine give the rest of the epoch."""
    if engine.name == "duckdb":
        assert_resumes_exactly(make_loader, epochs=2)
    else:
        assert_resumes_exactly(make_loader, epochs=1, every_cut=False)


def assert_same(
    actual: list[tuple[torch.Tensor, torch.Tensor]], expected: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    assert len(actual) == len(expected)
    for (x, y), (ex, ey) in zip(actual, expected, strict=True):
        assert x.dtype == ex.dtype and y.dtype == ey.dtype
        assert torch.equal(x, ex) and torch.equal(y, ey)


# --- semantics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_windows_cover_every_sample_once_and_match_duckdb(engine: Engine, shuffle: bool) -> None:
    data = series_table(PARTS)
    engine.create("series", data)
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0", "f1"],
        "batch_size": 5,
        "shuffle": shuffle,
        "window_size": [3, 2],
        "window_stride": 2,
        "group_col": "gid",
        "repartition_col": "part",
        "seed": 7,
    }
    got = batches(DDBDataLoader(engine.source(), SERIES_SQL, **options))
    starts = [int(r) for x, _ in got for r in x[:, 0, 0].tolist()]
    expected = {g * 1_000_000 + s for g, sizes in enumerate(PARTS) for s in range(0, sum(sizes) - 4, 2)}
    assert sorted(starts) == sorted(expected)  # every window once, none across groups
    for x, y in got:  # y anchored to x: rows s+3 and s+4
        assert torch.equal(y[:, :, 0], x[:, :1, 0] + torch.tensor([3.5, 4.5], dtype=x.dtype))
    assert_same(got, reference(SERIES_SQL, data, **options))


def test_explicit_schemes_keep_their_order_and_skip_empty_partitions(engine: Engine) -> None:
    data = series_table(PARTS)
    engine.create("series", data)
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 64,
        "group_col": "gid",
        "group_scheme": [2, 0, 1],
        "repartition_col": "part",
        "repartition_scheme": [3, 2, 1, 0],
    }
    with DDBDataLoader(engine.source(), SERIES_SQL, **options) as loader:
        assert [len(g.partitions) for g in loader.plan.groups] == [4, 3, 2]
        rows = torch.cat([x[:, 0] for x, _ in loader]).tolist()
    rid = data.column("rid").to_pylist()
    part = data.column("part").to_pylist()
    expected = [
        float(r) for g in (2, 0, 1) for p in (3, 2, 1, 0) for r, pp in zip(rid, part, strict=True)
        if r // 1_000_000 == g and pp == p
    ]  # fmt: skip
    assert rows == expected


def test_order_by_of_the_query_is_kept(engine: Engine) -> None:
    data = series_table(PARTS)
    engine.create("series", data)
    sql = "SELECT gid, part, pos, rid, f0, f1, y FROM series ORDER BY gid, pos DESC"
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 8,
        "group_col": "gid",
        "repartition_col": "part",
    }
    got = batches(DDBDataLoader(engine.source(), sql, **options))
    rows = torch.cat([x[:, 0] for x, _ in got]).tolist()
    # Each partition's rows descend; partitions come in repartition order (0, 1, ...).
    expected = [
        float(g * 1_000_000 + pos)
        for g, sizes in enumerate(PARTS)
        for p in range(len(sizes))
        for pos in reversed(range(sum(sizes[:p]), sum(sizes[: p + 1])))
    ]
    assert rows == expected
    assert_same(got, reference(sql, data, **options))


# --- fetch units: many partitions in one query -------------------------------------------------

# At least one row: sqlite cannot type the columns of an empty table.
UNIT_PARTS = st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=1, max_size=5).filter(
    lambda parts: any(map(any, parts))
)


UNIT_CASES = st.fixed_dictionaries(
    {
        "parts": UNIT_PARTS,
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32),
        "window": st.integers(1, 4),
        "repartitioned": st.booleans(),
        "fetch_bytes": st.sampled_from([64, 300, 2**20]),
    }
)


@pytest.mark.parametrize("engine", FAST_ENGINES, indirect=True)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=UNIT_CASES)
def test_fetch_units_give_the_batches_of_one_query_per_partition(
    engine: Engine, case: dict[str, Any]
) -> None:
    """Exactly once and deterministic: the same batches as one subquery per partition, on every engine."""
    check_fetch_units(engine, **case)


@pytest.mark.parametrize("engine", [pytest.param("spark", marks=SPARK_TIMEOUT)], indirect=True)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=UNIT_CASES)
def test_fetch_units_give_the_batches_of_one_query_per_partition_on_spark(
    engine: Engine, case: dict[str, Any]
) -> None:
    check_fetch_units(engine, **case)


def check_fetch_units(
    engine: Engine,
    parts: list[list[int]],
    shuffle: bool,
    seed: int,
    window: int,
    repartitioned: bool,
    fetch_bytes: int,
) -> None:
    """The batches of fetch units under ``fetch_bytes`` are those of one subquery per partition."""
    assume(any(sum(sizes) > window for sizes in parts))  # else refused at construction (test_plan)
    engine.create("series", series_table(parts))
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 4,
        "shuffle": shuffle,
        "seed": seed,
        "window_size": window,
        "group_col": "gid",
        "repartition_col": "part" if repartitioned else None,
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="samples need")
        alone = batches(DDBDataLoader(engine.source(), SERIES_SQL, fetch_bytes=0, **options))
        with DDBDataLoader(engine.source(), SERIES_SQL, fetch_bytes=fetch_bytes, **options) as loader:
            coalesced = list(loader)
            stats = loader.stats()
    assert_same(coalesced, alone)
    starts = sorted(int(r) for x, _ in coalesced for r in x[:, 0, 0].tolist())
    expected = sorted(g * 1_000_000 + s for g, sizes in enumerate(parts) for s in range(sum(sizes) - window))
    assert starts == expected
    assert stats.queries <= stats.partitions_fetched


def test_fetch_units_fetch_every_group_in_one_query(engine: Engine) -> None:
    """With a budget that holds the table, an epoch is one query, and resumes exactly."""
    engine.create("series", series_table(PARTS))
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0", "f1"],
        "batch_size": 5,
        "shuffle": True,
        "seed": 3,
        "window_size": 3,
        "group_col": "gid",
        "repartition_col": "part",
    }
    with DDBDataLoader(engine.source(), SERIES_SQL, **options) as loader:
        got = list(loader)
        stats = loader.stats()
    assert (stats.queries, stats.partitions_fetched) == (1, 9)
    assert stats.rows_per_query == sum(map(sum, PARTS))
    assert_same(got, reference(SERIES_SQL, series_table(PARTS), fetch_bytes=0, **options))
    resumes_exactly(engine, lambda: DDBDataLoader(engine.source(), SERIES_SQL, **options))


# --- streamed partitions: one query read in pieces ---------------------------------------------

#: Rows of f0 and y are 16 bytes: 100 rows fit fetch_bytes, so 300, 200 and 450 rows are streamed.
STREAMED_PARTS = [[300, 5, 200], [450]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine", ["duckdb", "postgres", "sqlite", "datafusion", "clickhouse", "flightsql"], indirect=True
)
@pytest.mark.parametrize("shuffle", [False, True])
def test_streamed_partitions_cover_every_window_once_and_resume_exactly(
    engine: Engine, shuffle: bool
) -> None:
    data = series_table(STREAMED_PARTS)
    engine.create("series", data)
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 16,
        "shuffle": shuffle,
        "seed": 5,
        "window_size": 7,
        "group_col": "gid",
        "repartition_col": "part",
        "fetch_bytes": 100 * 8,  # 100 rows of f0 and y, float32 (torch's default)
    }
    with DDBDataLoader(engine.source(), SERIES_SQL, **options) as loader:
        assert [len(g.partitions) for g in loader.plan.groups] == [3 + 1 + 2, 5]
        # the 450-row group is one subquery with a distinct key: its pieces are combed windows
        assert [g.combed_windows for g in loader.plan.groups] == [False, shuffle]
        ranged = [p.ranges is not None for p in views(loader.plan)]
        got = list(loader)
        stats = loader.stats()
    # with shuffle, range pieces by pos, each read by its own query (the combed windows of the
    # second group too); else one query per streamed subquery, and one for the 5-row partition
    assert ranged == [shuffle] * 3 + [False] + [shuffle] * 7
    assert stats.queries == (4 + 2 + 5 if shuffle else 4)
    starts = [int(r) for x, _ in got for r in x[:, 0, 0].tolist()]
    expected = [g * 1_000_000 + s for g, sizes in enumerate(STREAMED_PARTS) for s in range(sum(sizes) - 7)]
    assert sorted(starts) == expected  # every window once, across piece boundaries too
    if not shuffle:
        assert starts == expected
    for x, y in got:  # y anchored to x: row s+7
        assert torch.equal(y[:, 0, 0], x[:, 0, 0] + 7.5)
    assert_same(got, reference(SERIES_SQL, data, **options))
    resumes_exactly(engine, lambda: DDBDataLoader(engine.source(), SERIES_SQL, **options))


@pytest.mark.parametrize(
    "engine",
    [
        "duckdb",
        "postgres",
        "sqlite",
        pytest.param("spark", marks=SPARK_TIMEOUT),
        "datafusion",
        "clickhouse",
        "flightsql",
    ],
    indirect=True,
)
def test_combed_range_pieces_serve_every_row_once(engine: Engine) -> None:
    data = series_table(STREAMED_PARTS)
    engine.create("series", data)
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 16,
        "shuffle": True,
        "seed": 5,
        "group_col": "gid",
        "fetch_bytes": 100 * 16,
    }
    with DDBDataLoader(engine.source(), SERIES_SQL, **options) as loader:
        pieces = [p.ranges for p in views(loader.plan)]
        got = list(loader)
    assert all(r is not None for r in pieces) and any(len(r.spans) > 1 for r in pieces if r is not None)
    rows = sorted(int(v) for x, _ in got for v in x[:, 0].tolist())
    assert rows == sorted(int(v) for v in data.column("rid").to_pylist())  # every row once
    assert_same(got, reference(SERIES_SQL, data, **options))


# --- dtypes and nulls ---------------------------------------------------------------------------

_TYPED_SPARK = "CREATE TABLE typed (i4 INT, i8 BIGINT, f8 DOUBLE, n DECIMAL(10, 2), y DOUBLE) USING parquet"
_TYPED_DDL = {
    "duckdb": "CREATE TABLE typed (i4 INTEGER, i8 BIGINT, f8 DOUBLE, n DECIMAL(10, 2), y DOUBLE)",
    "postgres": "CREATE TABLE typed (i4 int4, i8 int8, f8 float8, n numeric(10, 2), y float8)",
    "sqlite": "CREATE TABLE typed (i4 INTEGER, i8 INTEGER, f8 REAL, n NUMERIC, y REAL)",
    "spark": _TYPED_SPARK,
    "datafusion": "CREATE TABLE typed (i4 INT, i8 BIGINT, f8 DOUBLE, n DECIMAL(10, 2), y DOUBLE)",
    "clickhouse": "CREATE TABLE typed (i4 Int32, i8 Int64, f8 Float64, n Decimal(10, 2), y Float64) "
    "ENGINE = MergeTree ORDER BY tuple()",
    "flightsql": _TYPED_SPARK,
}
# sqlite stores every integer as 64 bits, so its int4 arrives as int64.
_TYPED_DTYPES = {
    "duckdb": {"i4": torch.int32, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
    "postgres": {"i4": torch.int32, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
    "sqlite": {"i4": torch.int64, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
    "spark": {"i4": torch.int32, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
    "datafusion": {"i4": torch.int32, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
    "clickhouse": {"i4": torch.int32, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
    "flightsql": {"i4": torch.int32, "i8": torch.int64, "f8": torch.float32, "n": torch.float32},
}


def test_column_types_map_to_tensor_dtypes(engine: Engine) -> None:
    values = {
        "i4": [1, -2, 3],
        "i8": [2**40, -(2**41), 5],
        "f8": [0.5, -1.5, 1e-300],
        "n": [1.25, -2.5, 12345678.75],
    }
    types = {"i4": pa.int32(), "i8": pa.int64(), "f8": pa.float64(), "n": pa.float64()}
    data = pa.table({**{k: pa.array(v, types[k]) for k, v in values.items()}, "y": pa.array([0.0, 1.0, 2.0])})
    engine.create("typed", data, _TYPED_DDL[engine.name])
    for column, dtype in _TYPED_DTYPES[engine.name].items():
        with DDBDataLoader(
            engine.source(), "SELECT * FROM typed ORDER BY y", "y", batch_size=3, input_col=column
        ) as loader:
            ((x, _),) = list(loader)
        assert x.dtype == dtype, column
        assert x[:, 0].tolist() == torch.tensor(values[column], dtype=dtype).tolist(), column
        if dtype.is_floating_point:  # dtype=torch.float64 keeps every digit (DolphinDB's dtype)
            with DDBDataLoader(
                engine.source(),
                "SELECT * FROM typed ORDER BY y",
                "y",
                batch_size=3,
                input_col=column,
                dtype=torch.float64,
            ) as loader:
                ((x, _),) = list(loader)
            assert x[:, 0].tolist() == values[column], column


def test_nulls_become_nan_in_the_default_float(engine: Engine) -> None:
    data = pa.table(
        {
            "g": pa.array([1, 1, 1, 2], pa.int32()),
            "a": pa.array([1, None, 3, 4], pa.int32()),
            "b": pa.array([None, 0.5, 1.5, 2.5], pa.float64()),
            "y": pa.array([0.0, 1.0, 2.0, 3.0], pa.float64()),
        }
    )
    engine.create("nullable", data)
    with DDBDataLoader(
        engine.source(),
        "SELECT g, a, b, y FROM nullable ORDER BY y",
        "y",
        batch_size=4,
        input_col=["a", "b"],
        group_col="g",
    ) as loader:
        ((x, _),) = list(loader)
    assert x.dtype == torch.float32
    expected = np.array([[1, np.nan], [np.nan, 0.5], [3, 1.5], [4, 2.5]], np.float32)
    np.testing.assert_array_equal(x.numpy(), expected)


# --- hostile values -----------------------------------------------------------------------------

_SNIPPETS = [
    "'", '"', "\\", ";", "--", "/*", "*/", "' OR '1'='1", "'; DROP TABLE canary; --", "$1", "$2", "?",
    ":1", ":p1", "%s", "%(p1)s", "%", "@1", "`", "é", "中文", "😀", "\n", "\t", "\x00", "ddbparam_1",
]  # fmt: skip
HOSTILE = st.lists(st.one_of(st.sampled_from(_SNIPPETS), st.text(max_size=4)), max_size=4).map("".join)
BASE_NAMES = ["a", "b", "'", "' OR '1'='1", "x;y", ""]


HOSTILE_SCHEMES = st.lists(HOSTILE, min_size=1, max_size=3, unique=True)


@pytest.mark.filterwarnings("ignore:.* match no rows of:UserWarning")  # hostile values match nothing
@pytest.mark.slow
@pytest.mark.parametrize("engine", FAST_ENGINES, indirect=True)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=HOSTILE_SCHEMES, absent=HOSTILE)
def test_hostile_values_select_only_equal_rows_and_change_nothing(
    engine: Engine, values: list[str], absent: str
) -> None:
    check_hostile_values(engine, values, absent)


@pytest.mark.filterwarnings("ignore:.* match no rows of:UserWarning")  # hostile values match nothing
@pytest.mark.parametrize("engine", [pytest.param("spark", marks=SPARK_TIMEOUT)], indirect=True)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=HOSTILE_SCHEMES, absent=HOSTILE)
def test_hostile_values_on_spark(engine: Engine, values: list[str], absent: str) -> None:
    check_hostile_values(engine, values, absent)


def check_hostile_values(engine: Engine, values: list[str], absent: str) -> None:
    """Rows selected by hostile scheme values are exactly the equal ones; nothing else changes."""
    if engine.name == "postgres":  # PostgreSQL text cannot hold NUL (test_postgres_nul_is_a_clear_error)
        values = list(dict.fromkeys(v.replace("\x00", "") for v in values))
        absent = absent.replace("\x00", "")
    names = BASE_NAMES + [v for v in values if v not in BASE_NAMES]
    engine.create(
        "hostile",
        pa.table(
            {
                "name": pa.array(names, pa.string()),
                "v": pa.array(range(len(names)), pa.int64()),
                "y": pa.array([0.5] * len(names)),
            }
        ),
    )
    engine.create("canary", pa.table({"x": pa.array([42], pa.int64())}))
    scheme = values + ([absent] if absent not in values else [])
    before = engine.rows("SELECT name, v FROM hostile ORDER BY v")
    with DDBDataLoader(
        engine.source(),
        "SELECT name, v, y FROM hostile ORDER BY v",
        "y",
        batch_size=64,
        input_col="v",
        group_col="name",
        group_scheme=scheme,
        repartition_col="name",
        repartition_scheme=scheme,
    ) as loader:
        got = [int(v) for x, _ in loader for v in x[:, 0].tolist()]
    assert got == [i for value in scheme for i, name in enumerate(names) if name == value]
    assert engine.rows("SELECT name, v FROM hostile ORDER BY v") == before
    assert engine.rows("SELECT x FROM canary") == [(42,)]


def test_postgres_nul_is_a_clear_error(pg: PostgresEngine) -> None:
    pg.create("hostile", pa.table({"name": ["a"], "y": [0.5]}))
    with pytest.raises(ValueError, match="NUL"):
        DDBDataLoader(
            pg.source(),
            "SELECT name, y FROM hostile",
            "y",
            input_col="y",
            group_col="name",
            group_scheme=["a\x00; DROP TABLE hostile"],
        )
    assert pg.rows("SELECT name FROM hostile") == [("a",)]


# --- errors -------------------------------------------------------------------------------------


def _everything(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


def test_unknown_group_column_names_it(engine: Engine) -> None:
    engine.create("series", series_table([[3]]))
    with pytest.raises(Exception) as caught:
        DDBDataLoader(engine.source(), SERIES_SQL, "y", group_col="nosuch_col")
    # Refused before it reaches the engine: the key must be one of the query's result columns.
    assert isinstance(caught.value, ValueError)
    assert "by group_col 'nosuch_col'" in str(caught.value)
    assert "'nosuch_col' is not one of its result columns; select it" in str(caught.value)


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_permanent_fetch_error_names_subquery_and_parameters_without_retrying(engine: Engine) -> None:
    engine.create("series", series_table([[4, 4], [4]]))
    loader = DDBDataLoader(
        engine.source(),
        SERIES_SQL,
        "y",
        batch_size=2,
        group_col="gid",
        repartition_col="part",
        fetch_threads=1,
    )
    engine.execute("DROP TABLE series")
    started = time.monotonic()
    with loader, pytest.raises(Exception) as caught:
        list(loader)
    text = _everything(caught.value)
    assert "subquery" in text and "FROM series" in text
    assert "parameters [0, 0]" in text
    assert "gave up after" not in text and time.monotonic() - started < 5


# --- DuckDB: session settings of a passed connection --------------------------------------------


def test_duckdb_session_settings_reach_the_loader_cursors() -> None:
    """``CAST(ts AS DATE)`` of a TIMESTAMPTZ depends on TimeZone, a session setting that DuckDB
    cursors do not inherit: the loader's subqueries must split days as the user's connection does."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'America/New_York'")
    con.execute(
        "CREATE TABLE ticks AS SELECT TIMESTAMPTZ '2024-01-01 00:00:00+00' + INTERVAL (i) HOUR AS ts, "
        "i::DOUBLE AS v FROM range(72) r(i)"
    )
    days = con.execute(
        "SELECT CAST(ts AS DATE) AS day, count(*) FROM ticks GROUP BY day ORDER BY day"
    ).fetchall()
    assert len(days) == 4  # in New York; UTC would see 3 days of 24 hours
    sql = "SELECT ts, v FROM ticks ORDER BY ts"
    with DDBDataLoader(
        con, sql, "v", batch_size=72, input_col="v", repartition_col="CAST(ts AS DATE)"
    ) as loader:
        (group,) = loader.plan.groups
        assert [(p.repartition_value, p.rows) for p in group.partitions] == days
        ((x, _),) = list(loader)
    assert x[:, 0].tolist() == [float(i) for i in range(72)]
    con.close()


def test_duckdb_current_schema_reaches_the_loader_cursors() -> None:
    con = duckdb.connect()
    con.execute("CREATE SCHEMA mine; USE mine; CREATE TABLE t AS SELECT 1.5 AS v")
    with DDBDataLoader(con, "SELECT v FROM t", "v", input_col="v") as loader:  # unqualified: in 'mine'
        assert [y.item() for _, y in loader] == [1.5]
    con.close()


def test_a_duckdb_session_setting_that_cannot_carry_over_is_refused_by_name() -> None:
    con = duckdb.connect()
    con.execute("""CREATE SCHEMA "odd,name"; SET search_path = '"odd,name"'""")
    # DuckDB shows the current schema as odd,name, which SET schema cannot parse back
    with pytest.raises(
        ValueError, match=r"session setting schema = 'odd,name' cannot be set on the loader's"
    ):
        DDBDataLoader(con, "SELECT 1.5 AS v", "v")
    con.close()


# --- PostgreSQL: connections, retries, credentials ----------------------------------------------


def _pid(cursor: Any) -> int:
    return int(cursor.fetch("SELECT pg_backend_pid() AS pid", []).column("pid")[0].as_py())


def test_postgres_cursors_own_their_connections(pg: PostgresEngine) -> None:
    backend = ADBCBackend(pg.uri)
    cursors = [backend.cursor() for _ in range(3)]
    try:
        assert len({_pid(c) for c in cursors}) == 3
    finally:
        for cursor in cursors:
            cursor.close()
        backend.close()


def test_postgres_lost_connection_is_transient_and_a_new_cursor_reconnects(pg: PostgresEngine) -> None:
    import adbc_driver_manager

    backend = ADBCBackend(pg.uri)
    cursor = backend.cursor()
    first = _pid(cursor)
    pg.execute(f"SELECT pg_terminate_backend({first})")
    with pytest.raises(adbc_driver_manager.OperationalError) as caught:
        _pid(cursor)  # a backend runs a query once: the fetcher's retry loop decides what follows
    assert backend.is_transient(caught.value)
    cursor.close()
    fresh = backend.cursor()
    assert _pid(fresh) != first
    with pytest.raises(adbc_driver_manager.ProgrammingError) as caught:
        fresh.fetch("SELECT * FROM no_such_table", [])
    assert not backend.is_transient(caught.value)
    fresh.close()
    backend.close()


#: How long the server stays down in the restart test, and the retry budget that must cover it
#: on a loaded machine: waits of 0.2, 0.4, 0.8, ... s (capped at 30 s), about 90 s in all.
RESTART_DOWN_SECONDS = 2.0
RESTART_RETRIES = 10


@pytest.mark.timeout(300)
def test_postgres_restart_within_the_retry_budget_gives_an_exact_epoch(
    pg_server: pgserver.PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = pgserver.start()  # its own cluster: the restart must not disturb other tests' connections
    try:
        engine = PostgresEngine(server.uri)
        engine.create("series", series_table([[6] * 8 for _ in range(3)]))
        engine.admin.close()
        options: dict[str, Any] = {
            "target_col": "y",
            "input_col": ["f0"],
            "batch_size": 6,
            "group_col": "gid",
            "repartition_col": "part",
            "seed": 5,
            "shuffle": True,
            "prefetch_batch": 0,
            "prepartition_num": 1,
            "group_pool_size": 1,
            "fetch_threads": 1,
            "retries": RESTART_RETRIES,
            "retry_backoff": 0.2,
            "timeout": 200.0,
            # fetch units of two 6-row partitions (16-byte rows): fetches keep coming all epoch
            "fetch_bytes": 200,
        }
        expected = batches(DDBDataLoader(server.uri, SERIES_SQL, **options))
        outage: dict[str, float] = {}
        resumed = threading.Event()

        def resume() -> None:
            server.resume()
            outage["down"] = time.monotonic() - outage["halted"]
            resumed.set()

        got = []
        with (
            caplog.at_level("WARNING", logger="ddbloader"),
            DDBDataLoader(server.uri, SERIES_SQL, **options) as loader,
        ):
            for number, batch in enumerate(loader):
                got.append(batch)
                if number == 3:
                    server.halt()
                    outage["halted"] = time.monotonic()
                    threading.Timer(RESTART_DOWN_SECONDS, resume).start()
        assert resumed.wait(60), "the server did not come back"
        retried = [r for r in caplog.records if "retrying on a fresh cursor" in r.getMessage()]
        print(
            f"server down {outage['down']:.2f} s; {len(retried)} failed fetch attempts retried; "
            f"{len(got)} batches, equal to the uninterrupted run"
        )
        assert retried, "no fetch met the outage: the test did not test a restart"
        assert outage["down"] >= RESTART_DOWN_SECONDS
        assert_same(got, expected)
    finally:
        server.stop()


def test_postgres_loader_survives_killed_connections(pg: PostgresEngine) -> None:
    data = series_table(PARTS)
    pg.create("series", data)
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 4,
        "group_col": "gid",
        "repartition_col": "part",
        "seed": 3,
        "shuffle": True,
        "prefetch_batch": 0,
        "prepartition_num": 1,
        "group_pool_size": 1,
    }
    got = []
    with DDBDataLoader(pg.source(), SERIES_SQL, **options) as loader:
        for number, batch in enumerate(loader):
            got.append(batch)
            if number in (1, 4):
                pg.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
    assert_same(got, reference(SERIES_SQL, data, **options))


def test_postgres_interrupt_stops_a_running_query_without_retry(pg: PostgresEngine) -> None:
    backend = ADBCBackend(pg.uri)
    cursor = backend.cursor()
    _pid(cursor)  # connected
    timer = threading.Timer(0.3, cursor.interrupt)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        cursor.fetch("SELECT pg_sleep(20)", [])
    assert time.monotonic() - started < 5
    assert "cancel" in str(caught.value).lower()
    cursor.close()
    backend.close()


def test_postgres_passed_connection_is_cloned_and_left_open(pg: PostgresEngine) -> None:
    from adbc_driver_postgresql import dbapi

    pg.create("series", series_table([[5, 5]]))
    mine = dbapi.connect(pg.uri)
    with mine.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid() AS pid")
        my_pid = cursor.fetch_arrow_table().column("pid")[0].as_py()
    sql = "SELECT f0, y, pg_backend_pid() AS pid FROM series ORDER BY rid"
    with DDBDataLoader(mine, sql, "y", batch_size=10, input_col=["f0", "pid"]) as loader:
        ((x, _),) = list(loader)
    assert my_pid not in set(x[:, 1].tolist())
    with mine.cursor() as cursor:  # still open and usable
        cursor.execute("SELECT 1 AS one")
        assert cursor.fetch_arrow_table().column("one")[0].as_py() == 1
    mine.close()


def test_postgres_factory_is_accepted(pg: PostgresEngine) -> None:
    from adbc_driver_postgresql import dbapi

    pg.create("series", series_table([[3, 2]]))
    with DDBDataLoader(
        lambda: dbapi.connect(pg.uri), SERIES_SQL, "y", batch_size=5, input_col="f0"
    ) as loader:
        assert loader.plan.engine.startswith("PostgreSQL")
        ((x, _),) = list(loader)
    assert x[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_postgres_sessions_the_loader_opens_refuse_side_effecting_selects(pg: PostgresEngine) -> None:
    """The statement check sees a SELECT; the engine must refuse what the SELECT would write."""
    pg.create("series", series_table([[4, 4]]))
    pg.execute("CREATE SEQUENCE s")
    pg.execute(
        "CREATE FUNCTION purge() RETURNS double precision LANGUAGE plpgsql AS "
        "$$ BEGIN DELETE FROM series; RETURN 0; END $$"
    )
    from adbc_driver_postgresql import dbapi

    mine = dbapi.connect(pg.uri, autocommit=True)
    sources = {"URI": pg.uri, "ADBC connection (cloned)": mine, "factory": lambda: dbapi.connect(pg.uri)}
    for name, source in sources.items():
        for sql in (
            "SELECT setval('s', 5)::double precision AS v, y, gid FROM series",
            "SELECT purge() AS v, y, gid FROM series",
        ):
            with (
                pytest.raises(Exception, match="in a read-only transaction") as caught,
                DDBDataLoader(source, sql, "y", input_col="v", group_col="gid") as loader,
            ):
                list(loader)
            assert type(caught.value).__module__.startswith("adbc_driver"), name
        # A query may lift the session's read-only default for the queries after it, not for
        # itself; every query runs right after the switch, so this one never reaches setval().
        lifting = (
            "SELECT CASE WHEN current_setting('transaction_read_only') = 'on' "
            "THEN length(set_config('default_transaction_read_only', 'off', false))::float8 "
            "ELSE setval('s', 99)::float8 END AS v, y, gid FROM series"
        )
        with DDBDataLoader(source, lifting, "y", input_col="v", group_col="gid", fetch_threads=1) as loader:
            assert len(list(loader)) == 8
    assert pg.rows("SELECT last_value, is_called FROM s") == [(1, False)]
    assert pg.rows("SELECT count(*) FROM series") == [(8,)]
    with mine.cursor() as cursor:  # the user's own connection is left as it was: writable
        cursor.execute("SELECT setval('s', 7) AS v")
        assert cursor.fetch_arrow_table().column("v")[0].as_py() == 7
    mine.close()


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_credentials_never_appear(pg: PostgresEngine) -> None:
    pg.create("series", series_table([[3]]))
    with DDBDataLoader(pg.uri, SERIES_SQL, "y") as loader:
        assert pgserver.PASSWORD not in repr(loader)
        assert loader.plan.engine.startswith("postgresql (127.0.0.1:")
    wrong = pg.uri.replace(pgserver.PASSWORD, "not-the-password-xyz")
    with pytest.raises(Exception) as caught:
        DDBDataLoader(wrong, SERIES_SQL, "y")
    assert "not-the-password-xyz" not in _everything(caught.value)
    assert redact_uri(pg.uri) == pg.uri.replace(f"postgres:{pgserver.PASSWORD}@", "***@")


def test_redact_uri() -> None:
    assert redact_uri("postgresql://u:p%40ss@h:5/db?sslmode=require&password=x") == (
        "postgresql://***@h:5/db?sslmode=require&password=***"
    )
    assert redact_uri("dolphindb://admin:123456@127.0.0.1:8848") == "dolphindb://***@127.0.0.1:8848"
    assert redact_uri("postgresql://h/db") == "postgresql://h/db"


# --- DB-API fallback ----------------------------------------------------------------------------


def test_bind_parameters_for_every_paramstyle() -> None:
    sql = "SELECT a FROM t WHERE b = @2 AND c = @1 AND d LIKE '%x' UNION SELECT a FROM t WHERE b = @2"
    assert bind_parameters(sql, ["one", "two"], "sqlite", "qmark") == (
        "SELECT a FROM t WHERE b = ? AND c = ? AND d LIKE '%x' UNION SELECT a FROM t WHERE b = ?",
        ["two", "one", "two"],
    )
    assert bind_parameters(sql, ["one", "two"], "sqlite", "numeric")[0].count(":2") == 2
    text, named = bind_parameters(sql, ["one", "two"], "sqlite", "named")
    assert "c = :p1" in text and named == {"p1": "one", "p2": "two"}
    text, positional = bind_parameters(sql, ["one", "two"], "sqlite", "format")
    assert "b = %s" in text and "LIKE '%%x'" in text and positional == ["two", "one", "two"]
    text, named = bind_parameters(sql, ["one", "two"], "sqlite", "pyformat")
    assert "c = %(p1)s" in text and "LIKE '%%x'" in text
    assert bind_parameters("SELECT '%' AS p", [], "sqlite", "format") == ("SELECT '%' AS p", ())
    with pytest.raises(ValueError, match="paramstyle"):
        bind_parameters(sql, [1], "sqlite", "dollar")
    # A literal that looks like a marker stays a literal.
    text, _ = bind_parameters("SELECT 'ddbparam_1' AS a FROM t WHERE b = $1", [5], "postgres", "qmark")
    assert text == "SELECT 'ddbparam_1' AS a FROM t WHERE b = ?"


@pytest.mark.parametrize("paramstyle", ["qmark", "numeric", "named"])
def test_sqlite_runs_every_paramstyle_it_supports(tmp_path: Path, paramstyle: str) -> None:
    engine = SqliteEngine(tmp_path)
    engine.create("series", series_table([[3, 2], [4]]))
    backend = DBAPIBackend(engine.source(), paramstyle=paramstyle)
    with DDBDataLoader(
        backend, SERIES_SQL, "y", batch_size=9, input_col="f0", group_col="gid", repartition_col="part"
    ) as loader:
        rows = [v for x, _ in loader for v in x[:, 0].tolist()]
    assert rows == [0.0, 1.0, 2.0, 3.0, 4.0, 1e6, 1e6 + 1, 1e6 + 2, 1e6 + 3]
    engine.close()


def test_shared_dbapi_connection_is_serialised(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path)
    engine.create("series", series_table(PARTS))
    shared = sqlite3.connect(engine.path, check_same_thread=False)
    options: dict[str, Any] = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 7,
        "group_col": "gid",
        "repartition_col": "part",
        "fetch_threads": 3,
        "shuffle": True,
        "seed": 1,
    }
    with DDBDataLoader(shared, SERIES_SQL, **options) as loader:
        assert "shared connection" in loader.plan.engine
        got = list(loader)
    assert_same(got, reference(SERIES_SQL, series_table(PARTS), **options))
    assert shared.execute("SELECT COUNT(*) FROM series").fetchone() == (sum(map(sum, PARTS)),)  # left open
    shared.close()
    engine.close()


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_thread_bound_dbapi_connection_fails_with_a_hint(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path)
    engine.create("series", series_table([[3]]))
    bound = sqlite3.connect(engine.path)
    with DDBDataLoader(bound, SERIES_SQL, "y") as loader, pytest.raises(sqlite3.ProgrammingError) as caught:
        list(loader)
    assert "pass a factory" in _everything(caught.value)
    bound.close()
    engine.close()


def test_dbapi_schema_probe_types_columns_from_rows(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path)
    engine.create("series", series_table([[3]]))
    backend = DBAPIBackend(engine.source())
    cursor = backend.cursor()
    table = cursor.fetch("SELECT * FROM (SELECT pos, f0, 'x' AS s FROM series) AS q LIMIT 0", [])
    assert table.num_rows == 0
    assert table.schema.types == [pa.int64(), pa.float64(), pa.string()]
    cursor.close()
    backend.close()
    engine.close()


def test_dbapi_mixed_types_name_the_column(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path)
    engine.execute("CREATE TABLE mixed (v, y REAL)")
    engine.execute("INSERT INTO mixed VALUES (1, 0.5), ('text', 1.5)")
    backend = DBAPIBackend(engine.source())
    cursor = backend.cursor()
    with pytest.raises(TypeError, match="column 'v'"):
        cursor.fetch("SELECT v, y FROM mixed", [])
    cursor.close()
    backend.close()
    engine.close()


# --- connect() ----------------------------------------------------------------------------------


def test_connect_recognises_every_source(tmp_path: Path) -> None:
    made: list[duckdb.DuckDBPyConnection] = []

    def duck_factory() -> duckdb.DuckDBPyConnection:
        made.append(duckdb.connect())
        return made[-1]

    backend = connect(duck_factory)
    assert backend.dialect == "duckdb"
    assert backend.cursor().fetch("SELECT 41 + $1 AS v", [1]).column("v")[0].as_py() == 42
    backend.close()
    with pytest.raises(duckdb.ConnectionException):
        made[0].execute("SELECT 1")  # the factory's connection is the backend's to close
    engine = SqliteEngine(tmp_path)
    assert isinstance(connect(engine.source()), DBAPIBackend)
    assert isinstance(connect(None), DuckDBBackend)
    dolphin = connect("dolphindb://admin:123456@127.0.0.1:8848")
    assert isinstance(dolphin, DolphinDBBackend) and "123456" not in dolphin.engine
    with pytest.raises(TypeError, match="source must be"):
        connect(42)
    with pytest.raises(TypeError, match="factory returned"):
        connect(lambda: 42)
    engine.close()


def test_unknown_dbapi_driver_asks_for_dialect() -> None:
    class Connection:
        def cursor(self) -> None: ...
        def commit(self) -> None: ...
        def close(self) -> None: ...

    with pytest.raises(TypeError, match="dialect"):
        connect(Connection())
    backend = DBAPIBackend(Connection(), dialect="postgres", paramstyle="format")
    assert (backend.dialect, backend.paramstyle) == ("postgres", "format")


def test_sqlite_connections_from_a_factory_are_query_only(tmp_path: Path) -> None:
    """SQLite has no side-effecting SQL function, but a function the application registers can
    write: on the loader's connections the engine refuses it."""
    engine = SqliteEngine(tmp_path)
    engine.create("series", series_table([[3, 3]]))
    engine.execute("CREATE TABLE log (n INTEGER)")

    def connect_with_a_writing_function() -> sqlite3.Connection:
        connection = sqlite3.connect(engine.path)

        def note() -> float:
            connection.execute("INSERT INTO log VALUES (1)")
            return 0.0

        connection.create_function("note", 0, note)
        return connection

    backend = DBAPIBackend(connect_with_a_writing_function)
    cursor = backend.cursor()
    assert cursor.fetch("SELECT query_only FROM pragma_query_only", []).to_pylist() == [{"query_only": 1}]
    cursor.close()
    backend.close()
    sql = "SELECT note() AS v, y FROM series"
    with (
        pytest.raises(sqlite3.OperationalError, match="user-defined function raised exception"),
        DDBDataLoader(connect_with_a_writing_function, sql, "y", input_col="v", group_col="gid") as loader,
    ):
        list(loader)
    assert engine.rows("SELECT count(*) FROM log") == [(0,)]
    engine.close()


def test_duckdb_paths_are_opened_read_only(tmp_path: Path) -> None:
    path = tmp_path / "seq.duckdb"
    with duckdb.connect(str(path)) as writer:
        writer.execute("CREATE SEQUENCE s; CREATE TABLE t AS SELECT range::DOUBLE AS y FROM range(4)")
    sql = "SELECT nextval('s')::DOUBLE AS v, y FROM t"
    with (
        pytest.raises(duckdb.InvalidInputException, match="read-only mode"),
        DDBDataLoader(str(path), sql, "y", input_col="v", group_col="y") as loader,
    ):
        list(loader)
    with duckdb.connect(str(path)) as writer:
        assert writer.execute("SELECT nextval('s')").fetchall() == [(1,)]  # never advanced


def test_dbapi_interrupt_stops_a_running_query(tmp_path: Path) -> None:
    engine = SqliteEngine(tmp_path)
    backend = DBAPIBackend(engine.source())
    cursor = backend.cursor()
    timer = threading.Timer(0.3, cursor.interrupt)
    timer.start()
    started = time.monotonic()
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) AS m FROM n"
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        cursor.fetch(endless, [])
    assert time.monotonic() - started < 5
    cursor.close()
    backend.close()
    engine.close()


# --- DuckDB buffer pool ---------------------------------------------------------------------------


def _memory_limit(connection: duckdb.DuckDBPyConnection) -> str:
    ((limit,),) = connection.sql("SELECT current_setting('memory_limit')").fetchall()
    return str(limit)


def test_a_duckdb_database_the_loader_opens_has_a_capped_buffer_pool(tmp_path: Path) -> None:
    path = tmp_path / "capped.duckdb"
    with duckdb.connect(str(path)) as writer:
        writer.execute("CREATE TABLE t AS SELECT range AS y FROM range(10)")
    uncapped = duckdb.connect()
    default = _memory_limit(uncapped)
    uncapped.close()
    capped = DuckDBBackend(str(path))
    try:
        assert _memory_limit(capped._connection) == "244.1 MiB"  # 256 MB
        # the same file opened again in this process shares the instance, and its cap
        with duckdb.connect(str(path), read_only=True) as again:
            assert _memory_limit(again) == "244.1 MiB"
    finally:
        capped.close()
    for backend in (DuckDBBackend(str(path), memory_limit=None), DuckDBBackend(None, memory_limit="1GB")):
        assert _memory_limit(backend._connection) in {default, "953.6 MiB"}
        backend.close()
    mine = duckdb.connect()
    DuckDBBackend(mine).close()
    assert _memory_limit(mine) == default  # a connection passed in keeps its settings
    mine.close()


# --- DuckDB errors that point the way -------------------------------------------------------------


def test_a_path_this_process_holds_read_write_says_to_pass_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "held.duckdb"
    with duckdb.connect(str(path)) as writer:
        make_series(writer, [[4]])
        with pytest.raises(duckdb.ConnectionException, match="pass that connection as source instead"):
            DDBDataLoader(str(path), SERIES_SQL, "y")
        with DDBDataLoader(writer, SERIES_SQL, "y", exclude_col="y") as loader:
            assert len(loader) == 4


def notes_of(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


def test_the_temp_table_hint_comes_only_with_a_missing_table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TEMP TABLE scratch AS SELECT 1.0 AS y")
    with pytest.raises(duckdb.CatalogException, match="scratch") as missing:
        DDBDataLoader(con, "SELECT y FROM scratch", "y")
    assert any("TEMP tables" in note for note in notes_of(missing.value))
    con.execute("CREATE TABLE t AS SELECT 1.0 AS y")
    with pytest.raises(duckdb.CatalogException, match="no_such_function") as other:
        DDBDataLoader(con, "SELECT no_such_function(y) AS y FROM t", "y")
    assert not any("TEMP tables" in note for note in notes_of(other.value))


def test_duckdb_variables_reach_the_loader_cursors_with_their_types() -> None:
    # getvariable() was NULL in the loader's cursors: the feature was NaN in every row.
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i % 4 AS g, i::DOUBLE AS y FROM range(40) r(i)")
    con.execute("SET VARIABLE scale = 2.5::DECIMAL(4, 1)")
    con.execute("SET VARIABLE t0 = make_timestamp_ns(1500)")
    sql = "SELECT g, y, y * getvariable('scale') AS v, epoch_ns(getvariable('t0')) AS n FROM t ORDER BY y"
    with DDBDataLoader(con, sql, "y", input_col=["v", "n"], group_col="g", batch_size=40) as loader:
        ((x, y),) = list(loader)
    assert x[:, 0].tolist() == [v * 2.5 for v in y[:, 0].tolist()]
    assert set(x[:, 1].tolist()) == {1500.0}  # nanoseconds: the variable kept its type
    con.close()


def test_loaders_built_from_several_threads_on_one_duckdb_connection() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i % 4 AS g, i::DOUBLE AS y FROM range(400) r(i)")
    con.execute("SET threads = 2")  # a setting every loader copies from the connection
    errors: list[BaseException] = []
    rows: list[int] = []

    def build() -> None:
        try:
            for _ in range(3):
                with DDBDataLoader(
                    con, "SELECT g, y FROM t ORDER BY y", "y", input_col=["g"], group_col="g", batch_size=64
                ) as loader:
                    rows.append(sum(len(x) for x, _ in loader))
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    assert rows == [400] * 12
    con.close()


def test_a_passed_postgres_connection_keeps_its_session_for_every_loader_cursor(pg: PostgresEngine) -> None:
    # Cloned into fresh sessions, the loader read a stale `public.ticks` and UTC days.
    pg.execute("DROP SCHEMA IF EXISTS fresh CASCADE")
    pg.execute("CREATE SCHEMA fresh")
    pg.execute("DROP TABLE IF EXISTS public.ticks")
    pg.execute("CREATE TABLE public.ticks AS SELECT now() AS ts, -1.0::float8 AS v")
    pg.execute(
        "CREATE TABLE fresh.ticks AS SELECT "
        "TIMESTAMPTZ '2024-01-01 00:00:00+00' + i * INTERVAL '1 hour' AS ts, i::float8 AS v "
        "FROM generate_series(0, 71) i"
    )
    pg.execute("DROP ROLE IF EXISTS ddb_reader")
    pg.execute("CREATE ROLE ddb_reader")
    pg.execute("GRANT USAGE ON SCHEMA fresh TO ddb_reader")
    pg.execute("GRANT SELECT ON fresh.ticks TO ddb_reader")
    from adbc_driver_postgresql import dbapi

    mine = dbapi.connect(pg.uri, autocommit=True)
    with mine.cursor() as cursor:
        for statement in (
            "SET search_path = fresh",
            "SET TimeZone = 'America/New_York'",
            "SET ROLE ddb_reader",
        ):
            cursor.execute(statement)
    sql = "SELECT ts, v, current_user::text AS who FROM ticks ORDER BY ts"
    try:
        with DDBDataLoader(
            mine,
            sql,
            "v",
            input_col=["v"],
            repartition_col="CAST(ts AS DATE)",
            batch_size=72,
            fetch_threads=2,
        ) as loader:
            (group,) = loader.plan.groups
            assert [p.rows for p in group.partitions] == [5, 24, 24, 19]  # New York days, not UTC's 3
            ((x, _),) = list(loader)
            partition = group.partitions[0]
            backend = connect(mine)
            cursor = backend.cursor()
            assert set(cursor.fetch(partition.sql, partition.params).column("who").to_pylist()) == {
                "ddb_reader"
            }
            cursor.close()
            backend.close()
        assert x[:, 0].tolist() == [float(i) for i in range(72)]
        with mine.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS a")
        with pytest.raises(ValueError, match=r"holds temporary relations \['scratch'\]"):
            DDBDataLoader(mine, sql, "v", input_col=["v"])
    finally:
        with mine.cursor() as cursor:
            # scratch belongs to ddb_reader, and the server drops a closed session's temporary
            # tables after the close returns: DROP ROLE below once raced it (SQLSTATE 2BP01)
            cursor.execute("DROP TABLE IF EXISTS pg_temp.scratch")
        mine.close()
        pg.execute("DROP SCHEMA fresh CASCADE")
        pg.execute("DROP TABLE public.ticks")
        pg.execute("DROP ROLE ddb_reader")
