"""Shared fixtures (real DuckDB tables whose values encode where each row came from), the test tiers
(markers given by what a test uses) and the Hypothesis profiles."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import random
import signal
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pgserver
import pyarrow as pa
import pytest
import servers
import sparkserver
from hypothesis import settings

from ddbloader import DDBDataLoader
from ddbloader._io.streams import read_batches
from ddbloader.backends import Backend, Cursor, DuckDBBackend

# --- Hypothesis profiles ---------------------------------------------------------------------------
# "dev" (the default) keeps a property test to a few dozen examples; "ci" (HYPOTHESIS_PROFILE=ci, or
# any CI environment) runs each as deep as it asks. A test's own max_examples would override either
# profile, so the deep tests ask through examples().
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=2_000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def examples(deep: int) -> int:
    """A property test's ``max_examples``: ``deep`` under the "ci" profile, at most the loaded
    profile's ``max_examples`` (50 under "dev")."""
    return min(deep, settings.default.max_examples)


# --- test tiers ------------------------------------------------------------------------------------
# Markers (registered in pyproject.toml) are given here by what a test uses, so a new test is tiered
# without a decorator: a server fixture, an engine parameter that names a server, or its module. Tests
# that start processes or run long carry @pytest.mark.multiprocess / @pytest.mark.slow themselves.

#: Session fixtures that start a server, and the engine parameters whose fixtures request one.
SERVER_FIXTURES = frozenset({"pg_server", "spark_server", "flight_sql_uri"})
SERVER_ENGINES = frozenset({"postgres", "spark", "flightsql"})
#: Modules whose every test is of a tier.
MODULE_MARKERS: dict[str, tuple[str, ...]] = {
    "test_notebooks": ("notebook", "multiprocess", "slow"),
    "test_frameworks": ("framework", "multiprocess", "slow"),
    "test_main": ("multiprocess",),  # runs `python -m ddbloader`
    "test_docs": ("multiprocess", "slow"),  # runs README's and the site's blocks as scripts
    "test_benchmarks": ("multiprocess", "slow"),  # every benchmark's --smoke run
    "test_modes": ("framework",),  # imports JAX and TensorFlow, trains with Keras
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params: dict[str, object] = getattr(getattr(item, "callspec", None), "params", {})
        # an engine parameter (not a "dialect": SQL text rules, no server) that names a server
        engines = {value for key, value in params.items() if key != "dialect" and isinstance(value, str)}
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())) or engines & SERVER_ENGINES:
            item.add_marker(pytest.mark.server)
        for name in MODULE_MARKERS.get(item.path.stem, ()):
            item.add_marker(name)


SERIES_SQL = "SELECT gid, part, pos, rid, f0, f1, y FROM series ORDER BY gid, part, pos"


