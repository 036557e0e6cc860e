"""Reads: every query the loader sends for rows, and how its result is split among partitions.

A :class:`Read` is rendered here. :func:`whole_read` is a partition's own subquery;
:func:`stream_read` a streamed subquery's, split among its pieces by their row counts. The others come
from a choice of partitions made by the schedule (:func:`ddbloader._epoch.units.fetch_units`
picks them from counts, positions and the facts :func:`group_reads` plans, such as
:attr:`~ddbloader._sql.plan.GroupPlan.keyed` and
:attr:`~ddbloader._sql.plan.GroupPlan.read_runs`): :func:`keys_read` for partitions read by their
key values, :func:`run_read` for a read run. :class:`ddbloader._io.reader.ReadJob` runs it and
splits its result (:func:`ddbloader._io.unit_split.unit_blocks`, or by rows as they arrive).
Immutable, safe to share between threads.

What of a partition's read decides the rows it serves is stated here too, for the modules that
must not know read kinds: the plan fingerprint (:func:`read_shape`) and where the served rows
lie in the query's order (:func:`served_runs`, :func:`same_ranked_subquery`, for ``stats()``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .partition import PartitionSpec, Read
from .piece_tags import tag_regions, tagged_sql
from .plan import QueryPlan
from .query import UserQuery
from .window_rows import WindowRows

__all__ = [
    "GroupReads",
    "group_reads",
    "keys_read",
    "piece_notes",
    "read_shape",
    "run_read",
    "same_ranked_subquery",
    "served_runs",
    "stream_read",
    "unit_sql",
    "whole_read",
]

#: Shapes of reads whose SQL :data:`QueryPlan.rendered <ddbloader._sql.plan.QueryPlan.rendered>`
#: keeps (a few an epoch, the same every epoch when groups are of equal size), then forgets all
#: at once.
UNIT_SQL_SHAPES = 256


class GroupReads(NamedTuple):
    """How a group's partitions are read, per partition (by position): the facts
    :class:`~ddbloader._sql.plan.GroupPlan` holds (see its fields)."""

    reads: tuple[Read | None, ...]
    row_maps: tuple[WindowRows | None, ...]
    heads: tuple[int, ...]
    keyed: tuple[bool, ...]
    read_runs: tuple[int | None, ...]


def group_reads(partitions: Sequence[PartitionSpec]) -> GroupReads:
    """The read facts of a group whose partitions (in plan order) are ``partitions``: a whole
    subquery is read by its own query (:func:`whole_read`, made when it runs) or by key values
    with others; a range piece and the pieces of a subquery read in pieces by their subquery's
    streaming query (:func:`stream_read`, one object for all its pieces); tagged range pieces of
    one subquery and band (see :mod:`ddbloader._sql.piece_tags`) form read runs."""
    if not any(p.streamed for p in partitions):
        return _alone(len(partitions))
    streamed: list[Read | None] = []
    runs: list[int | None] = []
    for position, partition in enumerate(partitions):
        if not partition.streamed:
            streamed.append(None)
        else:
            streamed.append(stream_read(partitions, position) if partition.piece == 0 else streamed[-1])
        previous = partitions[position - 1] if position else None
        if not partition.tagged:
            runs.append(None)
        elif previous is not None and runs[-1] is not None and _same_run(previous, partition):
            runs.append(runs[-1])
        else:
            runs.append(position)
    return GroupReads(
        tuple(streamed),
        tuple(p.windows for p in partitions),
        tuple(position if read is None else read.cells[0].position for position, read in enumerate(streamed)),
        tuple(not p.streamed for p in partitions),
        tuple(runs),
    )


# Shared by every group of as many partitions each read alone (the common case: at thousands of
# small groups, tuples of their own would be as many more objects for the collector to sweep).
@functools.lru_cache(maxsize=256)
def _alone(count: int) -> GroupReads:
    """The read facts of ``count`` partitions each read by its own subquery."""
    nones = (None,) * count
    return GroupReads(nones, nones, tuple(range(count)), (True,) * count, nones)


def _same_run(a: PartitionSpec, b: PartitionSpec) -> bool:
    """Whether tagged range pieces ``a`` and ``b`` cut one subquery (its key values) in one band."""
    assert a.ranges is not None and b.ranges is not None
    return a.ranges.band == b.ranges.band and a.key_params == b.key_params


def whole_read(spec: PartitionSpec) -> Read:
    """The read of ``spec`` by its own subquery (with ``verify=True``, the fingerprinting one)."""
    sql = spec.sql if spec.fingerprint is None else spec.fingerprint.sql
    return Read(sql, spec.params, (spec,), frozenset([spec.key]), split="whole")


def stream_read(partitions: Sequence[PartitionSpec], head: int) -> Read:
    """The read of the streamed subquery whose first piece is ``partitions[head]`` (a group's
    partitions): its whole subquery (with ``verify=True``, the fingerprinting one, whose hash
    covers every piece), split by rows among its pieces."""
    first = partitions[head]
    cells = tuple(partitions[head : head + first.pieces])
    sql = first.sql if first.fingerprint is None else first.fingerprint.sql
    return Read(sql, first.params, cells, frozenset(c.key for c in cells), split="rows")


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
    (see :func:`unit_sql`)."""
    sql = unit_sql(plan, counts, lists=lists)
    if sql is None:
        return None
    if lists:
        bounds = np.cumsum([0, *(c for c in counts if c is not None)]).tolist()
        params = tuple(list(params[a:b]) for a, b in itertools.pairwise(bounds))
    return Read(sql, params, cells, frozenset(wanted))


