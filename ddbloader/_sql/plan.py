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
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core.window import WindowGeometry
from .fingerprint import Fingerprint
from .layout import ColumnLayout
from .pieces import KeyRanges
from .query import Query
from .window_rows import WindowRows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MIN_PIECE_ROWS",
    "PIECES_PER_QUERY",
    "GroupPlan",
    "PartitionSpec",
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


@dataclass(frozen=True)
class PartitionSpec:
    """One subquery: the rows of one group in one repartition, in the query's order.

    A subquery whose planned bytes exceed ``fetch_bytes`` is streamed: it becomes ``pieces``
    consecutive partitions of its group, piece ``piece`` holding its result's rows
    ``[first_row, first_row + rows)``; all pieces share ``sql`` and ``params``, and are read by
    one query (see :mod:`ddbloader._io.streams`). Invariants: ``0 <= piece < pieces``; the pieces of
    one subquery sit at positions ``position - piece`` to ``position - piece + pieces - 1``.

    With shuffle, such a subquery is cut instead into range pieces (see
    :mod:`ddbloader._sql.pieces`): each a partition of its own, ``sql`` the subquery's rows in
    ``ranges`` of its order key, ``params`` the key values then the ranges' bounds; one larger
    than ``fetch_bytes`` (equal keys) is itself read in pieces as above.

    ``fingerprint`` (``verify=True``): what the subquery's (or the range piece's) rows hash to
    (see :mod:`ddbloader._sql.fingerprint`); its SQL is the one fetches run, ``sql`` the plain one.
    """

    group: int
    position: int
    group_value: Any
    repartition_value: Any
    sql: str
    params: tuple[Any, ...]
    rows: int
    piece: int = 0
    pieces: int = 1
    first_row: int = 0
    #: A range piece's key ranges (see :mod:`ddbloader._sql.pieces`): ``sql`` reads only them.
    ranges: KeyRanges | None = None
    fingerprint: Fingerprint | None = None

    # made once per plan: at thousands of groups, a tuple per partition and epoch cost ~5 ms an epoch
    @functools.cached_property
    def key(self) -> tuple[int, int]:
        """``(group, position)``: this partition's identity within its plan."""
        return self.group, self.position

    @property
    def windows(self) -> WindowRows | None:
        """A combed piece of windows: where its rows lie in the series (else None)."""
        return None if self.ranges is None else self.ranges.windows

    @property
    def streamed(self) -> bool:
        """Whether this partition is read by a streaming query of its own, never by a fetch unit:
        a piece of a subquery read in pieces, or a range piece (a subquery of one piece)."""
        return self.pieces > 1 or self.ranges is not None

    @property
    def tagged(self) -> bool:
        """Whether a fetch unit may read this range piece together with others of its subquery
        (see :mod:`ddbloader._sql.piece_tags`): a combed piece of rows (not of windows) read whole,
        whose reader orders its rows. Else (and when no unit holds it) it is read by a streaming
        query of its own."""
        ranges = self.ranges
        return (
            self.pieces == 1
            and ranges is not None
            and ranges.band is not None
            and ranges.sort is not None
            and ranges.windows is None
        )

    @property
    def by_keys(self) -> bool:
        """Whether a query that lists key values (a fetch unit's, see
        :meth:`~ddbloader._sql.query.UserQuery.filtered_many`) may read this partition among
        others: a whole subquery. Else it is read by a query of its own, or by one that reads its
        read run (see :attr:`GroupPlan.read_runs`)."""
        return not self.streamed

    @property
    def in_units(self) -> bool:
        """Whether a fetch unit's query may read this partition: by its key values (see
        :attr:`by_keys`) or with its read run (see :attr:`GroupPlan.read_runs`). Else only its
        own streaming query reads it."""
        return not self.streamed or self.tagged

    def in_order(self, table: pa.Table) -> pa.Table:
        """This partition's rows ``table`` in the query's order: a combed piece's query may leave
        its order to the reader (see :meth:`~ddbloader._sql.pieces.KeyRanges.in_order`); any
        other's result is in order already."""
        return table if self.ranges is None else self.ranges.in_order(table)

    @property
    def head(self) -> int:
        """The position of the first piece of this partition's subquery (its own if not streamed)."""
        return self.position - self.piece

    @property
    def key_params(self) -> tuple[Any, ...]:
        """The key values among :attr:`params` (a range piece's bounds follow them)."""
        if self.ranges is None:
            return self.params
        return self.params[: len(self.params) - len(self.ranges.bounds())]

    def describe(self) -> str:
        """Name the subquery for messages: its values, its SQL and its parameters."""
        rows = (
            f"rows {self.first_row}-{self.first_row + self.rows - 1} (piece {self.piece + 1} of "
            f"{self.pieces}) of "
            if self.streamed
            else ""
        )
        ranges = f"order key in {self.ranges.describe()}: " if self.ranges is not None else ""
        return (
            f"partition {self.position} of group {self.group} "
            f"({rows}{ranges}subquery {self.sql!r} with parameters {list(self.params)!r})"
        )


