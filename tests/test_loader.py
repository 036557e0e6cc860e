"""DDBDataLoader: exact small examples, epochs, lifecycle, threads and error transport.

Tables come from ``make_series``: f0 = rid = gid * 1_000_000 + pos and y = rid + 0.5, so the
expected tensors below are written as the row positions each sample must hold.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest
import torch
from conftest import (
    SERIES_SQL,
    FaultyBackend,
    live_threads,
    make_series,
    wait_until,
    warnings_containing,
)

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(60)

Batch = tuple[torch.Tensor, torch.Tensor]
REPO = Path(__file__).resolve().parents[1]


def rid(group: int, position: int) -> float:
    return float(group * 1_000_000 + position)


def no_threads(grace: float = 2.0) -> bool:
    """True once no ddbloader thread is alive, allowing ``grace`` seconds for joins to finish."""
    return wait_until(lambda: not live_threads(), grace, poll=0.01)


def f0_loader(con: duckdb.DuckDBPyConnection, **kwargs: Any) -> DDBDataLoader:
    return DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], **kwargs)


def expected(samples: Sequence[tuple[Sequence[int], Sequence[int]]], windowed: bool, group: int = 0) -> Batch:
    """x and y of samples given as (x row positions, y row positions) of one group, in torch's
    default dtype (the loader's for DOUBLE columns)."""
    if windowed:
        x = torch.tensor([[[rid(group, p)] for p in xs] for xs, _ in samples])
        y = torch.tensor([[[rid(group, p) + 0.5] for p in ys] for _, ys in samples])
    else:
        x = torch.tensor([[rid(group, xs[0])] for xs, _ in samples])
        y = torch.tensor([[rid(group, ys[0]) + 0.5] for _, ys in samples])
    return x, y


def assert_batches_equal(got: Sequence[Batch], want: Sequence[Batch]) -> None:
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert gx.dtype == wx.dtype and gy.dtype == wy.dtype
        torch.testing.assert_close(gx, wx, rtol=0, atol=0)
        torch.testing.assert_close(gy, wy, rtol=0, atol=0)


# --- exact small examples ------------------------------------------------------------------------


def test_plain_case_one_row_per_sample(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[5]])
    with DDBDataLoader(con, SERIES_SQL, "y", batch_size=2, input_col=["f0", "f1"]) as loader:
        assert len(loader) == 3
        got = list(loader)
    assert [tuple(x.shape) for x, _ in got] == [(2, 2), (2, 2), (1, 2)]
    assert [tuple(y.shape) for _, y in got] == [(2, 1), (2, 1), (1, 1)]
    x = torch.cat([b[0] for b in got])
    y = torch.cat([b[1] for b in got])
    assert x.tolist() == [[p, -p] for p in (0.0, 1.0, 2.0, 3.0, 4.0)]
    assert y.tolist() == [[0.5], [1.5], [2.5], [3.5], [4.5]]


def test_plain_case_default_columns_leave_the_target_out_of_x(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[2, 1]])
    with DDBDataLoader(con, SERIES_SQL, "y", batch_size=3) as loader:
        ((x, y),) = list(loader)  # no warning: the suite turns any into an error
    # gid, part, pos, rid, f0, f1 (not y): INTEGER, BIGINT and DOUBLE promote to floating, torch's default
    assert x.dtype == y.dtype == torch.get_default_dtype() == torch.float32
    assert x.tolist() == [
        [0, 0, 0, 0, 0, -0.0],
        [0, 0, 1, 1, 1, -1],
        [0, 1, 2, 2, 2, -2],
    ]
    assert y.tolist() == [[0.5], [1.5], [2.5]]
    # DolphinDB's rule (the target fed back as a feature) and dtype, one argument each
    with DDBDataLoader(
        con, SERIES_SQL, "y", batch_size=3, input_col=["f0", "y"], dtype=torch.float64
    ) as loader:
        ((x, y),) = list(loader)
    assert x.dtype == y.dtype == torch.float64
    assert x[:, 1:].tolist() == y.tolist() == [[0.5], [1.5], [2.5]]


