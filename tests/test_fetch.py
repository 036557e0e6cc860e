"""Fetcher: parallel partition fetches, one cursor per thread, failures carried, clean close."""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import duckdb
import numpy as np
import pytest
from conftest import SERIES_SQL, FaultyBackend, make_series

from ddbloader import DDBDataLoader
from ddbloader.backends import DuckDBBackend
from ddbloader.fetch import Fetcher
from ddbloader.plan import PartitionSpec, QueryPlan
from ddbloader.prefetch import Stopped

pytestmark = pytest.mark.timeout(30)

PARTS = [[3, 2], [4, 1, 2]]


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ddbloader-fetch")]


def _wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def plan(con: duckdb.DuckDBPyConnection) -> Iterator[QueryPlan]:
    make_series(con, PARTS)
    loader = DDBDataLoader(
        con, SERIES_SQL, "y", input_col=["f0", "f1"], group_col="gid", repartition_col="part"
    )
    yield loader.plan
    loader.close()


def _specs(plan: QueryPlan) -> list[PartitionSpec]:
    return [p for g in plan.groups for p in g.partitions]


def _expected_rids(spec: PartitionSpec) -> list[float]:
    first = sum(PARTS[spec.group][: spec.position])
    return [spec.group * 1_000_000 + first + k for k in range(PARTS[spec.group][spec.position])]


@pytest.mark.parametrize("threads", [1, 3])
def test_every_partition_arrives_whole_and_in_row_order(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, threads: int
) -> None:
    fetcher = Fetcher(DuckDBBackend(con), plan.layout, threads)
    try:
        names = sorted(t.name for t in _fetch_threads())
        assert names == [f"ddbloader-fetch-{n}" for n in range(threads)]
        assert all(t.daemon for t in _fetch_threads())
        specs = _specs(plan)
        results = [fetcher.submit(spec) for spec in specs]
        for spec, pending in zip(specs, results, strict=True):
            block = pending.wait(threading.Event(), timeout=10)
            rids = _expected_rids(spec)
            np.testing.assert_array_equal(block.x, np.array([[r, -r] for r in rids]))
            np.testing.assert_array_equal(block.y, np.array([[r + 0.5] for r in rids]))
    finally:
        fetcher.close()
    assert not _fetch_threads()


@pytest.mark.parametrize("error", [OSError("disk gone"), duckdb.IOException("engine said no")])
def test_fetch_failure_reaches_the_waiter_with_type_and_subquery(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, error: Exception
) -> None:
    backend = FaultyBackend(DuckDBBackend(con), fail_on=[1], error=lambda: error)
    backend.planning = False
    fetcher = Fetcher(backend, plan.layout, 1)
    try:
        first, second = _specs(plan)[:2]
        failed, fine = fetcher.submit(first), fetcher.submit(second)
        with pytest.raises(type(error)) as caught:
            failed.wait(threading.Event(), timeout=10)
        assert caught.value is error
        (note,) = caught.value.__notes__
        assert note.startswith("raised in thread 'ddbloader-fetch-0' while fetching partition 0 of group 0")
        assert first.sql in note
        assert "with parameters [0, 0]" in note
        assert "in before_fetch" in "".join(traceback.format_exception(caught.value))
        # the thread survives a failed fetch and serves the next one
        assert fine.wait(threading.Event(), timeout=10).rows == PARTS[0][1]
    finally:
        fetcher.close()


def test_a_cursor_that_cannot_open_fails_every_fetch(plan: QueryPlan) -> None:
    closed = duckdb.connect()
    backend = DuckDBBackend(closed)
    closed.close()
    fetcher = Fetcher(backend, plan.layout, 2)
    try:
        for spec in _specs(plan)[:3]:
            with pytest.raises(duckdb.ConnectionException) as caught:
                fetcher.submit(spec).wait(threading.Event(), timeout=10)
            assert any("while opening a cursor" in note for note in caught.value.__notes__)
    finally:
        fetcher.close()
    assert not _fetch_threads()


def test_close_with_pending_tasks_cancels_the_unstarted_ones(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    backend = FaultyBackend(DuckDBBackend(con), hang_on=[1], hang_seconds=0.5)
    backend.planning = False
    fetcher = Fetcher(backend, plan.layout, 1)
    specs = _specs(plan)
    results = [fetcher.submit(spec) for spec in specs]
    assert _wait_until(lambda: backend.fetches == 1)
    started = time.monotonic()
    fetcher.close()
    fetcher.close()
    assert time.monotonic() - started < 2.0
    assert not _fetch_threads()
    # the fetch in flight finishes; the rest never start, and their waiters stop at once
    assert results[0].wait(threading.Event(), timeout=1).rows == PARTS[0][0]
    assert backend.fetches == 1
    for pending in results[1:]:
        started = time.monotonic()
        with pytest.raises(Stopped):
            pending.wait(threading.Event(), timeout=30)
        assert time.monotonic() - started < 0.5


def test_close_interrupts_a_running_query(con: duckdb.DuckDBPyConnection, plan: QueryPlan) -> None:
    endless = dataclasses.replace(
        _specs(plan)[0],
        sql="SELECT sum(a.range)::DOUBLE AS f0, 0::DOUBLE AS f1, 0::DOUBLE AS y FROM range(1000000000000) a",
        params=(),
    )
    fetcher = Fetcher(DuckDBBackend(con), plan.layout, 1)
    pending = fetcher.submit(endless)
    time.sleep(0.3)
    started = time.monotonic()
    fetcher.close()
    assert time.monotonic() - started < 3.0
    assert not _fetch_threads()
    with pytest.raises((duckdb.InterruptException, Stopped)):
        pending.wait(threading.Event(), timeout=1)


def test_idle_close_wakes_the_threads_instead_of_waiting_out_their_poll(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    elapsed = 0.0
    for _ in range(10):
        fetcher = Fetcher(DuckDBBackend(con), plan.layout, 4)
        assert _wait_until(lambda: len(_fetch_threads()) == 4)
        started = time.monotonic()
        fetcher.close()
        elapsed += time.monotonic() - started
        assert not _fetch_threads()
    # waiting out a 50 ms poll would cost about 0.4 s over ten closes of four threads
    assert elapsed < 0.2
