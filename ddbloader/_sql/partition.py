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

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PartitionSpec", "Read", "Split", "whole_read"]


@dataclass(frozen=True)
class PartitionSpec:
    """One partition of the plan: the rows of one group in one repartition (or a part of them),
    in the query's order.

    ``sql`` and ``params`` are its subquery (``params`` its key values); ``rows`` its planned row
    count. Which of its subquery's rows it holds and how they leave the engine are its
    :class:`Read`'s (:attr:`~ddbloader._sql.plan.GroupPlan.reads`): a subquery larger than
    ``fetch_bytes`` is several partitions read by one streaming query, or range pieces of its
    order key (see :mod:`ddbloader._sql.pieces`).

    ``fingerprint`` (``verify=True``): what the partition's rows hash to (see
    :mod:`ddbloader._sql.fingerprint`), and the SQL that hashes them.
    """

    group: int
    position: int
    group_value: Any
    repartition_value: Any
    sql: str
    params: tuple[Any, ...]
    rows: int
    fingerprint: Fingerprint | None = None

    # made once per plan: at thousands of groups, a tuple per partition and epoch cost ~5 ms an epoch
    @functools.cached_property
    def key(self) -> tuple[int, int]:
        """``(group, position)``: this partition's identity within its plan."""
        return self.group, self.position

    def describe(self, read: Read | None = None) -> str:
        """Name the partition for messages: its values, its SQL and its parameters; with ``read``
        (the streaming read that yields it), the rows of it this partition holds and its key
        ranges, and that read's SQL."""
        sql, params, rows, ranges = self.sql, self.params, "", ""
        if read is not None:
            sql, params = read.sql, read.params
            if read.split == "rows":
                first, pieces = read.first_rows[self.position], len(read.cells)
                piece = self.position - read.cells[0].position
                rows = f"rows {first}-{first + self.rows - 1} (piece {piece + 1} of {pieces}) of "
            if (cut := read.ranges_of(self)) is not None:
                ranges = f"order key in {cut.describe()}: "
        return (
            f"partition {self.position} of group {self.group} "
            f"({rows}{ranges}subquery {sql!r} with parameters {list(params)!r})"
        )


#: How a read's result is split among its cells: ``"whole"``, all of it is its one cell's rows;
#: ``"rows"``, its rows in order are its cells' one after another, cut by their planned counts
#: (read as a stream, each cell as it is asked for); ``"keys"``, by its last columns, each row's
#: key values; ``"cells"``, by its last column, each row's cell index.
Split = Literal["whole", "rows", "keys", "cells"]


@dataclass(frozen=True)
class Read:
    """Partitions fetched by one query.

    Invariants beyond those below: :attr:`ranges` and :attr:`alone` are empty or have one entry
    per cell.

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
    #: Per cell (empty where none is): a range piece's key ranges (see
    #: :mod:`ddbloader._sql.pieces`), which ``sql`` reads, their bounds among ``params`` after the
    #: key values.
    ranges: tuple[KeyRanges, ...] = ()
    #: Per cell (empty where none is): the read that yields it alone where that is not its own
    #: subquery (a read run's cells: their range pieces' reads), None where it is.
    alone: tuple[Read | None, ...] = ()

    @property
    def key_columns(self) -> int:
        """The columns after the rows' own (and the row hash) that tell a row's cell."""
        return {"whole": 0, "rows": 0, "keys": len(self.cells[0].params), "cells": 1}[self.split]

    @functools.cached_property
    def _index(self) -> dict[int, int]:
        return {c.position: index for index, c in enumerate(self.cells)}

    def ranges_of(self, cell: PartitionSpec) -> KeyRanges | None:
        """The key ranges of ``cell`` (one of :attr:`cells`) when it is a range piece, else None."""
        index = self._index[cell.position]
        if self.ranges:
            return self.ranges[index]
        own = self.alone[index] if self.alone else None
        return None if own is None else own.ranges_of(cell)

    def read_alone(self, cell: PartitionSpec) -> Read:
        """The read of ``cell`` (one of :attr:`cells`) by itself: its own range piece's read, or
        its own subquery (:func:`whole_read`)."""
        own = self.alone[self._index[cell.position]] if self.alone else None
        return whole_read(cell) if own is None else own

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
        ranges = self.ranges_of(cell)
        return table if ranges is None else ranges.in_order(table)

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