WINDOW_CASES = [
    pytest.param(5, {"offset": 2}, [([0], [2]), ([1], [3]), ([2], [4])], id="offset-no-window"),
    pytest.param(3, {"window_size": 1}, [([0], [1]), ([1], [2])], id="window-1-is-windowed"),
    pytest.param(
        6,
        {"window_size": 2},
        [([0, 1], [2]), ([1, 2], [3]), ([2, 3], [4]), ([3, 4], [5])],
        id="window-n",
    ),
    pytest.param(
        7,
        {"window_size": [3, 2]},
        [([0, 1, 2], [3, 4]), ([1, 2, 3], [4, 5]), ([2, 3, 4], [5, 6])],
        id="window-pair",
    ),
    pytest.param(
        5,
        {"window_size": [3, 2], "offset": 1},
        [([0, 1, 2], [1, 2]), ([1, 2, 3], [2, 3]), ([2, 3, 4], [3, 4])],
        id="window-pair-offset-inside-x",
    ),
    pytest.param(
        4, {"window_size": 2, "offset": 0}, [([0, 1], [0]), ([1, 2], [1]), ([2, 3], [2])], id="offset-0"
    ),
    pytest.param(
        7,
        {"window_size": 2, "window_stride": 2},
        [([0, 1], [2]), ([2, 3], [4]), ([4, 5], [6])],
        id="stride",
    ),
    pytest.param(
        7,
        {"window_size": 2, "window_stride": [2, 3]},
        [([0, 1], [2]), ([2, 3], [4]), ([4, 5], [6])],
        id="stride-pair-second-value-does-not-move-y",
    ),
    pytest.param(
        9,
        {"window_size": [2, 2], "window_stride": 3},
        [([0, 1], [2, 3]), ([3, 4], [5, 6])],
        id="stride-window-pair",
    ),
]


@pytest.mark.parametrize(("rows", "kwargs", "samples"), WINDOW_CASES)
def test_windows_offsets_and_strides(
    con: duckdb.DuckDBPyConnection,
    rows: int,
    kwargs: dict[str, Any],
    samples: list[tuple[list[int], list[int]]],
) -> None:
    make_series(con, [[rows]])
    with f0_loader(con, batch_size=len(samples), **kwargs) as loader:
        assert len(loader) == 1
        got = list(loader)
    assert_batches_equal(got, [expected(samples, windowed="window_size" in kwargs)])


def test_windows_continue_across_repartitions_but_not_across_groups(
    con: duckdb.DuckDBPyConnection,
) -> None:
    make_series(con, [[2, 3], [3, 1]])
    with f0_loader(con, batch_size=2, window_size=2, group_col="gid", repartition_col="part") as loader:
        assert len(loader) == 3
        got = list(loader)
    g0 = expected([([0, 1], [2]), ([1, 2], [3]), ([2, 3], [4])], windowed=True, group=0)
    g1 = expected([([0, 1], [2]), ([1, 2], [3])], windowed=True, group=1)
    x = torch.cat([g0[0], g1[0]])
    y = torch.cat([g0[1], g1[1]])
    assert_batches_equal(got, [(x[0:2], y[0:2]), (x[2:4], y[2:4]), (x[4:5], y[4:5])])


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_window_spans_several_small_repartitions(con: duckdb.DuckDBPyConnection, shuffle: bool) -> None:
    make_series(con, [[1, 1, 1, 2]])
    with f0_loader(
        con, batch_size=4, window_size=3, repartition_col="part", shuffle=shuffle, seed=3
    ) as loader:
        ((x, y),) = list(loader)
    order = torch.argsort(x[:, 0, 0])
    assert_batches_equal([(x[order], y[order])], [expected([([0, 1, 2], [3]), ([1, 2, 3], [4])], True)])


def test_groups_too_short_for_a_window_yield_nothing_even_if_their_rows_would_chain(
    con: duckdb.DuckDBPyConnection,
) -> None:
    make_series(con, [[2], [2]])
    with pytest.raises(
        ValueError,
        match=r"can make no sample: a sample needs 3 consecutive rows \(x window 2, y window 1, offset 2\), "
        r"but the longest group has only 2",
    ):
        f0_loader(con, window_size=2, group_col="gid")
    # the same rows as one series do chain into samples
    sql = "SELECT f0, y FROM series ORDER BY rid"
    with DDBDataLoader(con, sql, "y", input_col=["f0"], window_size=2) as loader:
        assert len(loader) == 2


def test_a_query_without_rows_is_refused_at_construction(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[3]])
    with f0_loader(con, window_size=2) as loader:
        assert len(loader) == 1
    with pytest.raises(ValueError, match=r"can make no sample: the query \(with its schemes\) returns no"):
        DDBDataLoader(con, "SELECT f0, y FROM series WHERE f0 < 0", "y")
    assert no_threads()


