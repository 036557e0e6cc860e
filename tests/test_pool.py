"""Sample emission through the real loader: coverage, group boundaries, alignment, batching, memory.

Every table comes from ``make_series``: x is the single column ``f0`` (the row id ``rid``, which
is ``gid * 1_000_000 + row number within the group``) and y is ``rid + 0.5``, so each batch says
exactly which rows every sample holds. The expected samples are computed here from the group
sizes alone, independently of the library's window arithmetic.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import numpy as np
import pytest
import torch
from conftest import SERIES_SQL, FaultyBackend, make_series, wait_until
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from planned import views

from ddbloader import DDBDataLoader
from ddbloader._core.config import LoaderConfig
from ddbloader._epoch import schedule as schedule_module
from ddbloader._epoch.schedule import BatchSchedule, EventKind
from ddbloader._epoch.shard import epoch_units
from ddbloader._epoch.units import fetch_units
from ddbloader._io.block import Block
from ddbloader._io.cache import PartitionCache
from ddbloader._io.fetch import Fetcher
from ddbloader._io.source import PartitionSource
from ddbloader._io.threads import Pending
from ddbloader._pipeline.arena import Arena
from ddbloader._pipeline.batch import batch_count, gather
from ddbloader._pipeline.pool import GroupPool
from ddbloader._sql.partition import PartitionSpec
from ddbloader._sql.plan import MIN_PIECE_ROWS, GroupPlan, QueryPlan
from ddbloader.backends import DuckDBBackend
from ddbloader.stats import LoaderStats

GROUP_ROWS = 1_000_000


@dataclass(frozen=True)
class Case:
    """One loader configuration over one table."""

    parts: list[list[int]]
    windowed: bool
    x_window: int
    y_window: int
    stride: int
    offset: int | None
    batch_size: int
    drop_last: bool
    shuffle: bool
    seed: int
    epoch: int
    group_pool_size: int
    prepartition_num: int
    fetch_threads: int
    prefetch_batch: int
    repartitioned: bool
    grouped: bool
    fetch_bytes: int = 0

    @property
    def effective_offset(self) -> int:
        if self.offset is not None:
            return self.offset
        return self.x_window if self.windowed else 0

    @property
    def span(self) -> int:
        return max(self.x_window, self.effective_offset + self.y_window)

    def kwargs(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "window_size": [self.x_window, self.y_window] if self.windowed else None,
            "window_stride": self.stride if self.windowed else None,
            "offset": self.offset,
            "input_col": ["f0"],
            "group_col": "gid" if self.grouped else None,
            "repartition_col": "part" if self.repartitioned else None,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "group_pool_size": self.group_pool_size,
            "prepartition_num": self.prepartition_num,
            "fetch_threads": self.fetch_threads,
            "prefetch_batch": self.prefetch_batch,
            "fetch_bytes": self.fetch_bytes,
            "timeout": 30.0,
            "dtype": torch.float64,  # the byte budgets above count 16-byte rows (x and y float64)
        }


def expected_starts(case: Case) -> list[int]:
    """Start rids of every valid window, group by group in row order."""
    starts = []
    for gid, sizes in enumerate(case.parts):
        rows = sum(sizes)
        s = 0
        while s + case.span <= rows:
            starts.append(gid * GROUP_ROWS + s)
            s += case.stride
    return starts


def touched_partitions(case: Case) -> int:
    """Non-empty partitions that hold at least one row of some sample: these must be fetched."""
    touched = 0
    for sizes in case.parts if case.repartitioned else [[sum(p)] for p in case.parts]:
        rows = sum(sizes)
        starts = range(0, max(rows - case.span + 1, 0), case.stride)
        first = 0
        for size in sizes:
            if size and any(s < first + size and s + case.span > first for s in starts):
                touched += 1
            first += size
    return touched


@st.composite
def cases(draw: st.DrawFn) -> Case:
    # Small partitions (often shorter than the window, often a single row) next to larger ones.
    size = st.one_of(st.integers(1, 3), st.integers(0, 12))
    parts = draw(st.lists(st.lists(size, min_size=1, max_size=4), min_size=1, max_size=4))
    windowed = draw(st.booleans())
    x_window, y_window = (draw(st.integers(1, 4)), draw(st.integers(1, 3))) if windowed else (1, 1)
    case = Case(
        parts=parts,
        windowed=windowed,
        x_window=x_window,
        y_window=y_window,
        stride=draw(st.integers(1, 4)) if windowed else 1,  # ignored without windows (DolphinDB)
        offset=draw(st.none() | st.integers(0, 5)),
        batch_size=draw(st.integers(1, 7)),
        drop_last=draw(st.booleans()),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**63 - 1)),
        epoch=draw(st.integers(0, 3)),
        group_pool_size=draw(st.integers(1, 4)),
        prepartition_num=draw(st.integers(1, 3)),
        fetch_threads=draw(st.integers(1, 3)),
        prefetch_batch=draw(st.integers(0, 2)),
        repartitioned=draw(st.booleans()),
        # Without group_col the whole table is one series, which is only right for one gid.
        grouped=len(parts) > 1 or draw(st.booleans()),
        # Rows are 16 bytes (f0 and y): one partition per query, units of a few rows, everything.
        fetch_bytes=draw(st.sampled_from([0, 48, 200, 64 * 2**20])),
    )
    assume(expected_starts(case))  # a loader that can make no sample is refused at construction
    return case


@st.composite
def streamed_cases(draw: st.DrawFn) -> Case:
    """Cases whose partitions are mostly larger than ``fetch_bytes``: streamed in pieces of 32 to
    160 rows, so windows cross piece boundaries."""
    case = draw(cases())
    size = st.one_of(st.integers(0, 12), st.integers(MIN_PIECE_ROWS, 4 * MIN_PIECE_ROWS))
    parts = draw(st.lists(st.lists(size, min_size=1, max_size=3), min_size=1, max_size=3))
    streamed = replace(
        case,
        parts=parts,
        grouped=len(parts) > 1 or case.grouped,
        batch_size=draw(st.integers(1, 40)),
        fetch_bytes=draw(st.sampled_from([16 * MIN_PIECE_ROWS, 40 * MIN_PIECE_ROWS, 16 * 2**20])),
    )
    assume(expected_starts(streamed))
    return streamed


def as_windows(x: torch.Tensor, y: torch.Tensor, windowed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The rids of x ``[B, wx]`` and of y ``[B, wy]`` (y's ``+ 0.5`` removed)."""
    if not windowed:
        x, y = x[:, None, :], y[:, None, :]
    assert x.shape[-1] == 1
    assert y.shape[-1] == 1
    assert x.dtype == torch.float64
    assert y.dtype == torch.float64
    return x[..., 0], y[..., 0] - 0.5


