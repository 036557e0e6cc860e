"""The ClickHouse (chDB) backend's own behaviour: URIs, read-only connections, passed connections.

The backend contract runs in tests/test_backends.py with ``clickhouse`` among its engines. chDB
holds one database per process, so every test here uses the run's one (``chdb_uri``).
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from test_backends import SERIES_SQL, ClickHouseEngine, series_table

from ddbloader import DDBDataLoader
from ddbloader.backends import ADBCBackend, ClickHouseBackend, connect

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def clickhouse(chdb_uri: str) -> Iterator[ClickHouseEngine]:
    made = ClickHouseEngine(chdb_uri)
    yield made
    made.close()


def test_connect_takes_a_chdb_uri_or_an_adbc_connection(clickhouse: ClickHouseEngine) -> None:
    backend = connect(clickhouse.uri)
    assert isinstance(backend, ClickHouseBackend) and backend.dialect == "clickhouse"
    assert backend.engine == f"chdb ({clickhouse.uri.removeprefix('chdb://')})"
    # parameters as sqlglot renders them for ClickHouse (@1), bound by the driver
    cursor = backend.cursor()
    assert cursor.fetch("SELECT 41 + @1 AS v", [1]).column("v").to_pylist() == [42]
    cursor.close()
    backend.close()
    passed = connect(clickhouse.admin)  # cloned per cursor, dialect from the vendor
    assert isinstance(passed, ADBCBackend) and passed.dialect == "clickhouse"
    passed.close()
    assert clickhouse.rows("SELECT 1 AS one") == [(1,)]  # the user's connection is left open
    with pytest.raises(ValueError, match="chdb://"):
        ClickHouseBackend("postgresql://u:pw@h/db")


@pytest.mark.multiprocess
def test_a_uri_backend_keeps_chdb_s_server_up_between_its_cursors() -> None:
    # chDB stops its server when the process's last connection closes: an in-memory table made
    # through one connection is gone by the next unless the backend holds one of its own. In a
    # fresh process, since this one's chDB is bound to the run's database path.
    probe = textwrap.dedent(
        """
        from ddbloader.backends import ClickHouseBackend
        backend = ClickHouseBackend("chdb://")
        writer = backend.open()
        with writer.cursor() as cursor:
            cursor.execute("CREATE TABLE kept (v Int32) ENGINE = Memory")
            cursor.execute("INSERT INTO kept VALUES (1), (2), (3)")
        writer.close()
        reader = backend.cursor()
        print(reader.fetch("SELECT count() AS n FROM kept", []).column("n").to_pylist())
        reader.close()
        backend.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[3]"


def _open_in_child(uri: str, report: Any) -> None:
    try:
        ClickHouseBackend(uri).close()
        report.put("opened")
    except Exception as error:
        report.put(f"{type(error).__name__}: {error}")


@pytest.mark.multiprocess
def test_a_process_forked_after_chdb_opened_is_refused_not_hung(clickhouse: ClickHouseEngine) -> None:
    # a DataLoader worker under fork: chDB's state without its threads hangs at the first query
    backend = connect(clickhouse.uri)
    fork = multiprocessing.get_context("fork")
    report = fork.Queue()
    child = fork.Process(target=_open_in_child, args=(clickhouse.uri, report))
    child.start()
    message = report.get(timeout=60)
    child.join(timeout=60)
    backend.close()
    assert message.startswith("RuntimeError: this process was forked from one that opened chDB")
    assert "num_workers=0" in message


@pytest.mark.parametrize("passed", [False, True], ids=["uri", "connection"])
def test_the_loader_s_connections_refuse_writes_and_cannot_lift_it(
    clickhouse: ClickHouseEngine, passed: bool
) -> None:
    clickhouse.create("series", series_table([[3, 3]]))
    source = clickhouse.admin if passed else clickhouse.uri
    backend = connect(source)
    cursor = backend.cursor()
    for statement in (
        "INSERT INTO series SELECT * FROM series",
        "SELECT 1 AS one SETTINGS readonly = 0",
        "SET readonly = 0",
    ):
        with pytest.raises(Exception, match="READONLY"):
            cursor.fetch(statement, [])
    # the query's own SETTINGS clause still works (readonly = 2, not 1)
    assert cursor.fetch("SELECT 1 AS one SETTINGS max_threads = 1", []).num_rows == 1
    cursor.close()
    backend.close()
    assert clickhouse.rows("SELECT count() FROM series") == [(6,)]
    clickhouse.execute("INSERT INTO series SELECT * FROM series LIMIT 1")  # the user's: still writable
    assert clickhouse.rows("SELECT count() FROM series") == [(7,)]


