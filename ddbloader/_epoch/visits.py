"""Partition visits: which partitions of a group a work unit's samples touch, and the order in
which its stream loads them.

Both are pure functions of (unit, config, geometry, epoch): the schedule
(:mod:`ddbloader._epoch.schedule`) and the cutting of fetch units (:mod:`ddbloader._epoch.units`)
read the same visits, so they agree on which partitions are asked for and when. The needed
pieces of one streamed subquery are visited together and in row order; so are up to
:data:`PIECES_PER_QUERY` neighbouring tagged range pieces (one fetch unit's query reads them);
with shuffle the subqueries (and those runs of pieces) are visited in a seeded order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import PartitionSpec, WorkUnit
from .owed import owed_partitions
from .shuffle import Purpose, visit_order

__all__ = [
    "PIECES_PER_QUERY",
    "PartitionKey",
    "neighbours",
    "partition_visits",
    "touched_partitions",
    "visit_weights",
]


#: Tagged range pieces (see :mod:`ddbloader._sql.piece_tags`) one fetch unit's query reads at most:
#: neighbours in plan order, whose stripes of the band touch, so the query reads nearly the
#: storage blocks one piece's does (a combed piece's query costs mostly those, not its key
#: tests), visited one after the other. Measured on DuckDB (2M rows x 32 float32, one thread):
#: two neighbours cost 0.67 of their two queries, four 0.49; two pieces far apart 0.94. Each
#: piece is within ``fetch_bytes``, so such a unit holds up to this many times the budget.
PIECES_PER_QUERY = 2

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
    touches a piece of a subquery read in pieces, whose visits are no such blocks (a streamed
    subquery's pieces are read front to back by one query)."""
    touched = touched_partitions(unit, geometry)
    if len(touched) == 1:
        return [unit.samples]
    partitions = [unit.group.partitions[position] for position in touched]
    if any(p.streamed for p in partitions):
        return None
    return [p.rows for p in partitions]


def neighbours(a: PartitionSpec, b: PartitionSpec) -> bool:
    """Whether tagged range piece ``b`` comes right after ``a`` in plan order, of the same
    subquery (its key values) and band: pieces one query may read together."""
    if not (a.tagged and b.tagged) or b.position != a.position + 1 or a.group != b.group:
        return False
    assert a.ranges is not None and b.ranges is not None
    return a.ranges.band == b.ranges.band and a.key_params == b.key_params


def partition_visits(
    unit: WorkUnit, config: LoaderConfig, geometry: WindowGeometry, epoch: int
) -> Sequence[int]:
    """The positions of the partitions ``unit`` needs, in the order its stream loads them.

    The needed pieces of one streamed subquery are visited together and in row order (its
    query reads them in that order), and so are runs of up to :data:`PIECES_PER_QUERY`
    :func:`neighbours` (a fetch unit reads each run): the subqueries and runs are shuffled,
    then expanded into pieces.
    """
    needed = touched_partitions(unit, geometry)
    if len(needed) < 2 or not config.shuffle:
        return needed
    partitions = unit.group.partitions
    runs: list[list[int]] = []
    for position in needed:
        here = partitions[position]
        last = partitions[runs[-1][-1]] if runs else None
        if last is not None and (
            (here.piece and last.head == here.head)
            or (len(runs[-1]) < PIECES_PER_QUERY and neighbours(last, here))
        ):
            runs[-1].append(position)
        else:
            runs.append([position])
    order = visit_order(
        len(runs), config.shuffle, config.seed, epoch, Purpose.PARTITION_ORDER, unit.group.index, unit.first
    )
    return [position for i in order for position in runs[int(i)]]
