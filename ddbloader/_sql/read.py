"""Reads: every query the loader sends for rows, and how its result is split among partitions.

A :class:`Read` is rendered here (a partition's own subquery,
:func:`~ddbloader._sql.partition.whole_read`, beside it);
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
from .pieces import KeyRanges
from .plan import GroupPlan, QueryPlan
from .query import UserQuery
from .window_rows import WindowRows

__all__ = [
    "Cut",
    "GroupReads",
    "group_reads",
    "keys_read",
    "piece_notes",
    "read_shape",
    "run_read",
    "same_ranked_subquery",
    "served_runs",
    "stream_read",
    "streaming_reads",
    "unit_sql",
]

#: Shapes of reads whose SQL :data:`QueryPlan.rendered <ddbloader._sql.plan.QueryPlan.rendered>`
#: keeps (a few an epoch, the same every epoch when groups are of equal size), then forgets all
#: at once.
UNIT_SQL_SHAPES = 256


class Cut(NamedTuple):
    """How the planner cut a subquery larger than ``fetch_bytes``, for one partition of it: piece
    ``piece`` of ``pieces`` consecutive partitions read by one streaming query, ``sql`` with
    ``params`` (the subquery's own, or a range piece's: rows in ``ranges`` of the order key, the
    ranges' bounds among ``params`` after the key values)."""

    piece: int
    pieces: int
    sql: str
    params: tuple[Any, ...]
    ranges: KeyRanges | None


class GroupReads(NamedTuple):
    """How a group's partitions are read, per partition (by position): the facts
    :class:`~ddbloader._sql.plan.GroupPlan` holds (see its fields)."""

    reads: tuple[Read | None, ...]
    row_maps: tuple[WindowRows | None, ...]
    heads: tuple[int, ...]
    keyed: tuple[bool, ...]
    read_runs: tuple[int | None, ...]


def group_reads(partitions: Sequence[PartitionSpec], cuts: Sequence[Cut | None]) -> GroupReads:
    """The read facts of a group whose partitions (in plan order) are ``partitions``, cut as
    ``cuts`` say (None: a whole subquery): a whole subquery is read by its own query
    (:func:`~ddbloader._sql.partition.whole_read`, made when it runs) or by key values with
    others; a range piece and the pieces of a subquery read in pieces by their subquery's
    streaming query (:func:`stream_read`, one object for all its pieces); tagged range pieces of
    one subquery and band (see :mod:`ddbloader._sql.piece_tags`) form read runs."""
    if not any(cuts):
        return _alone(len(partitions))
    streamed: list[Read | None] = []
    runs: list[int | None] = []
    for position, cut in enumerate(cuts):
        if cut is None:
            streamed.append(None)
        else:
            streamed.append(stream_read(partitions, position, cut) if cut.piece == 0 else streamed[-1])
        if cut is None or not _tagged(cut):
            runs.append(None)
        elif position and runs[-1] is not None and _same_run(partitions, cuts, position):
            runs.append(runs[-1])
        else:
            runs.append(position)
    return GroupReads(
        tuple(streamed),
        tuple(None if c is None or c.ranges is None else c.ranges.windows for c in cuts),
        tuple(position if read is None else read.cells[0].position for position, read in enumerate(streamed)),
        tuple(c is None for c in cuts),
        tuple(runs),
    )


# Shared by every group of as many partitions each read alone (the common case: at thousands of
# small groups, tuples of their own would be as many more objects for the collector to sweep).
@functools.lru_cache(maxsize=256)
def _alone(count: int) -> GroupReads:
    """The read facts of ``count`` partitions each read by its own subquery."""
    nones = (None,) * count
    return GroupReads(nones, nones, tuple(range(count)), (True,) * count, nones)


def _tagged(cut: Cut) -> bool:
    """Whether a fetch unit may read this range piece together with others of its subquery
    (see :mod:`ddbloader._sql.piece_tags`): a combed piece of rows (not of windows) read whole,
    whose reader orders its rows."""
    ranges = cut.ranges
    return (
        cut.pieces == 1
        and ranges is not None
        and ranges.band is not None
        and ranges.sort is not None
        and ranges.windows is None
    )


def _same_run(partitions: Sequence[PartitionSpec], cuts: Sequence[Cut | None], position: int) -> bool:
    """Whether tagged range pieces ``position - 1`` and ``position`` cut one subquery (its key
    values) in one band."""
    a, b = cuts[position - 1], cuts[position]
    assert a is not None and a.ranges is not None and b is not None and b.ranges is not None
    return a.ranges.band == b.ranges.band and partitions[position - 1].params == partitions[position].params


def stream_read(partitions: Sequence[PartitionSpec], head: int, cut: Cut) -> Read:
    """The read of the streamed subquery (or range piece) cut as ``cut`` says whose first piece is
    ``partitions[head]`` (a group's partitions): its query (with ``verify=True``, the
    fingerprinting one, whose hash covers every piece), split by rows among its pieces."""
    first = partitions[head]
    cells = tuple(partitions[head : head + cut.pieces])
    sql = cut.sql if first.fingerprint is None else first.fingerprint.sql
    ranges = () if cut.ranges is None else (cut.ranges,) * len(cells)
    return Read(sql, cut.params, cells, frozenset(c.key for c in cells), split="rows", ranges=ranges)


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
    group = plan.groups[cells[0].group]
    alone = tuple(group.reads[cell.position] for cell in cells)
    points, tags = tag_regions([r.ranges[0] for r in alone if r is not None and r.ranges])
    query, keys, piece_key = plan.query, [expression for _, expression in plan.keys], plan.piece_key
    sql = _kept(plan, ("run", tags), lambda: tagged_sql(query, keys, piece_key, tags))
    assert sql is not None
    params = (*cells[0].params, *points)
    wanted = frozenset(c.key for c in cells)
    return Read(sql, params, cells, wanted, split="cells", alone=alone)


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


def _ranges(group: GroupPlan, position: int) -> KeyRanges | None:
    """The key ranges of ``group``'s partition ``position`` when it is a range piece, else None."""
    read = group.reads[position]
    return None if read is None else read.ranges_of(group.partitions[position])


def streaming_reads(groups: Iterable[GroupPlan]) -> list[Read]:
    """The streaming reads of ``groups`` (each once), in plan order."""
    return [r for g in groups for p, r in enumerate(g.reads) if r is not None and r.cells[0].position == p]


def piece_notes(plan: QueryPlan) -> list[str]:
    """How ``plan``'s subqueries larger than ``fetch_bytes`` are read, for messages: ``'2
    streamed in 9 pieces'``, ``'40 range pieces of the order key'``; empty when none is."""
    heads = streaming_reads(plan.groups)
    streamed = [r for r in heads if not r.ranges]
    ranged = len(heads) - len(streamed)
    pieces = sum(len(r.cells) for r in streamed)
    notes = [f"{len(streamed):,} streamed in {pieces:,} pieces"] if streamed else []
    if ranged:
        notes.append(f"{ranged:,} range piece{'' if ranged == 1 else 's'} of the order key")
    return notes


def read_shape(group: GroupPlan, position: int) -> tuple[Any, ...]:
    """What of the read of ``group``'s partition ``position`` decides the rows it serves beyond
    their count: the pieces its subquery is streamed in, and a range piece's key ranges (hashed
    into the plan fingerprint)."""
    read = group.reads[position]
    if read is None:
        return (1,)
    ranges = read.ranges_of(group.partitions[position])
    return (len(read.cells), ranges) if ranges else (len(read.cells),)


def served_runs(group: GroupPlan, position: int) -> list[tuple[int, int]]:
    """``(row within the partition, row within its subquery)`` where each run of the rows the read
    of ``group``'s partition ``position`` serves begins: one for a partition read as it lies; a
    range piece's runs (as the planning query ranked them,
    :attr:`~ddbloader._sql.pieces.KeyRanges.runs`; a part of a piece read in parts: the runs it
    holds), or a combed piece of windows' stripes (where its windows start)."""
    ranges = _ranges(group, position)
    if ranges is not None and ranges.windows is not None:
        return [(low, low) for low, _ in ranges.windows.starts]
    if ranges is None or not ranges.runs:
        return [(0, 0)]
    read = group.reads[position]
    assert read is not None
    found = []
    offset = 0  # the run's first row within the piece
    begin = read.first_rows[position]
    end = begin + group.partitions[position].rows
    for first, rows in ranges.runs:
        low, high = max(offset, begin), min(offset + rows, end)
        if low < high:
            found.append((low - begin, first + low - offset))
        offset += rows
    return found


def same_ranked_subquery(group: GroupPlan, position: int) -> bool:
    """Whether ``group``'s partition ``position`` is a range piece with ranked runs of the
    subquery the partition before it is a range piece of: its runs are numbered from that
    subquery's start."""
    if not position:
        return False
    ranges, previous = _ranges(group, position), _ranges(group, position - 1)
    return bool(
        ranges is not None
        and ranges.runs
        and previous is not None
        and repr(group.partitions[position].repartition_value)
        == repr(group.partitions[position - 1].repartition_value)
    )
