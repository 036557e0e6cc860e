"""Faults injected in the real fetch path: transient errors retried with nothing lost, permanent
errors surfacing whole, hangs turning into TimeoutError, dead connections reopened."""

from __future__ import annotations

import logging
import re
import sqlite3
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from conftest import SERIES_SQL, FaultyBackend, make_series, series_file
from reliability_support import (
    BreakingBackend,
    as_bytes,
    delivered_windows,
    expected_windows,
    settle,
)

from ddbloader import DDBDataLoader
from ddbloader.backends import DuckDBBackend, connect

pytestmark = pytest.mark.timeout(60)

#: 4 groups, 12 partitions of 4..15 rows; windows of 3 x rows and 2 y rows, stride 2: span 5.
PARTS = [[10, 7, 12], [15, 6], [8, 9, 11, 10], [5, 4, 6]]
PARTITIONS = sum(len(p) for p in PARTS)
WINDOW = {"window_size": [3, 2], "window_stride": 2}
SPAN, STRIDE, OFFSET = 5, 2, 3
EXPECTED = expected_windows(PARTS, SPAN, STRIDE)


class EngineBusy(Exception):
    """An engine error that only the backend knows to be transient."""


class TransientFaulty(FaultyBackend):
    """FaultyBackend that declares :class:`EngineBusy` transient through ``is_transient``."""

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        return isinstance(error, EngineBusy)


