"""Fetch units: which partitions one query fetches, cut to a byte budget along the epoch's visits.

One query per (group, repartition) partition makes an epoch cost one round trip, and on an
engine that cannot prune on the key one table scan, per partition. A fetch unit instead fetches
many partitions with one query, a :class:`~ddbloader._sql.partition.Read` rendered in ``_sql``
(:meth:`~ddbloader._sql.query.UserQuery.filtered_many`: the key values bound as an ``IN`` list,
the keys selected as extra columns) and
:func:`~ddbloader._io.unit_split.unit_blocks` splits the Arrow result by key, vectorised,
keeping the query's order within each partition.

Units are cut by :func:`fetch_units` from the planned row counts to a byte budget
(``fetch_bytes``), along the order in which an epoch's streams ask for partitions: whole groups
in the epoch's group order while they fit, and a group larger than the budget as runs of its
partitions in their visit order. So which partitions share a unit is a function of (plan, seed,
epoch, rank, worker), and a unit's partitions are asked for close together. Units change only
how rows travel, never which rows a partition holds: every split is checked against the planned
counts, and a result that does not split exactly is fetched again one partition at a time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.partition import PartitionSpec, Read
from .._sql.plan import PIECES_PER_QUERY, GroupPlan, QueryPlan, WorkUnit
from .._sql.read import keys_read, run_read
from .schedule import DDB_POOL
from .visits import PartitionKey, partition_visits, touched_partitions

__all__ = ["FIRST_UNIT_SHARE", "MAX_VALUES", "fetch_units"]

#: Bound parameters in one unit's query at most: SQLite's historical limit, low enough for all.
MAX_VALUES = 999

#: The epoch's first unit holds at most this share of the budget's bytes (whole groups still join
#: it), so the first batch waits for a small query rather than a full one; each next unit may hold
#: twice as much, up to the budget, so that a unit's query is done by the time the rows of the
#: unit before it are served (a full unit after a small one kept every epoch waiting ~30 ms).
FIRST_UNIT_SHARE = 8


def fetch_units(
    plan: QueryPlan,
    work_units: Sequence[WorkUnit],
    config: LoaderConfig,
    epoch: int,
    budget: int,
    *,
    lists: bool = False,
) -> Iterator[Read]:
    """The epoch's fetch units, in the order the epoch's streams ask for their partitions, each
    yielded as soon as it is cut (the fetcher cuts them as the streams' requests reach them, so
    the first query does not wait for the cutting of the whole epoch: 4-10 ms at 4,000 groups).

    Whole groups (all their partitions: the query restricts the group key only) join a unit while
    its planned bytes stay within ``budget`` (the first unit: within ``budget //``
    :data:`FIRST_UNIT_SHARE`, so that the epoch's first batch waits for a small query; 0.9 s
    against 2.1 s at 10,000 groups on PostgreSQL; or the first ``group_pool_size`` groups that
    join whole, up to ``DDB_POOL x budget``: a shuffled first batch draws from all of them, and
    one query reads them in one scan, not a series of growing ones; the next ones within twice
    the share of the one before) and its values within :data:`MAX_VALUES` (unbounded with
    ``lists``: the backend binds each key's values as one list parameter), except that a group among the first
    ``group_pool_size`` larger than the first share is cut in two: a unit of the first
    ``prepartition_num`` partitions it visits (the schedule claims these first, the first
    batch reads them), and a unit of the rest, cut after the other first groups' heads (at the
    default shape the first batch then waits for 4,000-row queries instead of whole groups of
    10,000: 45-61 against 75-89 ms a warm epoch); a group larger than ``budget`` becomes runs of its
    partitions in visit order (the query restricts the group to one value and the
    repartition key to the run's values); partitions of one read run (see
    :attr:`~ddbloader._sql.plan.GroupPlan.read_runs`) visited one after the other join a unit of
    their own, up to :data:`~ddbloader._sql.plan.PIECES_PER_QUERY` of them (the visits keep such
    runs together); any other partition that no query listing key values reads (see
    :attr:`~ddbloader._sql.plan.GroupPlan.keyed`: read by a stream of its own, see
    :mod:`ddbloader._io.streams`) joins no unit. A partition asked for twice (a padded shard) is
    in the first unit only; a unit of one partition is left out (the partition's own subquery,
    or its stream, fetches it). No units at all when ``budget <= 0``, when the plan has neither
    keys nor range pieces, or when the query cannot select its keys (see ``filtered_many``).
    """
    if budget <= 0 or plan.query is None or not (plan.keys or plan.piece_key is not None):
        return
    group_key = bool(plan.keys) and plan.keys[0][0] == "group_col"
    max_values = sys.maxsize if lists else MAX_VALUES
    geometry = plan.geometry
    cutter = _Cutter(plan, group_key, max_values, lists, budget)
    cutter.widen_first(
        _pool_heads(work_units, config, geometry, cutter.first_share, budget, cutter.row_bytes)
    )
    row_bytes = cutter.row_bytes
    # a group is served twice only in a padded shard; else no partition can repeat
    repeats = len({unit.group.index for unit in work_units}) < len(work_units)
    seen: set[PartitionKey] = set()
    # The pool's first units are asked for their first prepartition_num partitions before any other
    # (see BatchSchedule): in a group that would be one unit of its own, they are a unit of their
    # own, cut before the rest of the pool's first groups (their tails).
    first_units = 0
    pool, head = config.group_pool_size, config.prepartition_num
    tails: list[tuple[GroupPlan, Sequence[int]]] = []
    for unit in work_units:
        group = unit.group
        visits = partition_visits(unit, config, geometry, epoch)
        if repeats:
            visits = [p for p in visits if (group.index, p) not in seen]
            seen.update((group.index, p) for p in visits)
        if not visits:
            continue
        size = group.rows * row_bytes
        first_units += 1
        if first_units <= pool and len(visits) > head and cutter.first_share < size <= budget:
            cutter.flush()
            cutter.add_runs(group, visits[:head])
            tails.append((group, visits[head:]))
        elif size <= budget:
            cutter.add_group(group, visits, size)
        else:
            cutter.flush()
            cutter.add_runs(group, visits)
        if first_units == pool and tails:
            cutter.add_tails(tails)
            tails = []
        yield from cutter.take()
    cutter.add_tails(tails)
    yield from cutter.take()


def _pool_heads(
    work_units: Sequence[WorkUnit],
    config: LoaderConfig,
    geometry: WindowGeometry,
    share: int,
    budget: int,
    row_bytes: int,
) -> int:
    """The planned bytes of the pool's first groups that join units whole (see :func:`fetch_units`).

    A shuffled batch draws from every active group, so the first batch waits for all of them;
    read in one query (one scan of a table with no index on the key), not a doubling series."""
    whole = 0
    head = config.prepartition_num
    for unit in work_units[: config.group_pool_size]:
        size = unit.group.rows * row_bytes
        cut = len(touched_partitions(unit, geometry)) > head and share < size
        whole += size if size <= budget and not cut else 0
    return whole


class _Cutter:
    """Accumulates whole groups into one unit until its share of the budget is spent."""

    def __init__(self, plan: QueryPlan, group_key: bool, max_values: int, lists: bool, budget: int) -> None:
        self._plan = plan
        self.row_bytes = max(plan.layout.row_bytes, 1)
        self._group_key = group_key
        self._max_values = max_values
        self._lists = lists
        self._groups: list[tuple[GroupPlan, Sequence[int]]] = []
        self._bytes = 0
        #: units cut and not yet taken
        self.units: list[Read] = []
        self._budget = budget
        #: Flushes of groups so far, each a unit or a partition its own subquery fetches (the
        #: first ones are cut to a share of the budget, see :data:`FIRST_UNIT_SHARE`).
        self._cut = 0
        self._share = self.first_share = budget // FIRST_UNIT_SHARE

    def widen_first(self, whole: int) -> None:
        """The first unit holds ``whole`` bytes of whole groups if more than its share, up to
        ``DDB_POOL x budget`` (the bytes :func:`~ddbloader._epoch.schedule.pool_size` sizes a
        pool's groups to)."""
        self._share = max(self._share, min(whole, DDB_POOL * self._budget))

    def take(self) -> list[Read]:
        """The units cut since the last take."""
        units, self.units = self.units, []
        return units

    def add_tails(self, tails: Sequence[tuple[GroupPlan, Sequence[int]]]) -> None:
        """The groups accumulated so far as a unit, then each tail's runs (see :meth:`add_runs`)."""
        self.flush()
        for group, visits in tails:
            self.add_runs(group, visits)

    def add_runs(self, group: GroupPlan, visits: Sequence[int]) -> None:
        """Units of runs of ``group``'s partitions ``visits``, in that order: runs within the budget,
        partitions of a read run in runs of up to PIECES_PER_QUERY, those no query listing key
        values reads in none."""
        run: list[int] = []
        run_bytes = 0
        together: list[int] = []
        row_bytes = self.row_bytes
        read_runs = group.read_runs
        for position in visits:
            partition = group.partitions[position]
            if read_runs[position] is not None:
                self.add_run(group, run)
                run, run_bytes = [], 0
                if together and (
                    len(together) >= PIECES_PER_QUERY or not group.read_together(together[-1], position)
                ):
                    self.add_together(group, together)
                    together = []
                together.append(position)
                continue
            self.add_together(group, together)
            together = []
            if not group.keyed[position]:  # read by its own streaming query
                self.add_run(group, run)
                run, run_bytes = [], 0
                continue
            size = partition.rows * row_bytes
            if run and (run_bytes + size > self._budget or len(run) >= self._max_values):
                self.add_run(group, run)
                run, run_bytes = [], 0
            run.append(position)
            run_bytes += size
        self.add_run(group, run)
        self.add_together(group, together)

    def add_group(self, group: GroupPlan, visits: Sequence[int], size: int) -> None:
        if self._groups and (
            self._bytes + size > self._share or len(self._groups) >= self._max_values or not self._group_key
        ):
            self.flush()
        self._groups.append((group, visits))
        self._bytes += size

    def flush(self) -> None:
        groups, self._groups, self._bytes = self._groups, [], 0
        if groups:
            self._cut += 1
            self._share = self._budget // max(FIRST_UNIT_SHARE >> self._cut, 1)
        cells = tuple(p for group, _ in groups for p in group.partitions)
        wanted = [group.partitions[p].key for group, visits in groups for p in visits]
        if len(cells) < 2:
            return
        counts: list[int | None] = []
        params: list[Any] = []
        for k in range(len(self._plan.keys)):
            values = list(dict.fromkeys(c.params[k] for c in cells))
            # The group key is always bound; another key when its values fit too, so the query
            # leaves out rows outside the scheme (and rows with a NULL key) on the engine's side.
            bound = (k == 0 and self._group_key) or len(params) + len(values) <= self._max_values
            counts.append(len(values) if bound else None)
            params += values if bound else []
        self._add(counts, tuple(params), cells, wanted)

    def add_run(self, group: GroupPlan, run: list[int]) -> None:
        if len(run) < 2:
            return
        cells = tuple(group.partitions[p] for p in sorted(run))
        repartition_values = tuple(c.params[-1] for c in cells)
        wanted = [group.partitions[p].key for p in run]
        if self._group_key:
            self._add([1, len(cells)], (cells[0].params[0], *repartition_values), cells, wanted)
        else:
            self._add([len(cells)], repartition_values, cells, wanted)

    def add_together(self, group: GroupPlan, positions: Sequence[int]) -> None:
        """A unit of the partitions ``positions`` of one read run of ``group`` (none for fewer than two)."""
        if len(positions) < 2:
            return
        cells = tuple(group.partitions[p] for p in sorted(positions))
        read = run_read(self._plan, cells)
        if read is not None:
            self.units.append(read)

    def _add(
        self,
        counts: list[int | None],
        params: tuple[Any, ...],
        cells: tuple[PartitionSpec, ...],
        wanted: Sequence[PartitionKey],
    ) -> None:
        read = keys_read(self._plan, counts, params, cells, wanted, lists=self._lists)
        if read is not None:
            self.units.append(read)
