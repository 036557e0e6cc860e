"""The query plan's data types: groups × repartitions → subqueries with exact row counts.

A :class:`QueryPlan` holds its :class:`GroupPlan` s, each its :class:`PartitionSpec` s (one
subquery each, with its exact row count); a :class:`WorkUnit` is a range of one group's samples.
Built once per loader by :func:`ddbloader._sql.planner.build_plan`, before iteration; immutable
afterwards and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.window import WindowGeometry
from .layout import ColumnLayout
from .partition import PartitionSpec, Read
from .query import Query
from .window_rows import WindowRows

__all__ = [
    "MIN_PIECE_ROWS",
    "PIECES_PER_QUERY",
    "GroupPlan",
    "QueryPlan",
    "WorkUnit",
    "series_rows",
]

#: The fewest rows ``fetch_bytes`` counts as when a subquery is cut into pieces (see
#: :func:`pieces`): however small it is, a subquery is never cut into more than
#: ``rows / MIN_PIECE_ROWS + 1`` pieces.
MIN_PIECE_ROWS = 64

#: Partitions of one read run (see :attr:`GroupPlan.read_runs`) one query reads at most: tagged
#: range pieces (see :mod:`ddbloader._sql.piece_tags`), neighbours in plan order whose stripes of
#: the band touch, so the query reads nearly the storage blocks one piece's does (a combed piece's
#: query costs mostly those, not its key tests). Measured on DuckDB (2M rows x 32 float32, one
#: thread): two neighbours cost 0.67 of their two queries, four 0.49; two pieces far apart 0.94.
#: Each piece is within ``fetch_bytes``, so such a query reads up to this many times the budget.
PIECES_PER_QUERY = 2


def pieces(rows: int, row_bytes: int, budget: int) -> list[tuple[int, int]]:
    """The pieces of a subquery of ``rows`` rows of ``row_bytes`` bytes as ``(first_row, rows)``.

    One piece when the rows fit in ``budget`` bytes (or ``budget <= 0``: nothing is streamed);
    else as few near-equal consecutive pieces as keep each within the budget, where a budget of
    fewer than :data:`MIN_PIECE_ROWS` rows counts as that many.
    """
    if budget <= 0 or rows * row_bytes <= budget:
        return [(0, rows)]
    per_piece = piece_rows(row_bytes, budget)
    count = -(-rows // per_piece)
    sizes = [rows // count + (1 if i < rows % count else 0) for i in range(count)]
    firsts = list(itertools.accumulate(sizes[:-1], initial=0))
    return list(zip(firsts, sizes, strict=True))


def piece_rows(row_bytes: int, budget: int) -> int:
    """The rows one piece of a ``budget``-byte fetch may hold: at least :data:`MIN_PIECE_ROWS`."""
    return max(budget // max(row_bytes, 1), MIN_PIECE_ROWS)


def series_rows(partitions: Sequence[PartitionSpec], row_maps: Sequence[WindowRows | None]) -> int:
    """The rows of a group whose partitions are ``partitions`` with ``row_maps`` (see
    :attr:`GroupPlan.row_maps`: a combed windowed piece counts its stripes, its context rows
    being another piece's)."""
    return sum(
        p.rows if rows is None else rows.stripe_rows for p, rows in zip(partitions, row_maps, strict=True)
    )


@dataclass(frozen=True)
class GroupPlan:
    """One time series: its non-empty partitions in repartition order.

    How each partition is read is stated by the per-partition facts the planner sets (see
    :func:`ddbloader._sql.read.group_reads`), so the schedule reads counts and positions, never
    how a query cuts or orders its rows.

    Its samples are ``first_sample`` to ``sample_stop - 1`` of those its rows hold (sample ``i``
    starts at row ``i * stride``); ``samples`` counts them. ``first_sample`` is 0 but where a
    split serves only the samples whose y starts at or after a bound (see
    :mod:`ddbloader._sql.splits`): the rows before it are the first samples' look-back.
    """

    index: int
    value: Any
    partitions: tuple[PartitionSpec, ...]
    samples: int
    first_sample: int = 0
    #: Per partition (by position): the query that yields it by itself where that is not its own
    #: subquery (a streaming query, one object for the partitions it yields; see
    #: :mod:`ddbloader._sql.read`); None where it is (see :attr:`keyed`): that read,
    #: :func:`~ddbloader._sql.partition.whole_read`, is made when it runs, not kept per partition.
    reads: tuple[Read | None, ...] = ()
    #: Per partition: where its rows lie in the series when they are not the rows
    #: after the previous partition's (a combed piece of windows, see
    #: :mod:`ddbloader._sql.window_pieces`: it serves the windows starting in its stripes, with
    #: every row they read, so it needs no neighbour's rows); None where they are.
    row_maps: tuple[WindowRows | None, ...] = ()
    #: Per partition: the position of the first partition its own query yields (one query may
    #: yield consecutive partitions, its rows cut among them in order); its own where it yields
    #: only this one.
    heads: tuple[int, ...] = ()
    #: Per partition: whether its own subquery reads it alone, and a query that lists key values
    #: (a fetch unit's, see :meth:`~ddbloader._sql.query.UserQuery.filtered_many`) among others.
    keyed: tuple[bool, ...] = ()
    #: Per partition: the position of the first partition of its read run, the consecutive
    #: partitions one query may read together, :data:`PIECES_PER_QUERY` at a time (see
    #: :func:`ddbloader._sql.read.run_read`); None where no query reads it with its neighbours.
    read_runs: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        # The facts not given are those of partitions each read alone by its own subquery.
        count = len(self.partitions)
        for name in ("reads", "row_maps", "heads", "keyed", "read_runs"):
            given = getattr(self, name)
            if not given:
                default = {"heads": range(count), "keyed": (True,) * count}.get(name, (None,) * count)
                object.__setattr__(self, name, tuple(default))
            elif len(given) != count:
                raise ValueError(f"{name} has {len(given)} entries for {count} partitions")

    @property
    def sample_stop(self) -> int:
        """One past this group's last sample."""
        return self.first_sample + self.samples

    @functools.cached_property  # read per group and epoch, thousands of times with small groups
    def rows(self) -> int:
        return series_rows(self.partitions, self.row_maps)

    @functools.cached_property
    def combed_windows(self) -> bool:
        """Whether the partitions are combed pieces of windows (see :attr:`row_maps`)."""
        return any(rows is not None for rows in self.row_maps)

    @functools.cached_property
    def subqueries(self) -> int:
        """How many queries read this group's partitions each by itself: one per partition but
        where several are pieces of one (see :attr:`heads`)."""
        return sum(head == position for position, head in enumerate(self.heads))

    def read_together(self, a: int, b: int) -> bool:
        """Whether one query may read the partition at position ``b`` right after the one at ``a``:
        ``b`` follows ``a`` in its read run (see :attr:`read_runs`)."""
        run = self.read_runs[a]
        return run is not None and b == a + 1 and self.read_runs[b] == run

    @functools.cached_property
    def _stripe_index(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Every stripe's first row, ascending, its stop, and the position of the partition holding it."""
        stripes = sorted(
            (low, high, position)
            for position, rows in enumerate(self.row_maps)
            if rows is not None
            for low, high in rows.starts
        )
        columns = list(zip(*stripes, strict=True)) if stripes else [(), (), ()]
        low, high, at = (np.array(column, np.int64) for column in columns)
        return low, high, at

    def partitions_starting(self, first: int, stop: int, stride: int) -> list[int]:
        """For a group of combed windowed pieces: the positions (ascending) of the partitions in
        whose stripes some of samples ``[first, stop)`` start (sample ``i`` at row ``i * stride``)."""
        low, high, at = self._stripe_index
        begin = np.maximum(low, first * stride)
        end = np.minimum(high, (stop - 1) * stride + 1)  # rows [begin, end) of each stripe
        holds = -(-begin // stride) * stride < end  # a multiple of stride among them
        found: list[int] = np.unique(at[holds]).tolist()
        return found

    def piece_order(self) -> np.ndarray[Any, Any] | None:
        """For a group of combed windowed pieces: its samples piece by piece (plan order), each
        piece's ascending, the sequence that shards cut (so a rank's share starts its windows in
        a few pieces and reads only those, where a range of samples spans every piece); None for
        any other group (its samples in index order). Computed on each call, not kept: 8 bytes a
        sample of the series, wanted once an epoch when shards are cut."""
        if not self.combed_windows:
            return None
        return np.concatenate(
            [rows.samples(self.first_sample, self.sample_stop) for rows in self.row_maps if rows is not None]
        )

    def starting_partitions(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """For a group of combed windowed pieces: the position of the partition whose windows
        start at each of ``rows`` (rows of the series)."""
        firsts, _, positions = self._stripe_index
        found: np.ndarray[Any, Any] = positions[np.searchsorted(firsts, rows, side="right") - 1]
        return found

    # The same object every epoch (for one rank and worker; shards cut their own): at thousands of
    # small groups, a new unit per group and epoch outlived enough collections to make the garbage
    # collector sweep the whole heap every few epochs.
    @functools.cached_property
    def whole(self) -> WorkUnit:
        """The unit of all this group's samples."""
        return WorkUnit(self, self.first_sample, self.sample_stop)


@dataclass(frozen=True)
class WorkUnit:
    """Samples ``[first, stop)`` of one group (indices as in the whole group), or only the ``owed``
    ones among them.

    ``owed`` (an elastic resume's remainder, see :mod:`ddbloader._epoch.elastic`) is None for every
    sample of ``[first, stop)``, else their sorted, distinct int64 indices with ``owed[0] == first``
    and ``owed[-1] == stop - 1``. It is left out of comparisons and hashing (an array compares
    elementwise), so a unit's identity stays ``(group, first, stop)``.
    """

    group: GroupPlan
    first: int
    stop: int
    owed: np.ndarray[Any, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def samples(self) -> int:
        return self.stop - self.first if self.owed is None else len(self.owed)


@dataclass(frozen=True)
class QueryPlan:
    """Everything an epoch needs, independent of seed and epoch.

    ``query`` and ``keys`` (each key's parameter name and parsed expression, group key first)
    derive the queries of fetch units (see :mod:`ddbloader._epoch.units`); no keys, no units.
    """

    engine: str
    groups: tuple[GroupPlan, ...]
    layout: ColumnLayout
    geometry: WindowGeometry
    query: Query | None = None
    keys: tuple[tuple[str, Any], ...] = ()
    #: The order key range pieces are cut on (a sqlglot expression), when the plan has any: the
    #: queries of read runs (see :func:`ddbloader._sql.read.run_read`: tagged pieces) test it.
    piece_key: Any = None

    # read every epoch: at thousands of groups a sum over them costs a millisecond each time
    @functools.cached_property
    def samples(self) -> int:
        return sum(g.samples for g in self.groups)

    @functools.cached_property
    def rows(self) -> int:
        return sum(g.rows for g in self.groups)

    @functools.cached_property
    def partitions(self) -> int:
        return sum(len(g.partitions) for g in self.groups)

    @functools.cached_property
    def largest_partition_rows(self) -> int:
        """The most rows one partition holds (an arena's regions are sized from it)."""
        return max((p.rows for g in self.groups for p in g.partitions), default=0)

    # The SQL of reads (see :mod:`ddbloader._sql.read`), kept per shape: every epoch cuts reads of
    # the same few shapes, and rendering one costs 5-20 ms.
    @functools.cached_property
    def rendered(self) -> dict[tuple[Any, ...], str | None]:
        return {}