@pytest.fixture
def table(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    make_series(con, PARTS)
    return con


def loader_over(source: Any, **kwargs: Any) -> DDBDataLoader:
    arguments: dict[str, Any] = {
        "batch_size": 4,
        "input_col": ["f0", "f1"],
        "group_col": "gid",
        "repartition_col": "part",
        "seed": 11,
        "shuffle": True,
        "group_pool_size": 2,
        "timeout": 10.0,
        # one query per partition: faults are injected into numbered partition fetches
        "fetch_bytes": 0,
        **WINDOW,
    }
    return DDBDataLoader(source, SERIES_SQL, "y", **(arguments | kwargs))


TRANSIENT: list[Any] = [
    pytest.param(lambda: ConnectionResetError("connection reset by peer"), FaultyBackend, id="reset"),
    pytest.param(lambda: TimeoutError("read timed out"), FaultyBackend, id="timeout"),
    pytest.param(lambda: EngineBusy("try again"), TransientFaulty, id="backend-declared"),
]


@pytest.mark.parametrize(("make_error", "backend_type"), TRANSIENT)
@pytest.mark.parametrize(
    ("fetch_threads", "prefetch_batch", "shuffle"), [(1, 0, False), (3, 2, True), (2, 1, True)]
)
def test_transient_faults_are_retried_and_every_sample_arrives_exactly_once(
    table: duckdb.DuckDBPyConnection,
    caplog: pytest.LogCaptureFixture,
    make_error: Callable[[], BaseException],
    backend_type: type[FaultyBackend],
    fetch_threads: int,
    prefetch_batch: int,
    shuffle: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger="ddbloader")
    options = {"fetch_threads": fetch_threads, "prefetch_batch": prefetch_batch, "shuffle": shuffle}
    with loader_over(table, **options) as clean:
        reference = list(clean)
    # Fetches 1 and 2 fail back to back (the same partition when one thread fetches), and a
    # fault lands mid-epoch and near its end. Retries cover the worst case: all on one partition.
    fail_on = [1, 2, 6, 9, PARTITIONS + 3]
    backend = backend_type(DuckDBBackend(table), fail_on=fail_on, error=make_error, jitter=0.002)
    with loader_over(backend, retries=len(fail_on), retry_backoff=0.001, **options) as loader:
        backend.planning = False
        batches = list(loader)
    assert backend.fetches == PARTITIONS + len(fail_on), "every fault was injected and retried once"
    assert delivered_windows(batches, OFFSET) == EXPECTED
    assert sum(EXPECTED.values()) == loader.plan.samples == 45
    # a retried fetch returns the same rows, so the sequence is the one without faults
    assert as_bytes(batches) == as_bytes(reference)
    retries = [r for r in caplog.records if "retrying on a fresh cursor" in r.getMessage()]
    assert len(retries) == len(fail_on)
    assert all(r.levelno == logging.WARNING for r in retries)
    assert settle()
    print(f"figure: faults={len(fail_on)} samples={sum(EXPECTED.values())} lost=0")


def test_transient_faults_beyond_the_retry_limit_surface_with_the_last_error(
    table: duckdb.DuckDBPyConnection,
) -> None:
    raised: list[BaseException] = []

    def record() -> BaseException:
        raised.append(ConnectionResetError(f"reset #{len(raised) + 1}"))
        return raised[-1]

    backend = FaultyBackend(DuckDBBackend(table), fail_on=[1, 2, 3], error=record)
    loader = loader_over(backend, shuffle=False, fetch_threads=1, retries=2, retry_backoff=0.001)
    backend.planning = False
    with pytest.raises(ConnectionResetError, match=r"reset #3") as caught:
        list(loader)
    assert caught.value is raised[-1]
    notes = caught.value.__notes__
    assert "ddbloader gave up after 3 attempts (transient errors)" in notes
    first = loader.plan.groups[0].partitions[0]
    assert any(f"fetching partition 0 of group 0 (subquery {first.sql!r}" in n for n in notes)
    assert settle()
    # the loader is not poisoned: the next epoch runs whole
    assert delivered_windows(list(loader), OFFSET) == EXPECTED
    loader.close()


class DiskGone(OSError):
    """A permanent failure with its own type and a payload the consumer may need."""

    def __init__(self, device: str) -> None:
        super().__init__(f"device {device} vanished")
        self.device = device


@pytest.mark.parametrize("fetch_threads", [1, 3])
def test_a_permanent_fault_surfaces_within_the_timeout_with_subquery_and_original_error(
    table: duckdb.DuckDBPyConnection, caplog: pytest.LogCaptureFixture, fetch_threads: int
) -> None:
    caplog.set_level(logging.WARNING, logger="ddbloader")
    raised: list[BaseException] = []

    def record() -> BaseException:
        raised.append(DiskGone("/dev/sdz"))
        return raised[-1]

    backend = FaultyBackend(DuckDBBackend(table), fail_on=[4], error=record)
    # a retry would wait 30 s: the error must come at once, far inside the 5 s timeout
    loader = loader_over(backend, fetch_threads=fetch_threads, timeout=5.0, retries=3, retry_backoff=30.0)
    backend.planning = False
    started = time.monotonic()
    delivered = 0
    with pytest.raises(DiskGone) as caught:
        for _ in loader:
            delivered += 1
    assert time.monotonic() - started < 2.0
    assert caught.value is raised[0]
    assert caught.value.device == "/dev/sdz"
    (note,) = [n for n in caught.value.__notes__ if "while fetching" in n]
    match = re.fullmatch(
        r"raised in thread 'ddbloader-fetch-\d' while fetching partition (\d) of group (\d) "
        r"\(subquery '(.*)' with parameters \[(\d), (\d)\]\)",
        note,
    )
    assert match, note
    position, group, sql, gid, part = match.groups()
    assert loader.plan.groups[int(group)].partitions[int(position)].sql == sql
    assert (gid, part) == (group, position)
    assert "in before_fetch" in "".join(traceback.format_exception(caught.value))
    assert backend.fetches < PARTITIONS
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    assert delivered < len(loader)
    assert settle()
    loader.close()


def test_an_engine_error_at_fetch_time_names_the_subquery(table: duckdb.DuckDBPyConnection) -> None:
    # error() runs only when the row is produced, in a column that is neither x nor y: planning
    # (counts, schema, the null checks of x and y) never meets it, the fetch does
    sql = (
        "SELECT gid, part, pos, f0, f1, y, CASE WHEN gid = 2 AND pos = 20 THEN error('bad row 20') "
        "ELSE 0 END AS boom FROM series ORDER BY gid, part, pos"
    )
    loader = DDBDataLoader(
        table, sql, "y", input_col=["f0", "f1"], group_col="gid", repartition_col="part", **WINDOW
    )
    with pytest.raises(duckdb.InvalidInputException, match="bad row 20") as caught:
        list(loader)
    notes = caught.value.__notes__
    # row 20 of group 2 lies in its third partition (8 + 9 = 17 rows before it)
    assert any("while fetching partition 2 of group 2" in n and "with parameters [2, 2]" in n for n in notes)
    assert settle()
    loader.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fetch_threads", [1, 3])
def test_a_fetch_hanging_mid_epoch_raises_a_clear_timeout(
    table: duckdb.DuckDBPyConnection, fetch_threads: int
) -> None:
    hang = 1.5
    backend = FaultyBackend(DuckDBBackend(table), hang_on=[7], hang_seconds=hang)
    loader = loader_over(backend, fetch_threads=fetch_threads, timeout=0.6, prefetch_batch=1)
    backend.planning = False
    delivered = []
    started = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        for batch in loader:
            delivered.append(batch)
            started = time.monotonic()
    waited = time.monotonic() - started
    message = str(caught.value)
    assert re.search(
        r"no result within 0\.6 s \(timeout=0\.6\) while fetching partition \d of group \d", message
    )
    assert "with parameters" in message
    # The wait times out at 0.6 s; the error then waits for the close() that joins the hung
    # thread (up to prefetch.JOIN_SECONDS), which here is the rest of its sleep.
    assert 0.6 <= waited < hang + 1.0
    # what came before the hang was right
    assert delivered, "the hang is the 7th of 12 fetches: some batches come first"
    ids = delivered_windows(delivered, OFFSET)
    assert not ids - EXPECTED
    loader.close()
    assert settle(grace=5.0)


@pytest.mark.timeout(30)
def test_retries_never_stretch_a_wait_past_the_timeout(table: duckdb.DuckDBPyConnection) -> None:
    backend = FaultyBackend(DuckDBBackend(table), fail_on=[1], error=lambda: ConnectionResetError("reset"))
    loader = loader_over(backend, fetch_threads=1, shuffle=False, timeout=0.5, retry_backoff=60.0)
    backend.planning = False
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timeout=0\.5\) while fetching partition 0 of group 0"):
        next(iter(loader))
    assert time.monotonic() - started < 2.0
    # close() cuts the 60 s backoff short
    assert settle(grace=2.0)
    loader.close()


