"""Elastic resume: the rest of an epoch saved under one world size, served by another.

The pure part is checked without an engine on plans of partition sizes (as in
tests/test_schedule.py): what the old ranks handed out plus what the new ranks serve is the
epoch, every sample once up to the padding bound, with equal batch counts on the new ranks.
End to end, loaders with explicit ``rank=``/``world_size=`` in one process stop mid-epoch, save
rank 0's state and resume under another world size, checked by ``key_col`` against the whole
query on DuckDB and PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pgserver
import pytest
import torch
from conftest import SERIES_SQL, examples, make_series
from elastic_worker import ARGS as ELASTIC_RUN
from hypothesis import given, settings
from hypothesis import strategies as st
from planned import views
from servers import free_port
from test_schedule import Epoch, epochs
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset
from ddbloader._epoch.elastic import Stretch, epoch_remainder
from ddbloader._epoch.owed import keep_owed, owed_partitions
from ddbloader._epoch.schedule import BatchSchedule, EventKind
from ddbloader._epoch.shard import EvenBatches, shard_samples, share_units
from ddbloader._pipeline.batch import batch_count
from ddbloader._sql.plan import WorkUnit

pytestmark = pytest.mark.timeout(300)

Pair = tuple[int, int]


def served(epoch: Epoch, units: Sequence[WorkUnit], batches: int | None = None) -> list[Pair]:
    """The (group, sample) pairs of the first ``batches`` batches (all by default) of ``units``."""
    config = epoch.config
    total = batch_count(sum(u.samples for u in units), config.batch_size, config.drop_last)
    count = total if batches is None else min(batches, total)
    schedule = BatchSchedule(units, epoch.geometry, config, epoch.epoch, count)
    pairs = [pair for b in schedule for pair in zip(b.groups.tolist(), b.samples.tolist(), strict=True)]
    assert schedule.high_water <= config.group_pool_size * config.prepartition_num, "the memory bound"
    return pairs


@st.composite
def stretches(draw: st.DrawFn, epoch: Epoch) -> Stretch:
    """An old world stopped mid-epoch: every rank's worker ``w`` had handed out ``batches[w]``."""
    world = draw(st.integers(1, 4))
    workers = draw(st.integers(1, 3))
    even: EvenBatches = draw(st.sampled_from(["pad", "drop"]))
    config = epoch.config
    shard = shard_samples(sum(g.samples for g in epoch.groups), world, even)
    batches = []
    for worker in range(workers):
        share = len(range(worker * shard // workers, (worker + 1) * shard // workers))
        batches.append(draw(st.integers(0, batch_count(share, config.batch_size, config.drop_last))))
    return Stretch(world, even, tuple(batches))


@dataclasses.dataclass(frozen=True)
class NewWorld:
    world_size: int
    num_workers: int
    even_batches: EvenBatches


new_worlds = st.builds(NewWorld, st.integers(1, 4), st.integers(1, 3), st.sampled_from(["pad", "drop"]))


def check_resume(epoch: Epoch, old: Sequence[Stretch], new: NewWorld) -> None:
    """The old stretches' batches, then the new world's remainder: the epoch, once, up to padding."""
    universe = {(g.index, i) for g in epoch.groups for i in range(g.samples)}
    consumed: set[Pair] = set()
    left = epoch_remainder(epoch, epoch.config, epoch.epoch, [])
    for done, stretch in enumerate(old, 1):
        for rank in range(stretch.world_size):
            for worker, handed in enumerate(stretch.batches):
                units = share_units(
                    left, rank, stretch.world_size, worker, stretch.num_workers, stretch.even_batches
                )
                consumed.update(served(epoch, units, handed))
        left = epoch_remainder(epoch, epoch.config, epoch.epoch, old[:done])
    owed = {(u.group.index, int(i)) for u in left for i in keep_owed(u, np.arange(u.first, u.stop))}
    assert owed == universe - consumed, "the remainder is exactly what no old rank handed out"
    assert len({u.group.index for u in left}) == len(left), "one unit per group"
    remaining = len(owed)
    per_rank: list[int] = []
    new_served: Counter[Pair] = Counter()
    for rank in range(new.world_size):
        rank_batches = 0
        rank_samples = 0
        for worker in range(new.num_workers):
            units = share_units(left, rank, new.world_size, worker, new.num_workers, new.even_batches)
            for unit in units:
                if unit.owed is not None:  # the only partitions fetched hold owed samples' rows
                    assert owed_partitions(unit, epoch.geometry) == touched_by(unit, epoch)
            pairs = served(epoch, units)
            new_served.update(pairs)
            rank_samples += sum(u.samples for u in units)
            rank_batches += batch_count(
                sum(u.samples for u in units), epoch.config.batch_size, epoch.config.drop_last
            )
        assert rank_samples == shard_samples(remaining, new.world_size, new.even_batches)
        per_rank.append(rank_batches)
    assert len(set(per_rank)) <= 1, f"equal batch counts on the new ranks: {per_rank}"
    assert not set(new_served) & consumed, "nothing handed out again"
    assert set(new_served) <= owed
    repeats = sum(n - 1 for n in new_served.values())
    assert repeats < new.world_size, "padding repeats fewer samples than the world size"
    if not epoch.config.drop_last:
        missed = len(owed - set(new_served))
        if new.even_batches == "pad":
            assert missed == 0 and repeats == new.world_size * per_rank_samples(remaining, new) - remaining
        else:
            assert repeats == 0 and missed == remaining - new.world_size * (remaining // new.world_size)


def per_rank_samples(remaining: int, new: NewWorld) -> int:
    return shard_samples(remaining, new.world_size, new.even_batches)


def touched_by(unit: WorkUnit, epoch: Epoch) -> list[int]:
    """Brute force: the partitions some owed sample of ``unit`` has a row in."""
    assert unit.owed is not None
    bounds = np.cumsum([0] + [p.rows for p in unit.group.partitions])
    touched: set[int] = set()
    for sample in unit.owed.tolist():
        for row in range(
            sample * epoch.geometry.stride, sample * epoch.geometry.stride + epoch.geometry.span
        ):
            touched.add(int(np.searchsorted(bounds, row, side="right")) - 1)
    return sorted(touched)


@settings(max_examples=examples(1000), deadline=None)
@given(data=st.data(), epoch=epochs(), new=new_worlds)
def test_old_consumption_and_new_remainder_are_the_epoch(
    data: st.DataObject, epoch: Epoch, new: NewWorld
) -> None:
    check_resume(epoch, [data.draw(stretches(epoch))], new)


@settings(max_examples=examples(500), deadline=None)
@given(data=st.data(), epoch=epochs(), new=new_worlds)
def test_a_resumed_epoch_resumed_again_is_still_the_epoch(
    data: st.DataObject, epoch: Epoch, new: NewWorld
) -> None:
    first = data.draw(stretches(epoch))
    left = epoch_remainder(epoch, epoch.config, epoch.epoch, [first])
    world = data.draw(st.integers(1, 4))
    even: EvenBatches = data.draw(st.sampled_from(["pad", "drop"]))
    shard = sum(u.samples for u in share_units(left, 0, world, 0, 1, even))
    handed = data.draw(st.integers(0, batch_count(shard, epoch.config.batch_size, epoch.config.drop_last)))
    check_resume(epoch, [first, Stretch(world, even, (handed,))], new)


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data(), epoch=epochs())
def test_the_remainder_is_a_pure_function(data: st.DataObject, epoch: Epoch) -> None:
    stretch = data.draw(stretches(epoch))
    one = epoch_remainder(epoch, epoch.config, epoch.epoch, [stretch])
    two = epoch_remainder(epoch, epoch.config, epoch.epoch, [stretch])
    assert one == two
    assert [None if u.owed is None else u.owed.tolist() for u in one] == [
        None if u.owed is None else u.owed.tolist() for u in two
    ]
    assert served(epoch, share_units(one, 0, 2, 0, 1, "pad")) == served(
        epoch, share_units(two, 0, 2, 0, 1, "pad")
    )


@settings(max_examples=examples(300), deadline=None)
@given(epoch=epochs())
def test_a_stretch_that_handed_out_nothing_leaves_the_ordinary_epoch(epoch: Epoch) -> None:
    left = epoch_remainder(epoch, epoch.config, epoch.epoch, [Stretch(3, "pad", (0, 0))])
    for rank in range(2):
        ordinary = epoch.units(rank, 2)
        assert share_units(left, rank, 2, 0, 1, "pad") == ordinary
        assert served(epoch, share_units(left, rank, 2, 0, 1, "pad")) == served(epoch, ordinary)


def test_owed_partitions_skip_a_partition_no_owed_sample_touches() -> None:
    from test_schedule import config, plan_groups

    from ddbloader._core.window import WindowGeometry

    geometry = WindowGeometry(2, 1, 1, 2, True)  # span 3: a sample's rows reach 2 rows on
    (group,) = plan_groups([[[10], [10], [10]]], geometry)
    owed = np.array([0, 1, 25, 26], np.int64)  # rows 0..3 and 25..28: partitions 0 and 2 only
    unit = WorkUnit(group, 0, 27, owed)
    assert owed_partitions(unit, geometry) == [0, 2]
    epoch = Epoch((group,), config(shuffle=False), geometry, 0)
    schedule = BatchSchedule([unit], geometry, epoch.config, 0, 1)
    (batch,) = list(schedule)
    assert batch.samples.tolist() == [0, 1, 25, 26]
    assert [e.key for e in batch.events if e.kind == EventKind.FETCH] == [(0, 0), (0, 2)]


def test_a_unit_compares_and_hashes_without_its_owed_samples() -> None:
    from test_schedule import plan_groups

    from ddbloader._core.window import WindowGeometry

    (group,) = plan_groups([[[10]]], WindowGeometry(1, 1, 1, 0, False))
    a = WorkUnit(group, 0, 5, np.array([0, 2, 4]))
    b = WorkUnit(group, 0, 5, np.array([0, 1, 4]))
    assert a == b and hash(a) == hash(b) and a.samples == b.samples == 3


# --- end to end: loaders of explicit ranks in one process, checked by key_col ---------------------

PARTS = [[150, 40, 90], [200, 30], [70, 130, 5, 60]]  # partitions over 64 rows stream in pieces
ARGS: dict[str, Any] = {
    "batch_size": 8,
    "shuffle": True,
    "seed": 11,
    "window_size": [4, 2],
    "window_stride": 2,
    "input_col": ["f0", "f1"],
    "group_col": "gid",
    "repartition_col": "part",
    "key_col": "rid",
    "fetch_bytes": 64 * 24,  # 64 rows of x (2 doubles) and y: a streamed partition's pieces
    "group_pool_size": 2,
}

Make = Callable[..., DDBDataLoader]


def keys(batches: Sequence[Any]) -> list[int]:
    return [key for batch in batches for key in batch[2]["rid"].tolist()]


def take(loader: DDBDataLoader, count: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``count`` batches, and the state after them (as a checkpoint file holds it),
    taken while the iteration is alive (one abandoned after a single batch gives its epoch back)."""
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(count)]
    return batches, json.loads(json.dumps(loader.state_dict()))


def predicted(loader: DDBDataLoader, stretches: Sequence[Stretch]) -> list[int]:
    """The keys the schedule says this rank serves of the rest of epoch 0 after ``stretches``."""
    plan, config, sharding = loader.plan, loader.config, loader.sharding
    left = epoch_remainder(plan, config, 0, stretches)
    units = share_units(left, sharding.rank, sharding.world_size, 0, 1, sharding.even_batches)
    total = batch_count(sum(u.samples for u in units), config.batch_size, config.drop_last)
    geometry = plan.geometry
    values = np.array([g.value for g in plan.groups], np.int64)
    return [
        key
        for b in BatchSchedule(units, geometry, config, 0, total)
        for key in (values[b.groups] * 1_000_000 + b.samples * geometry.stride + geometry.offset).tolist()
    ]


def resume_on(
    make: Make, state: dict[str, Any], world: int, stretches: Sequence[Stretch], **kwargs: Any
) -> list[list[Any]]:
    """Every rank of ``world`` resumes from ``state`` and serves the rest of the epoch; checks that
    ``len`` says so, that the batches are the schedule's, and that the next epoch is ordinary."""
    served = []
    for rank in range(world):
        with make(rank, world, **kwargs) as loader:
            loader.load_state_dict(state)
            count = len(loader)
            rest = list(loader)
            assert len(rest) == count
            assert keys(rest) == predicted(loader, stretches), "the pool serves the schedule's remainder"
            following = list(loader)
        with make(rank, world, **kwargs) as fresh:
            fresh.set_epoch(1)
            ordinary = list(fresh)
        assert keys(following) == keys(ordinary), "the next epoch is the new world's own"
        assert all(torch.equal(a[0], b[0]) for a, b in zip(following, ordinary, strict=True))
        served.append(rest)
    return served


def check_elastic(
    make: Make, old_world: int, new_world: int, handed: int, even: str = "pad", new_even: str | None = None
) -> None:
    with make(0, 1, drop_last=False) as whole_loader:
        whole = keys(list(whole_loader))
    plan = whole_loader.plan
    assert len(set(whole)) == len(whole) == plan.samples
    # big partitions are read in pieces: range pieces with shuffle, consecutive ones without
    pieces = [p for p in views(plan) if p.streamed]
    assert pieces, "partitions read in pieces"
    consumed: list[int] = []
    states = []
    for rank in range(old_world):
        with make(rank, old_world, even_batches=even) as old:
            batches, saved = take(old, handed)
            consumed += keys(batches)
            states.append({**saved, "rank": 0})
    state = states[0]
    assert all(saved == state for saved in states), "every rank reaches rank 0's state"
    assert state["world_size"] == old_world and state["batches"] == handed
    stretch = Stretch(old_world, even, (handed,))  # type: ignore[arg-type]
    left = epoch_remainder(plan, whole_loader.config, 0, [stretch])
    assert any(u.owed is not None for u in left), "some group was partly served: owed samples"
    rest = resume_on(make, state, new_world, [stretch], even_batches=new_even or even)
    counts = {len(batches) for batches in rest}
    assert len(counts) == 1, "every new rank yields the same number of batches"
    new = [key for batches in rest for key in keys(batches)]
    assert not set(new) & set(consumed), "nothing handed out again"
    repeats = len(new) - len(set(new))
    assert repeats < new_world
    lost = set(whole) - set(consumed) - set(new)
    with make(0, 1) as options:
        cut = options.batch_size if options.drop_last else 1  # drop_last: each rank's short last batch
    if (new_even or even) == "pad" and cut == 1:
        assert not lost and not set(new) - set(whole), "the epoch, every sample"
    else:
        assert len(lost) < new_world * cut and (repeats == 0 or (new_even or even) == "pad")


def duckdb_maker(con: duckdb.DuckDBPyConnection, **overrides: Any) -> Make:
    make_series(con, PARTS)

    def make(rank: int, world: int, **kwargs: Any) -> DDBDataLoader:
        arguments = {**ARGS, **overrides, **kwargs}
        return DDBDataLoader(con, SERIES_SQL, "y", rank=rank, world_size=world, **arguments)

    return make


@pytest.mark.parametrize(("old", "new", "handed"), [(2, 3, 7), (2, 1, 5), (3, 2, 4), (2, 3, 1), (3, 1, 13)])
def test_duckdb_resumes_on_another_world_size(
    con: duckdb.DuckDBPyConnection, old: int, new: int, handed: int
) -> None:
    check_elastic(duckdb_maker(con), old, new, handed)


@pytest.mark.parametrize(("old", "new", "handed"), [(2, 3, 7), (3, 1, 4)])
def test_combed_windows_resume_on_another_world_size(
    con: duckdb.DuckDBPyConnection, old: int, new: int, handed: int
) -> None:
    """Groups of one subquery with a distinct order key: combed pieces of windows (an owed
    sample's rows are all in the piece it starts in)."""
    make_series(con, PARTS)
    sql = "SELECT gid, pos, rid, f0, f1, y FROM series ORDER BY gid, pos"

    def make(rank: int, world: int, **kwargs: Any) -> DDBDataLoader:
        arguments = {**ARGS, "repartition_col": None, **kwargs}
        return DDBDataLoader(con, sql, "y", rank=rank, world_size=world, **arguments)

    with make(0, 1) as loader:
        assert all(g.combed_windows for g in loader.plan.groups)
    check_elastic(make, old, new, handed)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"cache_bytes": 2**24, "prefetch_batch": 0}, id="cached-no-prefetch"),
        pytest.param({"shuffle": False, "window_size": None, "window_stride": None}, id="ordered-rows"),
        pytest.param({"group_pool_size": 1, "prepartition_num": 1, "drop_last": True}, id="pool-1-drop-last"),
    ],
)
def test_other_options_resume_on_another_world_size(
    con: duckdb.DuckDBPyConnection, overrides: dict[str, Any]
) -> None:
    check_elastic(duckdb_maker(con, **overrides), 2, 3, 6)