def run_read(plan: QueryPlan, cells: tuple[PartitionSpec, ...]) -> Read | None:
    """The read of ``cells``, consecutive partitions of one read run (see
    :attr:`~ddbloader._sql.plan.GroupPlan.read_runs`: tagged range pieces of one subquery, in plan
    order), all wanted, its last column each row's cell index; None when the plan's query cannot
    be filtered by key ranges. The SQL is kept per shape of the pieces' regions (an epoch's
    pairs of combed pieces have a few shapes, and rendering one costs ~20 ms)."""
    if not isinstance(plan.query, UserQuery) or plan.piece_key is None:
        return None
    points, tags = tag_regions([cell.ranges for cell in cells if cell.ranges is not None])
    query, keys, piece_key = plan.query, [expression for _, expression in plan.keys], plan.piece_key
    sql = _kept(plan, ("run", tags), lambda: tagged_sql(query, keys, piece_key, tags))
    assert sql is not None
    params = (*cells[0].key_params, *points)
    return Read(sql, params, cells, frozenset(c.key for c in cells), split="cells")


def unit_sql(plan: QueryPlan, counts: Sequence[int | None], *, lists: bool) -> str | None:
    """``query.filtered_many`` of the plan's keys, rendered once per shape of read.

    Rendering an ``IN`` list of a thousand parameters costs ~5 ms, and every epoch cuts units of
    the same shapes, so the text is kept (see :data:`UNIT_SQL_SHAPES`; with groups of varied
    sizes the counts vary too). With ``lists`` the SQL says only which keys are bound, not how
    many values each has.
    """
    query = plan.query
    assert query is not None
    shape = tuple(count is not None if lists else count for count in counts)
    keys = [expression for _, expression in plan.keys]
    return _kept(plan, ("keys", lists, shape), lambda: query.filtered_many(keys, counts, lists=lists))


def _kept(plan: QueryPlan, shape: tuple[Any, ...], render: Callable[[], str | None]) -> str | None:
    """The SQL of ``shape`` kept by ``plan``, rendered by ``render`` the first time. Thread-safe:
    two threads rendering one shape at once both get the same text."""
    sqls = plan.rendered
    if shape not in sqls:
        if len(sqls) >= UNIT_SQL_SHAPES:
            sqls.clear()
        sqls[shape] = render()
    return sqls[shape]


def piece_notes(plan: QueryPlan) -> list[str]:
    """How ``plan``'s subqueries larger than ``fetch_bytes`` are read, for messages: ``'2
    streamed in 9 pieces'``, ``'40 range pieces of the order key'``; empty when none is."""
    every = [p for g in plan.groups for p in g.partitions]
    streamed = [p for p in every if p.streamed and p.ranges is None]
    ranged = sum(p.ranges is not None and p.piece == 0 for p in every)
    heads = sum(p.piece == 0 for p in streamed)
    notes = [f"{heads:,} streamed in {len(streamed):,} pieces"] if streamed else []
    if ranged:
        notes.append(f"{ranged:,} range piece{'' if ranged == 1 else 's'} of the order key")
    return notes


def read_shape(spec: PartitionSpec) -> tuple[Any, ...]:
    """What of ``spec``'s read decides the rows it serves beyond their count: the pieces its
    subquery is streamed in, and a range piece's key ranges (hashed into the plan fingerprint)."""
    return (spec.pieces, spec.ranges) if spec.ranges else (spec.pieces,)


def served_runs(spec: PartitionSpec) -> list[tuple[int, int]]:
    """``(row within the partition, row within its subquery)`` where each run of the rows
    ``spec``'s read serves begins: one for a partition read as it lies; a range piece's runs (as
    the planning query ranked them, :attr:`~ddbloader._sql.pieces.KeyRanges.runs`; a part of a
    piece read in parts: the runs it holds), or a combed piece of windows' stripes (where its
    windows start)."""
    ranges = spec.ranges
    if spec.windows is not None:
        return [(low, low) for low, _ in spec.windows.starts]
    if ranges is None or not ranges.runs:
        return [(0, 0)]
    found = []
    offset = 0  # the run's first row within the piece
    begin, end = spec.first_row, spec.first_row + spec.rows
    for first, rows in ranges.runs:
        low, high = max(offset, begin), min(offset + rows, end)
        if low < high:
            found.append((low - begin, first + low - offset))
        offset += rows
    return found


def same_ranked_subquery(previous: PartitionSpec | None, spec: PartitionSpec) -> bool:
    """Whether ``spec`` is a range piece with ranked runs of the subquery ``previous`` (the
    partition before it) is a range piece of: its runs are numbered from that subquery's start."""
    return bool(
        previous is not None
        and spec.ranges is not None
        and spec.ranges.runs
        and previous.ranges is not None
        and repr(spec.repartition_value) == repr(previous.repartition_value)
    )