@pytest.mark.timeout(30)
def test_a_query_stalled_in_the_engine_times_out_and_is_interrupted(table: duckdb.DuckDBPyConnection) -> None:
    backend = BreakingBackend(DuckDBBackend(table), stall_on=[2])
    loader = loader_over(backend, fetch_threads=1, shuffle=False, timeout=0.5)
    backend.planning = False
    with pytest.raises(TimeoutError, match=r"timeout=0\.5\) while fetching partition 1 of group 0"):
        list(loader)
    started = time.monotonic()
    loader.close()
    # the endless query was interrupted in the engine, not waited out
    assert settle(grace=3.0)
    assert time.monotonic() - started < 3.0


# --- dead connections ----------------------------------------------------------------------------


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return series_file(tmp_path / "series.duckdb", PARTS)


@pytest.mark.parametrize("fetch_threads", [1, 3])
def test_a_connection_dying_mid_epoch_is_replaced_and_nothing_is_lost(
    database: Path, caplog: pytest.LogCaptureFixture, fetch_threads: int
) -> None:
    caplog.set_level(logging.WARNING, logger="ddbloader")
    opened: list[duckdb.DuckDBPyConnection] = []

    def factory() -> duckdb.DuckDBPyConnection:
        opened.append(duckdb.connect(str(database), read_only=True))
        return opened[-1]

    # the library's own backend for a factory source; the wrapper kills cursors' connections
    backend = BreakingBackend(connect(factory), die_on=[3, 8], transient=(duckdb.ConnectionException,))
    with loader_over(backend, fetch_threads=fetch_threads, retry_backoff=0.001) as loader:
        planning = backend.cursors_opened
        backend.planning = False
        batches = list(loader)
        assert delivered_windows(batches, OFFSET) == EXPECTED
        assert backend.deaths == 2
        # each dead cursor was closed and replaced; every cursor is closed once the epoch ends
        assert backend.cursors_opened == backend.cursors_closed
        fetching = backend.cursors_opened - planning
        assert 1 + backend.deaths <= fetching <= fetch_threads + backend.deaths
    retried = [r.getMessage() for r in caplog.records if "retrying on a fresh cursor" in r.getMessage()]
    assert len(retried) == 2
    assert all("ConnectionException" in m for m in retried)
    assert len(opened) == 1
    assert settle()