def test_low_cardinality_and_nullable_columns_load(clickhouse: ClickHouseEngine) -> None:
    clickhouse.execute("DROP TABLE IF EXISTS lc")
    clickhouse.tables.add("lc")
    clickhouse.execute(
        "CREATE TABLE lc (sym LowCardinality(String), v Nullable(Int32), y Float64) "
        "ENGINE = MergeTree ORDER BY tuple()"
    )
    with clickhouse.admin.cursor() as cursor:
        data = {"sym": ["a", "b", "a"], "v": pa.array([1, None, 3], pa.int32()), "y": [0.5, 1.5, 2.5]}
        cursor.adbc_ingest("lc", pa.table(data), mode="append")
    sql = "SELECT sym, v, y FROM lc ORDER BY y"
    with DDBDataLoader(clickhouse.uri, sql, "y", batch_size=3, input_col="v", group_col="sym") as loader:
        assert [g.value for g in loader.plan.groups] == ["a", "b"]
        ((x, _),) = list(loader)
    assert x[:, 0].tolist()[:2] == [1.0, 3.0]  # group a first; v has a NULL, so floating with NaN


def test_a_fetch_unit_is_one_query(clickhouse: ClickHouseEngine) -> None:
    clickhouse.create("series", series_table([[5, 5], [4]]))
    options = {"input_col": ["f0"], "group_col": "gid", "repartition_col": "part", "batch_size": 4}
    with DDBDataLoader(clickhouse.uri, SERIES_SQL, "y", **options) as loader:
        rows = sum(x.shape[0] for x, _ in loader)
        stats = loader.stats()
    assert rows == 14 and (stats.queries, stats.partitions_fetched) == (1, 3)


def test_a_float_group_key_holding_both_zeros_is_refused_or_read_once(clickhouse: ClickHouseEngine) -> None:
    ids = list(range(60))
    clickhouse.create("zeros", pa.table({"id": ids, "x": [-0.0, 0.0, 1.0] * 20, "y": [i + 0.5 for i in ids]}))
    sql = "SELECT x, id, y FROM zeros ORDER BY id"
    with pytest.raises(ValueError, match=r"group_col 'x' holds both -0.0 and 0.0.*x \+ 0.0"):
        DDBDataLoader(clickhouse.uri, sql, "y", input_col=["id"], group_col="x")
    # the fix the message names: one group of 40 rows and one of 20, each row served once
    with DDBDataLoader(
        clickhouse.uri, sql, "y", input_col=["id"], group_col="x + 0.0", batch_size=7
    ) as loader:
        served = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
    assert served == ids


@pytest.mark.parametrize("passed", [False, True])
def test_interrupt_leaves_a_streamed_read_to_finish(clickhouse: ClickHouseEngine, passed: bool) -> None:
    """A cancel from the closing thread raced the reading thread's close of the result and could
    hang it and stop chDB's server, so ``interrupt()`` leaves chDB's query running: the reader
    still delivers every row (a cancel ends it with "query cancelled")."""
    backend = connect(clickhouse.admin if passed else clickhouse.uri)
    cursor = backend.cursor()
    try:
        tables = cursor.batches("SELECT number FROM numbers(3000000)", [], 65536)
        rows = next(tables).num_rows
        interrupter = threading.Thread(target=cursor.interrupt)
        interrupter.start()
        interrupter.join(10)
        rows += sum(table.num_rows for table in tables)
    finally:
        cursor.close()
        backend.close()
    assert rows == 3_000_000