def run_epoch(
    case: Case,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int, int, FaultyBackend, LoaderStats]:
    """Batches of one epoch, ``len(loader)``, the partitions planned, the backend and the stats."""
    con = duckdb.connect()
    try:
        make_series(con, case.parts)
        backend = FaultyBackend(DuckDBBackend(con))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="samples need")
            loader = DDBDataLoader(backend, SERIES_SQL, "y", **case.kwargs())
        backend.planning = False
        with loader:
            loader.set_epoch(case.epoch)
            batches = list(loader)
            return batches, len(loader), loader.plan.partitions, backend, loader.stats()
    finally:
        con.close()


def _series_rids(con: duckdb.DuckDBPyConnection, group: GroupPlan) -> np.ndarray[Any, Any]:
    """``group``'s rids in the order its samples number its rows: its partitions' rows one after
    another (the query's order, except across combed range pieces without windows, see
    ddbloader._sql.pieces), or, for combed pieces of windows, each piece's runs where they lie in
    the series (ddbloader._sql.window_pieces)."""
    blocks = [
        con.sql(p.sql, params=list(p.params))
        .to_arrow_table()
        .column("rid")
        .to_numpy()[p.first_row : p.first_row + p.rows]
        for p in views(group)
    ]
    if not group.combed_windows:
        return np.concatenate(blocks or [np.empty(0, np.int64)])
    series = np.full(group.rows, -1, np.int64)
    for partition, block in zip(views(group), blocks, strict=True):
        assert partition.windows is not None
        rows = np.concatenate([np.arange(first, first + n) for first, n in partition.windows.runs])
        series[rows] = block
    assert (series >= 0).all()
    return series


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_every_window_exactly_once_aligned_and_within_its_group(case: Case) -> None:
    check_every_window_exactly_once(case)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(case=streamed_cases())