@pytest.mark.parametrize("rows", [5, 6])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 6, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_size_and_drop_last_count_as_torch(
    con: duckdb.DuckDBPyConnection, rows: int, batch_size: int, drop_last: bool
) -> None:
    make_series(con, [[rows]])
    reference = list(torch.utils.data.DataLoader(range(rows), batch_size=batch_size, drop_last=drop_last))
    with f0_loader(con, batch_size=batch_size, drop_last=drop_last) as loader:
        assert len(loader) == len(reference)
        got = list(loader)
    assert [len(x) for x, _ in got] == [len(b) for b in reference]
    seen = [int(v) for x, _ in got for v in x[:, 0].tolist()]
    assert seen == [int(v) for b in reference for v in b.tolist()]


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_cpu(con: duckdb.DuckDBPyConnection, device: str | torch.device) -> None:
    make_series(con, [[4]])
    with f0_loader(con, batch_size=2, window_size=2, device=device) as loader:
        got = list(loader)
    assert len(got) == 1
    assert all(t.device == torch.device("cpu") for batch in got for t in batch)


@pytest.mark.parametrize(
    ("columns", "dtype", "x_dtype", "y_dtype"),
    [
        (["f0"], None, torch.float32, torch.float32),
        (["pos"], None, torch.int64, torch.float32),
        (["gid"], None, torch.int32, torch.float32),
        (["gid", "pos"], None, torch.int64, torch.float32),
        (["pos", "f0"], None, torch.float32, torch.float32),
        (["pos", "f0"], torch.float64, torch.float64, torch.float64),
        (["pos", "f0"], torch.float32, torch.float32, torch.float32),
        (["pos"], (torch.float64, torch.float32), torch.float64, torch.float32),
    ],
)
def test_dtype(
    con: duckdb.DuckDBPyConnection,
    columns: list[str],
    dtype: Any,
    x_dtype: torch.dtype,
    y_dtype: torch.dtype,
) -> None:
    make_series(con, [[3]])
    with DDBDataLoader(con, SERIES_SQL, "y", batch_size=3, input_col=columns, dtype=dtype) as loader:
        ((x, y),) = list(loader)
    assert (x.dtype, y.dtype) == (x_dtype, y_dtype)
    by_name = {"f0": [0.0, 1.0, 2.0], "pos": [0, 1, 2], "gid": [0, 0, 0]}
    assert x.tolist() == [list(row) for row in zip(*(by_name[c] for c in columns), strict=True)]
    assert y.tolist() == [[0.5], [1.5], [2.5]]


# --- len, epochs, lifecycle ----------------------------------------------------------------------


def _shuffled(source: Any, **kwargs: Any) -> DDBDataLoader:
    options: dict[str, Any] = {
        "batch_size": 4,
        "window_size": 3,
        "shuffle": True,
        "seed": 11,
        "group_col": "gid",
        "repartition_col": "part",
        "group_pool_size": 2,
        # one query per partition: the fault-injection tests count and fail partition fetches
        "fetch_bytes": 0,
    }
    options.update(kwargs)
    return DDBDataLoader(source, SERIES_SQL, "y", input_col=["f0"], **options)


def _starts(batches: Sequence[Batch]) -> list[float]:
    return [float(v) for x, _ in batches for v in x[:, 0, 0].tolist()]


def _series_windows() -> list[float]:
    parts = [[10, 7, 12], [15, 6], [8, 9, 11, 10]]
    return sorted(rid(g, s) for g, sizes in enumerate(parts) for s in range(sum(sizes) - 3))


