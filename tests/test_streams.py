"""Streamed partitions: a subquery larger than ``fetch_bytes`` read by one query in pieces.

A real DuckDB reader under a thin wrapper that counts the rows it handed out (and, for the
fault tests, raises after some of them): the wrapper changes nothing else on the real path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from conftest import SERIES_SQL, live_threads, make_series, wait_until
from planned import views

from ddbloader import DDBDataLoader
from ddbloader._io.fetch import Fetcher
from ddbloader._io.retry import RetryPolicy
from ddbloader._io.streams import read_batches
from ddbloader._io.threads import Stopped
from ddbloader._sql.partition import PartitionSpec
from ddbloader._sql.plan import MIN_PIECE_ROWS, GroupPlan, QueryPlan
from ddbloader._sql.read import group_reads
from ddbloader.backends import DBAPIBackend, DuckDBBackend

pytestmark = pytest.mark.timeout(60)

#: One group, one subquery of 10 pieces of MIN_PIECE_ROWS rows (x = f0 and y, DOUBLE loaded as
#: torch's default float32: 8 bytes a row).
ROWS = 10 * MIN_PIECE_ROWS
FETCH_BYTES = 8 * MIN_PIECE_ROWS


class _ReadCursor:
    def __init__(self, backend: _CountingBackend) -> None:
        self._backend = backend
        self._inner = backend.inner.cursor()
        with backend.lock:
            backend.open += 1

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        return self._inner.fetch(sql, params)

    def batches(self, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
        self._backend.queries += 1
        for table in read_batches(self._inner, sql, params, rows):
            with self._backend.lock:
                if self._backend.fail_after is not None and self._backend.read >= self._backend.fail_after:
                    self._backend.fail_after = None
                    raise self._backend.error
                self._backend.read += table.num_rows
            yield table

    def interrupt(self) -> None:
        self._inner.interrupt()

    def close(self) -> None:
        with self._backend.lock:
            self._backend.open -= 1
        self._inner.close()


class _CountingBackend:
    """A real DuckDB backend whose streaming reads count the rows handed out, and raise
    ``error`` once when ``fail_after`` rows have been handed out; ``open`` counts its cursors
    not closed."""

    def __init__(self, con: duckdb.DuckDBPyConnection, error: BaseException | None = None) -> None:
        self.inner = DuckDBBackend(con)
        self.dialect = self.inner.dialect
        self.engine = self.inner.engine
        self.lock = threading.Lock()
        self.read = 0
        self.queries = 0
        self.open = 0
        self.error = error or ConnectionError("injected: connection lost mid-stream")
        self.fail_after: int | None = None

    def cursor(self) -> _ReadCursor:
        return _ReadCursor(self)

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        return isinstance(error, ConnectionError)

    def close(self) -> None:
        self.inner.close()


def _plan(con: duckdb.DuckDBPyConnection, **options: Any) -> QueryPlan:
    make_series(con, [[ROWS]])
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], fetch_bytes=FETCH_BYTES, **options) as loader:
        return loader.plan


@contextlib.contextmanager
def _fetching(
    con: duckdb.DuckDBPyConnection,
    backend: _CountingBackend | None = None,
    more: tuple[GroupPlan, ...] = (),
    **options: Any,
) -> Iterator[tuple[list[PartitionSpec], _CountingBackend, Fetcher, threading.Event]]:
    """The pieces of the one streamed subquery, the backend, a fetcher over it (and the groups
    ``more``) and a stop event."""
    plan = _plan(con)
    plan = dataclasses.replace(plan, groups=plan.groups + more)
    backend = backend or _CountingBackend(con)
    fetcher = Fetcher(backend, plan, 1, **options)
    stop = threading.Event()
    try:
        yield list(plan.groups[0].partitions), backend, fetcher, stop
    finally:
        stop.set()
        fetcher.close()


def _rids(block: Any) -> list[float]:
    return [float(v) for v in np.asarray(block.x)[:, 0]]


def test_a_partition_larger_than_fetch_bytes_is_planned_as_pieces(con: duckdb.DuckDBPyConnection) -> None:
    pieces = views(_plan(con).groups[0])
    assert [(p.position, p.piece, p.pieces, p.first_row, p.rows) for p in pieces] == [
        (n, n, 10, n * MIN_PIECE_ROWS, MIN_PIECE_ROWS) for n in range(10)
    ]
    assert "piece 3 of 10" in pieces[2].describe(pieces[2].read)


def test_pieces_arrive_as_asked_for_without_reading_ahead(con: duckdb.DuckDBPyConnection) -> None:
    with _fetching(con) as (pieces, backend, fetcher, stop):
        first = fetcher.submit(pieces[0]).wait(stop, 10)
        assert _rids(first) == [float(r) for r in range(MIN_PIECE_ROWS)]
        # the first samples are served before the last rows leave the engine: the reader stops
        # at what was asked for (backpressure), a reader batch at most beyond it
        assert not wait_until(lambda: backend.read > 2 * MIN_PIECE_ROWS, seconds=0.3)
        rest = [fetcher.submit(p) for p in pieces[1:]]
        blocks = [p.wait(stop, 10) for p in rest]
    assert [r for b in [first, *blocks] for r in _rids(b)] == [float(r) for r in range(ROWS)]
    assert backend.queries == 1
    assert backend.read == ROWS


def test_a_resumed_read_skips_rows_and_a_piece_behind_the_reader_starts_a_new_query(
    con: duckdb.DuckDBPyConnection,
) -> None:
    with _fetching(con) as (pieces, backend, fetcher, stop):
        sixth = fetcher.submit(pieces[5]).wait(stop, 10)
        fifth = fetcher.submit(pieces[4]).wait(stop, 10)  # a neighbour's edge rows after a fast-forward
        seventh = fetcher.submit(pieces[6]).wait(stop, 10)
    for block, n in ((fifth, 4), (sixth, 5), (seventh, 6)):
        assert _rids(block) == [float(r) for r in range(n * MIN_PIECE_ROWS, (n + 1) * MIN_PIECE_ROWS)]
    assert backend.queries == 2
    assert live_threads() == []


def test_a_transient_failure_mid_stream_reads_again_from_the_first_piece_not_delivered(
    con: duckdb.DuckDBPyConnection,
) -> None:
    with _fetching(con, retry=RetryPolicy(retries=1, backoff=0.0)) as (pieces, backend, fetcher, stop):
        backend.fail_after = 3 * MIN_PIECE_ROWS
        waiting = [fetcher.submit(p) for p in pieces]
        blocks = [p.wait(stop, 10) for p in waiting]
    assert [r for b in blocks for r in _rids(b)] == [float(r) for r in range(ROWS)]
    assert backend.queries == 2


def test_a_failure_that_is_not_transient_reaches_every_waiting_piece(con: duckdb.DuckDBPyConnection) -> None:
    failing = _CountingBackend(con, error=RuntimeError("injected: the engine gave up"))
    failing.fail_after = MIN_PIECE_ROWS
    with _fetching(con, failing) as (pieces, backend, fetcher, stop):
        waiting = [fetcher.submit(p) for p in pieces[:4]]
        waiting[0].wait(stop, 10)
        for pending in waiting[1:]:
            with pytest.raises(RuntimeError, match="the engine gave up") as raised:
                pending.wait(stop, 10)
            assert any("fetching partition 1 of group 0" in note for note in raised.value.__notes__)
    assert backend.queries == 1


def test_a_parked_stream_leaves_the_only_fetch_thread_to_other_fetches(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # the whole subquery as one partition of a group of its own
    spec = dataclasses.replace(_plan(con).groups[0].partitions[0], group=1, position=0, rows=ROWS)
    alone = GroupPlan(1, None, (spec,), ROWS, **group_reads([spec], [None])._asdict())
    with _fetching(con, more=(alone,)) as (pieces, backend, fetcher, stop):
        first = fetcher.submit(pieces[0])
        assert _rids(first.wait(stop, 10)) == [float(r) for r in range(MIN_PIECE_ROWS)]
        # the whole partition: a fetch of its own on the pool's one thread, run while the stream
        # waits, parked, for its next piece
        whole = fetcher.submit(spec)
        assert _rids(whole.wait(stop, 10)) == [float(r) for r in range(ROWS)]
        assert backend.open == 2  # the parked stream's cursor and the thread's
        rest = [fetcher.submit(p) for p in pieces[1:]]
        assert [r for p in rest for r in _rids(p.wait(stop, 10))] == [
            float(r) for r in range(MIN_PIECE_ROWS, ROWS)
        ]
    assert backend.queries == 1  # the stream's one query, resumed where it parked
    assert live_threads() == []


def test_close_ends_a_parked_stream_and_cancels_its_pieces(
    con: duckdb.DuckDBPyConnection,
) -> None:
    plan = _plan(con)
    backend = _CountingBackend(con)
    fetcher = Fetcher(backend, plan, 1)
    stop = threading.Event()
    pieces = plan.groups[0].partitions
    fetcher.submit(pieces[0]).wait(stop, 10)
    # the stream parked (its result open on its own cursor) and gave its thread back: no thread
    # of its own, and the one pool thread is free for a partition fetched alone
    assert backend.open == 1
    assert live_threads() == ["ddbloader-fetch-0"]
    fetcher.close()
    assert live_threads() == []
    assert backend.open == 0
    with pytest.raises(Stopped):
        fetcher.submit(pieces[1]).wait(stop, 10)


def test_release_ends_the_stream_once_it_delivered_what_was_asked(con: duckdb.DuckDBPyConnection) -> None:
    with _fetching(con) as (pieces, backend, fetcher, stop):
        asked = [fetcher.submit(p) for p in pieces[:2]]
        fetcher.release([(0, p.position) for p in pieces])
        assert [len(_rids(p.wait(stop, 10))) for p in asked] == [MIN_PIECE_ROWS] * 2
        assert wait_until(lambda: backend.open == 0)  # the stream ended and closed its cursor
        assert backend.read <= 3 * MIN_PIECE_ROWS


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ("DELETE FROM series WHERE pos >= 600", "ended after 600 rows"),
        ("INSERT INTO series SELECT gid, part, pos + 10000, rid, f0, f1, y FROM series LIMIT 3", "returned"),
    ],
)
def test_a_streamed_subquery_whose_rows_changed_after_planning_is_refused_by_name(
    con: duckdb.DuckDBPyConnection, change: str, found: str
) -> None:
    make_series(con, [[ROWS]])
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], fetch_bytes=FETCH_BYTES) as loader:
        con.execute(change)
        with pytest.raises(
            ValueError, match=rf"piece \d+ of 10\) of subquery .* {found}.* build the loader again"
        ):
            list(loader)


class _FailingCursor:
    """A real sqlite3 cursor that, once :attr:`armed`, raises on its second ``fetchmany`` (the
    reader paused mid-result) or on ``fetchall``: a fault injected into a real read."""

    armed = False

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor
        self._fetches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def fetchmany(self, size: int) -> list[Any]:
        self._fetches += 1
        if self.armed and self._fetches == 2:
            raise sqlite3.OperationalError("injected: disk I/O error")
        return self._cursor.fetchmany(size)

    def fetchall(self) -> list[Any]:
        if self.armed:
            raise sqlite3.OperationalError("injected: disk I/O error")
        return self._cursor.fetchall()


class _FailingConnection:
    def __init__(self, path: str) -> None:
        self._connection = sqlite3.connect(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def cursor(self) -> _FailingCursor:
        return _FailingCursor(self._connection.cursor())


_FailingConnection.__module__ = "sqlite3"  # the DB-API backend reads the driver from the module


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("fault", ["rows added after planning", "a driver error mid-read"])
def test_a_db_api_stream_error_reaches_the_loop_only_and_no_thread_dies_with_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fault: str, shuffle: bool
) -> None:
    path = str(tmp_path / "series.db")
    with contextlib.closing(sqlite3.connect(path)) as writer:
        writer.execute("CREATE TABLE t (id INTEGER, x DOUBLE, y DOUBLE)")
        writer.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, i, 2 * i) for i in range(ROWS)])
        writer.commit()
    died: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    added = fault == "rows added after planning"
    factory = (lambda: sqlite3.connect(path)) if added else (lambda: _FailingConnection(path))
    with DDBDataLoader(
        DBAPIBackend(factory),
        "SELECT * FROM t ORDER BY id",
        "y",
        input_col=["x"],
        fetch_bytes=FETCH_BYTES,
        batch_size=100,
        shuffle=shuffle,
        seed=1,
    ) as loader:
        monkeypatch.setattr(_FailingCursor, "armed", True)
        if added:  # the reader is paused mid-result when the stream finds too many rows
            with contextlib.closing(sqlite3.connect(path)) as writer:
                writer.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, 0, 0) for i in range(7, 107)])
                writer.commit()
        expected = (ValueError, "data changed") if added else (sqlite3.OperationalError, "disk I/O error")
        with pytest.raises(expected[0], match=expected[1]):
            list(loader)
    assert live_threads() == []
    assert died == []


def test_a_parked_stream_resumes_on_the_thread_that_opened_its_sqlite_connection(tmp_path: Any) -> None:
    # sqlite3 refuses a connection from any thread but its own: four groups streamed at once by
    # four fetch threads, each stream parking and resuming many times
    path = str(tmp_path / "series.db")
    with contextlib.closing(sqlite3.connect(path)) as writer:
        writer.execute("CREATE TABLE t (g INTEGER, id INTEGER, x DOUBLE, y DOUBLE)")
        writer.executemany(
            "INSERT INTO t VALUES (?, ?, ?, ?)", [(i % 4, i, i, 2 * i) for i in range(4 * ROWS)]
        )
        writer.commit()
    with DDBDataLoader(
        DBAPIBackend(lambda: sqlite3.connect(path)),
        "SELECT * FROM t ORDER BY id",
        "y",
        input_col=["x"],
        group_col="g",
        fetch_bytes=FETCH_BYTES,
        batch_size=100,
        fetch_threads=4,
    ) as loader:
        assert all(p.pieces == 10 for p in views(loader.plan))
        got = [float(v) for _, y in loader for v in y.flatten().tolist()]
    assert sorted(got) == [2.0 * i for i in range(4 * ROWS)]
    assert live_threads() == []
