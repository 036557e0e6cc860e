"""One snapshot per loader (ddbloader.backends.postgres): writers that commit mid-epoch change nothing.

Real PostgreSQL (tests/pgserver.py): a second session updates, inserts and deletes rows while an
epoch runs; the epoch, the next one and DataLoader workers all serve the rows of the table as it
was when the loader was built, the writer is never blocked, and close() releases the snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pgserver
import pytest
import torch
from torch.utils.data import DataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset

SQL = "SELECT g, ts, v, y FROM t ORDER BY g, ts"
ROWS = 4000
ARGS: dict[str, Any] = {
    "target_col": "y",
    "input_col": ["v", "ts"],
    "group_col": "g",
    "group_scheme": None,
    "batch_size": 64,
    "shuffle": True,
    "seed": 3,
    "fetch_bytes": 8192,  # many fetches an epoch, so most of them come after the writes
    "dtype": torch.float64,
}


@pytest.fixture
def table(pg_server: pgserver.PostgresServer) -> Iterator[Any]:
    """A fresh table ``t`` (20 groups x 200 rows, v = 1) and an autocommit writer session."""
    from adbc_driver_postgresql import dbapi

    writer = dbapi.connect(pg_server.uri, autocommit=True)
    _run(writer, "DROP TABLE IF EXISTS t")
    _run(
        writer,
        f"CREATE TABLE t AS SELECT (i % 20) AS g, i AS ts, 1.0::float8 AS v, 0.5::float8 AS y "
        f"FROM generate_series(0, {ROWS - 1}) i",
    )
    try:
        yield writer
    finally:
        writer.close()


def _run(connection: Any, sql: str) -> list[tuple[Any, ...]]:
    cursor = connection.cursor()
    try:
        cursor.execute(sql)
        return cursor.fetchall() if cursor.description else []
    finally:
        cursor.close()


def _write_concurrently(writer: Any) -> None:
    """Commit an UPDATE of every row, an INSERT and a DELETE; fail if any of them waits on a lock."""
    done = threading.Event()

    def write() -> None:
        _run(writer, "UPDATE t SET v = -1")
        _run(writer, "INSERT INTO t SELECT 0, -i, -1, 0.5 FROM generate_series(1, 50) i")
        _run(writer, "DELETE FROM t WHERE g = 7")
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(timeout=30)
    assert done.is_set(), "the writer was blocked by the loader's snapshot"


def _rows(batches: Any) -> np.ndarray[Any, Any]:
    """Every x row (v, ts) of an epoch, sorted by ts."""
    rows = np.concatenate([x.numpy().reshape(-1, 2) for x, _ in batches])
    return rows[np.argsort(rows[:, 1], kind="stable")]


def _expected() -> np.ndarray[Any, Any]:
    ts = np.arange(ROWS, dtype=np.float64)
    return np.stack([np.ones(ROWS), ts], axis=1)


def test_an_epoch_reads_the_table_as_it_was_when_the_loader_was_built(
    table: Any, pg_server: pgserver.PostgresServer
) -> None:
    loader = DDBDataLoader(pg_server.uri, SQL, verify=True, **ARGS)
    try:
        iterator = iter(loader)
        first = next(iterator)
        _write_concurrently(table)
        epoch = _rows([first, *iterator])
        np.testing.assert_array_equal(epoch, _expected())
        # the next epoch too: the snapshot is held until close()
        np.testing.assert_array_equal(_rows(loader), _expected())
    finally:
        loader.close()
    fresh = DDBDataLoader(pg_server.uri, SQL, **ARGS)
    try:
        after = _rows(fresh)
    finally:
        fresh.close()
    assert len(after) == ROWS - ROWS // 20 + 50 and (after[:, 0] == -1).all()


def test_dataloader_workers_read_their_parent_s_snapshot(
    table: Any, pg_server: pgserver.PostgresServer
) -> None:
    data = DDBIterableDataset(pg_server.uri, SQL, num_workers=2, **ARGS)
    try:
        _write_concurrently(table)
        epoch = _rows(DataLoader(data, batch_size=None, num_workers=2))
    finally:
        data.close()
    np.testing.assert_array_equal(epoch, _expected())


def _importable(connection: Any, snapshot: str) -> bool:
    """Whether another session can still read ``snapshot`` (its holder's transaction is open)."""
    import adbc_driver_manager

    cursor = connection.cursor()
    try:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
        return True
    except adbc_driver_manager.Error as error:
        assert "invalid snapshot identifier" in str(error)
        return False
    finally:
        cursor.execute("ROLLBACK")
        cursor.close()


def test_close_releases_the_snapshot(table: Any, pg_server: pgserver.PostgresServer) -> None:
    loader = DDBDataLoader(pg_server.uri, SQL, **ARGS)
    snapshot = getattr(loader._backend, "snapshot", None)
    assert snapshot is not None and _importable(table, snapshot)
    list(loader)
    loader.close()
    assert not _importable(table, snapshot)


def test_a_server_restart_renews_the_snapshot_and_says_so(
    table: Any, pg_server: pgserver.PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart ends every session, the snapshot's holder too: the loader goes on under a new
    snapshot (the planned counts check the rows) and logs a WARNING naming both."""
    with DDBDataLoader(pg_server.uri, SQL, **ARGS) as loader:
        lost = getattr(loader._backend, "snapshot", None)
        pg_server.halt()
        pg_server.resume()
        with caplog.at_level("WARNING", logger="ddbloader"):
            epoch = _rows(loader)
    np.testing.assert_array_equal(epoch, _expected())
    renewed = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(renewed) == 1 and str(lost) in renewed[0]