def pieces(rows: int, row_bytes: int, budget: int) -> list[tuple[int, int]]:
    """The pieces of a subquery of ``rows`` rows of ``row_bytes`` bytes as ``(first_row, rows)``.

    One piece when the rows fit in ``budget`` bytes (or ``budget <= 0``: nothing is streamed);
    else as few near-equal consecutive pieces as keep each within the budget, where a budget of
    fewer than :data:`MIN_PIECE_ROWS` rows counts as that many.
    """
    if budget <= 0 or rows * row_bytes <= budget:
        return [(0, rows)]
    per_piece = max(budget // max(row_bytes, 1), MIN_PIECE_ROWS)
    count = -(-rows // per_piece)
    sizes = [rows // count + (1 if i < rows % count else 0) for i in range(count)]
    firsts = list(itertools.accumulate(sizes[:-1], initial=0))
    return list(zip(firsts, sizes, strict=True))


def series_rows(partitions: Sequence[PartitionSpec]) -> int:
    """The rows of a group whose partitions are ``partitions`` (a combed windowed piece counts
    its stripes: its context rows are another piece's)."""
    return sum(p.rows if p.windows is None else p.windows.stripe_rows for p in partitions)


def _same_read(a: PartitionSpec, b: PartitionSpec) -> bool:
    """Whether tagged range pieces ``a`` and ``b`` cut one subquery (its key values) in one band."""
    assert a.ranges is not None and b.ranges is not None
    return a.ranges.band == b.ranges.band and a.key_params == b.key_params


@dataclass(frozen=True)
class GroupPlan:
    """One time series: its non-empty partitions in repartition order.

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

    @property
    def sample_stop(self) -> int:
        """One past this group's last sample."""
        return self.first_sample + self.samples

    @functools.cached_property  # read per group and epoch, thousands of times with small groups
    def rows(self) -> int:
        return series_rows(self.partitions)

    @functools.cached_property
    def row_maps(self) -> tuple[WindowRows | None, ...]:
        """Per partition (by position): where its rows lie in the series when they are not the
        rows after the previous partition's (a combed piece of windows, see
        :mod:`ddbloader._sql.window_pieces`: it serves the windows starting in its stripes, with
        every row they read, so it needs no neighbour's rows); None where they are."""
        return tuple(p.windows for p in self.partitions)

    @functools.cached_property
    def combed_windows(self) -> bool:
        """Whether the partitions are combed pieces of windows (see :attr:`row_maps`)."""
        return any(rows is not None for rows in self.row_maps)

    @functools.cached_property
    def read_runs(self) -> tuple[int | None, ...]:
        """Per partition (by position): the position of the first partition of its read run,
        the consecutive partitions one query may read together, :data:`PIECES_PER_QUERY` at a
        time (tagged range pieces of one subquery and band, see
        :mod:`ddbloader._sql.piece_tags`); None where no query reads it with its neighbours."""
        runs: list[int | None] = []
        previous: PartitionSpec | None = None
        for position, partition in enumerate(self.partitions):
            if not partition.tagged:
                runs.append(None)
            elif previous is not None and runs[-1] is not None and _same_read(previous, partition):
                runs.append(runs[-1])
            else:
                runs.append(position)
            previous = partition
        return tuple(runs)

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

    def piece_notes(self) -> list[str]:
        """How the subqueries larger than ``fetch_bytes`` are read, for messages: ``'2 streamed
        in 9 pieces'``, ``'40 range pieces of the order key'``; empty when none is."""
        every = [p for g in self.groups for p in g.partitions]
        streamed = [p for p in every if p.streamed and p.ranges is None]
        ranged = sum(p.ranges is not None and p.piece == 0 for p in every)
        heads = sum(p.piece == 0 for p in streamed)
        notes = [f"{heads:,} streamed in {len(streamed):,} pieces"] if streamed else []
        if ranged:
            notes.append(f"{ranged:,} range piece{'' if ranged == 1 else 's'} of the order key")
        return notes

    # The SQL of reads (see :mod:`ddbloader._sql.read`), kept per shape: every epoch cuts reads of
    # the same few shapes, and rendering one costs 5-20 ms.
    @functools.cached_property
    def rendered(self) -> dict[tuple[Any, ...], str | None]:
        return {}
