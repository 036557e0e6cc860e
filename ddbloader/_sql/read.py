"""Reads: every query the loader sends for rows, and how its result is split among partitions.

A :class:`Read` is rendered here. :func:`whole_read` is a partition's own subquery;
:func:`stream_read` a streamed subquery's, split among its pieces by their row counts. The others come
from a choice of partitions made by the schedule (:func:`ddbloader._epoch.units.fetch_units`
picks them from counts, positions and the planned facts
:attr:`~ddbloader._sql.plan.PartitionSpec.by_keys` and
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
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .piece_tags import tag_regions, tagged_sql
from .plan import GroupPlan, PartitionSpec, QueryPlan
from .query import UserQuery

__all__ = [
    "Read",
    "Split",
    "keys_read",
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

#: How a read's result is split among its cells: ``"whole"``, all of it is its one cell's rows;
#: ``"rows"``, its rows in order are its cells' one after another, cut by their planned counts
#: (read as a stream, each cell as it is asked for); ``"keys"``, by its last columns, each row's
#: key values; ``"cells"``, by its last column, each row's cell index.
Split = Literal["whole", "rows", "keys", "cells"]


@dataclass(frozen=True)
class Read:
    """Partitions fetched by one query.

    ``cells`` are every partition whose rows the query returns, in plan order; ``wanted`` are the
    keys (``(group, position)``) of those the epoch asks for (the others belong to another
    worker's share of a group and are dropped on arrival). The result is split among ``cells`` as
    ``split`` says (see :data:`Split`): by its last :attr:`key_columns` columns, each row's key
    values, or the index of its cell (a read run's query, see :func:`run_read`, whose cells' rows
    the client puts in order, see :meth:`~ddbloader._sql.plan.PartitionSpec.in_order`).

    With ``verify=True`` (:attr:`hashed`) the rows' own columns are followed by their hash (before
    the key columns), and each cell's hash sum is checked against its planned
    :attr:`~ddbloader._sql.plan.PartitionSpec.fingerprint`.

    Invariants: ``wanted`` ⊆ keys of ``cells``; every cell's key values are among ``params``; a
    ``"whole"`` read has one cell; a ``"rows"`` read's cells are consecutive partitions of one
    group, all wanted.
    """

    sql: str
    params: tuple[Any, ...]
    cells: tuple[PartitionSpec, ...]
    wanted: frozenset[tuple[int, int]]
    split: Split = "keys"

    @property
    def key_columns(self) -> int:
        """The columns after the rows' own (and the row hash) that tell a row's cell."""
        return {"whole": 0, "rows": 0, "keys": len(self.cells[0].params), "cells": 1}[self.split]

    @property
    def hashed(self) -> bool:
        """Whether the result carries the row hash column (``verify=True``)."""
        return self.cells[0].fingerprint is not None

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.cells)

    @functools.cached_property
    def first_rows(self) -> dict[int, int]:
        """A ``"rows"`` read's cells by position: the first row of each in the result."""
        firsts = itertools.accumulate((c.rows for c in self.cells[:-1]), initial=0)
        return {c.position: first for c, first in zip(self.cells, firsts, strict=True)}

    def describe(self) -> str:
        """Name the read for messages: its partitions and its SQL."""
        if self.split == "whole":
            return self.cells[0].describe()
        groups = sorted({c.group for c in self.cells})
        shown = f"{groups[:5]}{'...' if len(groups) > 5 else ''}"
        return (
            f"{len(self.cells)} partitions of group(s) {shown} in one query "
            f"({self.sql!r} with {len(self.params)} parameters)"
        )


def whole_read(spec: PartitionSpec) -> Read:
    """The read of ``spec`` by its own subquery (with ``verify=True``, the fingerprinting one)."""
    sql = spec.sql if spec.fingerprint is None else spec.fingerprint.sql
    return Read(sql, spec.params, (spec,), frozenset([spec.key]), split="whole")


def stream_read(group: GroupPlan, head: int) -> Read:
    """The read of the streamed subquery whose first piece is ``group``'s partition ``head``: its
    whole subquery (with ``verify=True``, the fingerprinting one, whose hash covers every piece),
    split by rows among its pieces."""
    first = group.partitions[head]
    cells = group.partitions[head : head + first.pieces]
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