def test_streamed_partitions_give_every_window_exactly_once(case: Case) -> None:
    partitions = check_every_window_exactly_once(case)
    subqueries = [rows for g in case.parts for rows in (g if case.repartitioned else [sum(g)]) if rows]
    streamed = [rows for rows in subqueries if rows * 16 > case.fetch_bytes]  # rows: f0 and y
    assert partitions >= len(subqueries) + len(streamed)


def check_every_window_exactly_once(case: Case) -> int:
    """One epoch of ``case`` emits exactly the expected windows, aligned, in order unshuffled;
    each partition is fetched at most once and every partition a sample needs is fetched.
    Returns the partitions planned."""
    batches, length, partitions, backend, stats = run_epoch(case)
    expected = expected_starts(case)

    assert length == len(batches)
    sizes = [x.shape[0] for x, _ in batches]
    assert all(len(y) == n for (_, y), n in zip(batches, sizes, strict=True))
    if case.drop_last:
        assert sizes == [case.batch_size] * (len(expected) // case.batch_size)
    else:
        assert sum(sizes) == len(expected)
        assert all(n == case.batch_size for n in sizes[:-1])
        assert all(1 <= n <= case.batch_size for n in sizes[-1:])

    starts: list[int] = []
    for x, y in batches:
        assert x.shape[1:] == ((case.x_window, 1) if case.windowed else (1,))
        assert y.shape[1:] == ((case.y_window, 1) if case.windowed else (1,))
        x_rids, y_rids = as_windows(x, y, case.windowed)
        for xs, ys in zip(x_rids.tolist(), y_rids.tolist(), strict=True):
            start = int(xs[0])
            gid = start // GROUP_ROWS
            assert {int(r) // GROUP_ROWS for r in xs + ys} == {gid}, "a sample crosses groups"
            assert xs == [float(start + k) for k in range(case.x_window)], "x rows are not consecutive"
            y_first = start + case.effective_offset
            assert ys == [float(y_first + k) for k in range(case.y_window)], "y is not anchored to x"
            starts.append(start)

    if case.drop_last:
        assert Counter(starts) <= Counter(expected)
        assert len(starts) == len(expected) - len(expected) % case.batch_size
    else:
        assert Counter(starts) == Counter(expected)
    if not case.shuffle:
        assert starts == expected[: len(starts)]

    # Each partition is fetched at most once, and every one an emitted sample needs is fetched;
    # fetch units bring several in one query. A query still running when the epoch ends (the
    # next unit, fetched ahead, when drop_last leaves its samples out) is counted by the engine
    # but not by the stats.
    assert stats.queries <= backend.fetches <= partitions
    assert stats.partitions_fetched <= partitions
    if len(starts) == len(expected):
        assert stats.partitions_fetched >= touched_partitions(case)
        if case.fetch_bytes == 0:
            assert backend.fetches == stats.partitions_fetched
    return partitions


def test_unshuffled_order_example(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[2, 3], [1, 1, 1, 1]])
    with DDBDataLoader(
        con,
        SERIES_SQL,
        "y",
        batch_size=2,
        window_size=[2, 1],
        input_col=["f0"],
        group_col="gid",
        repartition_col="part",
        prepartition_num=1,
        group_pool_size=2,
    ) as loader:
        batches = list(loader)
    assert len(loader) == 3
    firsts = [x[:, 0, 0].tolist() for x, _ in batches]
    assert firsts == [[0.0, 1.0], [2.0, 1_000_000.0], [1_000_001.0]]
    assert [y[:, 0, 0].tolist() for _, y in batches] == [[2.5, 3.5], [4.5, 1_000_002.5], [1_000_003.5]]


def schedule_of(plan: QueryPlan, config: LoaderConfig, epoch: int) -> BatchSchedule:
    """The schedule of one (single-process) epoch, as the loader makes it."""
    units = epoch_units(plan, config, epoch)
    batches = batch_count(sum(u.samples for u in units), config.batch_size, config.drop_last)
    return BatchSchedule(units, plan.geometry, config, epoch, batches)


def pool_of(
    plan: QueryPlan,
    config: LoaderConfig,
    epoch: int,
    fetcher: PartitionSource,
    stop: threading.Event,
    arena: Arena | None = None,
) -> GroupPool:
    return GroupPool(schedule_of(plan, config, epoch), fetcher, stop, arena=arena)


def held_partitions(con: duckdb.DuckDBPyConnection, case: Case) -> tuple[int, int]:
    """Drive a real GroupPool over one epoch (checking its gauge after every batch); return its
    high-water mark and what it holds after."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="samples need")
        loader = DDBDataLoader(con, SERIES_SQL, "y", **case.kwargs())
    with loader:
        fetcher = Fetcher(DuckDBBackend(con), loader.plan, case.fetch_threads)
        stop = threading.Event()
        try:
            pool = pool_of(loader.plan, loader.config, case.epoch, fetcher, stop)
            limit = case.group_pool_size * case.prepartition_num
            for pieces in pool.batches():
                assert sum(len(p.starts) for p in pieces) <= case.batch_size
                assert pool.gauge.held <= limit
            return pool.gauge.high_water, pool.gauge.held
        finally:
            stop.set()
            fetcher.close()


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(case=cases() | streamed_cases())
def test_partitions_held_never_exceed_pool_times_prepartition(case: Case) -> None:
    case = replace(case, drop_last=False)  # every sample served: every partition handed back
    con = duckdb.connect()
    try:
        make_series(con, case.parts)
        high_water, held_after = held_partitions(con, case)
    finally:
        con.close()
    assert high_water <= case.group_pool_size * case.prepartition_num
    assert held_after == 0
    if expected_starts(case):
        assert high_water >= 1


def pool_epoch(
    con: duckdb.DuckDBPyConnection, case: Case, arena: Arena | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of a real GroupPool, each batch gathered on the host."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="samples need")
        loader = DDBDataLoader(con, SERIES_SQL, "y", **case.kwargs())
    with loader:
        plan = loader.plan
        fetcher = Fetcher(DuckDBBackend(con), plan, case.fetch_threads)
        stop = threading.Event()
        try:
            pool = pool_of(plan, loader.config, case.epoch, fetcher, stop, arena)
            return [gather(pieces, plan.geometry, plan.layout, pin=False) for pieces in pool.batches()]
        finally:
            stop.set()
            fetcher.close()


def pool_batches(con: duckdb.DuckDBPyConnection, case: Case, arena: Arena | None) -> list[bytes]:
    """One epoch of a real GroupPool, each batch as bytes."""
    return [x.numpy().tobytes() + y.numpy().tobytes() for x, y in pool_epoch(con, case, arena)]


class _KeyRecordingFetcher(Fetcher):
    """A real fetcher that also records the key of every partition claimed, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claimed: list[tuple[int, int]] = []

    def submit(self, spec: PartitionSpec) -> Pending[Block]:
        self.claimed.append(spec.key)
        return super().submit(spec)


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(
    case=cases() | streamed_cases(),
    whole=st.none() | st.booleans(),
    resume_at=st.none() | st.integers(1, 12),
    runs=st.booleans(),
)
def test_the_pool_serves_the_schedule(
    case: Case, whole: bool | None, resume_at: int | None, runs: bool
) -> None:
    # Batch by batch, the real pool over DuckDB hands out the samples of the schedule (the
    # oracle), claims partitions in its order, at its batches, and holds as many at most; with
    # and without an arena (whole=True: every step's segment in it, a batch is one piece).
    # Resumed after ``resume_at`` batches (replayed as bookkeeping, nothing fetched for them), it
    # hands out the schedule's batches from there on, and still hands every partition back.
    # runs=True: a shuffled schedule draws in runs from a pool of one slot on (see Slots), and
    # the pool turns a run into rows from its step index.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schedule_module, "RUNS_FROM", 1 if runs else 1 << 30)
        check_the_pool_serves_the_schedule(case, whole, resume_at)


def check_the_pool_serves_the_schedule(case: Case, whole: bool | None, resume_at: int | None) -> None:
    con = duckdb.connect()
    try:
        make_series(con, case.parts)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="samples need")
            loader = DDBDataLoader(con, SERIES_SQL, "y", **case.kwargs())
        with loader:
            plan, config = loader.plan, loader.config
            fetcher = _KeyRecordingFetcher(DuckDBBackend(con), plan, case.fetch_threads)
            stop = threading.Event()
            region_rows = max(map(sum, case.parts)) + 16
            arena = None if whole is None else Arena(region_rows, 9, whole_partitions=whole)
            skip = resume_at or 0
            try:
                schedule = schedule_of(plan, config, case.epoch)
                expected = list(schedule)  # the oracle: a pure function, iterated here first
                pool = pool_of(plan, config, case.epoch, fetcher, stop, arena)
                rids_of = [_series_rids(con, group) for group in plan.groups]
                served = claimed = 0
                for pieces, batch in zip(pool.batches(skip), expected[skip:], strict=True):
                    x, _ = gather(pieces, plan.geometry, plan.layout, pin=False)
                    rids = x.reshape(len(x), -1)[:, 0].long().numpy()
                    starts = np.array(
                        [
                            rids_of[g][i * case.stride]
                            for g, i in zip(batch.groups, batch.samples, strict=True)
                        ],
                        dtype=np.int64,
                    )
                    assert rids.tolist() == starts.tolist()
                    assert pool.gauge.held <= case.group_pool_size * case.prepartition_num
                    if not skip:  # the claims made for this batch (its events are honoured first)
                        assert fetcher.claimed[claimed:] == [
                            e.key for e in batch.events if e.kind == EventKind.FETCH
                        ]
                        claimed = len(fetcher.claimed)
                    served += 1
                assert served == max(len(expected) - skip, 0)
                assert pool.gauge.high_water == schedule.high_water
                if served and not case.drop_last:
                    assert pool.gauge.held == 0
            finally:
                stop.set()
                fetcher.close()
    finally:
        con.close()


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    case=cases() | streamed_cases(),
    region_rows=st.sampled_from([None, 4]),
    regions=st.integers(1, 9),
    whole=st.booleans(),
)
def test_an_arena_serves_the_same_batches(
    case: Case, region_rows: int | None, regions: int, whole: bool
) -> None:
    # small arenas too: segments that do not fit or find no free region get arrays of their own
    con = duckdb.connect()
    try:
        make_series(con, case.parts)
        largest = max((rows for group in case.parts for rows in group), default=0)
        arena = Arena(region_rows or largest + 2 * 8, regions, whole_partitions=whole)
        assert pool_batches(con, case, arena) == pool_batches(con, case, None)
    finally:
        con.close()
    arena.recycle()
    assert arena.fits(arena.region_rows, arena.regions, whole)  # every region handed back


