"""DataSource: which columns become x and y, their dtypes and shapes, and one partition → row-major blocks.

The conversion is the only per-partition copy: each Arrow column is viewed as numpy without a
copy where Arrow allows it (one chunk, no nulls) and written once into a row-major block of the
common dtype, so every later window is a strided view of that block.

A column of x or y is numeric and holds either one value per row (one feature) or one
fixed-shape tensor per row: an Arrow ``fixed_size_list`` or ``fixed_shape_tensor`` column, or a
``[rows, *shape]`` tensor that a transform returns. Several columns concatenate their flattened
features; a column with two or more dimensions per row (an image ``[C, H, W]``) must be the only
column of its tensor, and the sample keeps its shape. Blocks stay 2-D ``[rows, features]`` either
way (windows and edge stitching never look inside a row); :func:`~ddbloader._pipeline.batch.gather` gives
the batch its per-row shape.

A partition transform (``transform=``, see :mod:`ddbloader.transforms`) runs in
:func:`to_block`, so in the fetch thread, between the fetch and the conversion. The layout
describes the transform's output, which planning learns by probing the transform: on the query's
empty result first, and — when the transform cannot run on zero rows (an image decoder cannot
tell an image's size from no image) — on the first rows of the smallest partition.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .._core.config import PartitionTransform
from .._core.errors import add_note, warn_caller
from .keys import KeyArrays, key_arrays

__all__ = [
    "PROBE_ROWS",
    "Block",
    "ColumnLayout",
    "ColumnType",
    "arrow_column_type",
    "arrow_values",
    "check_result_schema",
    "nullable_candidates",
    "resolve_columns",
    "resolve_layout",
    "resolve_layout_on_rows",
    "to_block",
]


class ColumnChoice(Protocol):
    """The arguments that choose x and y (:class:`ddbloader._core.config.LoaderConfig` has them).

    A protocol, so that this module needs nothing from :mod:`ddbloader._core.config`, which sits above it.
    """

    @property
    def target_col(self) -> tuple[str, ...]: ...
    @property
    def input_col(self) -> tuple[str, ...] | None: ...
    @property
    def exclude_col(self) -> tuple[str, ...]: ...
    @property
    def key_col(self) -> tuple[str, ...]: ...
    @property
    def windowed(self) -> bool: ...
    @property
    def x_dtype(self) -> np.dtype[Any] | None: ...
    @property
    def y_dtype(self) -> np.dtype[Any] | None: ...
    @property
    def transform(self) -> PartitionTransform | None: ...


#: Rows of a partition a transform is probed on at planning time when it cannot run on zero rows.
PROBE_ROWS = 64

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ColumnLayout:
    """The columns of x and y, in output order, and the dtype and per-sample shape of each tensor.

    ``as_float64`` holds the integer/boolean/decimal columns that must go through float64 (nulls
    become NaN, decimals lose their fixed point). ``result_names`` and ``result_types`` are the
    query's result columns as planning saw them; empty means "take the fetched names as they are".
    ``shapes`` lists the
    columns that hold a tensor per row, with that tensor's shape; every other column holds one
    value per row. ``transform`` runs on every fetched partition before the conversion.

    ``x_stacked`` / ``y_stacked``: the tensor's columns are arrays of one length L from the query
    (DolphinDB's ArrayVector shape), so one row is ``[C, L]``; the block still holds them side by
    side, column after column, which is that shape in row-major order.

    Invariant: a column with two or more dimensions per row is the only column of x (or y); a
    stacked tensor's columns all hold arrays of one length.
    """

    x_names: tuple[str, ...]
    y_names: tuple[str, ...]
    x_dtype: np.dtype[Any]
    y_dtype: np.dtype[Any]
    as_float64: frozenset[str]
    result_names: tuple[str, ...] = ()
    shapes: tuple[tuple[str, Shape], ...] = ()
    transform: PartitionTransform | None = None
    result_types: tuple[pa.DataType, ...] = ()
    x_stacked: bool = False
    y_stacked: bool = False
    key_names: tuple[str, ...] = ()
    key_objects: frozenset[str] = frozenset()

    def column_shape(self, name: str) -> Shape:
        """Shape of ``name``'s value in one row: ``()`` for a scalar column."""
        return dict(self.shapes).get(name, ())

    @functools.cached_property
    def x_shape(self) -> Shape:
        """Shape of one row of x: ``(Fx,)``, ``(C, L)`` for C stacked array columns of length L,
        or the shape of x's one tensor column."""
        return _sample_shape(self.x_names, self.column_shape, self.x_stacked)

    @functools.cached_property
    def y_shape(self) -> Shape:
        """Shape of one row of y, as :attr:`x_shape`."""
        return _sample_shape(self.y_names, self.column_shape, self.y_stacked)

    @property
    def x_features(self) -> int:
        """Values in one row of x (the width of the x block)."""
        return math.prod(self.x_shape)

    @property
    def y_features(self) -> int:
        """Values in one row of y (the width of the y block)."""
        return math.prod(self.y_shape)

    @property
    def row_bytes(self) -> int:
        """Bytes of one x row plus one y row."""
        return self.x_features * self.x_dtype.itemsize + self.y_features * self.y_dtype.itemsize


def _sample_shape(names: Sequence[str], shape_of: Any, stacked: bool) -> Shape:
    shapes = [shape_of(n) for n in names]
    if stacked:
        return (len(names), shapes[0][0])
    if len(names) == 1 and len(shapes[0]) >= 2:
        return tuple(shapes[0])
    return (sum(math.prod(s) for s in shapes),)


# Not frozen: a frozen dataclass's __init__ costs 0.6 µs more, and a block is made per partition
# and per view (thousands an epoch with small groups); read-only by contract instead.
@dataclass(slots=True, eq=False)
class Block:
    """One partition as row-major arrays: x ``[rows, Fx]`` and y ``[rows, Fy]``. Read-only.

    A :meth:`view` remembers the block it was cut from (``origin``, never itself a view) and
    where (``offset``): its rows are ``origin``'s rows ``[offset, offset + rows)``, so that rows of
    several views of one fetch unit's conversion can be gathered in one take.
    """

    x: np.ndarray[Any, Any]
    y: np.ndarray[Any, Any]
    keys: KeyArrays | None = None
    origin: Block | None = field(default=None, repr=False, compare=False)
    offset: int = 0

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])

    def view(self, start: int, stop: int) -> Block:
        """Rows ``[start, stop)``, sharing this block's memory."""
        keys = None if self.keys is None else {n: v[start:stop] for n, v in self.keys.items()}
        origin = self if self.origin is None else self.origin
        return Block(self.x[start:stop], self.y[start:stop], keys, origin, self.offset + start)

    def rows_between(self, start: int, stop: int) -> Block:
        """Rows ``[start, stop)`` as a compact copy, so the full block can be freed."""
        keys = None if self.keys is None else {n: v[start:stop].copy() for n, v in self.keys.items()}
        return Block(self.x[start:stop].copy(), self.y[start:stop].copy(), keys)

    def empty_like(self, rows: int) -> Block:
        """``rows`` uninitialised rows shaped like this block's (address space until written)."""
        return self._allocated(rows, np.empty)

    def same_layout(self, other: Block) -> bool:
        """Whether ``other``'s rows can be written into this block's (same dtypes and key columns)."""
        if self.x.dtype != other.x.dtype or self.y.dtype != other.y.dtype:
            return False
        if self.keys is None or other.keys is None:
            return self.keys is None and other.keys is None
        return self.keys.keys() == other.keys.keys() and all(
            self.keys[n].dtype == other.keys[n].dtype for n in self.keys
        )

    def write(self, at: int, rows: Block) -> None:
        """Copy ``rows`` into rows ``[at, at + rows.rows)`` (of an arena's block; see :meth:`same_layout`)."""
        stop = at + rows.rows
        self.x[at:stop] = rows.x
        self.y[at:stop] = rows.y
        if self.keys is not None and rows.keys is not None:
            for name, values in rows.keys.items():
                self.keys[name][at:stop] = values

    def zeros(self, rows: int) -> Block:
        """``rows`` rows of zeros shaped like this block's (placeholders no sample reads)."""
        return self._allocated(rows, np.zeros)

    def _allocated(self, rows: int, allocate: Callable[..., np.ndarray[Any, Any]]) -> Block:
        keys = None if self.keys is None else {n: allocate(rows, v.dtype) for n, v in self.keys.items()}
        return Block(
            allocate((rows, self.x.shape[1]), self.x.dtype),
            allocate((rows, self.y.shape[1]), self.y.dtype),
            keys=keys,
        )

    @staticmethod
    def concatenate(blocks: Sequence[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        keys = blocks[0].keys
        if keys is not None:
            with_keys = [b.keys for b in blocks if b.keys is not None]
            if len(with_keys) != len(blocks):  # the keys would shift against their rows
                raise RuntimeError("internal error: concatenating blocks with and without keys")
            keys = {n: np.concatenate([k[n] for k in with_keys]) for n in keys}
        return Block(np.concatenate([b.x for b in blocks]), np.concatenate([b.y for b in blocks]), keys=keys)


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
        return ColumnType(np.dtype(data_type.to_pandas_dtype()), (), text)
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


def _value_type(value: Any) -> ColumnType:
    """Describe one column of a transform's dict output: a tensor, an array or a list."""
    if isinstance(value, torch.Tensor):
        try:
            dtype = np.dtype(torch.empty(0, dtype=value.dtype).numpy().dtype)
        except TypeError:
            return ColumnType(None, (), f"tensor of {value.dtype}")
        return ColumnType(dtype, tuple(value.shape[1:]), f"tensor of {value.dtype}")
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return ColumnType(value.dtype, tuple(value.shape[1:]), f"array of {value.dtype}")
    return ColumnType(None, (), type(value).__name__)


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
        dtype = np.dtype(data_type.to_pandas_dtype())
        parts = [
            np.frombuffer(chunk.buffers()[1], dtype, len(chunk), chunk.offset * dtype.itemsize)
            for chunk in chunks
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    return np.asarray(pa.chunked_array(chunks, data_type).to_numpy())


def _columns_where(
    schema: pa.Schema, names: Collection[str], kind: Callable[[pa.DataType], bool]
) -> list[str]:
    # Fields by position: a name the query returns twice is reported by resolve_columns, not here.
    return [
        field.name
        for field in schema
        if field.name in names and schema.names.count(field.name) == 1 and kind(field.type)
    ]


def nullable_candidates(schema: pa.Schema, names: Collection[str]) -> list[str]:
    """Columns among ``names`` whose dtype changes if they hold nulls (integers and booleans)."""
    return _columns_where(schema, names, lambda t: pa.types.is_integer(t) or pa.types.is_boolean(t))


_LIST_HINT = (
    "; it holds variable-length lists: cast it to a fixed-size array of its length L, "
    "e.g. CAST({name} AS DOUBLE[L]) in DuckDB, so that x is [B, C, L]"
)


def _stacked(parameter: str, chosen: Sequence[str], types: Mapping[str, ColumnType]) -> bool:
    """True when ``chosen`` are array columns of one length (DolphinDB's ArrayVector shape).

    Raises:
        ValueError: array and scalar columns mixed, or arrays of different lengths.
    """
    arrays = [n for n in chosen if len(types[n].shape) == 1]
    if not arrays:
        return False
    scalars = [n for n in chosen if not types[n].shape]
    if scalars:
        raise ValueError(
            f"{parameter} mixes array columns {arrays} with scalar columns {scalars}; as in DolphinDB, "
            f"the columns of {parameter} are all arrays (one row: [columns, length]) or all scalars: "
            f"choose one kind with input_col / exclude_col / target_col"
        )
    lengths = {n: types[n].shape[0] for n in arrays}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"{parameter} stacks array columns of different lengths {lengths}; "
            f"they must have one length to form [columns, length]"
        )
    return True


def _check_named(
    names: Sequence[str], parameter: str, columns: Sequence[tuple[str, ColumnType]], origin: str
) -> None:
    available = [n for n, _ in columns]
    types = dict(columns)
    for name in names:
        if name not in available:
            raise ValueError(
                f"{parameter} names {name!r}, which is not a column of {origin}; columns: {available}"
            )
        if available.count(name) > 1:
            raise ValueError(f"{parameter} names {name!r}, but {origin} returns several columns of that name")
        if types[name].dtype is None:
            raise TypeError(
                f"{parameter} names {name!r} of type {types[name].text}, which is not numeric; "
                f"cast it in the query or leave it out"
                + ("" if origin == "the query" else ", or convert it in the transform")
                + (_LIST_HINT.format(name=name) if types[name].variable_list else "")
            )


def _warn_target_in_x(x_names: Sequence[str], config: ColumnChoice) -> None:
    """Without windows, a target left in x (DolphinDB's rule) hands the model its own answer."""
    leaked = [n for n in config.target_col if n in x_names]
    if leaked and config.input_col is None and not config.windowed:
        warn_caller(
            f"target_col {leaked} stays in x (DolphinDB's rule), so without windows each sample's x "
            f"holds its own y; leave it out with exclude_col={[*config.exclude_col, *leaked]}"
        )


def _resolve(
    columns: Sequence[tuple[str, ColumnType]],
    config: ColumnChoice,
    columns_with_nulls: Collection[str],
    result: pa.Schema,
    transform: PartitionTransform | None,
    keys: Collection[str] = (),
) -> ColumnLayout:
    origin = "the query" if transform is None else f"the output of transform {transform.name}"
    names = [n for n, _ in columns]
    types = dict(columns)
    _check_named(config.target_col, "target_col", columns, origin)
    for name in config.exclude_col:
        if name not in names:
            raise ValueError(
                f"exclude_col names {name!r}, which is not a column of {origin}; columns: {names}"
            )
    if config.input_col is not None:
        _check_named(config.input_col, "input_col", columns, origin)
        x_names = [n for n in config.input_col if n not in config.exclude_col]
    else:
        left_out = {*config.exclude_col, *config.key_col, *keys}
        candidates = [n for n in names if n not in left_out]
        skipped = [n for n in candidates if types[n].dtype is None]
        if skipped:
            warn_caller(
                f"leaving non-numeric columns {skipped} out of x; "
                f"name input_col or exclude_col to silence this"
            )
        x_names = [n for n in candidates if n not in skipped]
        _check_named(x_names, "the query" if transform is None else "the transform", columns, origin)
    if not x_names:
        raise ValueError("x has no columns: input_col/exclude_col leave nothing to feed the model")
    _warn_target_in_x(x_names, config)
    for parameter, chosen in (("x", x_names), ("y", config.target_col)):
        wide = [n for n in chosen if len(types[n].shape) >= 2]
        if wide and len(chosen) > 1:
            raise ValueError(
                f"{parameter} combines {wide[0]!r}, which holds a {list(types[wide[0]].shape)} tensor per "
                f"row, with other columns {[n for n in chosen if n != wide[0]]}; a column with two or "
                f"more dimensions per row must be the only column of {parameter}"
            )
    # DolphinDB's ArrayVector shape applies to the query's own columns; a transform shapes its own.
    x_stacked = transform is None and _stacked("x", x_names, types)
    y_stacked = transform is None and _stacked("y", config.target_col, types)
    as_float64 = frozenset(
        n for n in {*x_names, *config.target_col} if n in columns_with_nulls or types[n].decimal
    )

    def column_dtype(name: str) -> np.dtype[Any]:
        if name in as_float64:
            return np.dtype(np.float64)
        dtype = types[name].dtype
        assert dtype is not None  # _check_named refused the non-numeric ones
        return dtype

    x_dtype = config.x_dtype or np.result_type(*(column_dtype(n) for n in x_names))
    y_dtype = config.y_dtype or np.result_type(*(column_dtype(n) for n in config.target_col))
    shapes = tuple(
        (n, types[n].shape) for n in dict.fromkeys([*x_names, *config.target_col]) if types[n].shape
    )
    return ColumnLayout(
        tuple(x_names),
        config.target_col,
        np.dtype(x_dtype),
        np.dtype(y_dtype),
        as_float64,
        tuple(result.names),
        shapes,
        transform,
        tuple(result.types),
        x_stacked,
        y_stacked,
        _key_names(config.key_col, tuple(result.names)),
        frozenset(
            n
            for n in config.key_col
            if n in result.names and _exact_only_as_objects(result.field(n).type, n in columns_with_nulls)
        ),
    )


def _exact_only_as_objects(data_type: pa.DataType, nullable: bool) -> bool:
    """Whether a key column's values are exact only as Python values: decimals, and integers or
    booleans that hold NULL somewhere in the query (decided once, so every batch agrees)."""
    nullable_number = nullable and (pa.types.is_integer(data_type) or pa.types.is_boolean(data_type))
    return bool(nullable_number or pa.types.is_decimal(data_type))


def _key_names(key_col: tuple[str, ...], result_names: tuple[str, ...]) -> tuple[str, ...]:
    """``key_col``, checked against the query's own columns (keys are read before any transform)."""
    for name in key_col:
        if name not in result_names:
            raise ValueError(
                f"key_col names {name!r}, which is not a column of the query; columns: {list(result_names)}"
            )
    return key_col


def resolve_columns(
    schema: pa.Schema, config: ColumnChoice, columns_with_nulls: Collection[str], keys: Collection[str] = ()
) -> ColumnLayout:
    """Pick x and y from the query's result schema (no transform).

    y is ``target_col``; x is ``input_col`` if given, else every column but ``keys`` (the result
    columns that ``group_col`` / ``repartition_col`` name) and ``key_col``; then ``exclude_col``
    is removed from x. A named non-numeric column is an error; unnamed non-numeric columns are
    left out of x with one warning that names them.

    Raises:
        ValueError: an unknown, duplicated or ambiguous column, or an empty x.
        TypeError: a named column that is not numeric.
    """
    columns = [(field.name, arrow_column_type(field.type)) for field in schema]
    return _resolve(columns, config, columns_with_nulls, schema, None, keys)


def _describe(output: Any) -> list[tuple[str, ColumnType]]:
    if isinstance(output, pa.Table):
        return [(field.name, arrow_column_type(field.type)) for field in output.schema]
    return [(name, _value_type(value)) for name, value in output.items()]


def resolve_layout(
    probe: pa.Table, config: ColumnChoice, columns_with_nulls: Collection[str], keys: Collection[str] = ()
) -> ColumnLayout | None:
    """The layout of the query's result (``probe``: its empty result), after the transform if any.

    Returns None when the transform fails on zero rows: then probe it on rows with
    :func:`resolve_layout_on_rows`. ``columns_with_nulls`` names the query's columns that hold
    nulls; a column the transform derives has the dtype the transform gives it. ``keys``: as
    :func:`resolve_columns` (left out of a derived x, the transform's output's too).

    Raises:
        ValueError / TypeError: as :func:`resolve_columns`, for the transform's output.
    """
    transform = config.transform
    if transform is None:
        return resolve_columns(probe.schema, config, columns_with_nulls, keys)
    try:
        output = transform(probe)
    except Exception:
        return None
    return _resolve(_describe(output), config, columns_with_nulls, probe.schema, transform, keys)


def resolve_layout_on_rows(
    probe: pa.Table,
    rows: pa.Table | None,
    where: str,
    config: ColumnChoice,
    columns_with_nulls: Collection[str],
    keys: Collection[str] = (),
) -> ColumnLayout:
    """The layout after a transform that needs rows, probed on the first :data:`PROBE_ROWS` of ``rows``.

    ``rows`` is one partition of the query (None when the query has no rows: then the transform
    must run on the empty ``probe``); ``where`` names it for the error note.

    Raises:
        Exception: what the transform raised, with a note naming it and ``where``.
    """
    transform = config.transform
    assert transform is not None
    names = tuple(probe.schema.names)
    sample = probe if rows is None else _renamed(rows, names).slice(0, PROBE_ROWS)
    try:
        output = transform(sample)
    except Exception as error:
        add_note(error, f"ddbloader was probing transform {transform.name} at planning time on {where}")
        raise
    return _resolve(_describe(output), config, columns_with_nulls, probe.schema, transform, keys)


def _renamed(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    if not names or tuple(table.column_names) == names:
        return table
    if table.num_columns != len(names):
        raise ValueError(f"a partition has columns {table.column_names}, but planning saw {list(names)}")
    return table.rename_columns(list(names))


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


def _fill(
    out: np.ndarray[Any, Any], frame: pa.Table | Mapping[str, Any], names: Sequence[str], layout: ColumnLayout
) -> None:
    rows = out.shape[0]
    at = 0
    # by name once per partition: a Table's own name lookups scan every column (O(F²) per block)
    columns = (
        dict(zip(frame.column_names, frame.columns, strict=True)) if isinstance(frame, pa.Table) else frame
    )
    for name in names:
        values = _values(columns, name, layout)
        width = math.prod(values.shape[1:])
        out[:, at : at + width] = values.reshape(rows, width)
        at += width


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
    table = _renamed(table, layout.result_names)
    rows = table.num_rows
    keys = key_arrays(table, layout.key_names, layout.key_objects) if layout.key_names else None
    frame = table if layout.transform is None else layout.transform(table)
    x = np.empty((rows, layout.x_features), dtype=layout.x_dtype)
    y = np.empty((rows, layout.y_features), dtype=layout.y_dtype)
    try:
        _fill(x, frame, layout.x_names, layout)
        _fill(y, frame, layout.y_names, layout)
    except Exception as error:
        if layout.transform is not None:
            add_note(error, f"ddbloader was converting the output of transform {layout.transform.name}")
        raise
    return Block(x, y, keys=keys)