def test_len_is_exact_before_any_partition_is_fetched(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    backend = faulty(series)
    loader = _shuffled(backend)
    backend.planning = False
    # (10+7+12-3) + (15+6-3) + (8+9+11+10-3) = 79 windows in batches of 4
    assert len(loader) == 20
    assert backend.fetches == 0
    iterator = iter(loader)
    assert len(iterator) == 20
    next(iterator)
    assert len(iterator) == 19
    assert len(list(iterator)) == 19
    assert backend.fetches == 9
    loader.close()


def test_iterating_again_runs_the_next_epoch_and_set_epoch_replays_one(
    series: duckdb.DuckDBPyConnection,
) -> None:
    with _shuffled(series) as loader:
        assert loader.epoch == 0
        first = list(loader)
        assert loader.epoch == 1
        second = list(loader)
        assert loader.epoch == 2
        loader.set_epoch(0)
        again = list(loader)
    assert sorted(_starts(first)) == sorted(_starts(second)) == _series_windows()
    assert _starts(first) != _starts(second)
    assert_batches_equal(again, first)
    with _shuffled(series) as other:
        other.set_epoch(1)
        assert_batches_equal(list(other), second)
        assert other.epoch == 2


def test_without_shuffle_every_epoch_is_the_same(series: duckdb.DuckDBPyConnection) -> None:
    with _shuffled(series, shuffle=False) as loader:
        first, second = list(loader), list(loader)
    assert_batches_equal(first, second)
    assert _starts(first) == _series_windows()


def test_a_process_group_that_changes_the_world_size_mid_epoch_is_named(
    series: duckdb.DuckDBPyConnection,
) -> None:
    """Without an explicit rank the loader follows torch.distributed: a world that grows during an
    epoch (the epoch was cut for one rank) stops the epoch with both sizes, never a wrong shard."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with _shuffled(series, shuffle=False) as loader:
        batches = iter(loader)
        next(batches)
        torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        try:
            with pytest.raises(ValueError, match="world size changed from 1 to 2 during an epoch"):
                next(batches)
        finally:
            torch.distributed.destroy_process_group()


@pytest.mark.parametrize("epoch", [-1, 1.0, True, "1"])
def test_set_epoch_refuses_what_is_not_an_epoch(series: duckdb.DuckDBPyConnection, epoch: Any) -> None:
    with _shuffled(series) as loader, pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(epoch)


def test_with_block_closes_the_loader_and_what_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "series.duckdb"
    writer = duckdb.connect(str(path))
    make_series(writer, [[6, 5]])
    writer.close()
    with _shuffled(str(path)) as loader:
        iterator = iter(loader)
        assert next(iterator)[0].shape == (4, 3, 1)
        assert live_threads()
        with pytest.raises(duckdb.ConnectionException):
            duckdb.connect(str(path))  # the loader holds the file open read-only
    assert no_threads()
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    duckdb.connect(str(path)).close()


def test_with_block_exited_by_an_exception_stops_the_threads(series: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ZeroDivisionError), _shuffled(series) as loader:
        iterator = iter(loader)
        next(iterator)
        assert live_threads()
        _ = 1 / 0
    assert no_threads()


def test_closed_loader_refuses_to_iterate_and_its_iterator_raises(series: duckdb.DuckDBPyConnection) -> None:
    loader = _shuffled(series)
    iterator = iter(loader)
    next(iterator)
    loader.close()
    loader.close()
    assert no_threads()
    for _ in range(2):  # never a StopIteration that would end a training loop as if the epoch were done
        with pytest.raises(RuntimeError, match=r"DDBDataLoader was closed \(loader.close\(\)\)"):
            next(iterator)
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    with pytest.raises(RuntimeError, match="closed"):
        for _ in loader:
            pass


def test_a_temporary_loader_stays_alive_while_its_iterator_runs(series: duckdb.DuckDBPyConnection) -> None:
    count = sum(1 for _ in _shuffled(series))
    assert count == 20
    assert no_threads()


def test_a_new_iteration_over_an_abandoned_one_is_safe(series: duckdb.DuckDBPyConnection) -> None:
    with _shuffled(series) as reference:
        epoch0, epoch1 = list(reference), list(reference)
    with _shuffled(series) as loader:
        old = iter(loader)
        head = [next(old), next(old)]
        new = iter(loader)
        with pytest.raises(RuntimeError, match=r"superseded: iter\(loader\) was called again"):
            next(old)
        rest = list(new)
    assert_batches_equal(head, epoch0[:2])
    assert_batches_equal(rest, epoch1)
    assert no_threads()


def test_a_shape_probe_inside_the_loop_stops_it_with_an_error(series: duckdb.DuckDBPyConnection) -> None:
    """``next(iter(loader))`` inside the loop starts the next epoch: the running loop must not end
    quietly after 3 of 20 batches as if its epoch were complete."""
    with _shuffled(series) as loader:
        seen = 0
        with pytest.raises(RuntimeError, match="superseded"):
            for seen, _ in enumerate(loader, start=1):
                if seen == 3:
                    assert next(iter(loader))[0].shape == (4, 3, 1)
        assert seen == 3


def test_an_ended_epoch_keeps_raising_stop_iteration(series: duckdb.DuckDBPyConnection) -> None:
    with _shuffled(series) as loader:
        iterator = iter(loader)
        assert len(list(iterator)) == 20
        iterator.close()
        with pytest.raises(StopIteration):
            next(iterator)
        iter(loader)  # the finished iteration stops nothing
        with pytest.raises(StopIteration):
            next(iterator)


def test_a_closed_iterator_raises(series: duckdb.DuckDBPyConnection) -> None:
    with _shuffled(series) as loader:
        iterator = iter(loader)
        next(iterator)
        iterator.close()
        with pytest.raises(RuntimeError, match=r"iteration was closed \(iterator.close\(\)\)"):
            next(iterator)


def test_a_failed_iteration_raises_on_its_next_step(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    backend = faulty(series, fail_on=[2], error=lambda: PermissionError("revoked"))
    with _shuffled(backend, prepartition_num=1, group_pool_size=1, fetch_threads=1) as loader:
        backend.planning = False
        iterator = iter(loader)
        with pytest.raises(PermissionError):
            while True:
                next(iterator)
        with pytest.raises(RuntimeError, match=r"failed earlier \(PermissionError\)"):
            next(iterator)


@pytest.mark.parametrize("prefetch_batch", [0, 2])
def test_close_from_another_thread_during_a_step_raises_in_the_loop(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend], prefetch_batch: int
) -> None:
    backend = faulty(series, hang_on=[3], hang_seconds=1.0)
    loader = _shuffled(
        backend, prefetch_batch=prefetch_batch, prepartition_num=1, group_pool_size=1, fetch_threads=1
    )
    backend.planning = False
    closer = threading.Thread(target=lambda: (wait_until(lambda: backend.fetches >= 3), loader.close()))
    closer.start()
    with pytest.raises(RuntimeError, match="DDBDataLoader was closed"):
        for _ in loader:
            pass
    closer.join(10)
    assert no_threads()


def test_a_second_thread_cannot_iterate_a_loader_in_use(series: duckdb.DuckDBPyConnection) -> None:
    taken = threading.Event()
    done = threading.Event()
    batches: list[Batch] = []

    def consume() -> None:
        iterator = iter(loader)
        batches.append(next(iterator))
        taken.set()
        done.wait(10)
        batches.extend(iterator)

    with _shuffled(series) as loader:
        first = threading.Thread(target=consume, name="trainer")
        first.start()
        assert taken.wait(10)
        with pytest.raises(RuntimeError, match="being iterated by thread 'trainer'"):
            iter(loader)
        done.set()
        first.join(10)
        assert len(batches) == 20  # the first thread's iteration was left alone
        assert len(list(loader)) == 20  # once it ended, another thread may iterate


def test_two_threads_stepping_one_iterator_get_an_error_at_once(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    backend = faulty(series, hang_on=[1], hang_seconds=1.0)
    with _shuffled(backend, prefetch_batch=0, fetch_threads=1) as loader:
        backend.planning = False
        iterator = iter(loader)
        stepping = threading.Thread(target=next, args=(iterator,))
        stepping.start()
        assert wait_until(lambda: backend.fetches >= 1)  # the other thread is inside its step
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="two threads are stepping the same DDBDataLoader iterator"):
            next(iterator)
        assert time.monotonic() - started < 0.5
        stepping.join(10)


def test_inline_assembly_gives_the_same_batches(series: duckdb.DuckDBPyConnection) -> None:
    runs = []
    for prefetch_batch, fetch_threads in [(0, 1), (1, 2), (3, 3)]:
        with _shuffled(series, prefetch_batch=prefetch_batch, fetch_threads=fetch_threads) as loader:
            runs.append(list(loader))
    assert len(runs[0]) == 20
    assert_batches_equal(runs[1], runs[0])
    assert_batches_equal(runs[2], runs[0])


# --- threads -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("prefetch_batch", "assembler"), [(0, []), (2, ["ddbloader-assemble"])])
def test_threads_are_named_daemons(
    series: duckdb.DuckDBPyConnection, prefetch_batch: int, assembler: list[str]
) -> None:
    with _shuffled(series, prefetch_batch=prefetch_batch, fetch_threads=3) as loader:
        iterator = iter(loader)
        next(iterator)
        threads = [t for t in threading.enumerate() if t.name.startswith("ddbloader")]
        assert sorted(t.name for t in threads) == [
            *assembler,
            "ddbloader-fetch-0",
            "ddbloader-fetch-1",
            "ddbloader-fetch-2",
        ]
        assert all(t.daemon for t in threads)
    assert no_threads()


@pytest.mark.slow
def test_no_threads_left_after_50_early_breaks(series: duckdb.DuckDBPyConnection) -> None:
    """Each break is checked; tests/reliability's start-stop cycles repeat the endings 1,000 times."""
    with _shuffled(series) as loader:
        for _ in range(50):
            for step, (x, _y) in enumerate(loader):
                assert x.shape == (4, 3, 1)
                if step == 1:
                    break
            assert no_threads(), live_threads()
        assert loader.epoch == 50
        assert len(list(loader)) == 20
    assert no_threads()


def abandon_in_a_cycle(loader: DDBDataLoader) -> None:
    """Start an iteration, take one batch and drop the iterator inside a reference cycle, so that
    only the garbage collector can reach (and finalize) it."""
    cycle: dict[str, Any] = {"iterator": iter(loader)}
    cycle["self"] = cycle
    next(cycle["iterator"])
    del cycle


def test_no_threads_left_after_close(series: duckdb.DuckDBPyConnection) -> None:
    loader = _shuffled(series)
    iterator = iter(loader)
    next(iterator)
    assert live_threads()
    loader.close()
    assert no_threads()


def test_no_threads_left_after_gc_of_an_abandoned_iterator(series: duckdb.DuckDBPyConnection) -> None:
    with _shuffled(series) as loader:
        iterator = iter(loader)
        next(iterator)
        del iterator
        gc.collect()
        assert no_threads()
        # only the garbage collector can reach an iterator caught in a reference cycle
        gc.disable()
        try:
            abandon_in_a_cycle(loader)
            assert live_threads()
            gc.collect()
        finally:
            gc.enable()
        assert no_threads()


def test_gc_running_in_the_abandoned_iterators_own_fetch_thread_does_not_stall(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    def collect_then_fail() -> BaseException:
        gc.collect()
        return OSError("fetch after the collection")

    # one fetch thread, three partitions requested up front: the third fetch hangs until well after
    # the iterator is dropped, then runs the collection (hence its finalizer) in that fetch thread
    backend = faulty(series, fail_on=[3], hang_on=[3], hang_seconds=0.8, error=collect_then_fail)
    loader = _shuffled(backend, shuffle=False, fetch_threads=1, group_pool_size=1, prepartition_num=3)
    backend.planning = False
    gc.disable()
    try:
        abandon_in_a_cycle(loader)
        started = time.monotonic()
        assert no_threads(grace=4.0)
        assert time.monotonic() - started < 3.0
        # the hanging third fetch ran; the next group's first partition may have been queued ahead
        # of need and fetched before the close reached the fetch thread
        assert backend.fetches >= 3
    finally:
        gc.enable()
        loader.close()


def test_no_threads_left_after_an_exception_in_the_loop_body(series: duckdb.DuckDBPyConnection) -> None:
    with _shuffled(series) as loader:
        with pytest.raises(KeyError):
            for _ in loader:
                raise KeyError("consumer failed")
        assert no_threads()
        assert len(list(loader)) == 20


# --- errors --------------------------------------------------------------------------------------


class InjectedError(Exception):
    """A library-specific failure whose type the consumer must see."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"[{code}] {detail}")


class InjectedAbort(BaseException):
    """Not an Exception: must still travel, not vanish in a thread."""


ERRORS: list[Any] = [
    pytest.param(lambda: OSError("injected fault"), id="OSError"),
    pytest.param(lambda: InjectedError(7, "custom"), id="custom"),
    pytest.param(lambda: InjectedAbort("abort"), id="BaseException"),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make_error", ERRORS)
@pytest.mark.parametrize("prefetch_batch", [0, 2])
def test_fetch_error_reaches_the_consumer_with_its_type_subquery_and_frames(
    series: duckdb.DuckDBPyConnection,
    faulty: Callable[..., FaultyBackend],
    make_error: Callable[[], BaseException],
    prefetch_batch: int,
) -> None:
    raised: list[BaseException] = []

    def record() -> BaseException:
        raised.append(make_error())
        return raised[-1]

    backend = faulty(series, fail_on=[2], error=record)
    loader = _shuffled(backend, shuffle=False, fetch_threads=1, prefetch_batch=prefetch_batch)
    backend.planning = False
    error_type = type(make_error())
    with pytest.raises(error_type) as caught:
        for _ in loader:
            pass
    assert caught.value is raised[0]
    notes = caught.value.__notes__
    # one fetch thread fetches in submission order: fetch 2 is group 0's second partition
    fetch_note = (
        f"raised in thread 'ddbloader-fetch-0' while fetching partition 1 of group 0 "
        f"(subquery {loader.plan.groups[0].partitions[1].sql!r} with parameters [0, 1])"
    )
    assert fetch_note in notes
    assert re.search(r"WHERE gid = \$1 AND part = \$2", fetch_note)
    assert ("raised in thread 'ddbloader-assemble' while assembling batches" in notes) == bool(prefetch_batch)
    frames = "".join(traceback.format_exception(caught.value))
    assert "in before_fetch" in frames
    assert "in _run_job" in frames
    assert no_threads()
    # the failure does not poison the loader: the next epoch runs whole
    assert len(list(loader)) == len(loader)
    loader.close()


@pytest.mark.timeout(20)
def test_fetch_error_with_several_fetch_threads_names_its_subquery(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    backend = faulty(series, fail_on=[4], jitter=0.01)
    loader = _shuffled(backend, fetch_threads=3)
    backend.planning = False
    with pytest.raises(OSError, match="injected fault") as caught:
        list(loader)
    (note,) = [n for n in caught.value.__notes__ if "fetching" in n]
    assert re.fullmatch(
        r"raised in thread 'ddbloader-fetch-[0-2]' while fetching partition \d of group \d "
        r"\(subquery '.*' with parameters \[\d, \d\]\)",
        note,
    )
    assert no_threads()
    loader.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("prefetch_batch", [0, 1])
def test_a_hanging_fetch_times_out_promptly_and_leaves_no_threads(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend], prefetch_batch: int
) -> None:
    backend = faulty(series, hang_on=[1], hang_seconds=1.5)
    loader = _shuffled(backend, shuffle=False, fetch_threads=1, timeout=0.5, prefetch_batch=prefetch_batch)
    backend.planning = False
    started = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        next(iter(loader))
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "0.5 s" in message
    assert "fetching partition 0 of group 0" in message
    assert "with parameters [0, 0]" in message
    # The fetch wait times out at 0.5 s; joining the hung thread takes until its sleep ends, and
    # must not let the consumer's batch timeout (1 s) replace the error that names the subquery.
    assert 0.5 <= elapsed < 1.5 + 1.0
    assert no_threads()
    loader.close()


@pytest.mark.parametrize("ordered", [True, False])
def test_ranks_over_a_query_without_order_by_are_warned_about(
    con: duckdb.DuckDBPyConnection, ordered: bool
) -> None:
    """Ranks both read the partition a shard boundary cuts: only an ORDER BY makes them agree."""
    make_series(con, [[20, 10], [15]])
    sql = "SELECT gid, part, f0, y FROM series" + (" ORDER BY gid, part, pos" if ordered else "")
    about_order = warnings_containing(
        "no ORDER BY",
        lambda: DDBDataLoader(con, sql, "y", input_col=["f0"], group_col="gid", rank=1, world_size=2).close(),
    )
    if ordered:
        assert about_order == []
    else:
        assert len(about_order) == 1
        assert about_order[0].startswith("world_size=2 splits groups between ranks")


def _named(batches: Any) -> list[list[float]]:
    """Per batch, the names (first x row) of its samples."""
    return [_starts([batch]) for batch in batches]


def _epochs(source: Any, count: int) -> list[list[list[float]]]:
    """The first-x-row names of every batch of epochs 0..count-1, each pinned with set_epoch."""
    with _shuffled(source) as loader:
        epochs = []
        for epoch in range(count):
            loader.set_epoch(epoch)
            epochs.append(_named(loader))
    assert len({str(e) for e in epochs}) == count, "the reference epochs differ from each other"
    return epochs


def test_iterators_that_never_step_use_up_no_epoch(series: duckdb.DuckDBPyConnection) -> None:
    """tqdm wrappers (tqdm.auto calls iter() in its constructor) and probes claim nothing."""
    from tqdm import tqdm
    from tqdm.auto import tqdm as auto_tqdm

    reference = _epochs(series, 3)
    with _shuffled(series) as loader:
        for _ in range(3):
            iter(loader)  # a framework's probe
        assert loader.epoch == 0
        seen = [_named(auto_tqdm(loader)), _named(tqdm(loader))]
        seen.append(_named(auto_tqdm(loader, total=len(loader))))
        assert loader.epoch == 3
    assert seen == reference


def test_a_peek_gives_its_epoch_back(series: duckdb.DuckDBPyConnection) -> None:
    reference = _epochs(series, 2)
    with _shuffled(series) as loader:
        first = next(iter(loader))  # dropped at once: the iterator is collected
        assert _named([first]) == reference[0][:1]
        assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (0, 0)
        kept = iter(loader)
        next(kept)
        assert loader.state_dict()["batches"] == 1, "inside the loop the state counts the batch"
        assert _named(loader) == reference[0], "superseding a peek gives its epoch back too"
        assert _named(loader) == reference[1]
        with pytest.raises(RuntimeError, match="superseded"):
            next(kept)


def test_two_batches_claim_the_epoch(series: duckdb.DuckDBPyConnection) -> None:
    reference = _epochs(series, 2)
    with _shuffled(series) as loader:
        iterator = iter(loader)
        assert _named([next(iterator), next(iterator)]) == reference[0][:2]
        del iterator
        assert loader.epoch == 1
        assert _named(loader) == reference[1]


def test_set_epoch_pins_the_epoch_that_starts_next(series: duckdb.DuckDBPyConnection) -> None:
    reference = _epochs(series, 3)
    with _shuffled(series) as loader:
        iterator = iter(loader)
        assert iterator.epoch == 0
        loader.set_epoch(2)
        assert iterator.epoch == 2, "an iterator that has not stepped serves the pinned epoch"
        assert len(iterator) == len(reference[2])
        assert _named(iterator) == reference[2]
        peek = iter(loader)
        next(peek)
        loader.set_epoch(1)  # pinning drops the peek's claim to give epoch 3 back
        del peek
        assert loader.epoch == 1
        assert _named(loader) == reference[1]


def test_the_dataloader_attributes_torch_code_reads(series: duckdb.DuckDBPyConnection) -> None:
    reference = _epochs(series, 3)
    with _shuffled(series, batch_size=5, drop_last=True) as loader:
        assert (loader.batch_size, loader.drop_last, loader.num_workers) == (5, True, 0)
        assert loader.pin_memory is torch.cuda.is_available()  # pin_memory="auto", resolved
        assert len(loader.dataset) == len(loader.sampler) == loader.plan.samples == 79
        assert len(loader) == 79 // 5
    with _shuffled(series) as loader, _shuffled(series, rank=1, world_size=2) as half:
        loader.sampler.set_epoch(1)
        assert _named(loader) == reference[1]
        assert len(half.sampler) == 40 and len(half.dataset) == 79


@pytest.mark.parametrize(("argument", "value"), [("group_col", "nope"), ("repartition_col", "part + nope")])
def test_an_unknown_key_column_names_the_argument_and_the_column(
    series: duckdb.DuckDBPyConnection, argument: str, value: str
) -> None:
    message = f"cannot split this query by {argument} '{re.escape(value)}'.* 'nope' is not one of its result"
    with pytest.raises(ValueError, match=message):
        DDBDataLoader(series, SERIES_SQL, "y", input_col=["f0"], **{argument: value})


@pytest.mark.parametrize(
    ("sql", "shown"),
    [
        ("SELEC * FROM series", 'Parser Error: syntax error at or near "SELEC"\n\nLINE 1: SELEC \\* FROM'),
        ("SELECT f0 * FROM series", 'syntax error at or near "FROM"\n\nLINE 1: SELECT f0 \\* FROM series'),
        ("SELECT f0 FRM series", 'syntax error at or near "series"'),
    ],
)
def test_a_sql_syntax_error_gives_the_engines_own_message(
    series: duckdb.DuckDBPyConnection, sql: str, shown: str
) -> None:
    with pytest.raises(ValueError, match="sql does not parse as duckdb SQL: ") as raised:
        DDBDataLoader(series, sql, "y")
    assert re.search(shown, str(raised.value)), raised.value
    assert "sqlglot" not in str(raised.value) and "<class" not in str(raised.value)


@pytest.mark.multiprocess
def test_a_duckdb_file_locked_by_another_process_says_who_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "locked.duckdb"
    writer = (
        f"import duckdb, sys; c = duckdb.connect({str(path)!r}); "
        "c.execute('CREATE TABLE t AS SELECT 1.0 AS y'); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", writer],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(
            duckdb.IOException, match=rf"PID {holder.pid}\)(.|\n)*one writer(.|\n)*read_only=True"
        ):
            DDBDataLoader(str(path), "SELECT y FROM t", "y")
    finally:
        holder.communicate(timeout=30)


def test_a_dataframe_as_the_source_points_to_from_pandas() -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"f": [0.5, 1.5], "y": [1.0, 2.0]})
    with pytest.raises(TypeError, match=r"pandas.DataFrame, .*DDBDataLoader\.from_pandas\(data, target_col"):
        DDBDataLoader(frame, "SELECT * FROM data", "y")
    with DDBDataLoader.from_pandas(frame, "y", batch_size=2) as loader:
        ((x, y),) = list(loader)
    assert x.tolist() == [[0.5], [1.5]] and y.tolist() == [[1.0], [2.0]]


def test_scheme_values_equal_in_sql_are_reported_as_such_not_as_an_unresolved_group_col() -> None:
    with duckdb.connect() as con:
        con.execute(
            "CREATE TABLE t AS SELECT (i % 3)::VARCHAR AS g, i * 1.0 AS f, i * 0.5 AS y FROM range(9) r(i)"
        )
        with pytest.raises(ValueError, match=r"^group_scheme values \[1, '1'\] are equal in SQL"):
            DDBDataLoader(con, "SELECT * FROM t", "y", group_col="g", group_scheme=[1, "1"])