@pytest.mark.parametrize("shuffle", [False, True])
def test_partition_gauge_reaches_its_bound(con: duckdb.DuckDBPyConnection, shuffle: bool) -> None:
    # Five groups of four partitions: the pool fills to exactly 2 groups x 3 partitions.
    parts: Sequence[list[int]] = [[5, 5, 5, 5]] * 5
    make_series(con, parts)
    case = Case(
        parts=list(parts),
        windowed=True,
        x_window=3,
        y_window=1,
        stride=1,
        offset=None,
        batch_size=4,
        drop_last=False,
        shuffle=shuffle,
        seed=7,
        epoch=0,
        group_pool_size=2,
        prepartition_num=3,
        fetch_threads=2,
        prefetch_batch=1,
        repartitioned=True,
        grouped=True,
    )
    high_water, held_after = held_partitions(con, case)
    assert high_water == 6
    assert held_after == 0


class _RecordingFetcher(Fetcher):
    """A real fetcher that also records, for each queued fetch, its group and how many samples
    the pool had handed out when it was queued."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.taken = 0
        self.queued: list[tuple[int, int]] = []

    def submit(self, spec: PartitionSpec) -> Pending[Block]:
        self.queued.append((spec.group, self.taken))
        return super().submit(spec)


def _pairs_loader(con: duckdb.DuckDBPyConnection, **options: Any) -> DDBDataLoader:
    """Batches of 2 windows of 2 rows of f0, one series per gid, repartitioned by part."""
    return DDBDataLoader(
        con,
        SERIES_SQL,
        "y",
        batch_size=2,
        window_size=2,
        input_col=["f0"],
        group_col="gid",
        repartition_col="part",
        **options,
    )


@pytest.mark.parametrize("shuffle", [False, True])
def test_next_unit_is_fetched_ahead_within_the_budget(con: duckdb.DuckDBPyConnection, shuffle: bool) -> None:
    # Three groups of three 6-row partitions, one unit in the pool, two partitions each: once
    # group 0 is on its last partition the budget has room for group 1's first one, so group 1's
    # first batch never waits for a fetch queued only when it enters the pool.
    make_series(con, [[6, 6, 6]] * 3)
    options: dict[str, Any] = {"group_pool_size": 1, "prepartition_num": 2, "shuffle": shuffle, "seed": 3}
    with _pairs_loader(con, **options) as loader:
        plan, config = loader.plan, loader.config
        fetcher = _RecordingFetcher(DuckDBBackend(con), plan, 1)
        stop = threading.Event()
        try:
            units = epoch_units(plan, config, 0)
            pool = pool_of(plan, config, 0, fetcher, stop)
            for pieces in pool.batches():
                assert pool.gauge.held <= 2
                fetcher.taken += sum(len(p.starts) for p in pieces)
            assert fetcher.taken == plan.samples
        finally:
            stop.set()
            fetcher.close()
    assert len(fetcher.queued) == 9
    first_unit, second_unit = units[0], units[1]
    ahead = next(taken for group, taken in fetcher.queued if group == second_unit.group.index)
    assert 0 < ahead < first_unit.samples
    assert pool.gauge.high_water == 2


@pytest.mark.parametrize(
    ("change", "rows"),
    [
        ("DELETE FROM series WHERE gid = 0 AND part = 1 AND pos % 2 = 0", 3),
        (
            "INSERT INTO series SELECT gid, part, pos + 100, rid + 100, f0, f1, y FROM series WHERE gid = 0 "
            "AND part = 1",
            12,
        ),
    ],
)
def test_a_partition_whose_rows_changed_after_planning_is_refused_by_name(
    con: duckdb.DuckDBPyConnection, change: str, rows: int
) -> None:
    # len(), the windows and the sample order rest on the planned counts: a partition that no
    # longer has them must stop the epoch, never feed rows the plan does not describe
    make_series(con, [[5, 6], [4]])
    with _pairs_loader(con) as loader:
        con.execute(change)
        with pytest.raises(
            ValueError, match=rf"partition 1 of group 0 .* returned {rows} rows, but planning counted 6"
        ):
            list(loader)


@pytest.mark.parametrize("how", ["partly cached", "resumed"])
def test_no_fetch_unit_keeps_rows_once_every_sample_is_served(
    con: duckdb.DuckDBPyConnection, how: str
) -> None:
    """Partitions the pool never claims from a started fetch unit are released, so the unit does
    not keep them, and its conversion, to the end of the epoch: served from a partly filled
    cache, at once; passed while a resume replays the batches it skips, when their work unit
    ends (at once for a group of one partition)."""
    make_series(con, [[5]] * 60)
    options: dict[str, Any] = {"input_col": ["f0", "f1"], "group_col": "gid", "shuffle": True, "seed": 1}
    with DDBDataLoader(con, SERIES_SQL, "y", batch_size=4, group_pool_size=4, **options) as loader:
        plan, config = loader.plan, loader.config
    stop = threading.Event()
    cache = PartitionCache()
    if how == "partly cached":  # half the groups were fetched in an earlier epoch
        alone = Fetcher(DuckDBBackend(con), plan, 1)
        for group in plan.groups[::2]:
            cache.keep(group.partitions[0], alone.submit(group.partitions[0]).wait(stop, 10))
        alone.close()
    work = epoch_units(plan, config, 1)
    units = list(fetch_units(plan, work, config, 1, budget=plan.layout.row_bytes * 5 * 40))
    assert len(units) > 2
    fetcher = Fetcher(DuckDBBackend(con), plan, 1, units=units)
    try:
        pool = pool_of(plan, config, 1, cache.around(fetcher), stop)
        served = sum(1 for _ in pool.batches(skip=12 if how == "resumed" else 0))
        assert served == -(-sum(u.samples for u in work) // 4) - (12 if how == "resumed" else 0)
        # every key is claimed or released now: a unit still delivering adds nothing to hold
        assert wait_until(lambda: not any(state.ready for state in fetcher._units._states))
    finally:
        fetcher.close()
