"""Fetcher: parallel partition fetches, one cursor per thread, failures carried, retries, clean close."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import gc
import logging
import re
import sqlite3
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import ENGINES, SERIES_SQL, FaultyBackend, make_series, table_engine, wait_until
from planned import Planned, views
from test_backends import ClickHouseEngine, SparkEngine

from ddbloader import DDBDataLoader
from ddbloader._epoch.shard import epoch_units
from ddbloader._epoch.units import fetch_units
from ddbloader._io.block import Block
from ddbloader._io.fetch import Fetcher
from ddbloader._io.retry import MAX_BACKOFF_SECONDS, RetryPolicy, is_transient
from ddbloader._io.threads import Pending, Stopped
from ddbloader._sql.partition import PartitionSpec
from ddbloader._sql.plan import QueryPlan
from ddbloader._sql.read import group_reads
from ddbloader.backends import DBAPIBackend, DolphinDBBackend, DuckDBBackend

pytestmark = pytest.mark.timeout(30)

PARTS = [[3, 2], [4, 1, 2]]


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ddbloader-fetch")]


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


def test_a_units_rows_are_let_go_once_its_partitions_are_claimed_or_released(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    """A unit's partitions are views of one conversion, made when claimed: the unit keeps the
    conversion only while a delivered partition waits to be claimed."""
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0", "f1"], group_col="gid") as loader:
        config = loader.config
    units = list(fetch_units(plan, epoch_units(plan, config, 0), config, 0, budget=2**30))
    assert [len(u.cells) for u in units] == [5]
    specs = _specs(plan)
    stop = threading.Event()
    fetcher = Fetcher(DuckDBBackend(con), plan, 1, units=units)
    try:
        first = fetcher.submit(specs[0]).wait(stop, 10)
        assert first.x[:, 0].tolist() == _expected_rids(specs[0])
        conversion = weakref.ref(first.x.base)
        del first
        gc.collect()
        assert conversion() is not None  # four partitions wait to be claimed
        claimed = [fetcher.submit(spec).wait(stop, 10) for spec in specs[1:3]]
        assert [b.x[:, 0].tolist() for b in claimed] == [_expected_rids(s) for s in specs[1:3]]
        fetcher.release([(s.group, s.position) for s in specs[3:]])
        del claimed
        gc.collect()
        assert conversion() is None
    finally:
        fetcher.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_every_partition_arrives_whole_and_in_row_order(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, threads: int
) -> None:
    fetcher = Fetcher(DuckDBBackend(con), plan, threads)
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
    fetcher = Fetcher(backend, plan, 1)
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
    fetcher = Fetcher(backend, plan, 2)
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
    fetcher = Fetcher(backend, plan, 1)
    specs = _specs(plan)
    results = [fetcher.submit(spec) for spec in specs]
    assert wait_until(lambda: backend.fetches == 1)
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


def _planned(plan: QueryPlan, spec: PartitionSpec) -> QueryPlan:
    """``plan`` with ``spec`` in place of the partition of its key, its group's reads planned again."""
    group = plan.groups[spec.group]
    partitions = tuple(spec if p.key == spec.key else p for p in group.partitions)
    assert not any(group.reads), "a group of partitions each read by its own subquery"
    cuts = [None] * len(partitions)
    changed = dataclasses.replace(group, partitions=partitions, **group_reads(partitions, cuts)._asdict())
    return dataclasses.replace(plan, groups=tuple(changed if g is group else g for g in plan.groups))


def test_close_interrupts_a_running_query(con: duckdb.DuckDBPyConnection, plan: QueryPlan) -> None:
    endless = dataclasses.replace(
        _specs(plan)[0],
        sql="SELECT sum(a.range)::DOUBLE AS f0, 0::DOUBLE AS f1, 0::DOUBLE AS y FROM range(1000000000000) a",
        params=(),
    )
    fetcher = Fetcher(DuckDBBackend(con), _planned(plan, endless), 1)
    pending = fetcher.submit(endless)
    time.sleep(0.3)
    started = time.monotonic()
    fetcher.close()
    assert time.monotonic() - started < 3.0
    assert not _fetch_threads()
    with pytest.raises((duckdb.InterruptException, Stopped)):
        pending.wait(threading.Event(), timeout=1)


