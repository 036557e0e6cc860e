"""Exact mid-epoch resume through ``state_dict`` / ``load_state_dict`` (see tests/resume_check.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import duckdb
import pytest
from conftest import SERIES_SQL, FaultyBackend, make_series
from resume_check import (
    Batch,
    assert_resumes_exactly,
    assert_same_batches,
    assert_small_state,
    assert_state_counts_handed_out,
    json_roundtrip,
)

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(60)

GROUPED = {"group_col": "gid", "repartition_col": "part"}


def factory(con: duckdb.DuckDBPyConnection, **kwargs: Any) -> Callable[[], DDBDataLoader]:
    return lambda: DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0", "f1"], **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"batch_size": 4}, id="plain"),
        pytest.param({"batch_size": 4, "shuffle": True}, id="shuffled-seed-none"),
        pytest.param({"batch_size": 5, "shuffle": True, "seed": 7, "drop_last": True}, id="drop-last"),
        pytest.param({"batch_size": 3, "window_size": [4, 2], "window_stride": 2}, id="windowed"),
        pytest.param({"batch_size": 4, "shuffle": True, "window_size": 3, **GROUPED}, id="grouped-shuffled"),
        pytest.param({"batch_size": 6, "window_size": 5, **GROUPED}, id="grouped"),
        pytest.param(
            {
                "batch_size": 4,
                "shuffle": True,
                "seed": 1,
                "prefetch_batch": 0,
                "group_pool_size": 1,
                **GROUPED,
            },
            id="no-prefetch-pool-1",
        ),
        pytest.param(
            {"batch_size": 4, "shuffle": True, "seed": 2, "rank": 1, "world_size": 3, **GROUPED},
            id="rank-1-of-3",
        ),
    ],
)
def test_resumes_exactly(series: duckdb.DuckDBPyConnection, kwargs: dict[str, Any]) -> None:
    assert_resumes_exactly(factory(series, **kwargs), epochs=2)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [False, True])
def test_resumes_exactly_in_the_middle_of_a_streamed_partition(
    con: duckdb.DuckDBPyConnection, shuffle: bool
) -> None:
    # Rows of f0, f1 and y are 24 bytes: partitions of 300 and 260 rows are streamed in pieces of
    # 60-65 rows, so the cuts fall inside a streamed subquery; the resumed epoch's query skips
    # the rows before the piece it starts at, and windows cross the piece boundaries.
    make_series(con, [[300, 40], [260]])
    kwargs = {"batch_size": 16, "window_size": 5, "seed": 3, "fetch_bytes": 66 * 24, **GROUPED}
    assert_resumes_exactly(factory(con, shuffle=shuffle, **kwargs), epochs=2)


def test_a_state_from_other_streamed_pieces_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    """fetch_bytes decides how a big partition is cut into pieces, and the pieces decide the order."""
    make_series(con, [[300, 40], [260]])
    kwargs = {"batch_size": 16, "window_size": 5, "seed": 3, "shuffle": True, **GROUPED}
    with DDBDataLoader(con, SERIES_SQL, "y", fetch_bytes=66 * 24, **kwargs) as first:
        next(iter(first))
        state = json_roundtrip(first.state_dict())
    with (
        DDBDataLoader(con, SERIES_SQL, "y", fetch_bytes=200 * 24, **kwargs) as second,
        pytest.raises(ValueError, match=r"whose plan has \d+ partitions; this one has \d+: .*fetch_bytes"),
    ):
        second.load_state_dict(state)


def test_a_single_batch_epoch_resumes(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[3]])
    assert_resumes_exactly(factory(con, batch_size=8, shuffle=True), epochs=3)


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_the_state_counts_batches_handed_out_not_prefetched(series: duckdb.DuckDBPyConnection) -> None:
    with DDBDataLoader(
        series, SERIES_SQL, "y", batch_size=2, prefetch_batch=64, fetch_threads=3, **GROUPED
    ) as loader:
        assert len(loader) > 10
        assert_state_counts_handed_out(loader, 3)


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_every_rank_resumes_from_rank_0s_state(series: duckdb.DuckDBPyConnection) -> None:
    """Checkpoints are usually written by rank 0 only: its state must serve every rank."""
    shared = {"batch_size": 3, "shuffle": True, "seed": 5, "world_size": 3, **GROUPED}
    with DDBDataLoader(series, SERIES_SQL, "y", rank=0, **shared) as rank0:
        iterator = iter(rank0)
        for _ in range(2):
            next(iterator)
        state = json_roundtrip(rank0.state_dict())
    for rank in range(3):
        with DDBDataLoader(series, SERIES_SQL, "y", rank=rank, **shared) as reference:
            want = list(reference)[2:]
        with DDBDataLoader(series, SERIES_SQL, "y", rank=rank, **shared) as resumed:
            resumed.load_state_dict(state)
            assert_same_batches(list(resumed), want, f"rank {rank}")


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_a_state_from_another_plan_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[10, 7]])
    with DDBDataLoader(con, SERIES_SQL, "y", batch_size=2) as loader:
        state = loader.state_dict()
    with (
        DDBDataLoader(con, SERIES_SQL, "y", batch_size=2, window_size=3) as windowed,
        pytest.raises(ValueError, match=r"17 samples per epoch; this one has 14"),
    ):
        windowed.load_state_dict(state)
    make_series(con, [[10, 8]])
    with DDBDataLoader(con, SERIES_SQL, "y", batch_size=2) as grown:
        with pytest.raises(ValueError, match="the query, the data or the window arguments differ"):
            grown.load_state_dict(state)
        with pytest.raises(
            ValueError, match=r"state version 2 is not 4: .* batches for the same seed differ"
        ):
            grown.load_state_dict({**state, "version": 2})


def test_set_epoch_after_load_keeps_the_resume_only_for_the_saved_epoch(
    series: duckdb.DuckDBPyConnection,
) -> None:
    """Decision: ``set_epoch(saved epoch)`` (a DistributedSampler-style loop) still resumes mid-epoch;
    ``set_epoch`` of any other epoch discards the position and runs that epoch whole."""
    make = factory(series, batch_size=4, shuffle=True, seed=3)
    with make() as loader:
        epoch0, epoch1 = list(loader), list(loader)
        loader.set_epoch(1)
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 1)

    with make() as resumed:
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        assert resumed.state_dict()["batches"] == 1
        assert_same_batches(list(resumed), epoch1[1:], "set_epoch(saved) then resume")
    with make() as restarted:
        restarted.load_state_dict(state)
        with pytest.warns(UserWarning, match=r"set_epoch\(0\) drops the position load_state_dict restored"):
            restarted.set_epoch(0)
        assert (restarted.state_dict()["epoch"], restarted.state_dict()["batches"]) == (0, 0)
        assert_same_batches(list(restarted), epoch0, "set_epoch(other) runs that epoch whole")
        assert_same_batches(list(restarted), epoch1, "and the next one after it")


def test_a_state_at_the_last_batch_finishes_that_epoch_first(series: duckdb.DuckDBPyConnection) -> None:
    """A checkpoint at the last step (inside the loop) resumes to an empty rest of that epoch."""
    make = factory(series, batch_size=10, shuffle=True, seed=4)
    with make() as loader:
        iterator = iter(loader)
        epoch0 = [next(iterator) for _ in range(len(loader))]
        inside = loader.state_dict()
        with pytest.raises(StopIteration):
            next(iterator)
        outside = loader.state_dict()
        epoch1 = list(loader)
    assert_small_state(inside)
    assert (inside["epoch"], inside["batches"]) == (0, len(epoch0))
    assert (outside["epoch"], outside["batches"]) == (1, 0)
    with make() as resumed:
        resumed.load_state_dict(inside)
        assert list(resumed) == []
        assert_same_batches(list(resumed), epoch1, "epoch 1 after the empty rest")


@pytest.mark.parametrize(
    ("saved", "changed"),
    [
        ({"batch_size": 4}, {"batch_size": 5}),
        ({"shuffle": True, "seed": 1}, {"shuffle": False, "seed": 1}),
        ({"drop_last": False}, {"drop_last": True}),
        (
            {"group_pool_size": 3, "shuffle": True, "seed": 1},
            {"group_pool_size": 2, "shuffle": True, "seed": 1},
        ),
    ],
)
def test_a_state_from_other_batching_arguments_is_refused(
    series: duckdb.DuckDBPyConnection, saved: dict[str, Any], changed: dict[str, Any]
) -> None:
    base = {"batch_size": 4, "window_size": 3, "group_col": "gid", "input_col": ["f0"]}
    with DDBDataLoader(series, SERIES_SQL, "y", **{**base, **saved}) as first:
        iterator = iter(first)
        next(iterator)
        state = first.state_dict()
    name = next(iter(k for k in changed if k != "seed"))
    with (
        DDBDataLoader(series, SERIES_SQL, "y", **{**base, **changed}) as second,
        pytest.raises(ValueError, match=name),
    ):
        second.load_state_dict(state)


def resume_last_two(
    con: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend], options: dict[str, Any]
) -> tuple[int, list[Batch], int]:
    """Cut an epoch of f0 windows 2 batches before its end and resume over a fetch-counting backend.

    Returns the batches served before the cut, the last 2 batches (checked equal to the
    uninterrupted run's) and the partition fetches of the resumed loader.
    """
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], **options) as loader:
        iterator = iter(loader)
        served = len(loader) - 2
        for _ in range(served):
            next(iterator)
        state = loader.state_dict()
        rest = list(iterator)
    backend = faulty(con)
    with DDBDataLoader(backend, SERIES_SQL, "y", input_col=["f0"], **options) as resumed:
        backend.planning = False
        resumed.load_state_dict(state)
        assert_same_batches(list(resumed), rest, "the last 2 batches")
    return served, rest, backend.fetches


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resume_fetches_only_what_the_rest_of_the_epoch_needs(
    con: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend], shuffle: bool
) -> None:
    # 4 series x 10 partitions; resuming before the last 2 batches must not replay the epoch's
    # fetches: only the partitions being served, those queued behind them and the neighbours
    # whose edge rows a remaining window spans
    make_series(con, [[8] * 10] * 4)
    options: dict[str, Any] = {"batch_size": 8, "window_size": 3, "shuffle": shuffle, "seed": 5, **GROUPED}
    served, _, fetches = resume_last_two(con, faulty, options)
    assert served > 20
    assert 1 <= fetches <= 12  # of the 40 partitions a full replay fetched


def test_a_resume_does_not_fetch_edge_rows_no_remaining_window_reaches(
    con: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    # one series of 3 partitions of 5 rows, windows of 3 rows: the last 2 samples (rows 11..14)
    # lie in partition 2 alone, so partition 1's edge rows, kept for the step, need no fetch
    make_series(con, [[5, 5, 5]])
    options: dict[str, Any] = {"batch_size": 1, "window_size": [3, 1], "offset": 2, **GROUPED}
    _, rest, fetches = resume_last_two(con, faulty, options)
    assert [x[0, :, 0].tolist() for x, _ in rest] == [[11.0, 12.0, 13.0], [12.0, 13.0, 14.0]]
    assert fetches == 1


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        (None, TypeError, r"load_state_dict takes a ddbloader state, .*got NoneType None"),
        ([("epoch", 1)], TypeError, r"got list \[\('epoch', 1\)\]"),
        (
            {"_snapshot": {}, "_num_yielded": 3, "_sampler_iter_state": None},
            ValueError,
            r"not a ddbloader state .*it lacks \['version', 'epoch', .*torchdata StatefulDataLoader's state",
        ),
        (
            {"model": {}, "optimizer": {}},
            ValueError,
            r"not a ddbloader state .*its keys: \['model', 'optimizer'\]",
        ),
    ],
    ids=["none", "list", "stateful-dataloader", "foreign-dict"],
)
def test_what_is_not_a_loader_state_is_refused_naming_what_it_got(
    series: duckdb.DuckDBPyConnection, state: Any, error: type[Exception], message: str
) -> None:
    with factory(series, batch_size=4)() as loader:
        with pytest.raises(error, match=message):
            loader.load_state_dict(state)
        assert len(list(loader)) == len(loader)  # the loader is as it was


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("epoch", -3),
        ("epoch", "1"),
        ("seed", 1.5),
        ("batches", -1),
        ("world_size", 0),
        ("rank", None),
        ("batch_size", True),
        ("shuffle", 1),
        ("drop_last", "no"),
        ("group_pool_size", 0),
        ("even_batches", "even"),
        ("partitions", -1),
        ("plan", 7),
        ("worker", -1),
        ("num_workers", 0),
        ("resumed", "[]"),
        ("version", "4"),
    ],
)
def test_every_state_field_is_checked_at_load_not_at_the_first_batch(
    series: duckdb.DuckDBPyConnection, field: str, value: Any
) -> None:
    make = factory(series, batch_size=4, shuffle=True, seed=3)
    with make() as saver:
        whole = len(saver)
        iterator = iter(saver)
        next(iterator)
        state = json_roundtrip(saver.state_dict())
    with make() as loader:
        with pytest.raises(ValueError, match=rf"^state has {field}={re.escape(repr(value))}, which is not "):
            loader.load_state_dict({**state, field: value})
        loader.load_state_dict(state)  # the state itself loads, and resumes after its batch
        assert len(list(loader)) == whole - 1


@pytest.mark.parametrize("cut", [0, 3, "last"])
def test_len_after_a_resume_is_the_batches_the_next_iteration_yields(
    series: duckdb.DuckDBPyConnection, cut: int | str
) -> None:
    """As after an elastic resume (tests/test_elastic.py): the rest of the epoch, then whole epochs."""
    make = factory(series, batch_size=4, shuffle=True, seed=3, **GROUPED)
    with make() as saver:
        whole = len(saver)
        taken = whole if cut == "last" else int(cut)
        iterator = iter(saver)
        for _ in range(taken):
            next(iterator)
        state = json_roundtrip(saver.state_dict())
    with make() as loader:
        loader.load_state_dict(state)
        assert len(loader) == whole - taken
        assert len(list(loader)) == whole - taken
        assert len(loader) == whole
        assert len(list(loader)) == whole
