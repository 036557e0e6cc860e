"""Elastic resume: the rest of an epoch interrupted under one world size, split for another.

An epoch's order is a pure function of (plan, seed, epoch, shard), so what the old ranks had
handed out when a state was saved is computable from the state alone: every rank (and, with
DataLoader workers, every rank's worker ``w``) had handed out the same number of batches, so the
first ``batches`` of each old (rank, worker)'s :class:`~ddbloader._epoch.schedule.BatchSchedule`
are its consumption. Their union is the epoch's *consumed* samples; the *remainder* is every
sample of the plan that no old rank handed out. A padding repeat (``even_batches="pad"``: a short
rank repeats its first samples) counts as handing its sample out, so a sample can be consumed
even though the rank that owns it had not reached it yet; with ``"drop"`` (or ``drop_last``) the
samples that the old world would have dropped at the epoch's end are in the remainder.

The remainder, one unit per group in the epoch's group order (a :class:`WorkUnit` that owes only
the group's remaining samples, see :mod:`ddbloader._epoch.owed`), is laid end to end and cut for
the new world as an ordinary epoch's groups are (:func:`~ddbloader._epoch.shard.share_units`):
``world_size`` near-equal contiguous runs, padded or dropped to equal counts, then per worker. So
every new rank yields the same number of batches, the new ranks together yield every remaining
sample exactly once (plus padding repeats of fewer than ``world_size`` samples, or minus as many
dropped), and the epochs after it are the new world's ordinary ones.

Such an epoch can itself be interrupted and resumed again: the stretches it was served in are a
chain of :class:`Stretch`\\ es (each one's world, even_batches and batches per worker), every
one applied to the remainder the ones before it left. Exact across world sizes: the set of the
epoch's samples. Not kept: which rank serves which sample, and the order within the remainder.

Decisions. The remainder is cut by the rule that cuts an ordinary epoch (contiguous runs of the
epoch's group order), not by continuing each old rank's own order: W' ranks cannot continue W
schedules, and contiguous runs keep a group's remaining samples on few ranks, so each partition
is fetched by few ranks. A partly consumed group is one unit whose ``owed`` samples are kept in
its steps' orders (a filter of the pure order), so the schedule, the pool and the fetch units
need no other change; a group with nothing consumed stays a plain unit (no array, no filter).
Partitions none of whose owed samples' rows lie in them are not fetched; a partly consumed
partition is fetched whole (rows are fetched per partition), and a group small enough to join a
fetch unit comes back whole in that unit's query (its unwanted partitions dropped on arrival, as
for a worker's share of a group). Samples the old world would have dropped (``"drop"``,
``drop_last``) are in the remainder: they were never handed out.

Cost: building the old ranks' first batches runs their schedules (no data, no engine), about
1-2 µs per sample handed out (about a second at half an epoch of a million samples); the remainder
holds arrays only for the groups that were partly consumed. Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import GroupPlan, WorkUnit
from .owed import owed_unit
from .schedule import BatchSchedule
from .shard import EvenBatches, share_units
from .shuffle import Purpose, visit_order

__all__ = ["PlanShape", "Stretch", "consumed_samples", "epoch_remainder", "remainder"]


class PlanShape(Protocol):
    """What of a plan an epoch's order depends on (a :class:`~ddbloader._sql.plan.QueryPlan` is
    one): its groups, indexed by position, and the window geometry."""

    @property
    def groups(self) -> Sequence[GroupPlan]: ...

    @property
    def geometry(self) -> WindowGeometry: ...


@dataclass(frozen=True)
class Stretch:
    """Part of an epoch served under one world: ``batches[w]`` batches by worker ``w`` of every rank
    (one entry without DataLoader workers). Invariant: ``world_size >= 1``, ``batches`` non-empty."""

    world_size: int
    even_batches: EvenBatches
    batches: tuple[int, ...]

    @property
    def num_workers(self) -> int:
        return len(self.batches)


def _batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _served(
    units: Sequence[WorkUnit], plan: PlanShape, config: LoaderConfig, epoch: int, stretch: Stretch
) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """``(groups, samples)`` of every batch the stretch's ranks and workers handed out of ``units``."""
    for rank in range(stretch.world_size):
        for worker, handed in enumerate(stretch.batches):
            if handed <= 0:
                continue
            share = share_units(
                units, rank, stretch.world_size, worker, stretch.num_workers, stretch.even_batches
            )
            total = _batch_count(sum(u.samples for u in share), config.batch_size, config.drop_last)
            for batch in BatchSchedule(share, plan.geometry, config, epoch, min(handed, total)):
                yield batch.groups, batch.samples


def consumed_samples(
    units: Sequence[WorkUnit], plan: PlanShape, config: LoaderConfig, epoch: int, stretch: Stretch
) -> np.ndarray[Any, Any]:
    """The samples the stretch handed out of ``units``, as sorted distinct ids ``offset(group) +
    sample`` (``offset``: the sample stops of the groups before it in plan order)."""
    offsets = np.cumsum([0] + [g.sample_stop for g in plan.groups], dtype=np.int64)
    ids = [offsets[groups] + samples for groups, samples in _served(units, plan, config, epoch, stretch)]
    return np.unique(np.concatenate(ids)) if ids else np.empty(0, np.int64)


def remainder(
    units: Sequence[WorkUnit], plan: PlanShape, config: LoaderConfig, epoch: int, stretch: Stretch
) -> list[WorkUnit]:
    """``units`` (at most one per group) less what the stretch handed out of them, in their order.

    A unit none of whose samples were handed out is kept as it is; an emptied one is left out.
    """
    consumed = consumed_samples(units, plan, config, epoch, stretch)
    offsets = np.cumsum([0] + [g.sample_stop for g in plan.groups], dtype=np.int64)
    left: list[WorkUnit] = []
    for unit in units:
        base = int(offsets[unit.group.index])
        lo, hi = np.searchsorted(consumed, [base + unit.first, base + unit.stop])
        if lo == hi:
            left.append(unit)
            continue
        mine = unit.owed if unit.owed is not None else np.arange(unit.first, unit.stop, dtype=np.int64)
        owed = np.setdiff1d(mine, consumed[lo:hi] - base, assume_unique=True)
        if len(owed):
            left.append(owed_unit(unit.group, owed))
    return left


def epoch_remainder(
    plan: PlanShape, config: LoaderConfig, epoch: int, stretches: Sequence[Stretch]
) -> list[WorkUnit]:
    """What the ``stretches`` of ``epoch``, served one after another, left of it: one unit per
    group with samples left, in the epoch's group order."""
    order = visit_order(len(plan.groups), config.shuffle, config.seed, epoch, Purpose.GROUP_ORDER)
    units = [plan.groups[i].whole for i in order.tolist() if plan.groups[i].samples > 0]
    for stretch in stretches:
        if any(stretch.batches):
            units = remainder(units, plan, config, epoch, stretch)
    return units