def make_series(
    con: duckdb.DuckDBPyConnection, parts: Sequence[Sequence[int]], table: str = "series"
) -> None:
    """Create ``table``: group g has partitions with ``parts[g][p]`` rows each.

    Columns: gid INTEGER, part INTEGER, pos BIGINT (row number within the group), rid BIGINT
    (globally unique, ``gid * 1_000_000 + pos``), f0 DOUBLE = rid, f1 DOUBLE = -rid,
    y DOUBLE = rid + 0.5. So x[..., f0] names the rows a sample holds.
    """
    gids: list[int] = []
    part_ids: list[int] = []
    positions: list[int] = []
    for gid, sizes in enumerate(parts):
        pos = 0
        for part, size in enumerate(sizes):
            gids += [gid] * size
            part_ids += [part] * size
            positions += list(range(pos, pos + size))
            pos += size
    rid = [g * 1_000_000 + p for g, p in zip(gids, positions, strict=True)]
    data = pa.table(  # noqa: F841 -- read by name by DuckDB's replacement scan below
        {
            "gid": pa.array(gids, pa.int32()),
            "part": pa.array(part_ids, pa.int32()),
            "pos": pa.array(positions, pa.int64()),
            "rid": pa.array(rid, pa.int64()),
            "f0": pa.array([float(r) for r in rid], pa.float64()),
            "f1": pa.array([-float(r) for r in rid], pa.float64()),
            "y": pa.array([r + 0.5 for r in rid], pa.float64()),
        }
    )
    con.execute(f"DROP TABLE IF EXISTS {table}")
    con.execute(f"CREATE TABLE {table} AS SELECT * FROM data")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.PostgresServer]:
    """One throwaway PostgreSQL server for the session (tests/pgserver.py)."""
    try:
        import adbc_driver_postgresql  # noqa: F401
    except ImportError:
        pgserver.unavailable("adbc-driver-postgresql is not installed (pip install 'ddbloader[postgres]')")
    server = pgserver.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_server() -> Iterator[sparkserver.SparkServer]:
    """One Spark Connect server for the whole run (started on first use: 10-20 s, ~2 GB)."""
    server = sparkserver.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chdb_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The one chDB database of the run: chDB opens one storage path per process.

    A connection held for the whole run keeps chDB's embedded server up between tests (it stops
    when its last connection closes), so the run starts it once, as a user's process would.
    """
    _require("adbc_driver_chdb", "chdb is not installed (pip install 'ddbloader[clickhouse]')", "ClickHouse")
    from adbc_driver_chdb import dbapi

    uri = f"chdb://{tmp_path_factory.mktemp('chdb')}"
    keeper = dbapi.connect(uri)
    yield uri
    keeper.close()


@pytest.fixture(scope="session")
def flight_sql_uri() -> Iterator[str]:
    """A Sail Flight SQL server in this process (127.0.0.1, a free port) for the whole run."""
    _require("adbc_driver_flightsql", "adbc-driver-flightsql is not installed", "Flight SQL")
    _require("pysail", "pysail (the Flight SQL test server) is not installed", "Flight SQL")
    from pysail.flight import FlightSqlServer

    server = FlightSqlServer("127.0.0.1", 0)
    server.start(background=True)
    host, port = server.listening_address
    yield f"grpc://{host}:{port}"
    server.stop()


def _require(module: str, reason: str, engine: str) -> None:
    if importlib.util.find_spec(module) is None:
        servers.unavailable(reason, engine, "pyproject.toml's dev extra")


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    yield connection
    connection.close()


class TableEngine:
    """A real engine holding the table ``t``: its name, the source a loader takes, and ``run``,
    which runs a query whole and returns its first column."""

    def __init__(self, name: str, source: Any, run: Callable[[str], list[Any]]) -> None:
        self.name = name
        self.source = source
        self.run = run


ENGINES = ["duckdb", "postgres", "sqlite"]


@contextlib.contextmanager
def table_engine(
    request: pytest.FixtureRequest, tmp_path: Path, name: str, data: pa.Table
) -> Iterator[TableEngine]:
    """``data`` as the table ``t`` of a real engine ``name`` (one of :data:`ENGINES`; PostgreSQL
    through the session's ``pg_server``), dropped afterwards. Integer columns are INTEGER in
    SQLite, the others REAL."""
    if name == "duckdb":
        con = duckdb.connect()
        con.register("_incoming", data)
        con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
        yield TableEngine("duckdb", con, lambda sql: [r[0] for r in con.execute(sql).fetchall()])
        con.close()
    elif name == "sqlite":
        path = str(tmp_path / "t.sqlite")
        admin = sqlite3.connect(path)
        columns = ", ".join(
            f"{field.name} {'INTEGER' if pa.types.is_integer(field.type) else 'REAL'}"
            for field in data.schema
        )
        admin.execute(f"CREATE TABLE t ({columns})")
        marks = ", ".join("?" * data.num_columns)
        admin.executemany(f"INSERT INTO t VALUES ({marks})", [tuple(r.values()) for r in data.to_pylist()])
        admin.commit()
        yield TableEngine(
            "sqlite", functools.partial(sqlite3.connect, path), lambda sql: [r[0] for r in admin.execute(sql)]
        )
        admin.close()
    else:
        server: pgserver.PostgresServer = request.getfixturevalue("pg_server")
        from adbc_driver_postgresql import dbapi

        admin = dbapi.connect(server.uri, autocommit=True)
        with admin.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS t")
            cursor.adbc_ingest("t", data, mode="create")

        def run(sql: str) -> list[Any]:
            with admin.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetch_arrow_table().column(0).to_pylist())

        yield TableEngine("postgres", server.uri, run)
        with admin.cursor() as cursor:
            cursor.execute("DROP TABLE t")
        admin.close()


def series_file(path: Path, parts: Sequence[Sequence[int]]) -> Path:
    """Write a DuckDB file at ``path`` holding ``make_series(parts)``'s ``series`` table."""
    with duckdb.connect(str(path)) as writer:
        make_series(writer, parts)
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    """A DuckDB file holding the ``series`` table of :func:`series` (for loaders that open a path)."""
    return str(series_file(tmp_path / "series.duckdb", [[10, 7, 12], [15, 6], [8, 9, 11, 10]]))


@pytest.fixture
def series(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Three groups of 3, 2 and 4 partitions with uneven sizes (6..15 rows)."""
    make_series(con, [[10, 7, 12], [15, 6], [8, 9, 11, 10]])
    return con


class _FaultyCursor:
    def __init__(self, inner: Cursor, backend: FaultyBackend) -> None:
        self._inner = inner
        self._backend = backend

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        self._backend.before_fetch(sql, params)
        return self._inner.fetch(sql, params)

    def batches(self, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
        """A streamed subquery's query: one fetch for the faults, read through the inner reader."""
        self._backend.before_fetch(sql, params)
        return read_batches(self._inner, sql, params, rows)

    def interrupt(self) -> None:
        self._inner.interrupt()

    def close(self) -> None:
        self._inner.close()


class FaultyBackend:
    """A real DuckDB backend with faults injected before chosen partition fetches.

    ``fail_on``: partition-fetch numbers (1-based, counted across threads) that raise ``error``.
    ``jitter``: maximum random sleep in seconds before every partition fetch.
    ``hang_on``: partition-fetch numbers that sleep ``hang_seconds`` first.
    Count, schema and discovery queries (planning) pass untouched.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        fail_on: Sequence[int] = (),
        error: Callable[[], BaseException] = lambda: OSError("injected fault"),
        jitter: float = 0.0,
        hang_on: Sequence[int] = (),
        hang_seconds: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._inner = inner
        self.dialect = inner.dialect
        self.engine = inner.engine
        self.fail_on = set(fail_on)
        self.error = error
        self.jitter = jitter
        self.hang_on = set(hang_on)
        self.hang_seconds = hang_seconds
        self.fetches = 0
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.planning = True

    def before_fetch(self, sql: str, params: Sequence[Any]) -> None:
        if self.planning:
            return
        with self._lock:
            self.fetches += 1
            number = self.fetches
            delay = self._random.uniform(0, self.jitter) if self.jitter else 0.0
        if number in self.hang_on:
            time.sleep(self.hang_seconds)
        if delay:
            time.sleep(delay)
        if number in self.fail_on:
            raise self.error()

    def cursor(self) -> _FaultyCursor:
        return _FaultyCursor(self._inner.cursor(), self)

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def faulty() -> Callable[..., FaultyBackend]:
    """``faulty(con, **faults)`` wraps a connection; flip ``.planning = False`` after building."""

    def make(connection: duckdb.DuckDBPyConnection, **faults: Any) -> FaultyBackend:
        return FaultyBackend(DuckDBBackend(connection), **faults)

    return make


def assert_units_split_as_read_alone(loader: DDBDataLoader, units: Sequence[Any]) -> None:
    """Each fetch unit's result, split, gives every cell the very rows (``key_col`` ``id``, x, y),
    in the very order, of the cell's own query read alone."""
    import numpy as np

    from ddbloader._io.reader import fetch_partition
    from ddbloader._io.unit_split import unit_blocks

    assert loader._backend is not None
    cursor = loader._backend.cursor()
    try:
        for unit in units:
            split = unit_blocks(cursor.fetch(unit.sql, unit.params), unit, loader.plan.layout)
            assert split is not None and split.specs == unit.cells
            for n, spec in enumerate(split.specs):
                alone = fetch_partition(cursor, unit.read_alone(spec), loader.plan.layout)
                got = split.block(n)
                assert got.keys is not None and alone.keys is not None
                assert got.keys["id"].tolist() == alone.keys["id"].tolist()
                assert np.array_equal(got.x, alone.x) and np.array_equal(got.y, alone.y)
    finally:
        cursor.close()


def wait_until(condition: Callable[[], bool], seconds: float = 5.0, poll: float = 0.005) -> bool:
    """True once ``condition()`` holds, False if it still does not after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def warnings_containing(text: str, action: Callable[[], object]) -> list[str]:
    """The messages of the warnings ``action`` raises that contain ``text``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [str(w.message) for w in caught if text in str(w.message)]


def live_threads() -> list[str]:
    """Names of ddbloader's threads still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith("ddbloader")]


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here rather than in tests/reliability/: pytest reads this hook only from initial conftests.
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the long reliability soak variants (tests/reliability): more cycles, bigger tables",
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # `timeout`, CI runners and IDEs stop a run with SIGTERM, whose default action ends the process
    # at once: the session's PostgreSQL and Spark servers would outlive it. As an interrupt, pytest
    # stops the run and tears the fixtures down (servers stopped, temporary directories removed).
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _interrupt)


def series_loader(source: Any, **kwargs: Any) -> DDBDataLoader:
    """A loader over ``series`` (see :func:`make_series`): x = f0, f1; y; grouped by gid,
    repartitioned by part, batches of 8; ``kwargs`` add or override arguments."""
    arguments: dict[str, Any] = {
        "batch_size": 8,
        "input_col": ["f0", "f1"],
        "group_col": "gid",
        "repartition_col": "part",
    }
    arguments.update(kwargs)
    return DDBDataLoader(source, SERIES_SQL, "y", **arguments)