def test_even_batches_drop_resumes_on_another_world_size(con: duckdb.DuckDBPyConnection) -> None:
    check_elastic(duckdb_maker(con), 3, 2, 6, even="drop")


def test_another_even_batches_on_the_same_world_size_resumes_elastically(
    con: duckdb.DuckDBPyConnection,
) -> None:
    check_elastic(duckdb_maker(con), 2, 2, 5, even="drop", new_even="pad")


def test_postgres_resumes_on_another_world_size(
    con: duckdb.DuckDBPyConnection, pg_server: pgserver.PostgresServer
) -> None:
    from adbc_driver_postgresql import dbapi

    make_series(con, PARTS)
    table = con.sql("SELECT * FROM series").to_arrow_table()
    with dbapi.connect(pg_server.uri, autocommit=True) as admin, admin.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS series")
        cursor.adbc_ingest("series", table, mode="create")

    def make(rank: int, world: int, **kwargs: Any) -> DDBDataLoader:
        return DDBDataLoader(
            pg_server.uri, SERIES_SQL, "y", rank=rank, world_size=world, **{**ARGS, **kwargs}
        )

    # one world change: the others are the loader's arithmetic, checked on DuckDB above
    check_elastic(make, 2, 3, 7)


@pytest.mark.slow
def test_a_resumed_rest_resumes_again_elsewhere_and_in_place(con: duckdb.DuckDBPyConnection) -> None:
    """2 ranks stop after 6 batches, 3 resume and stop after 4, then 2 resume (the epoch's third
    world) and, from the same state, 3 again (the same world: the remainder's own batches on)."""
    make = duckdb_maker(con)
    with make(0, 1) as whole_loader:
        whole = keys(list(whole_loader))
    first = Stretch(2, "pad", (6,))
    consumed: list[int] = []
    states = []
    for rank in range(2):
        with make(rank, 2) as old:
            batches, saved = take(old, 6)
            consumed += keys(batches)
            states.append(saved)
    state = states[0]
    middle: list[list[Any]] = []
    agains = []
    for rank in range(3):
        with make(rank, 3) as loader:
            loader.load_state_dict(state)
            batches, saved = take(loader, 4)
            middle.append(batches)
            agains.append(saved)
    again = agains[0]
    assert again["resumed"] == [[2, "pad", [6]]] and (again["world_size"], again["batches"]) == (3, 4)
    consumed += [key for batches in middle for key in keys(batches)]
    rest = resume_on(make, again, 2, [first, Stretch(3, "pad", (4,))])
    new = [key for batches in rest for key in keys(batches)]
    assert not set(new) & set(consumed)
    assert set(new) | set(consumed) == set(whole)
    uninterrupted = []
    for rank in range(3):
        with make(rank, 3) as loader:
            loader.load_state_dict(state)
            uninterrupted.append(list(loader))
        with make(rank, 3) as loader:
            loader.load_state_dict(again)
            assert len(loader) == len(uninterrupted[rank][4:]), "len() is what the next iteration yields"
            tail = list(loader)
        assert keys(tail) == keys(uninterrupted[rank][4:]), "the same world continues bit for bit"
        assert all(torch.equal(a[0], b[0]) for a, b in zip(tail, uninterrupted[rank][4:], strict=True))


