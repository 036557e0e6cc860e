"""A fetch unit's result split by key into its partitions' blocks, vectorised.

Rows of one key keep the query's order. The split is checked against the planned cells: a result
that does not split into exactly the planned partitions (a value that does not convert to the
key column's type, or a count other than planned) gives None, never a guess, and the caller then
fetches the partitions one by one. With ``verify=True`` each cell's rows are hashed as split
(:func:`unit_contents`) and checked against its planned content (:func:`check_unit_contents`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._sql.arrow_types import arrow_values
from .._sql.fingerprint import content_mismatch, strip_hash
from .._sql.layout import ColumnLayout
from .._sql.partition import PartitionSpec, Read
from .block import Block
from .convert import to_block

__all__ = [
    "UnitPartitions",
    "check_unit_contents",
    "split_by_key",
    "take_rows",
    "unit_blocks",
    "unit_contents",
]


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


def _cell_of_tags(tags: pa.ChunkedArray, cells: int) -> np.ndarray[Any, Any] | None:
    """Per row, its tag (see :mod:`ddbloader._sql.piece_tags`) where it names one of ``cells``,
    else -1 (NULL, or out of range: counted as a row of no cell, so the split refuses it); None
    when the engine returned tags that are not numbers."""
    try:
        values = arrow_values(tags.fill_null(-1), "piece tags", "error")
    except (TypeError, ValueError):
        return None
    codes = np.array(values, dtype=np.int64)  # a copy: Arrow's own buffer is read-only
    codes[(codes < 0) | (codes >= cells) | (codes != values)] = -1
    return codes


def _cell_of_rows(
    table: pa.Table, cells: Sequence[PartitionSpec], cell_index: bool
) -> np.ndarray[Any, Any] | None:
    """Per row of ``table``, the index of the cell whose key values its key columns hold (its
    last column when ``cell_index``), or -1 (a row outside the scheme: no subquery returns it);
    None if a value cannot be compared."""
    if cell_index:
        return _cell_of_tags(table.column(table.num_columns - 1), len(cells))
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


def split_by_key(
    table: pa.Table, cells: Sequence[PartitionSpec], *, cell_index: bool = False
) -> list[pa.Table] | None:
    """Cut a unit's result into its cells' rows, each in the result's order.

    ``table`` ends with one column per key (as ``filtered_many`` selects them), or with the tag
    column when ``cell_index``; cell ``i``'s rows are those whose key values equal
    ``cells[i].params`` (whose tag is ``i``), compared as Arrow values of the key column's type;
    rows that match no cell (outside the scheme) are dropped, as no subquery returns them. The
    key columns are dropped.

    Returns None when the result does not split into exactly the planned rows: a key value that
    does not convert to the column's type, or a cell whose row count differs from planning (the
    client compared a value differently from the engine, or the data changed). The caller then
    fetches the cells one by one, with subqueries the engine compares itself.
    """
    grouped = _grouped_by_cell(table, cells, cell_index)
    if grouped is None:
        return None
    data, bounds = grouped
    return [data.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(cells))]


def _grouped_by_cell(
    table: pa.Table, cells: Sequence[PartitionSpec], cell_index: bool
) -> tuple[pa.Table, list[int]] | None:
    """The rows of ``table`` without its key columns, grouped by cell in cell order (each cell's
    in the result's order, rows outside the scheme first), and where each cell's rows begin:
    cell ``i`` is rows ``[bounds[i], bounds[i + 1])``. None as in :func:`split_by_key`."""
    cell_of_row = _cell_of_rows(table, cells, cell_index)
    if cell_of_row is None:
        return None
    counts = np.bincount(cell_of_row + 1, minlength=len(cells) + 1)
    if counts[1:].tolist() != [c.rows for c in cells]:
        return None
    data = table.select(range(table.num_columns - (1 if cell_index else len(cells[0].params))))
    if len(cell_of_row) and (np.diff(cell_of_row) < 0).any():
        # a stable sort of 16-bit keys is a radix sort: O(rows), 7x faster than of 64-bit ones
        narrow = cell_of_row.astype(np.int16) if len(cells) < np.iinfo(np.int16).max else cell_of_row
        order = np.argsort(narrow, kind="stable").astype(np.int64, copy=False)
        data = take_rows(data, order)
    return data, np.cumsum(counts).tolist()


def _in_order(data: pa.Table, bounds: Sequence[int], read: Read) -> pa.Table:
    """``data`` with each of ``read``'s cells' rows (``[bounds[i], bounds[i + 1])``) put in the
    query's order by :meth:`~ddbloader._sql.partition.Read.in_order`, as for a piece read alone;
    ``data`` itself when every cell's rows came in order (one pass over the key each)."""
    cells = read.cells
    parts = [data.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(cells))]
    ordered = [read.in_order(c, part) for c, part in zip(cells, parts, strict=True)]
    if all(a is b for a, b in zip(ordered, parts, strict=True)):
        return data
    return pa.concat_tables([data.slice(0, bounds[0]), *ordered])


def take_rows(data: pa.Table, rows: np.ndarray[Any, Any]) -> pa.Table:
    """Rows ``rows`` (int64) of ``data``, in that order: one gather of every column."""
    # from the buffer, as pa.array(rows) would import pandas (see _codes)
    return data.take(pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)]))


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


def unit_blocks(table: pa.Table, unit: Read, layout: ColumnLayout) -> UnitPartitions | None:
    """The wanted partitions of a unit's result, or None if it does not split exactly.

    Without a transform the rows are converted once and each partition's block is a view of
    that conversion (of the grouped result itself when every partition is wanted, without
    cutting it into partitions and joining them again); a transform runs on each partition's
    rows, as for a partition fetched alone.
    """
    grouped = _grouped_by_cell(table, unit.cells, unit.split == "cells")
    if grouped is None:
        return None
    data, bounds = grouped
    if unit.split == "cells":
        data = _in_order(data, bounds, unit)
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


def unit_contents(table: pa.Table, read: Read) -> tuple[pa.Table, list[int] | None]:
    """A hashed read's result without its hash column (before its key columns), and each cell's
    hash sum; None when the result does not split into the planned cells (then neither does the
    data, and the read falls back to its partitions' whole reads)."""
    at = table.num_columns - read.key_columns - 1
    hashed = split_by_key(
        table.select([at, *range(at + 1, table.num_columns)]), read.cells, cell_index=read.split == "cells"
    )
    sums = None if hashed is None else [strip_hash(part, 0)[1] for part in hashed]
    return table.remove_column(at), sums


def check_unit_contents(read: Read, sums: list[int]) -> None:
    """Refuse a read whose cells hash otherwise than planned (it falls back to reading them one
    by one: a cell split wrongly by the client is then told from changed data)."""
    for spec, content in zip(read.cells, sums, strict=True):
        assert spec.fingerprint is not None
        if content != spec.fingerprint.content:
            raise content_mismatch(
                f"{spec.describe()} in {read.describe()}",
                spec.params,
                spec.rows,
                spec.fingerprint.content,
                content,
            )
