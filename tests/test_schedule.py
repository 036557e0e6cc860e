"""BatchSchedule: an epoch's order from row counts alone, checked without an engine.

Plans are built from partition sizes (no SQL, no data), so each example costs microseconds to
milliseconds: exactly-once, shard disjointness and equal counts across ranks, pad/drop, the
partition budget, events in a consistent order, and the pool's slot contract. That the real pool
serves what the schedule says is checked against DuckDB in tests/test_pool.py; the default pool's
size, which reads a plan, at the end of this file.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import numpy as np
import pytest
import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader
from ddbloader._core.config import LoaderConfig
from ddbloader._core.window import WindowGeometry
from ddbloader._epoch import schedule as schedule_module
from ddbloader._epoch.schedule import BatchSchedule, EventKind, ScheduledBatch
from ddbloader._epoch.shard import EvenBatches, epoch_units, shard_samples, split_units
from ddbloader._epoch.shuffle import Purpose, SourceDraws, visit_order
from ddbloader._epoch.visits import PartitionKey, touched_partitions
from ddbloader._pipeline.batch import batch_count
from ddbloader._sql.partition import PartitionSpec
from ddbloader._sql.plan import GroupPlan, WorkUnit
from ddbloader._sql.window_pieces import WindowTile, window_layout

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Epoch:
    """A plan of partition sizes (a list of subqueries per group, each a list of piece sizes),
    a window geometry and the options that order an epoch."""

    groups: tuple[GroupPlan, ...]
    config: LoaderConfig
    geometry: WindowGeometry
    epoch: int

    def units(
        self, rank: int = 0, world: int = 1, worker: int = 0, workers: int = 1, even: EvenBatches = "pad"
    ) -> list[WorkUnit]:
        """The units of one (rank, worker), as :func:`~ddbloader._epoch.shard.epoch_units` cuts them."""
        config = self.config
        order = visit_order(len(self.groups), config.shuffle, config.seed, self.epoch, Purpose.GROUP_ORDER)
        return split_units([self.groups[i] for i in order.tolist()], rank, world, worker, workers, even)

    def schedule(self, units: Sequence[WorkUnit]) -> BatchSchedule:
        total = sum(u.samples for u in units)
        batches = batch_count(total, self.config.batch_size, self.config.drop_last)
        return BatchSchedule(units, self.geometry, self.config, self.epoch, batches)


def config(**options: object) -> LoaderConfig:
    base: dict[str, object] = {
        "target_col": ("y",),
        "batch_size": 4,
        "shuffle": True,
        "windowed": True,
        "x_window": 3,
        "y_window": 1,
        "stride": 1,
        "offset": 3,
        "input_col": None,
        "exclude_col": (),
        "group_col": "g",
        "group_scheme": None,
        "repartition_col": "d",
        "repartition_scheme": None,
        "seed": 0,
        "drop_last": False,
        "device": torch.device("cpu"),
        "pin_memory": False,
        "prefetch_batch": 1,
        "prepartition_num": 2,
        "group_pool_size": 3,
        "fetch_threads": 1,
        "x_dtype": None,
        "y_dtype": None,
        "timeout": 1.0,
    }
    return LoaderConfig(**{**base, **options})  # type: ignore[arg-type]


def combed_group(index: int, rows: int, pieces: int, geometry: WindowGeometry) -> GroupPlan:
    """A series of ``rows`` rows (its key: its row numbers) cut into ``pieces`` combed pieces of
    windows, 4 stripes each, as the planner cuts one (see ddbloader/_sql/window_pieces.py)."""
    edge, count = geometry.span - 1, pieces * 4
    firsts = [r for r in range(rows) if r == 0 or r * count // rows != (r - 1) * count // rows]
    tiles = [
        WindowTile((low,), high - low, (low + edge if low + edge < rows else 0,))
        for low, high in itertools.pairwise([*firsts, rows])
    ]
    cut = window_layout(tiles, (False,), pieces, 64, geometry.span, geometry.stride)
    specs = tuple(
        PartitionSpec(index, position, index, 0, "", (), size) for position, (_, size) in enumerate(cut)
    )
    row_maps = tuple(ranges.windows for ranges, _ in cut)
    return GroupPlan(index, index, specs, geometry.sample_count(rows), row_maps=row_maps)


def plan_groups(
    subqueries: Sequence[Sequence[Sequence[int]]], geometry: WindowGeometry, combed: Sequence[bool] = ()
) -> tuple[GroupPlan, ...]:
    """Groups whose partitions are the non-empty pieces of their subqueries, in order; a group
    whose ``combed`` flag is set is one subquery of all its rows, cut into combed pieces of
    windows instead (when windows are longer than a row)."""
    groups = []
    for g, group in enumerate(subqueries):
        rows = sum(sum(pieces) for pieces in group)
        if (
            g < len(combed)
            and combed[g]
            and len(group) == 1
            and len(group[0]) > 1
            and rows > 1 < geometry.span
        ):
            groups.append(combed_group(g, rows, len(group[0]), geometry))
            continue
        specs: list[PartitionSpec] = []
        heads: list[int] = []
        for r, pieces in enumerate(group):
            sizes = [rows for rows in pieces if rows] if len(pieces) > 1 else [sum(pieces)]
            sizes = [rows for rows in sizes if rows]
            heads += [len(specs)] * len(sizes)
            specs += [PartitionSpec(g, len(specs) + n, g, r, "", (), rows) for n, rows in enumerate(sizes)]
        rows = sum(s.rows for s in specs)
        groups.append(GroupPlan(g, g, tuple(specs), geometry.sample_count(rows), heads=tuple(heads)))
    return tuple(groups)


@st.composite
def epochs(draw: st.DrawFn) -> Epoch:
    # Small partitions (often shorter than the window) next to larger ones; some subqueries in pieces.
    sizes = draw(st.lists(st.integers(0, 14), min_size=1, max_size=24))
    cuts = draw(st.lists(st.integers(0, 2), min_size=len(sizes), max_size=len(sizes)))
    subqueries: list[list[list[int]]] = [[[sizes[0]]]]
    for rows, cut in zip(sizes[1:], cuts[1:], strict=True):
        if cut == 0:  # a new group
            subqueries.append([[rows]])
        elif cut == 1:  # a new subquery of the group
            subqueries[-1].append([rows])
        else:  # a new piece of the subquery
            subqueries[-1][-1].append(rows)
    # combed pieces of windows (a shuffled series of one subquery), in about half the examples
    combing = draw(st.booleans())
    windowed = combing or draw(st.booleans())
    x_window, y_window = (draw(st.integers(1, 4)), draw(st.integers(1, 3))) if windowed else (1, 1)
    offset = draw(st.integers(1 if combing else 0, 5)) if windowed else 0
    stride = draw(st.integers(1, 4)) if windowed else 1
    geometry = WindowGeometry(x_window, y_window, stride, offset, windowed)
    options = config(
        batch_size=draw(st.integers(1, 9)),
        shuffle=combing or draw(st.booleans()),
        windowed=windowed,
        x_window=x_window,
        y_window=y_window,
        stride=stride,
        offset=offset,
        seed=draw(st.integers(0, 2**63 - 1)),
        drop_last=draw(st.booleans()),
        prepartition_num=draw(st.integers(1, 3)),
        group_pool_size=draw(st.integers(1, 5)),
    )
    combed = [combing and (g % 2 == 0 or draw(st.booleans())) for g in range(len(subqueries))]
    return Epoch(plan_groups(subqueries, geometry, combed), options, geometry, draw(st.integers(0, 3)))


def pairs(batches: Sequence[ScheduledBatch]) -> list[tuple[int, int]]:
    return [pair for b in batches for pair in zip(b.groups.tolist(), b.samples.tolist(), strict=True)]


@settings(max_examples=examples(500), deadline=None)
@given(epoch=epochs())
def test_every_sample_exactly_once_in_batches_of_the_asked_size(epoch: Epoch) -> None:
    units = epoch.units()
    batches = list(epoch.schedule(units))
    total = sum(g.samples for g in epoch.groups)
    size = epoch.config.batch_size
    assert [b.index for b in batches] == list(range(len(batches)))
    lengths = [len(b.groups) for b in batches]
    if epoch.config.drop_last:
        assert lengths == [size] * (total // size)
    else:
        assert sum(lengths) == total
        assert all(n == size for n in lengths[:-1])
    served = pairs(batches)
    assert len(set(served)) == len(served)
    universe = [(g.index, i) for g in epoch.groups for i in range(g.samples)]
    assert set(served) <= set(universe)
    if not epoch.config.drop_last:
        assert set(served) == set(universe)
    if not epoch.config.shuffle:  # group order, then sample order, as the query's rows
        assert served == [(u.group.index, i) for u in units for i in range(u.first, u.stop)][: len(served)]


@settings(max_examples=examples(500), deadline=None)
@given(epoch=epochs())
def test_partitions_held_stay_within_the_budget_and_events_come_in_order(epoch: Epoch) -> None:
    units = epoch.units()
    schedule = epoch.schedule(units)
    batches = list(schedule)
    budget = epoch.config.group_pool_size * epoch.config.prepartition_num
    assert schedule.high_water <= budget
    again = list(schedule)  # a pure function: the same batches and events every time
    assert [b.events for b in again] == [b.events for b in batches]
    assert pairs(again) == pairs(batches)
    held: set[PartitionKey] = set()
    loaded: set[PartitionKey] = set()
    current: dict[int, PartitionKey] = {}
    released: Counter[PartitionKey] = Counter()
    samples_of = {u.group.index: set(range(u.first, u.stop)) for u in units}
    for batch in batches:
        at = 0
        for event in batch.events:
            assert at <= event.at <= len(batch.groups)
            at = event.at
            key = event.key
            if event.kind == EventKind.FETCH:
                assert key not in held and key not in loaded
                held.add(key)
                assert len(held) <= budget
            elif event.kind == EventKind.LOAD:
                assert key in held, "a step is loaded only once fetched"
                assert key[0] not in current, "one step per unit at a time"
                assert event.left <= epoch.geometry.span - 1 and event.right <= epoch.geometry.span - 1
                loaded.add(key)
                current[key[0]] = key
            elif event.kind == EventKind.DROP:
                held.remove(key)
                if current.get(key[0]) == key:
                    del current[key[0]]
            else:
                released[key] += 1
        # every sample of the batch belongs to the step being served in its unit when it is drawn
        for group, sample in zip(batch.groups.tolist(), batch.samples.tolist(), strict=True):
            assert sample in samples_of[group]
    if not epoch.config.drop_last:
        assert not held, "every partition is handed back by the end of the epoch"
        for unit in units:
            touched = touched_partitions(unit, epoch.geometry)
            if len(unit.group.partitions) > 1:
                assert {p for (g, p) in released if g == unit.group.index} == set(touched)
            assert {p for (g, p) in loaded if g == unit.group.index} <= set(touched)


@settings(max_examples=examples(400), deadline=None)
@given(
    epoch=epochs(), world=st.integers(2, 4), workers=st.integers(1, 3), even=st.sampled_from(["pad", "drop"])
)
def test_ranks_serve_disjoint_shards_of_equal_length(
    epoch: Epoch, world: int, workers: int, even: EvenBatches
) -> None:
    total = sum(g.samples for g in epoch.groups)
    per_rank = shard_samples(total, world, even)
    everything: Counter[tuple[int, int]] = Counter()
    lengths = set()
    for rank in range(world):
        rank_pairs = []
        for worker in range(workers):
            units = epoch.units(rank, world, worker, workers, even)
            rank_pairs += pairs(list(epoch.schedule(units)))
        if not epoch.config.drop_last and workers == 1:
            assert len(rank_pairs) == per_rank
        lengths.add(len(rank_pairs))
        everything.update(rank_pairs)
    assert len(lengths) == 1, "every rank serves the same number of samples"
    if even == "drop":
        assert all(count == 1 for count in everything.values())
    elif not epoch.config.drop_last:  # padding repeats some of a rank's own samples
        universe = {(g.index, i) for g in epoch.groups for i in range(g.samples)}
        assert set(everything) == universe
        assert sum(everything.values()) == world * per_rank


def slot_model(units: Sequence[WorkUnit], epoch: Epoch, sizes: Sequence[int]) -> list[list[int]]:
    """The group of each sample of each batch, as the pool's contract says (an independent
    model, from the contract's words): sample k of a draw goes to slot floor(u_k * active) and
    each slot serves its share in slot order from its unit; a finished unit hands its slot to the
    next one; the shares of slots that close (no unit waiting) are drawn again."""
    draws = SourceDraws(epoch.config.seed, epoch.epoch)
    waiting = [[unit.group.index, unit.samples] for unit in units if unit.samples]
    active: list[list[int]] = []
    batches = []
    for size in sizes:
        groups: list[int] = []
        while len(groups) < size:
            while len(active) < epoch.config.group_pool_size and waiting:
                active.append(waiting.pop(0))
            for slot, share in enumerate(draws.counts(len(active), size - len(groups)).tolist()):
                owed = share
                while owed:
                    group, left = active[slot]
                    give = min(owed, left)
                    groups += [group] * give
                    owed -= give
                    active[slot][1] -= give
                    if active[slot][1] == 0:
                        if not waiting:
                            break
                        active[slot] = waiting.pop(0)
            active = [unit for unit in active if unit[1]]
        batches.append(groups)
    return batches


@settings(max_examples=examples(600), deadline=None)
@given(epoch=epochs())
def test_shuffled_batches_follow_the_pool_slot_contract(epoch: Epoch) -> None:
    if not epoch.config.shuffle:
        epoch = dataclasses.replace(epoch, config=dataclasses.replace(epoch.config, shuffle=True))
    units = epoch.units()
    batches = list(epoch.schedule(units))
    served = [b.groups.tolist() for b in batches]
    assert served == slot_model(units, epoch, [len(g) for g in served])


def test_a_step_holds_the_samples_its_partition_completes() -> None:
    # one group of partitions of 4, 1 and 5 rows, windows of 3 rows and 1 y row (span 4), unshuffled:
    # partition 0 completes sample 0 (rows 0-3), partition 1 sample 1 (with 3 kept rows of
    # partition 0), partition 2 samples 2-6 (with its neighbour's 1 row and 2 of partition 0)
    geometry = WindowGeometry(3, 1, 1, 3, True)
    epoch = Epoch(plan_groups([[[4], [1], [5]]], geometry), config(shuffle=False, batch_size=3), geometry, 0)
    batches = list(epoch.schedule(epoch.units()))
    assert [b.samples.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    loads = [(e.key, e.left, e.right, e.at) for b in batches for e in b.events if e.kind == EventKind.LOAD]
    assert loads == [((0, 0), 0, 0, 0), ((0, 1), 3, 0, 1), ((0, 2), 3, 0, 2)]
    fetches = [(b.index, e.key) for b in batches for e in b.events if e.kind == EventKind.FETCH]
    # prepartition_num=2: the third is queued when the first is dropped
    assert fetches == [(0, (0, 0)), (0, (0, 1)), (0, (0, 2))]
    drops = [(b.index, e.key, e.at) for b in batches for e in b.events if e.kind == EventKind.DROP]
    assert drops == [(0, (0, 0), 1), (0, (0, 1), 2), (2, (0, 2), 1)]


def test_units_that_end_together_find_their_successors_fetched() -> None:
    """A shuffled pool drains its units at one pace, so they end within a few batches of each
    other: every successor's first partition is claimed once the budget has room, when the
    active units start their last partitions (~37 batches of 16 before it is loaded here: three
    units share the batches, a partition holds ~200 samples), so its fetch overlaps those
    batches; claiming only the next one ahead left the others a handful of batches (2-7)."""
    geometry = WindowGeometry(3, 1, 1, 3, True)
    subqueries = [[[200] for _ in range(5)] for _ in range(9)]  # 9 groups of 5 equal days
    epoch = Epoch(plan_groups(subqueries, geometry), config(batch_size=16), geometry, 0)
    batches = list(epoch.schedule(epoch.units()))
    first: dict[EventKind, dict[int, int]] = {EventKind.FETCH: {}, EventKind.LOAD: {}}
    for batch in batches:
        for event in batch.events:
            if event.kind in first:
                first[event.kind].setdefault(event.key[0], batch.index)
    first_fetch, first_load = first[EventKind.FETCH], first[EventKind.LOAD]
    successors = [unit.group.index for unit in epoch.units()[3:]]  # those not in the first pool
    assert len(successors) == 6
    assert all(first_load[g] - first_fetch[g] >= 20 for g in successors), (first_fetch, first_load)


def test_a_plan_of_many_groups_serves_every_sample_once() -> None:
    # 200 groups of one to three partitions, eight in the pool
    geometry = WindowGeometry(5, 1, 1, 5, True)
    rng = np.random.default_rng(0)
    subqueries = [[[int(n)] for n in rng.integers(0, 40, int(rng.integers(1, 4)))] for _ in range(200)]
    epoch = Epoch(plan_groups(subqueries, geometry), config(batch_size=32, group_pool_size=8), geometry, 1)
    batches = list(epoch.schedule(epoch.units()))
    assert sum(len(b.groups) for b in batches) == sum(g.samples for g in epoch.groups)


# --- the default pool (group_pool_size=None) ------------------------------------------------------


def _series_table(con: duckdb.DuckDBPyConnection, groups: int, rows: int) -> None:
    con.execute(
        f"CREATE TABLE s AS SELECT i // {rows} AS g, i % {rows} AS t, random() AS f, random() AS y "
        f"FROM range({groups * rows}) r(i)"
    )


def _median_groups_per_batch(loader: DDBDataLoader) -> float:
    return float(np.median([len(np.unique(batch[2]["g"].numpy())) for batch in loader]))


def test_the_default_pool_mixes_a_batch_like_a_uniform_shuffle(con: duckdb.DuckDBPyConnection) -> None:
    """With default arguments a shuffled batch draws from as many groups as it has samples: the
    median distinct groups per batch is at least half a uniform shuffle's; group_pool_size=3 is
    DolphinDB's pool (at most 3 groups a batch)."""
    _series_table(con, 100, 60)
    options = {"group_col": "g", "input_col": ["f"], "window_size": 4, "batch_size": 32, "key_col": ["g"]}
    with DDBDataLoader(con, "SELECT * FROM s ORDER BY g, t", "y", shuffle=True, seed=2, **options) as loader:
        assert loader.config.group_pool_size == 6000 // (schedule_module.FILL_SHARE * 60)  # 25 < 32
        mixed = _median_groups_per_batch(loader)
        groups = np.repeat(np.arange(100), loader.plan.groups[0].rows - 4)  # samples' groups
        uniform = np.random.default_rng(2).permutation(groups)
        batches = [uniform[i : i + 32] for i in range(0, len(uniform), 32)]
        assert mixed >= np.median([len(np.unique(b)) for b in batches]) / 2
    with DDBDataLoader(
        con, "SELECT * FROM s ORDER BY g, t", "y", shuffle=True, seed=2, group_pool_size=3, **options
    ) as ddb:
        assert _median_groups_per_batch(ddb) <= 3
    with DDBDataLoader(con, "SELECT * FROM s ORDER BY g, t", "y", **options) as ordered:
        assert ordered.config.group_pool_size == schedule_module.DDB_POOL


def test_the_default_pool_holds_its_bytes(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default pool's groups' largest partitions fit POOL_BYTES and a FILL_SHARE of the rows
    (at least DolphinDB's 3 groups), so the partitions held stay within that many partitions."""
    _series_table(con, 40, 50)  # 50 rows x 8 bytes (f and y, float32): 400 bytes a group
    options = {"group_col": "g", "input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 1}
    # 2,000 rows: a quarter is 10 groups' partitions
    for pool_bytes, expected in ((7 * 400 + 399, 7), (400, 3), (10**9, 10)):
        monkeypatch.setattr(schedule_module, "POOL_BYTES", pool_bytes)
        with DDBDataLoader(con, "SELECT * FROM s ORDER BY g, t", "y", **options) as loader:
            assert loader.config.group_pool_size == expected
            schedule = BatchSchedule(
                epoch_units(loader.plan, loader.config, 0),
                loader.plan.geometry,
                loader.config,
                0,
                len(loader),
            )
            assert sum(len(b.samples) for b in schedule) == 40 * 50
            assert schedule.high_water <= expected * loader.config.prepartition_num
