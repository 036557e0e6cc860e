"""Where the rows a group's partitions serve lie in the query's order, as they are read.

What ``stats()`` places served samples by (see :mod:`ddbloader._diagnostics.mixing`). Where each
partition's read puts its rows is the reads' to say (:func:`~ddbloader._sql.read.served_runs`);
this module lays the partitions end to end.
"""

from __future__ import annotations

from .plan import GroupPlan
from .read import same_ranked_subquery, served_runs

__all__ = ["order_runs"]


def order_runs(group: GroupPlan) -> list[tuple[int, int, int]]:
    """Where the rows ``group``'s partitions serve lie in the query's order, as read.

    Per run of rows, ``(start, base, position)``: its first row among the group's partitions laid
    end to end (in a combed series: its row of the series, by which its samples are numbered),
    that row's place among the group's rows in the query's order, and the position of the
    partition holding it. A partition's runs are its read's
    (:func:`~ddbloader._sql.read.served_runs`), numbered from its subquery's first row.
    """
    found = []
    at = 0  # the partition's first row among its group's partitions
    subquery = 0  # where the partition's subquery begins in the group, in the query's order
    for position, p in enumerate(group.partitions):
        if not same_ranked_subquery(group, position):
            subquery = at
        origin = 0 if group.combed_windows else at
        for offset, first in served_runs(group, position):
            found.append((origin + offset, (0 if group.combed_windows else subquery) + first, position))
        at += p.rows
    return found
