"""Where the rows a group's partitions serve lie in the query's order, as they are read.

What ``stats()`` places served samples by (see :mod:`ddbloader._diagnostics.mixing`): a partition
read as it lies is one run of the query's order; a range piece holds the runs the planning query
ranked (see :mod:`ddbloader._sql.ranges`), a combed piece of windows its stripes.
"""

from __future__ import annotations

from .plan import GroupPlan, PartitionSpec

__all__ = ["order_runs"]


def order_runs(group: GroupPlan) -> list[tuple[int, int, int]]:
    """Where the rows ``group``'s partitions serve lie in the query's order, as read.

    Per run of rows, ``(start, base, position)``: its first row among the group's partitions laid
    end to end (in a combed series: its row of the series, by which its samples are numbered),
    that row's place among the group's rows in the query's order, and the position of the
    partition holding it. One run per partition read as it lies; per run of a range piece (its
    rows as the planning query ranked them: :attr:`~ddbloader._sql.pieces.KeyRanges.runs`), or
    per stripe of a combed piece of windows (where its windows start).
    """
    found = []
    at = 0  # the partition's first row among its group's partitions
    subquery = 0  # where the partition's subquery begins in the group, in the query's order
    previous: PartitionSpec | None = None
    for position, p in enumerate(group.partitions):
        if not (p.ranges is not None and p.ranges.runs and _same_subquery(p, previous)):
            subquery = at
        previous = p
        origin = 0 if group.combed_windows else at
        for offset, first in _runs(p):
            found.append((origin + offset, (0 if group.combed_windows else subquery) + first, position))
        at += p.rows
    return found


def _runs(partition: PartitionSpec) -> list[tuple[int, int]]:
    """``(row within the partition, row within its subquery)`` where each run of ``partition``:
    one for a partition read as it lies; a range piece's runs (a part of a piece read in parts:
    the runs it holds), or a combed piece of windows' stripes (where its windows start)."""
    ranges = partition.ranges
    if partition.windows is not None:
        return [(low, low) for low, _ in partition.windows.starts]
    if ranges is None or not ranges.runs:
        return [(0, 0)]
    found = []
    offset = 0  # the run's first row within the piece
    begin, end = partition.first_row, partition.first_row + partition.rows
    for first, rows in ranges.runs:
        low, high = max(offset, begin), min(offset + rows, end)
        if low < high:
            found.append((low - begin, first + low - offset))
        offset += rows
    return found


def _same_subquery(a: PartitionSpec, b: PartitionSpec | None) -> bool:
    return bool(
        b is not None
        and a.ranges is not None
        and b.ranges is not None
        and repr(a.repartition_value) == repr(b.repartition_value)
    )
