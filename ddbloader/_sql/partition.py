"""A partition and the query that reads it.

A :class:`PartitionSpec` is one partition of the plan: which group and position it is, its key
values and its planned row count (with ``verify=True``, what its rows hash to). A :class:`Read`
is one query the loader sends for rows and how its result is split among the partitions it
yields. Both are made by the planner (:mod:`ddbloader._sql.planner`, the reads by
:mod:`ddbloader._sql.read`) before iteration; immutable afterwards and safe to share between
threads.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .fingerprint import Fingerprint
from .pieces import KeyRanges
from .window_rows import WindowRows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PartitionSpec", "Read", "Split"]


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
    values, or the index of its cell (a read run's query, see
    :func:`~ddbloader._sql.read.run_read`). The client puts each cell's rows in the query's order
    (see :meth:`in_order`).

    With ``verify=True`` (:attr:`hashed`) the rows' own columns are followed by their hash (before
    the key columns), and each cell's hash sum is checked against its planned
    :attr:`~ddbloader._sql.partition.PartitionSpec.fingerprint`.

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

    def in_order(self, cell: PartitionSpec, table: pa.Table) -> pa.Table:
        """The rows ``table`` of ``cell`` (one of :attr:`cells`) in the query's order: a combed
        range piece's query may leave its order to the client (see
        :meth:`~ddbloader._sql.pieces.KeyRanges.in_order`); any other's result is in order."""
        return table if cell.ranges is None else cell.ranges.in_order(table)

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