def test_idle_close_wakes_the_threads_instead_of_waiting_out_their_poll(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a poll of 30 s: a close that waited it out would take that long, however loaded the machine
    monkeypatch.setattr("ddbloader._io.retry.POLL_SECONDS", 30.0)
    for _ in range(3):
        fetcher = Fetcher(DuckDBBackend(con), plan, 4)
        assert wait_until(lambda: len(_fetch_threads()) == 4)
        started = time.monotonic()
        fetcher.close()
        assert time.monotonic() - started < 10
        assert not _fetch_threads()


# --- retries --------------------------------------------------------------------------------------


class CountingBackend(FaultyBackend):
    """A :class:`FaultyBackend` that counts the cursors opened and closed, and may refuse to open.

    ``refuse_open``: how many ``cursor()`` calls raise ``open_error`` before one succeeds.
    ``transient``: when given, becomes the backend's ``is_transient`` method.
    """

    def __init__(
        self,
        inner: DuckDBBackend,
        *,
        refuse_open: int = 0,
        open_error: Callable[[], BaseException] = lambda: ConnectionRefusedError("engine restarting"),
        transient: Callable[[BaseException], bool] | None = None,
        **faults: Any,
    ) -> None:
        super().__init__(inner, **faults)
        self.planning = False
        self.opened = 0
        self.closed = 0
        self.refuse_open = refuse_open
        self.open_error = open_error
        if transient is not None:
            self.is_transient = transient

    def cursor(self) -> Any:
        if self.refuse_open:
            self.refuse_open -= 1
            raise self.open_error()
        cursor = super().cursor()
        self.opened += 1
        close = cursor.close

        def counted_close() -> None:
            self.closed += 1
            close()

        cursor.close = counted_close  # type: ignore[method-assign]
        return cursor


def _wait_result(pending: Pending[Block], timeout: float = 10) -> Block:
    return pending.wait(threading.Event(), timeout=timeout)


@contextlib.contextmanager
def faulty_fetcher(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, retry: RetryPolicy, **faults: Any
) -> Iterator[tuple[CountingBackend, Fetcher]]:
    """A one-thread fetcher over ``con`` with ``faults`` injected (see CountingBackend); closed after."""
    backend = CountingBackend(DuckDBBackend(con), **faults)
    fetcher = Fetcher(backend, plan, 1, retry=retry)
    try:
        yield backend, fetcher
    finally:
        fetcher.close()


@pytest.mark.parametrize(
    "make_error",
    [
        lambda: ConnectionResetError("peer reset"),
        lambda: BrokenPipeError("pipe"),
        lambda: TimeoutError("read timed out"),
        lambda: ConnectionAbortedError("aborted"),
    ],
    ids=["ConnectionResetError", "BrokenPipeError", "TimeoutError", "ConnectionAbortedError"],
)
def test_a_network_error_is_retried_on_a_fresh_cursor(
    con: duckdb.DuckDBPyConnection,
    plan: QueryPlan,
    caplog: pytest.LogCaptureFixture,
    make_error: Callable[[], BaseException],
) -> None:
    caplog.set_level(logging.WARNING, logger="ddbloader")
    with faulty_fetcher(con, plan, RetryPolicy(retries=2, backoff=0.01), fail_on=[1], error=make_error) as (
        backend,
        fetcher,
    ):
        spec = _specs(plan)[0]
        block = _wait_result(fetcher.submit(spec))
        np.testing.assert_array_equal(block.x[:, 0], _expected_rids(spec))
        assert backend.fetches == 2
        # the failed cursor was closed and a new one opened for the second attempt
        assert (backend.opened, backend.closed) == (2, 1)
    assert backend.closed == 2
    (record,) = [r for r in caplog.records if r.name == "ddbloader"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "partition 0 of group 0 (parameters [0, 0]) failed on attempt 1 of 3" in message
    assert type(make_error()).__name__ in message
    assert "retrying on a fresh cursor in 0.01 s" in message


def test_retries_wait_with_exponential_backoff(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ddbloader")
    with faulty_fetcher(
        con,
        plan,
        RetryPolicy(retries=3, backoff=0.05),
        fail_on=[1, 2, 3],
        error=lambda: ConnectionResetError("x"),
    ) as (backend, fetcher):
        started = time.monotonic()
        assert _wait_result(fetcher.submit(_specs(plan)[0])).rows == PARTS[0][0]
        elapsed = time.monotonic() - started
    # 0.05 + 0.1 + 0.2 s of waiting before the fourth attempt succeeds
    assert 0.35 <= elapsed < 2.0
    delays = [re.search(r"in (\S+) s$", r.getMessage()) for r in caplog.records]
    assert [m.group(1) for m in delays if m] == ["0.05", "0.1", "0.2"]
    assert backend.opened == 4


def test_when_retries_run_out_the_last_error_surfaces_with_its_subquery(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    raised: list[BaseException] = []

    def record() -> BaseException:
        raised.append(ConnectionAbortedError(f"attempt {len(raised) + 1}"))
        return raised[-1]

    with faulty_fetcher(
        con, plan, RetryPolicy(retries=2, backoff=0.001), fail_on=[1, 2, 3], error=record
    ) as (backend, fetcher):
        spec = _specs(plan)[0]
        failed = fetcher.submit(spec)
        with pytest.raises(ConnectionAbortedError, match="attempt 3") as caught:
            _wait_result(failed)
        assert caught.value is raised[2]
        notes = caught.value.__notes__
        assert "ddbloader gave up after 3 attempts (transient errors)" in notes
        assert any(spec.sql in n and "with parameters [0, 0]" in n for n in notes)
        # the thread goes on serving with a fresh cursor
        assert _wait_result(fetcher.submit(_specs(plan)[1])).rows == PARTS[0][1]
    assert backend.fetches == 4


@pytest.mark.parametrize(
    "make_error",
    [
        lambda: OSError("disk gone"),
        lambda: duckdb.BinderException("no such column"),
        lambda: ValueError("bad"),
    ],
    ids=["OSError", "BinderException", "ValueError"],
)
def test_a_permanent_error_is_raised_at_once_without_retry(
    con: duckdb.DuckDBPyConnection,
    plan: QueryPlan,
    caplog: pytest.LogCaptureFixture,
    make_error: Callable[[], BaseException],
) -> None:
    caplog.set_level(logging.WARNING, logger="ddbloader")
    with faulty_fetcher(con, plan, RetryPolicy(retries=5, backoff=10.0), fail_on=[1], error=make_error) as (
        backend,
        fetcher,
    ):
        started = time.monotonic()
        with pytest.raises(type(make_error())) as caught:
            _wait_result(fetcher.submit(_specs(plan)[0]))
        assert time.monotonic() - started < 1.0
        assert not any("gave up" in n for n in caught.value.__notes__)
        assert backend.fetches == 1
        assert backend.opened == 1 and backend.closed == 0
    assert not caplog.records


def test_retries_zero_means_one_attempt(con: duckdb.DuckDBPyConnection, plan: QueryPlan) -> None:
    with faulty_fetcher(
        con, plan, RetryPolicy(retries=0), fail_on=[1], error=lambda: ConnectionResetError("x")
    ) as (backend, fetcher):
        with pytest.raises(ConnectionResetError) as caught:
            _wait_result(fetcher.submit(_specs(plan)[0]))
        assert not any("gave up" in n for n in caught.value.__notes__)
        assert backend.fetches == 1


class EngineHiccup(Exception):
    """An engine-specific error that only its backend knows to be transient."""


@pytest.mark.parametrize(("declared", "attempts"), [(True, 2), (False, 1)])
def test_the_backend_decides_what_else_is_transient(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, declared: bool, attempts: int
) -> None:
    judged: list[BaseException] = []

    def transient(error: BaseException) -> bool:
        judged.append(error)
        return declared and isinstance(error, EngineHiccup)

    backend = CountingBackend(
        DuckDBBackend(con), fail_on=[1], error=lambda: EngineHiccup("busy"), transient=transient
    )
    fetcher = Fetcher(backend, plan, 1, retry=RetryPolicy(retries=2, backoff=0.001))
    try:
        pending = fetcher.submit(_specs(plan)[0])
        if declared:
            assert _wait_result(pending).rows == PARTS[0][0]
        else:
            with pytest.raises(EngineHiccup):
                _wait_result(pending)
    finally:
        fetcher.close()
    assert backend.fetches == attempts
    assert len(judged) == 1 and isinstance(judged[0], EngineHiccup)


def test_a_transient_failure_to_open_a_cursor_is_retried(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    with faulty_fetcher(con, plan, RetryPolicy(retries=2, backoff=0.001), refuse_open=2) as (
        backend,
        fetcher,
    ):
        assert _wait_result(fetcher.submit(_specs(plan)[0])).rows == PARTS[0][0]
        assert (backend.refuse_open, backend.opened) == (0, 1)


def test_a_permanent_failure_to_open_a_cursor_names_the_subquery(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    with faulty_fetcher(
        con,
        plan,
        RetryPolicy(retries=2, backoff=0.001),
        refuse_open=1,
        open_error=lambda: PermissionError("denied"),
    ) as (_backend, fetcher):
        spec = _specs(plan)[0]
        with pytest.raises(PermissionError) as caught:
            _wait_result(fetcher.submit(spec))
        (note,) = caught.value.__notes__
        assert note.startswith(
            "raised in thread 'ddbloader-fetch-0' while opening a cursor to fetch partition 0"
        )
        assert spec.sql in note
        # the next fetch opens the cursor again and succeeds
        assert _wait_result(fetcher.submit(_specs(plan)[1])).rows == PARTS[0][1]


def test_close_during_a_backoff_wait_stops_at_once(con: duckdb.DuckDBPyConnection, plan: QueryPlan) -> None:
    backend = CountingBackend(DuckDBBackend(con), fail_on=[1], error=lambda: ConnectionResetError("x"))
    fetcher = Fetcher(backend, plan, 1, retry=RetryPolicy(retries=2, backoff=20.0))
    pending = fetcher.submit(_specs(plan)[0])
    assert wait_until(lambda: backend.fetches == 1)
    time.sleep(0.05)
    started = time.monotonic()
    fetcher.close()
    assert time.monotonic() - started < 1.0
    assert not _fetch_threads()
    with pytest.raises(Stopped):
        pending.wait(threading.Event(), timeout=1)
    assert backend.fetches == 1
    assert backend.opened == backend.closed == 1


def test_one_debug_line_per_partition_fetched(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ddbloader")
    fetcher = Fetcher(DuckDBBackend(con), plan, 2)
    try:
        for pending in [fetcher.submit(spec) for spec in _specs(plan)]:
            _wait_result(pending)
    finally:
        fetcher.close()
    lines = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert len(lines) == sum(len(p) for p in PARTS)
    pattern = (
        r"fetched partition (\d) of group (\d) \(parameters \[(\d), (\d)\]\): (\d+) rows in \d+\.\d{3} s"
    )
    for line in lines:
        match = re.fullmatch(pattern, line)
        assert match, line
        position, group, gid, part, rows = map(int, match.groups())
        assert (gid, part) == (group, position)
        assert rows == PARTS[group][position]


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionError("x"), True),
        (ConnectionRefusedError("x"), True),
        (TimeoutError("x"), True),
        (OSError("x"), False),
        (duckdb.ConnectionException("closed"), False),
        (RuntimeError("x"), False),
        (KeyboardInterrupt(), False),
        (SystemExit(1), False),
    ],
    ids=repr,
)
def test_is_transient_without_a_backend_opinion(
    con: duckdb.DuckDBPyConnection, error: BaseException, transient: bool
) -> None:
    assert is_transient(DuckDBBackend(con), error) is transient


def test_a_backend_cannot_make_an_interrupt_transient(con: duckdb.DuckDBPyConnection) -> None:
    backend = CountingBackend(DuckDBBackend(con), transient=lambda error: True)
    assert is_transient(backend, RuntimeError("x"))
    assert not is_transient(backend, KeyboardInterrupt())


def test_each_built_in_backend_decides_what_is_transient(tmp_path: Path) -> None:
    """The fetcher's one retry loop asks every backend by the same name (it once asked for a
    name the server backends did not define, so their network errors were never retried)."""
    network = OSError(errno.ENETDOWN, "network is down")  # not a ConnectionError: the backend decides
    path = str(tmp_path / "t.sqlite")
    assert is_transient(DBAPIBackend(functools.partial(sqlite3.connect, path)), network)
    shared = sqlite3.connect(path)
    assert not is_transient(DBAPIBackend(shared), network)  # the caller's: cannot be reopened
    shared.close()
    dolphindb = DolphinDBBackend(lambda: None)
    assert is_transient(dolphindb, RuntimeError("the connection has been closed"))
    assert not is_transient(dolphindb, RuntimeError("Syntax Error"))
    assert not is_transient(DuckDBBackend(None), network)


def test_retry_policy_delays_double_up_to_a_cap() -> None:
    policy = RetryPolicy(retries=40, backoff=0.1)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert policy.delay(40) == MAX_BACKOFF_SECONDS
    assert RetryPolicy(retries=1, backoff=0).delay(1) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retries": -1}, r"retries must be an int >= 0, got -1"),
        ({"retries": 1.0}, r"retries must be an int >= 0, got 1.0"),
        ({"retries": True}, r"retries must be an int >= 0, got True"),
        ({"backoff": -0.5}, r"retry_backoff must be a finite number >= 0, got -0.5"),
        ({"backoff": float("nan")}, r"retry_backoff must be a finite number >= 0, got nan"),
    ],
)
def test_retry_policy_refuses_what_is_not_a_policy(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_a_permanent_error_after_retries_says_how_many_came_before(
    con: duckdb.DuckDBPyConnection, plan: QueryPlan
) -> None:
    errors = iter([ConnectionResetError("reset"), PermissionError("revoked")])
    with (
        faulty_fetcher(
            con, plan, RetryPolicy(retries=3, backoff=0.001), fail_on=[1, 2], error=lambda: next(errors)
        ) as (backend, fetcher),
        pytest.raises(PermissionError) as caught,
    ):
        _wait_result(fetcher.submit(_specs(plan)[0]))
    assert "ddbloader gave up on attempt 2: this error is not transient" in caught.value.__notes__
    assert backend.fetches == 2


# --- every read kind, every engine: exactly the planned partitions' rows -------------------------

READ_ROWS = 1200
#: 8 bytes a row (f and y as float32): pieces of 100 rows
READ_BUDGET = 100 * 8


def _read_table() -> pa.Table:
    ids = np.arange(READ_ROWS)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "sym": pa.array([["a", "b", "c"][i % 3] for i in ids], pa.string()),
            "day": pa.array(ids * 4 // READ_ROWS, pa.int64()),
            "f": pa.array((ids * 37 % 1201) * 0.5, pa.float64()),
            "y": pa.array(ids + 0.25, pa.float64()),
        }
    )


#: Per read kind: the loader's options, and what of the plan (and its epoch's fetch units) shows
#: the kind is there; every kind with key_col ``id``, x ``f``, y ``y``.
READ_KINDS: dict[str, tuple[dict[str, Any], Callable[[QueryPlan, list[Any]], bool]]] = {
    "partition": (
        {"group_col": "sym", "fetch_bytes": 0},
        lambda plan, units: not units and not any(p.streamed for p in views(plan)),
    ),
    "fetch unit": (
        {"group_col": "sym", "repartition_col": "day", "fetch_bytes": 2**20},
        lambda plan, units: bool(units) and all(len(u.cells) > 1 for u in units),
    ),
    "streamed pieces": (
        {"fetch_bytes": READ_BUDGET},
        lambda plan, units: any(p.pieces > 1 and p.ranges is None for p in views(plan)),
    ),
    "contiguous range pieces": (
        {"shuffle": True, "window_size": 3, "group_col": "sym", "repartition_col": "day", "fetch_bytes": 320},
        lambda plan, units: any(p.ranges is not None and p.ranges.band is None for p in views(plan)),
    ),
    "combed pieces, read two to a query": (
        {"shuffle": True, "fetch_bytes": READ_BUDGET},
        lambda plan, units: any(u.split == "cells" for u in units),
    ),
    "combed pieces, ordered by the engine": (
        {
            "shuffle": True,
            "fetch_bytes": READ_BUDGET,
            "sql": "SELECT id, sym, day, f, y FROM t ORDER BY sym, id",
        },
        lambda plan, units: all(p.ranges is not None and p.ranges.sort is None for p in views(plan)),
    ),
    "combed pieces of windows": (
        {"shuffle": True, "window_size": 3, "fetch_bytes": READ_BUDGET},
        lambda plan, units: all(p.windows is not None for p in views(plan)),
    ),
}


@pytest.fixture(
    params=[
        "duckdb",
        "postgres",
        "sqlite",
        "datafusion",
        "clickhouse",
        pytest.param("spark", marks=[pytest.mark.slow, pytest.mark.timeout(300)]),  # its server starts
    ]
)
def read_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The source of a real engine holding :func:`_read_table` as ``t``."""
    if request.param == "spark":
        spark = SparkEngine(request.getfixturevalue("spark_server").uri)
        spark.create("t", _read_table())
        yield spark.uri
        spark.close()
    elif request.param in ENGINES:
        with table_engine(request, tmp_path, request.param, _read_table()) as made:
            yield made.source
    elif request.param == "datafusion":
        datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
        context = datafusion.SessionContext()
        context.register_record_batches("t", [_read_table().to_batches()])
        yield context
    else:
        clickhouse = ClickHouseEngine(request.getfixturevalue("chdb_uri"))
        clickhouse.create("t", _read_table())
        yield clickhouse.uri
        clickhouse.close()


def _planned_ids(spec: Planned, whole: pa.Table, keyed: list[str]) -> list[int]:
    """The ids the partition ``spec`` holds by its plan, cut from the query run whole: its key
    values' rows in the query's order, then its rows of them (a range piece: its runs; a piece
    read in parts: its rows of those)."""
    rows = whole
    for column, value in zip(keyed, (spec.group_value, spec.repartition_value)[: len(keyed)], strict=True):
        rows = rows.filter(pc.equal(rows.column(column), value))
    ids = rows.column("id").to_pylist()
    if spec.ranges is not None:
        runs = spec.windows.runs if spec.windows is not None else spec.ranges.runs
        ids = [i for first, count in runs for i in ids[first : first + count]]
    if spec.pieces > 1:
        ids = ids[spec.first_row : spec.first_row + spec.rows]
    return ids


@pytest.mark.parametrize("kind", list(READ_KINDS))
def test_every_read_kind_yields_exactly_its_planned_partitions_rows(read_engine: Any, kind: str) -> None:
    """Each partition of each read kind, fetched by the Fetcher (through the epoch's fetch units
    where it has some), holds exactly the rows its plan says, in the query's order: the oracle is
    the user's query run whole on the same engine."""
    options, present = READ_KINDS[kind]
    options = dict(options)
    sql = options.pop("sql", "SELECT id, sym, day, f, y FROM t ORDER BY id")
    keyed = [options[k] for k in ("group_col", "repartition_col") if k in options]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the note that x leaves the text column out
        loader = DDBDataLoader(read_engine, sql, "y", input_col=["f"], key_col=["id"], seed=1, **options)
    with loader:
        plan, config = loader.plan, loader.config
        units = list(fetch_units(plan, epoch_units(plan, config, 0), config, 0, config.fetch_bytes))
        assert present(plan, units), f"the plan has no {kind}"
        assert loader._backend is not None
        cursor = loader._backend.cursor()
        try:
            whole = cursor.fetch(sql, ())
        finally:
            cursor.close()
        fetcher = Fetcher(loader._backend, plan, 2, units=units)
        stop = threading.Event()
        try:
            for spec in views(plan):
                block = fetcher.submit(spec.spec).wait(stop, 30)
                assert block.keys is not None
                assert block.keys["id"].tolist() == _planned_ids(spec, whole, keyed), spec.describe(spec.read)
        finally:
            fetcher.close()
    served = sum(len(_planned_ids(spec, whole, keyed)) for spec in views(plan))
    assert served >= READ_ROWS  # combed windows' context rows are read twice
