"""Slots: a shuffled pool of many units draws in runs, and its batches are those of a draw one unit
at a time, bit for bit (samples, chunks, events, every random draw), checked without an engine.
That the real pool gathers the rows of runs is checked in tests/test_pool.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import Epoch, config, epochs, plan_groups

from ddbloader._core.window import WindowGeometry
from ddbloader._epoch import schedule as schedule_module
from ddbloader._epoch import slots as slots_module
from ddbloader._epoch.events import ScheduledBatch
from ddbloader._epoch.owed import owed_unit
from ddbloader._sql.plan import WorkUnit

pytestmark = pytest.mark.timeout(120)


def batches_of(epoch: Epoch, units: Sequence[WorkUnit], runs: bool) -> tuple[list[ScheduledBatch], int]:
    """The epoch's batches drawn in runs (from a pool of one slot on) or one unit at a time, and
    the high-water mark of partitions held."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schedule_module, "RUNS_FROM", 1 if runs else 1 << 30)
        schedule = epoch.schedule(units)
        assert schedule.in_runs == runs
        return list(schedule), schedule.high_water


def flat(batch: ScheduledBatch) -> tuple[Any, ...]:
    """Everything a batch says, as plain values (either form of its chunks)."""
    chunks = [(step, samples.tolist()) for step, samples in batch.drawn()]
    per_chunk = (batch.steps, batch.counts, batch.chunk_groups)
    ints = [np.asarray(values, np.int64).tolist() for values in per_chunk]
    return batch.index, batch.events, chunks, ints, batch.samples.tolist(), batch.groups.tolist()


@st.composite
def owing(draw: st.DrawFn, epoch: Epoch) -> list[WorkUnit]:
    """The epoch's units, some of them owing only some of their samples (an elastic remainder)."""
    units = []
    for unit in epoch.units():
        if unit.samples > 1 and draw(st.booleans()):
            kept = draw(st.lists(st.booleans(), min_size=unit.samples, max_size=unit.samples))
            owed = np.flatnonzero(kept) + unit.first
            if len(owed):
                units.append(owed_unit(unit.group, owed.astype(np.int64)))
                continue
        units.append(unit)
    return units


@settings(max_examples=examples(750), deadline=None)
@given(data=st.data(), epoch=epochs(), buffer=st.sampled_from([1, 1 << 14]))
def test_runs_draw_the_batches_of_a_draw_one_unit_at_a_time(
    data: st.DataObject, epoch: Epoch, buffer: int
) -> None:
    # a buffer of 1 sample: every step's samples move it to a new buffer (the compaction)
    epoch = dataclasses.replace(epoch, config=dataclasses.replace(epoch.config, shuffle=True))
    units = data.draw(owing(epoch)) if data.draw(st.booleans()) else epoch.units()
    plain, plain_high = batches_of(epoch, units, runs=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slots_module, "_LEAST_BUFFER", buffer)
        drawn, drawn_high = batches_of(epoch, units, runs=True)
    assert [flat(b) for b in drawn] == [flat(b) for b in plain]
    assert drawn_high == plain_high
    assert all(isinstance(b.steps, tuple) for b in plain)


def many_groups(groups: int, rows: int, pool: int, batch_size: int) -> Iterator[ScheduledBatch]:
    geometry = WindowGeometry(5, 1, 1, 5, True)
    epoch = Epoch(
        plan_groups([[[rows]]] * groups, geometry),
        config(batch_size=batch_size, group_pool_size=pool, x_window=5, offset=5),
        geometry,
        0,
    )
    return iter(epoch.schedule(epoch.units()))


def test_a_pool_of_many_units_draws_a_batch_as_one_run() -> None:
    # 200 one-partition groups of 45 samples, all in the pool: a unit loads when first drawn, one
    # by one; the batches after (until units run out) are each one run, without a unit to visit
    batches = list(many_groups(200, 50, 200, 64))
    assert slots_module.RUNS_FROM <= 200
    assert all(len(b.chunks) == 1 and isinstance(b.steps, np.ndarray) for b in batches[1:])
    quiet = batches[20:90]
    assert all(not b.events for b in quiet)
    assert all(len(b.steps) > 40 for b in quiet), "about a chunk per unit drawn"
    served = [(g, s) for b in batches for g, s in zip(b.groups.tolist(), b.samples.tolist(), strict=True)]
    assert sorted(served) == [(g, s) for g in range(200) for s in range(45)]


def test_a_pool_below_runs_from_draws_one_unit_at_a_time() -> None:
    batches = list(many_groups(20, 50, slots_module.RUNS_FROM - 1, 64))
    assert all(isinstance(b.steps, tuple) and len(b.chunks) == len(b.steps) for b in batches)
