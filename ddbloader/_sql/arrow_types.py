"""Arrow column types: what a numeric column holds per row, and its values as numpy.

A column of x or y is numeric and holds either one value per row (one feature) or one
fixed-shape tensor per row: an Arrow ``fixed_size_list`` or ``fixed_shape_tensor`` column.
:func:`arrow_values` views a column as numpy without a copy where Arrow allows it (one chunk, no
nulls); a null becomes NaN or is refused, never a silent zero.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ColumnType", "Shape", "arrow_column_type", "arrow_values", "renamed"]


Shape = tuple[int, ...]


@dataclass(frozen=True)
class ColumnType:
    """What a column holds per row: ``dtype`` is None for a non-numeric column."""

    dtype: np.dtype[Any] | None
    shape: Shape
    text: str
    decimal: bool = False
    variable_list: bool = False


def arrow_column_type(data_type: pa.DataType) -> ColumnType:
    """Describe an Arrow type: a numeric scalar, a (nested) fixed-size list or a fixed-shape tensor.

    Cached per type, since every fetched partition asks again for each of its columns; a Python
    extension type without ``__hash__`` is described afresh each time.
    """
    try:
        hash(data_type)
    except TypeError:
        return _column_type(data_type)
    return _cached_column_type(data_type)


@functools.lru_cache(maxsize=256)
def _cached_column_type(data_type: pa.DataType) -> ColumnType:
    return _column_type(data_type)


def _column_type(data_type: pa.DataType) -> ColumnType:
    text = str(data_type)
    if pa.types.is_decimal(data_type):
        return ColumnType(np.dtype(np.float64), (), text, decimal=True)
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_boolean(data_type):
        return ColumnType(_fixed_width_dtype(data_type), (), text)
    if isinstance(data_type, pa.FixedShapeTensorType):
        inner = arrow_column_type(data_type.value_type)
        return ColumnType(inner.dtype, tuple(data_type.shape), text)
    if pa.types.is_fixed_size_list(data_type):
        inner = arrow_column_type(data_type.value_type)
        if inner.dtype is None:
            return ColumnType(None, (), text)
        return ColumnType(inner.dtype, (data_type.list_size, *inner.shape), text)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return ColumnType(None, (), text, variable_list=True)
    return ColumnType(None, (), text)


def _null_error(name: str, text: str) -> ValueError:
    return ValueError(
        f"column {name!r} ({text}) holds NULL values where planning saw none, and its dtype has no NaN; "
        f"fill them, or cast the column to DOUBLE, in the query or the transform"
    )


def arrow_values(column: pa.ChunkedArray, name: str, nulls: Literal["nan", "error"]) -> np.ndarray[Any, Any]:
    """A numeric Arrow column as numpy ``[rows, *shape]`` (zero-copy where Arrow allows).

    ``nulls="nan"``: integer/boolean/decimal columns with nulls become float64 with NaN.
    ``nulls="error"``: a null in a column whose dtype has no NaN raises (a float null is NaN).

    Raises:
        ValueError: a null that ``nulls="error"`` refuses, or a null tensor/list row.
        TypeError: the column is not numeric.
    """
    kind = arrow_column_type(column.type)
    if kind.dtype is None:
        raise TypeError(f"column {name!r} of type {column.type} is not numeric")
    data_type = column.type
    if not kind.shape:
        has_nan = pa.types.is_floating(data_type)
        if kind.decimal or (column.null_count and not has_nan):
            if nulls == "error" and column.null_count and not kind.decimal:
                raise _null_error(name, kind.text)
            column = pc.cast(column, pa.float64())
        return _numpy(column.chunks, column.type)
    if column.null_count:
        raise ValueError(f"column {name!r} ({kind.text}) has NULL rows; every row needs a value")
    rows = len(column)
    if isinstance(data_type, pa.FixedShapeTensorType):
        parts = [chunk.to_numpy_ndarray() for chunk in column.chunks if len(chunk)]
        if not parts:
            return np.empty((0, *kind.shape), dtype=kind.dtype)
        return np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])
    flat = column.combine_chunks() if column.num_chunks else pa.array([], data_type)
    while pa.types.is_fixed_size_list(flat.type):
        flat = flat.flatten()
    if flat.null_count and not pa.types.is_floating(flat.type):
        if nulls == "error":
            raise _null_error(name, kind.text)
        flat = pc.cast(flat, pa.float64())
    return _numpy([flat], flat.type).reshape(rows, *kind.shape)


def _fixed_width_dtype(data_type: pa.DataType) -> np.dtype[Any]:
    """numpy's dtype for an Arrow integer, float or boolean type, named from its width rather than
    by ``to_pandas_dtype``, which imports pandas (a second or more, once per process) before pyarrow 26."""
    if pa.types.is_boolean(data_type):
        return np.dtype(np.bool_)
    kind = "f" if pa.types.is_floating(data_type) else "i" if pa.types.is_signed_integer(data_type) else "u"
    return np.dtype(f"{kind}{data_type.bit_width // 8}")


def _numpy(chunks: Sequence[pa.Array], data_type: pa.DataType) -> np.ndarray[Any, Any]:
    """Arrow chunks of one type as one numpy array: views of the values buffers (one chunk: no
    copy) where no value is null and the type is a fixed-width integer or float, else what
    pyarrow converts.

    The buffer view comes first because pyarrow's ``to_numpy`` imports pandas on its first call:
    a second or more, once per process, in a fetch thread while the first batch waits for it.
    """
    chunks = [chunk for chunk in chunks if len(chunk)]
    if (
        chunks
        and all(chunk.null_count == 0 for chunk in chunks)
        and (pa.types.is_integer(data_type) or pa.types.is_floating(data_type))
    ):
        dtype = _fixed_width_dtype(data_type)
        parts = [
            np.frombuffer(chunk.buffers()[1], dtype, len(chunk), chunk.offset * dtype.itemsize)
            for chunk in chunks
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    return np.asarray(pa.chunked_array(chunks, data_type).to_numpy())


def renamed(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """``table`` with its columns named ``names`` (planning's names; empty: as it is), by position."""
    if not names or tuple(table.column_names) == names:
        return table
    if table.num_columns != len(names):
        raise ValueError(f"a partition has columns {table.column_names}, but planning saw {list(names)}")
    return table.rename_columns(list(names))
