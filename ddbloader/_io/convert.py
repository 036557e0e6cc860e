"""Converting one fetched partition into a :class:`~ddbloader._io.block.Block`, after checking its schema.

The conversion is the only per-partition copy: each Arrow column is viewed as numpy without a
copy where Arrow allows it (no nulls) and written once into a row-major block of the common
dtype, so every later window is a strided view of that block. The block is written a cache-sized
tile of rows at a time, every column's slice into the tile, rather than column by column: a
column written alone strides through the whole block, so a block larger than the cache was read
and written from memory once per column. A partition transform
(``transform=``, see :mod:`ddbloader.transforms`) runs in :func:`to_block`, so in the fetch
thread, between the fetch and the conversion; its output must have the columns and per-row
shapes planning saw (:mod:`ddbloader._sql.columns`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .._core.errors import add_note
from .._sql.arrow_types import arrow_column_type, arrow_values, renamed
from .._sql.layout import ColumnLayout
from .block import Block
from .key_arrays import key_arrays

__all__ = ["check_result_schema", "to_block"]


_RESULT_CHANGED = "the query's result changed after the loader was built; build the loader again"


def check_result_schema(schema: pa.Schema, layout: ColumnLayout, where: Callable[[], str]) -> None:
    """Refuse a fetched table whose columns are not the ones planning saw: matched by name.

    Called once per fetched table, before :func:`to_block` takes its columns by position. Each
    column must have the name planning saw at its position (so a reordered, renamed, missing or
    added column is refused), except a name the table repeats: an engine may rename a repeated
    name when the query is wrapped (DuckDB ``a, a`` → ``a, a_1``), so those are matched by
    position. The columns x and y are read from (every column when a transform reads the table)
    must keep their type, up to a safe numeric cast into the planned dtype, or a type of no value
    (a DB-API partition that holds only NULLs there).

    Raises:
        ValueError: naming the column, what planning saw, what the subquery ``where()`` names
            (called only then: naming a fetch unit's thousand partitions costs a millisecond)
            returned.
    """
    planned = layout.result_names
    if not planned or (tuple(schema.names) == planned and tuple(schema.types) == layout.result_types):
        return
    subquery = where()
    names = schema.names
    rebuild = f"planning saw {list(planned)}; {_RESULT_CHANGED}"
    repeated = {n for n in names if names.count(n) > 1}
    missing = [n for n in planned if n not in names]
    added = [n for n in names if n not in planned and n not in repeated]
    if missing and not (repeated and len(names) == len(planned)):
        raise ValueError(f"{subquery} returned no column {missing[0]!r} (columns {names}); {rebuild}")
    if added or len(names) != len(planned):
        extra = added[0] if added else sorted(repeated)[0]
        raise ValueError(f"{subquery} returned column {extra!r}, new since planning ({names}); {rebuild}")
    for position, (name, expected) in enumerate(zip(names, planned, strict=True)):
        if name != expected and name not in repeated:
            raise ValueError(
                f"{subquery} returned column {name!r} at position {position}, where planning saw "
                f"{expected!r} (columns {names}); {rebuild}"
            )
    read = set(planned) if layout.transform is not None else {*layout.x_names, *layout.y_names}
    for name, planned_type, fetched in zip(planned, layout.result_types, schema.types, strict=False):
        if name in read and not _keeps_type(planned_type, fetched, name in layout.as_float64):
            mixed = (
                f"the column holds values of several types (an engine that types each value, as "
                f"SQLite does, gives a partition the type of its own values): cast it in the query, "
                f"e.g. CAST({name} AS REAL); or "
                if _both_numeric(planned_type, fetched)
                else ""
            )
            raise ValueError(
                f"{subquery} returned column {name!r} as {fetched}, where planning saw {planned_type}; "
                f"{mixed}{_RESULT_CHANGED}"
            )


def _both_numeric(planned: pa.DataType, fetched: pa.DataType) -> bool:
    return all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in (planned, fetched))


def _keeps_type(planned: pa.DataType, fetched: pa.DataType, as_float64: bool) -> bool:
    if planned == fetched or pa.types.is_null(planned) or pa.types.is_null(fetched):
        return True
    before, after = arrow_column_type(planned), arrow_column_type(fetched)
    if before.dtype is None or after.dtype is None or before.shape != after.shape:
        return False
    target = np.dtype(np.float64) if as_float64 else before.dtype
    return bool(np.can_cast(after.dtype, target, "safe"))


def _values(frame: Mapping[str, Any], name: str, layout: ColumnLayout) -> np.ndarray[Any, Any]:
    """Column ``name`` of a partition (or of its transform's output) as numpy ``[rows, *shape]``."""
    transform = layout.transform
    origin = "the partition" if transform is None else f"transform {transform.name}"
    if name not in frame:
        raise ValueError(f"{origin} gave no column {name!r}, which planning saw; columns: {list(frame)}")
    value = frame[name]
    if isinstance(value, pa.ChunkedArray):
        if name in layout.as_float64:
            value = pc.cast(value, pa.float64())
        values = arrow_values(value, name, "error")
    elif isinstance(value, torch.Tensor):
        values = value.numpy(force=True)
    elif isinstance(value, np.ndarray):
        values = value
    else:
        raise TypeError(f"{origin} gave column {name!r} as {type(value).__name__}; x and y need tensors")
    shape = layout.column_shape(name)
    if values.shape[1:] != shape:
        raise ValueError(
            f"{origin} gave column {name!r} with per-row shape {list(values.shape[1:])}, but planning saw "
            f"{list(shape)}: every partition must give the same shape (planning probed the transform on "
            f"the query's empty result or on a few rows of one partition)"
        )
    return values


#: rows of a table converted at a time: its columns are numpy views of Arrow's buffers where Arrow
#: allows, else copies of these rows alone (a few MB at most beside the block, never a column)
_SPAN_BYTES = 1 << 24
#: bytes of the block written at a time: a tile stays in the core's cache while every column
#: writes its slice of it, so the block is written in one pass over memory instead of one per
#: column (2M rows x 31 float32: 0.78 s -> 0.12 s; 8 MB and less: the same)
_TILE_BYTES = 1 << 19


def _spans(
    frame: pa.Table | Mapping[str, Any], rows: int, row_bytes: int
) -> Iterator[tuple[int, int, Mapping[str, Any]]]:
    """``frame`` as ``(first row, stop row, its columns by name)``: a table in slices of
    ``_SPAN_BYTES`` of the block (one, empty, for no rows), a transform's output whole."""
    if not isinstance(frame, pa.Table):
        yield 0, rows, frame
        return
    span = max(1, _SPAN_BYTES // max(1, row_bytes))
    for start in range(0, max(rows, 1), span):
        part = frame.slice(start, span)
        # by name once per span, for x and y: a Table's own name lookups scan every column (O(F²))
        yield start, start + part.num_rows, dict(zip(part.column_names, part.columns, strict=True))


def _fill(
    out: np.ndarray[Any, Any], columns: Mapping[str, Any], names: Sequence[str], layout: ColumnLayout
) -> None:
    rows = out.shape[0]
    at = 0
    sources = []
    for name in names:
        values = _values(columns, name, layout)
        width = math.prod(values.shape[1:])
        sources.append((at, at + width, values.reshape(rows, width)))
        at += width
    tile = max(1, _TILE_BYTES // max(1, out.strides[0]))
    for start in range(0, rows, tile):
        rows_out = out[start : start + tile]
        for first, stop, values in sources:
            rows_out[:, first:stop] = values[start : start + tile]


def to_block(table: pa.Table, layout: ColumnLayout) -> Block:
    """Convert one fetched partition into row-major x and y blocks (one write per value).

    Columns are matched to ``layout.result_names`` by position, once :func:`check_result_schema`
    has matched them by name: an engine may name the columns of a query differently once it is
    wrapped in a subquery (DuckDB renames a repeated ``a`` to ``a_1``), and planning saw the
    wrapped names. The layout's transform, if any, runs first.

    Raises:
        ValueError: the partition has another number of columns than planning saw; the
            transform's output lacks a planned column, changes a per-row shape, or holds NULLs
            in a column whose dtype has no NaN.
        Exception: what the transform raised, with a note naming it.
    """
    table = renamed(table, layout.result_names)
    rows = table.num_rows
    keys = key_arrays(table, layout.key_names, layout.key_objects) if layout.key_names else None
    frame = table if layout.transform is None else layout.transform(table)
    x = np.empty((rows, layout.x_features), dtype=layout.x_dtype)
    y = np.empty((rows, layout.y_features), dtype=layout.y_dtype)
    try:
        for start, stop, columns in _spans(frame, rows, x.strides[0] + y.strides[0]):
            _fill(x[start:stop], columns, layout.x_names, layout)
            _fill(y[start:stop], columns, layout.y_names, layout)
    except Exception as error:
        if layout.transform is not None:
            add_note(error, f"ddbloader was converting the output of transform {layout.transform.name}")
        raise
    return Block(x, y, keys=keys)