def test_a_state_from_another_world_size_reports_its_own_place_until_it_starts(
    con: duckdb.DuckDBPyConnection,
) -> None:
    make = duckdb_maker(con)
    with make(0, 2) as two:
        _, state = take(two, 3)
    with make(0, 1) as one:
        one.load_state_dict(state)
        pending = one.state_dict()
        assert (pending["world_size"], pending["batches"], pending["epoch"]) == (2, 3, 0)
        iterator = iter(one)
        next(iterator)
        del iterator  # a peek: abandoned after its first batch, it gives the rest back
        back = one.state_dict()  # the same place, as this world's rest of the old world's epoch
        assert (back["resumed"], back["world_size"], back["batches"]) == ([[2, "pad", [3]]], 1, 0)
        assert len(one) == len(list(one))
        done = one.state_dict()
        assert (done["world_size"], done["batches"], done["epoch"], done["resumed"]) == (1, 0, 1, [])


def test_a_malformed_or_foreign_state_is_refused_by_name(con: duckdb.DuckDBPyConnection) -> None:
    make = duckdb_maker(con)
    with make(0, 2) as two:
        state = two.state_dict()
    with (
        make(0, 3, batch_size=4) as other,
        pytest.raises(ValueError, match="batch_size=8; this loader has batch_size=4"),
    ):
        other.load_state_dict(state)
    with make(0, 3) as three:
        with pytest.raises(ValueError, match=r"resumed entry \[2, 'even', \[1\]\]"):
            three.load_state_dict({**state, "resumed": [[2, "even", [1]]]})
        with pytest.raises(ValueError, match="worker=2, num_workers=2"):
            three.load_state_dict({**state, "worker": 2, "num_workers": 2})
        old_keys = {k: v for k, v in state.items() if k not in ("worker", "num_workers", "resumed")}
        three.load_state_dict({**old_keys, "version": 3})  # the same order, without elastic keys
        assert three.state_dict()["world_size"] == 2
        three.load_state_dict({**state, "worker": 1, "num_workers": 2, "batches": 1})
        with pytest.raises(ValueError, match="names only its own batches"):
            len(three)


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_a_stateful_dataloader_state_resumes_under_another_worker_count(db_path: str) -> None:
    """torchdata refuses another num_workers; the workers' states merged into one resume anywhere."""
    args = {**ARGS, "batch_size": 5, "window_size": 3, "window_stride": 1, "fetch_bytes": 0}
    with DDBDataLoader(db_path, SERIES_SQL, "y", **args) as whole_loader:
        whole = keys(list(whole_loader))
    data = DDBIterableDataset(db_path, SERIES_SQL, "y", num_workers=2, **args)
    stateful = StatefulDataLoader(data, batch_size=None, num_workers=2)
    iterator = iter(stateful)
    consumed = keys([next(iterator) for _ in range(5)])
    snapshot = pickle.loads(pickle.dumps(stateful.state_dict()))
    del iterator
    merged = json.loads(json.dumps(DDBIterableDataset.merge_worker_states(snapshot)))
    assert (merged["batches"], merged["num_workers"]) == ([3, 2], 2)
    for workers in (3, 0):
        fresh = DDBIterableDataset(db_path, SERIES_SQL, "y", num_workers=workers, **args)
        fresh.load_state_dict(merged)
        count = len(fresh)
        batches = list(DataLoader(fresh, batch_size=None, num_workers=workers))
        assert len(batches) == count, "len() is the rest's batches under the new worker count"
        rest = keys(batches)
        assert not set(rest) & set(consumed) and len(set(rest)) == len(rest)
        assert set(rest) | set(consumed) == set(whole)
        fresh.close()


