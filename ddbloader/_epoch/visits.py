"""Partition visits: which partitions of a group a work unit's samples touch, and the order in
which its stream loads them.

Both are pure functions of (unit, config, geometry, epoch): the schedule
(:mod:`ddbloader._epoch.schedule`) and the cutting of fetch units (:mod:`ddbloader._epoch.units`)
read the same visits, so they agree on which partitions are asked for and when. The needed
pieces of one streamed subquery are visited together and in row order; so are up to
:data:`~ddbloader._sql.plan.PIECES_PER_QUERY` partitions of one read run (see
:attr:`~ddbloader._sql.plan.GroupPlan.read_runs`: one fetch unit's query reads them); with
shuffle the subqueries (and those runs) are visited in a seeded order. The visits know
positions, counts and those planned facts, not how a partition is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import PIECES_PER_QUERY, WorkUnit
from .owed import owed_partitions
from .shuffle import Purpose, visit_order

__all__ = ["PartitionKey", "partition_visits", "touched_partitions", "visit_weights"]

#: A partition's identity within a plan: (group index, position in the group).
PartitionKey = tuple[int, int]


#: The visits of a group of one partition that has samples (shared, not a list per group and epoch).
_ONLY_PARTITION = (0,)


def touched_partitions(unit: WorkUnit, geometry: WindowGeometry) -> Sequence[int]:
    """Positions of the partitions of ``unit.group`` whose rows ``unit``'s samples touch.

    A plain loop, not numpy: it runs once per group per epoch, and most groups have a handful of
    partitions, where building an array cost 100 µs a group (1 s an epoch at 10,000 groups).
    """
    if len(unit.group.partitions) == 1 and unit.samples > 0:
        return _ONLY_PARTITION
    if unit.group.combed_windows:  # a sample's rows are all in the piece its window starts in
        if unit.owed is None:
            return unit.group.partitions_starting(unit.first, unit.stop, geometry.stride)
        touched: list[int] = np.unique(unit.group.starting_partitions(unit.owed * geometry.stride)).tolist()
        return touched
    if unit.owed is not None:  # an elastic resume's remainder: only the partitions it owes samples of
        return owed_partitions(unit, geometry)
    first_row = unit.first * geometry.stride
    stop_row = (unit.stop - 1) * geometry.stride + geometry.span
    touched = []
    start = 0
    for position, partition in enumerate(unit.group.partitions):
        if start >= stop_row:
            break
        stop = start + partition.rows
        if stop > first_row:
            touched.append(position)
        start = stop
    return touched


def visit_weights(unit: WorkUnit, geometry: WindowGeometry) -> list[int] | None:
    """The rows of each block a shuffled epoch visits in a random order to serve ``unit``: its
    samples when it touches one partition, else each touched partition's rows. None where it
    touches a partition that no query listing key values reads (see
    :attr:`~ddbloader._sql.plan.GroupPlan.keyed`: a piece of a subquery read in pieces), whose
    visits are no such blocks."""
    touched = touched_partitions(unit, geometry)
    if len(touched) == 1:
        return [unit.samples]
    group = unit.group
    if not all(group.keyed[position] for position in touched):
        return None
    return [group.partitions[position].rows for position in touched]


def partition_visits(
    unit: WorkUnit, config: LoaderConfig, geometry: WindowGeometry, epoch: int
) -> Sequence[int]:
    """The positions of the partitions ``unit`` needs, in the order its stream loads them.

    The needed pieces of one streamed subquery are visited together and in row order (its
    query reads them in that order), and so are up to :data:`~ddbloader._sql.plan.PIECES_PER_QUERY`
    partitions of a read run one after the other (see
    :meth:`~ddbloader._sql.plan.GroupPlan.read_together`; a fetch unit reads each such run): the
    subqueries and runs are shuffled, then expanded into pieces.
    """
    needed = touched_partitions(unit, geometry)
    if len(needed) < 2 or not config.shuffle:
        return needed
    group = unit.group
    heads = group.heads
    runs: list[list[int]] = []
    for position in needed:
        last = runs[-1][-1] if runs else None
        if last is not None and (
            (heads[last] == heads[position])
            or (len(runs[-1]) < PIECES_PER_QUERY and group.read_together(last, position))
        ):
            runs[-1].append(position)
        else:
            runs.append([position])
    order = visit_order(
        len(runs), config.shuffle, config.seed, epoch, Purpose.PARTITION_ORDER, unit.group.index, unit.first
    )
    return [position for i in order for position in runs[int(i)]]
