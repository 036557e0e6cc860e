"""Reads: one query that yields the rows of many partitions, and how its result is split.

A :class:`Read` is rendered here, from a choice of partitions made by the schedule
(:func:`ddbloader._epoch.units.fetch_units` picks them from counts, positions and the planned
facts :attr:`~ddbloader._sql.plan.PartitionSpec.by_keys` and
:attr:`~ddbloader._sql.plan.GroupPlan.read_runs`): :func:`keys_read` for partitions read by their
key values, :func:`run_read` for a read run. The readers in ``_io`` run it and split its result
(:func:`ddbloader._io.unit_split.unit_blocks`). Immutable, safe to share between threads.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .plan import PartitionSpec, QueryPlan

__all__ = ["Read", "keys_read", "run_read"]


@dataclass(frozen=True)
class Read:
    """Many partitions fetched by one query.

    ``cells`` are every partition whose rows the query returns, in plan order; ``wanted`` are the
    keys (``(group, position)``) of those the epoch asks for (the others belong to another
    worker's share of a group and are dropped on arrival). The result is split among ``cells`` by
    its last :attr:`key_columns` columns: each row's key values, or with ``cell_index`` the index
    of its cell (a read run's query, see :meth:`~ddbloader._sql.plan.QueryPlan.read_run_query`,
    whose cells' rows the client puts in order, see
    :meth:`~ddbloader._sql.plan.PartitionSpec.in_order`).

    Invariants: ``wanted`` ⊆ keys of ``cells``; every cell's key values are among ``params``.
    """

    sql: str
    params: tuple[Any, ...]
    cells: tuple[PartitionSpec, ...]
    wanted: frozenset[tuple[int, int]]
    cell_index: bool = False

    @property
    def key_columns(self) -> int:
        """The columns after the rows' own (and the row hash) that tell a row's cell."""
        return 1 if self.cell_index else len(self.cells[0].params)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.cells)

    def describe(self) -> str:
        """Name the read for messages: its partitions and its SQL."""
        groups = sorted({c.group for c in self.cells})
        shown = f"{groups[:5]}{'...' if len(groups) > 5 else ''}"
        return (
            f"{len(self.cells)} partitions of group(s) {shown} in one query "
            f"({self.sql!r} with {len(self.params)} parameters)"
        )


def keys_read(
    plan: QueryPlan,
    counts: Sequence[int | None],
    params: tuple[Any, ...],
    cells: tuple[PartitionSpec, ...],
    wanted: Iterable[tuple[int, int]],
    *,
    lists: bool,
) -> Read | None:
    """The read of ``cells`` by their key values: key ``i`` bound to ``counts[i]`` values of
    ``params`` (in key order), or not restricted where ``counts[i]`` is None; with ``lists`` each
    bound key's values as one list parameter. None when the plan's query cannot select its keys
    (see :meth:`~ddbloader._sql.plan.QueryPlan.unit_sql`)."""
    sql = plan.unit_sql(counts, lists=lists)
    if sql is None:
        return None
    if lists:
        bounds = np.cumsum([0, *(c for c in counts if c is not None)]).tolist()
        params = tuple(list(params[a:b]) for a, b in itertools.pairwise(bounds))
    return Read(sql, params, cells, frozenset(wanted))


def run_read(plan: QueryPlan, cells: tuple[PartitionSpec, ...]) -> Read | None:
    """The read of ``cells``, consecutive partitions of one read run, all wanted; None when the
    plan's query cannot be filtered by key ranges."""
    found = plan.read_run_query(cells)
    if found is None:
        return None
    sql, params = found
    return Read(sql, params, cells, frozenset(c.key for c in cells), cell_index=True)