# --- real ranks under torchrun: two save, three resume ---------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def torchrun(ranks: int, *arguments: str) -> None:
    # The rank processes run tests/elastic_worker.py as a script: make them import this checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={ranks}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(REPO / "tests" / "elastic_worker.py"),
        *arguments,
    ]
    done = subprocess.run(
        command, check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_torchrun_two_ranks_save_and_three_resume(db_path: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    torchrun(2, db_path, str(out), "save", "3")
    torchrun(3, db_path, str(out), "resume")
    saved = [json.loads((out / f"save-rank{r}.json").read_text()) for r in range(2)]
    resumed = [json.loads((out / f"resume-rank{r}.json").read_text()) for r in range(3)]
    assert len({report["seed"] for report in saved + resumed}) == 1, "the state carries rank 0's seed"
    consumed = [key for report in saved for batch in report["keys"] for key in batch]
    rest = [key for report in resumed for batch in report["keys"] for key in batch]
    assert len({len(report["keys"]) for report in resumed}) == 1, "equal batch counts on the new ranks"
    assert all(report["len"] == len(report["keys"]) for report in resumed)
    with DDBDataLoader(db_path, SERIES_SQL, "y", **{**ELASTIC_RUN, "seed": 0}) as whole:
        every = keys(list(whole))
    assert not set(consumed) & set(rest) and len(rest) - len(set(rest)) < 3
    assert set(consumed) | set(rest) == set(every), "the epoch, every sample"
    following = [key for report in resumed for batch in report["next"] for key in batch]
    assert set(following) == set(every), "the next epoch is a whole one"
