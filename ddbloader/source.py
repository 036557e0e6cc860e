"""DataSource: which columns become x and y, their dtypes, and one partition → row-major blocks.

The conversion is the only per-partition copy: each Arrow column is viewed as numpy without a
copy where Arrow allows it (one chunk, no nulls) and written once into a row-major block of the
common dtype, so every later window is a strided view of that block.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import LoaderConfig
from .errors import warn_caller

__all__ = ["Block", "ColumnLayout", "nullable_candidates", "resolve_columns", "to_block"]


@dataclass(frozen=True)
class ColumnLayout:
    """The columns of x and y, in output order, and the dtype of each tensor.

    ``as_float64`` holds the integer/boolean/decimal columns that must go through float64 (nulls
    become NaN, decimals lose their fixed point). ``result_names`` are the query's result columns
    as planning saw them; empty means "take the fetched names as they are".
    """

    x_names: tuple[str, ...]
    y_names: tuple[str, ...]
    x_dtype: np.dtype[Any]
    y_dtype: np.dtype[Any]
    as_float64: frozenset[str]
    result_names: tuple[str, ...] = ()

    @property
    def row_bytes(self) -> int:
        """Bytes of one x row plus one y row."""
        return len(self.x_names) * self.x_dtype.itemsize + len(self.y_names) * self.y_dtype.itemsize


@dataclass(frozen=True)
class Block:
    """One partition as row-major arrays: x ``[rows, Fx]`` and y ``[rows, Fy]``. Read-only."""

    x: np.ndarray[Any, Any]
    y: np.ndarray[Any, Any]

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])

    def rows_between(self, start: int, stop: int) -> Block:
        """Rows ``[start, stop)`` as a compact copy, so the full block can be freed."""
        return Block(self.x[start:stop].copy(), self.y[start:stop].copy())

    @staticmethod
    def concatenate(blocks: Sequence[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        return Block(np.concatenate([b.x for b in blocks]), np.concatenate([b.y for b in blocks]))


def _is_numeric(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_decimal(data_type)
    )


def nullable_candidates(schema: pa.Schema, names: Collection[str]) -> list[str]:
    """Columns among ``names`` whose dtype changes if they hold nulls (integers and booleans)."""
    # Fields by position: a name the query returns twice is reported by resolve_columns, not here.
    return [
        field.name
        for field in schema
        if field.name in names
        and schema.names.count(field.name) == 1
        and (pa.types.is_integer(field.type) or pa.types.is_boolean(field.type))
    ]


def _check_named(names: Sequence[str], parameter: str, schema: pa.Schema) -> None:
    available = schema.names
    for name in names:
        if name not in available:
            raise ValueError(
                f"{parameter} names {name!r}, which is not a column of the query; columns: {available}"
            )
        if available.count(name) > 1:
            raise ValueError(
                f"{parameter} names {name!r}, but the query returns several columns of that name"
            )
        if not _is_numeric(schema.field(name).type):
            raise TypeError(
                f"{parameter} names {name!r} of type {schema.field(name).type}, which is not numeric; "
                f"cast it in the query or leave it out"
            )


def resolve_columns(
    schema: pa.Schema, config: LoaderConfig, columns_with_nulls: Collection[str]
) -> ColumnLayout:
    """Pick x and y from the query's result schema.

    y is ``target_col``; x is ``input_col`` if given, else every column; then ``exclude_col`` is
    removed from x. A named non-numeric column is an error; unnamed non-numeric columns are left
    out of x with one warning that names them.

    Raises:
        ValueError: an unknown, duplicated or ambiguous column, or an empty x.
        TypeError: a named column that is not numeric.
    """
    _check_named(config.target_col, "target_col", schema)
    for name in config.exclude_col:
        if name not in schema.names:
            raise ValueError(
                f"exclude_col names {name!r}, which is not a column of the query; columns: {schema.names}"
            )
    if config.input_col is not None:
        _check_named(config.input_col, "input_col", schema)
        x_names = [n for n in config.input_col if n not in config.exclude_col]
    else:
        candidates = [n for n in schema.names if n not in config.exclude_col]
        skipped = [n for n in candidates if not _is_numeric(schema.field(n).type)]
        if skipped:
            warn_caller(
                f"leaving non-numeric columns {skipped} out of x; "
                f"name input_col or exclude_col to silence this"
            )
        x_names = [n for n in candidates if n not in skipped]
        _check_named(x_names, "the query", schema)
    if not x_names:
        raise ValueError("x has no columns: input_col/exclude_col leave nothing to feed the model")
    as_float64 = frozenset(
        n
        for n in {*x_names, *config.target_col}
        if n in columns_with_nulls or pa.types.is_decimal(schema.field(n).type)
    )

    def column_dtype(name: str) -> np.dtype[Any]:
        if name in as_float64:
            return np.dtype(np.float64)
        return np.dtype(schema.field(name).type.to_pandas_dtype())  # type: ignore[no-any-return]

    x_dtype = config.x_dtype or np.result_type(*(column_dtype(n) for n in x_names))
    y_dtype = config.y_dtype or np.result_type(*(column_dtype(n) for n in config.target_col))
    return ColumnLayout(
        tuple(x_names),
        config.target_col,
        np.dtype(x_dtype),
        np.dtype(y_dtype),
        as_float64,
        tuple(schema.names),
    )


def _fill(out: np.ndarray[Any, Any], table: pa.Table, names: Sequence[str], layout: ColumnLayout) -> None:
    for j, name in enumerate(names):
        column = table.column(name)
        if name in layout.as_float64:
            column = pc.cast(column, pa.float64())
        out[:, j] = column.to_numpy()


def to_block(table: pa.Table, layout: ColumnLayout) -> Block:
    """Convert one fetched partition into row-major x and y blocks (one write per value).

    Columns are matched to ``layout.result_names`` by position: an engine may name the columns
    of a query differently once it is wrapped in a subquery (DuckDB renames a repeated ``a`` to
    ``a_1``), and planning saw the wrapped names.

    Raises:
        ValueError: the partition has another number of columns than planning saw.
    """
    if layout.result_names and tuple(table.column_names) != layout.result_names:
        if table.num_columns != len(layout.result_names):
            raise ValueError(
                f"a partition has columns {table.column_names}, but planning saw {list(layout.result_names)}"
            )
        table = table.rename_columns(list(layout.result_names))
    rows = table.num_rows
    x = np.empty((rows, len(layout.x_names)), dtype=layout.x_dtype)
    y = np.empty((rows, len(layout.y_names)), dtype=layout.y_dtype)
    _fill(x, table, layout.x_names, layout)
    _fill(y, table, layout.y_names, layout)
    return Block(x, y)
