"""Fetch units: which partitions one query fetches, and the split of its result into partitions.

One query per (group, repartition) partition makes an epoch cost one round trip, and on an
engine that cannot prune on the key one table scan, per partition. A :class:`FetchUnit` instead
fetches many partitions with one query (:meth:`~ddbloader._sql.query.UserQuery.filtered_many`: the
key values bound as an ``IN`` list, the keys selected as extra columns) and
:func:`unit_blocks` splits the Arrow result by key, vectorised, keeping the query's order within
each partition.

Units are cut by :func:`fetch_units` from the planned row counts to a byte budget
(``fetch_bytes``), along the order in which an epoch's streams ask for partitions: whole groups
in the epoch's group order while they fit, and a group larger than the budget as runs of its
partitions in their visit order. So which partitions share a unit is a function of (plan, seed,
epoch, rank, worker), and a unit's partitions are asked for close together. Units change only
how rows travel, never which rows a partition holds: every split is checked against the planned
counts, and a result that does not split exactly is fetched again one partition at a time.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import GroupPlan, PartitionSpec, QueryPlan, WorkUnit
from .._sql.source import Block, ColumnLayout, arrow_values, to_block
from .owed import owed_partitions
from .shuffle import Purpose, visit_order

__all__ = [
    "FIRST_UNIT_SHARE",
    "MAX_VALUES",
    "FetchUnit",
    "UnitPartitions",
    "fetch_units",
    "partition_visits",
    "split_by_key",
    "unit_blocks",
]

#: Bound parameters in one unit's query at most: SQLite's historical limit, low enough for all.
MAX_VALUES = 999

#: The epoch's first unit holds at most this share of the budget's bytes (whole groups still join
#: it), so the first batch waits for a small query rather than a full one; each next unit may hold
#: twice as much, up to the budget, so that a unit's query is done by the time the rows of the
#: unit before it are served (a full unit after a small one kept every epoch waiting ~30 ms).
FIRST_UNIT_SHARE = 8

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


def partition_visits(
    unit: WorkUnit, config: LoaderConfig, geometry: WindowGeometry, epoch: int
) -> Sequence[int]:
    """The positions of the partitions ``unit`` needs, in the order its stream loads them.

    The needed pieces of one streamed subquery are visited together and in row order (its
    query reads them in that order): the subqueries are shuffled, then expanded into pieces.
    """
    needed = touched_partitions(unit, geometry)
    if len(needed) < 2 or not config.shuffle:
        return needed
    partitions = unit.group.partitions
    runs: list[list[int]] = []
    for position in needed:
        if runs and partitions[position].piece and partitions[runs[-1][-1]].head == partitions[position].head:
            runs[-1].append(position)
        else:
            runs.append([position])
    order = visit_order(
        len(runs), config.shuffle, config.seed, epoch, Purpose.PARTITION_ORDER, unit.group.index, unit.first
    )
    return [position for i in order for position in runs[int(i)]]


@dataclass(frozen=True)
class FetchUnit:
    """Many partitions fetched by one query.

    ``cells`` are every partition whose rows the query returns, in plan order; ``wanted`` are the
    keys of those the epoch asks for (the others belong to another worker's share of a group and
    are dropped on arrival). ``values[i]`` lists the values of key ``i`` the query binds, or is
    None where the query does not restrict key ``i``.

    Invariants: ``wanted`` ⊆ keys of ``cells``; every cell's key values are among ``values``.
    """

    sql: str
    params: tuple[Any, ...]
    cells: tuple[PartitionSpec, ...]
    wanted: frozenset[PartitionKey]

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.cells)

    def describe(self) -> str:
        """Name the unit for messages: its partitions and its SQL."""
        groups = sorted({c.group for c in self.cells})
        shown = f"{groups[:5]}{'...' if len(groups) > 5 else ''}"
        return (
            f"{len(self.cells)} partitions of group(s) {shown} in one query "
            f"({self.sql!r} with {len(self.params)} parameters)"
        )


def fetch_units(
    plan: QueryPlan,
    work_units: Sequence[WorkUnit],
    config: LoaderConfig,
    epoch: int,
    budget: int,
    *,
    lists: bool = False,
) -> Iterator[FetchUnit]:
    """The epoch's fetch units, in the order the epoch's streams ask for their partitions, each
    yielded as soon as it is cut (the fetcher cuts them as the streams' requests reach them, so
    the first query does not wait for the cutting of the whole epoch: 4-10 ms at 4,000 groups).

    Whole groups (all their partitions: the query restricts the group key only) join a unit while
    its planned bytes stay within ``budget`` (the first unit: within ``budget //``
    :data:`FIRST_UNIT_SHARE`, so that the epoch's first batch waits for a small query; 0.9 s
    against 2.1 s at 10,000 groups on PostgreSQL; the next ones within twice the share of the
    one before) and its values within :data:`MAX_VALUES` (unbounded with ``lists``: the backend
    binds each key's values as one list parameter); a group larger than ``budget`` becomes runs
    of its partitions in visit order (the query restricts the group to one value and the
    repartition key to the run's values); the pieces of a streamed subquery (see
    :mod:`ddbloader._io.streams`) join no unit. A partition asked for twice (a padded shard) is in
    the first unit only; a unit of one partition is left out (the partition's own subquery
    fetches it). No units at all when ``budget <= 0``, when the plan has no keys, or when the
    query cannot select its keys (see ``filtered_many``).
    """
    if budget <= 0 or plan.query is None or not plan.keys:
        return
    group_key = plan.keys[0][0] == "group_col"
    row_bytes = max(plan.layout.row_bytes, 1)
    max_values = sys.maxsize if lists else MAX_VALUES
    cutter = _Cutter(plan, group_key, max_values, lists, budget)
    geometry = plan.geometry
    # a group is served twice only in a padded shard; else no partition can repeat
    repeats = len({unit.group.index for unit in work_units}) < len(work_units)
    seen: set[PartitionKey] = set()
    for unit in work_units:
        group = unit.group
        visits = partition_visits(unit, config, geometry, epoch)
        if repeats:
            visits = [p for p in visits if (group.index, p) not in seen]
            seen.update((group.index, p) for p in visits)
        if not visits:
            continue
        size = group.rows * row_bytes
        if size <= budget:
            cutter.add_group(group, visits, size)
            if cutter.units:
                yield from cutter.take()
            continue
        cutter.flush()
        run: list[int] = []
        run_bytes = 0
        for position in visits:
            if group.partitions[position].streamed:  # read by its own streaming query
                cutter.add_run(group, run)
                run, run_bytes = [], 0
                continue
            size = group.partitions[position].rows * row_bytes
            if run and (run_bytes + size > budget or len(run) >= max_values):
                cutter.add_run(group, run)
                run, run_bytes = [], 0
            run.append(position)
            run_bytes += size
        cutter.add_run(group, run)
        yield from cutter.take()
    cutter.flush()
    yield from cutter.take()


class _Cutter:
    """Accumulates whole groups into one unit until its share of the budget is spent."""

    def __init__(self, plan: QueryPlan, group_key: bool, max_values: int, lists: bool, budget: int) -> None:
        self._plan = plan
        self._group_key = group_key
        self._max_values = max_values
        self._lists = lists
        self._groups: list[tuple[GroupPlan, Sequence[int]]] = []
        self._bytes = 0
        #: units cut and not yet taken
        self.units: list[FetchUnit] = []
        self._budget = budget
        #: Flushes of groups so far, each a unit or a partition its own subquery fetches (the
        #: first ones are cut to a share of the budget, see :data:`FIRST_UNIT_SHARE`).
        self._cut = 0
        self._share = budget // FIRST_UNIT_SHARE

    def take(self) -> list[FetchUnit]:
        """The units cut since the last take."""
        units, self.units = self.units, []
        return units

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

    def _add(
        self,
        counts: list[int | None],
        params: tuple[Any, ...],
        cells: tuple[PartitionSpec, ...],
        wanted: Sequence[PartitionKey],
    ) -> None:
        sql = self._plan.unit_sql(counts, lists=self._lists)
        if sql is None:
            return
        if self._lists:  # one list parameter per bound key
            bounds = np.cumsum([0, *(c for c in counts if c is not None)]).tolist()
            params = tuple(list(params[a:b]) for a, b in itertools.pairwise(bounds))
        self.units.append(FetchUnit(sql, params, cells, frozenset(wanted)))


def _codes(column: pa.ChunkedArray, values: Sequence[Any]) -> np.ndarray[Any, Any] | None:
    """Per row, the index of its value in ``values`` (-1 for none), compared as Arrow values of
    the column's type; None when ``values`` do not convert to that type.

    When every distinct value of the column equals one of ``values`` (or is NULL) as a Python
    value, the codes come from the column's own distinct values, without converting ``values`` to
    Arrow: ``pa.array`` and ``to_numpy`` import pandas on their first call (a second or more, in a
    fetch thread, while the first batch waits).
    """
    codes = _codes_by_distinct(column, values)
    if codes is not None:
        return codes
    try:
        value_set = pa.array(values, type=column.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        try:
            value_set = pa.array(values).cast(column.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return None
    codes = pc.index_in(column, value_set=value_set)
    return np.asarray(codes.fill_null(-1).to_numpy(), dtype=np.int64)


def _codes_by_distinct(column: pa.ChunkedArray, values: Sequence[Any]) -> np.ndarray[Any, Any] | None:
    """:func:`_codes` from the column's distinct values, or None when one of them is not among
    ``values`` (a row outside them, or a value that Python and Arrow may compare differently).

    One dictionary encoding finds the distinct values and each row's (half the time of finding
    them and then looking each row up); a NULL row is -1 unless ``values`` holds None."""
    encoded = column.combine_chunks().dictionary_encode()
    index = {value: i for i, value in enumerate(values)}
    try:
        found = [index.get(value) for value in encoded.dictionary.to_pylist()]
        null_code = index.get(None, -1)
    except TypeError:  # an unhashable value (a list column): compare as Arrow values
        return None
    if None in found:
        return None
    indices = encoded.indices
    if indices.null_count:
        indices = indices.fill_null(len(found))
    lookup = np.asarray([*found, null_code], dtype=np.int64)
    codes: np.ndarray[Any, Any] = lookup[arrow_values(pa.chunked_array([indices]), "key codes", "error")]
    return codes


def _cell_of_rows(table: pa.Table, cells: Sequence[PartitionSpec]) -> np.ndarray[Any, Any] | None:
    """Per row of ``table``, the index of the cell whose key values its key columns hold, or -1
    (a row outside the scheme: no subquery returns it); None if a value cannot be compared."""
    keys = len(cells[0].params)
    first_key = table.num_columns - keys
    row_code = np.zeros(table.num_rows, dtype=np.int64)
    cell_code = np.zeros(len(cells), dtype=np.int64)
    outside = np.zeros(table.num_rows, dtype=bool)
    for k in range(keys):
        values = list(dict.fromkeys(c.params[k] for c in cells))
        codes = _codes(table.column(first_key + k), values)
        if codes is None:
            return None
        outside |= codes < 0
        index = {v: i for i, v in enumerate(values)}
        row_code = row_code * len(values) + codes
        cell_code = cell_code * len(values) + np.array([index[c.params[k]] for c in cells], dtype=np.int64)
    if np.array_equal(cell_code, np.arange(len(cells))):
        # cells enumerate the codes (one key; a run of one group's repartitions; groups that all
        # hold the same repartition values): a row's code is its cell, no search needed
        row_code[outside | (row_code >= len(cells))] = -1
        return row_code
    by_code = np.argsort(cell_code)
    sorted_codes = cell_code[by_code]
    at = np.minimum(np.searchsorted(sorted_codes, row_code), len(cells) - 1)
    cell = by_code[at]
    cell[outside | (sorted_codes[at] != row_code)] = -1
    return cell


def split_by_key(table: pa.Table, cells: Sequence[PartitionSpec]) -> list[pa.Table] | None:
    """Cut a unit's result into its cells' rows, each in the result's order.

    ``table`` ends with one column per key (as ``filtered_many`` selects them); cell ``i``'s rows
    are those whose key values equal ``cells[i].params``, compared as Arrow values of the key
    column's type; rows that match no cell (outside the scheme) are dropped, as no subquery
    returns them. The key columns are dropped.

    Returns None when the result does not split into exactly the planned rows: a key value that
    does not convert to the column's type, or a cell whose row count differs from planning (the
    client compared a value differently from the engine, or the data changed). The caller then
    fetches the cells one by one, with subqueries the engine compares itself.
    """
    grouped = _grouped_by_cell(table, cells)
    if grouped is None:
        return None
    data, bounds = grouped
    return [data.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(cells))]


def _grouped_by_cell(table: pa.Table, cells: Sequence[PartitionSpec]) -> tuple[pa.Table, list[int]] | None:
    """The rows of ``table`` without its key columns, grouped by cell in cell order (each cell's
    in the result's order, rows outside the scheme first), and where each cell's rows begin:
    cell ``i`` is rows ``[bounds[i], bounds[i + 1])``. None as in :func:`split_by_key`."""
    cell_of_row = _cell_of_rows(table, cells)
    if cell_of_row is None:
        return None
    counts = np.bincount(cell_of_row + 1, minlength=len(cells) + 1)
    if counts[1:].tolist() != [c.rows for c in cells]:
        return None
    data = table.select(range(table.num_columns - len(cells[0].params)))
    if len(cell_of_row) and (np.diff(cell_of_row) < 0).any():
        # a stable sort of 16-bit keys is a radix sort: O(rows), 7x faster than of 64-bit ones
        narrow = cell_of_row.astype(np.int16) if len(cells) < np.iinfo(np.int16).max else cell_of_row
        order = np.argsort(narrow, kind="stable").astype(np.int64, copy=False)
        # from the buffer, as pa.array(order) would import pandas (see _codes)
        data = data.take(pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)]))
    return data, np.cumsum(counts).tolist()


class UnitPartitions:
    """The wanted partitions of a fetch unit, in cell order: ``specs[i]``'s rows are
    :meth:`block` ``(i)``, made when asked for. Read-only, so thread-safe.

    Without a transform the partitions are rows ``[bounds[i], bounds[i + 1])`` of one conversion
    (``whole``), and each block is a view made on demand: made at once, a block per partition
    (thousands an epoch with small groups) waited to be claimed long enough for the garbage
    collector to promote them, and to sweep the whole heap every few epochs. With a transform
    (or partitions fetched one by one) each has a block of its own (``blocks``).
    """

    def __init__(
        self,
        specs: Sequence[PartitionSpec],
        *,
        whole: Block | None = None,
        bounds: Sequence[int] = (),
        blocks: Sequence[Block] = (),
    ) -> None:
        self.specs = tuple(specs)
        self._whole = whole
        self._bounds = bounds
        self._blocks = blocks

    def block(self, index: int) -> Block:
        if self._whole is None:
            return self._blocks[index]
        return self._whole.view(self._bounds[index], self._bounds[index + 1])

    @property
    def rows(self) -> int:
        if self._whole is None:
            return sum(b.rows for b in self._blocks)
        return self._bounds[-1] - self._bounds[0]


def unit_blocks(table: pa.Table, unit: FetchUnit, layout: ColumnLayout) -> UnitPartitions | None:
    """The wanted partitions of a unit's result, or None if it does not split exactly.

    Without a transform the rows are converted once and each partition's block is a view of
    that conversion (of the grouped result itself when every partition is wanted, without
    cutting it into partitions and joining them again); a transform runs on each partition's
    rows, as for a partition fetched alone.
    """
    grouped = _grouped_by_cell(table, unit.cells)
    if grouped is None:
        return None
    data, bounds = grouped
    if layout.transform is None and len(unit.wanted) == len(unit.cells):
        outside = bounds[0]
        whole = to_block(data.slice(outside), layout)
        return UnitPartitions(unit.cells, whole=whole, bounds=[b - outside for b in bounds])
    wanted = [
        (spec, data.slice(bounds[i], bounds[i + 1] - bounds[i]))
        for i, spec in enumerate(unit.cells)
        if spec.key in unit.wanted
    ]
    specs = [spec for spec, _ in wanted]
    if layout.transform is not None:
        return UnitPartitions(specs, blocks=[to_block(part, layout) for _, part in wanted])
    # One chunk, not one per partition: converting 2,000 one-partition chunks column by column
    # cost 10x the copy that joins them.
    whole = to_block(pa.concat_tables([part for _, part in wanted]).combine_chunks(), layout)
    bounds = list(itertools.accumulate((part.num_rows for _, part in wanted), initial=0))
    return UnitPartitions(specs, whole=whole, bounds=bounds)