def _sqlite_copy(duck: duckdb.DuckDBPyConnection, path: Path) -> None:
    table: pa.Table = duck.sql("SELECT * FROM series").to_arrow_table()
    with sqlite3.connect(path) as lite:
        lite.execute(
            "CREATE TABLE series (gid INTEGER, part INTEGER, pos INTEGER, rid INTEGER, "
            "f0 REAL, f1 REAL, y REAL)"
        )
        lite.executemany(
            "INSERT INTO series VALUES (?, ?, ?, ?, ?, ?, ?)", zip(*table.to_pydict().values(), strict=True)
        )
    lite.close()


def test_a_server_restart_mid_epoch_reconnects_through_the_factory(
    table: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    path = tmp_path / "series.sqlite"
    _sqlite_copy(table, path)
    made: list[sqlite3.Connection] = []

    def factory() -> sqlite3.Connection:
        made.append(sqlite3.connect(path, check_same_thread=False))
        return made[-1]

    class Restarting(BreakingBackend):
        """Every connection the factory ever made dies before fetch 5 (a server restart)."""

        def fault_now(self) -> str | None:
            fault = super().fault_now()
            if fault == "die":
                for connection in made:
                    connection.close()
                return None
            return fault

    backend = Restarting(connect(factory), die_on=[5], transient=(sqlite3.ProgrammingError,))
    # one fetch thread: sqlite3 must not close a connection another thread is reading from
    with loader_over(backend, fetch_threads=1, retry_backoff=0.001) as loader:
        before = len(made)
        backend.planning = False
        batches = list(loader)
    assert delivered_windows(batches, OFFSET) == EXPECTED
    assert backend.deaths == 1
    # the fetch thread's connection came from the factory, then a new one after the restart
    assert len(made) == before + 2
    assert settle()


def test_a_duckdb_factory_connection_closed_mid_epoch_is_reopened(database: Path) -> None:
    opened: list[duckdb.DuckDBPyConnection] = []

    def factory() -> duckdb.DuckDBPyConnection:
        opened.append(duckdb.connect(str(database), read_only=True))
        return opened[-1]

    class Restarting(BreakingBackend):
        def fault_now(self) -> str | None:
            fault = super().fault_now()
            if fault == "die":
                opened[-1].close()
            return fault

    backend = Restarting(connect(factory), die_on=[4], transient=(duckdb.ConnectionException,))
    with loader_over(backend, fetch_threads=1, retry_backoff=0.001) as loader:
        backend.planning = False
        assert delivered_windows(list(loader), OFFSET) == EXPECTED
    assert len(opened) == 2


def test_each_retry_is_one_warning_naming_the_partition_and_the_wait(
    table: duckdb.DuckDBPyConnection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ddbloader")
    backend = FaultyBackend(DuckDBBackend(table), fail_on=[2], error=lambda: ConnectionResetError("reset"))
    with loader_over(backend, fetch_threads=1, shuffle=False, retry_backoff=0.02) as loader:
        backend.planning = False
        list(loader)
        second = loader.plan.groups[0].partitions[1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "fetching partition 1 of group 0 (parameters [0, 1]) failed on attempt 1 of 3 with "
        "ConnectionResetError: reset; retrying on a fresh cursor in 0.02 s"
    ]
    assert second.params == (0, 1)
    fetched = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fetched partition")]
    assert len(fetched) == PARTITIONS
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.getMessage() in fetched)
