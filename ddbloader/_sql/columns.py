"""Resolving columns at planning time: x and y from the query's result (or a transform's output).

``target_col``, ``input_col``, ``exclude_col`` and ``key_col`` are checked against the columns the
query returns, and the result is a :class:`~ddbloader._sql.layout.ColumnLayout`. A partition
transform (``transform=``, see :mod:`ddbloader.transforms`) changes the columns: the layout
describes the transform's output, which planning learns by probing the transform: on the query's
empty result first, and — when the transform cannot run on zero rows (an image decoder cannot
tell an image's size from no image) — on the first rows of the smallest partition.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .._core.config import PartitionTransform
from .._core.dtypes import numpy_dtype
from .._core.errors import add_note, warn_caller
from .arrow_types import ColumnType, arrow_column_type, renamed
from .layout import ColumnChoice, ColumnLayout

__all__ = ["PROBE_ROWS", "nullable_candidates", "resolve_columns", "resolve_layout", "resolve_layout_on_rows"]


#: Rows of a partition a transform is probed on at planning time when it cannot run on zero rows.
PROBE_ROWS = 64


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


_TARGET_HINT = (
    " (without windows target_col is not in x; to feed it, as DolphinDB does, name it in input_col)"
)

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


def _unknown(parameter: str, name: str, origin: str, available: Sequence[str]) -> ValueError:
    """The error for a name that is not a column: the argument, the name, the closest column."""
    close = (
        difflib.get_close_matches(name, available, n=1)
        or [n for n in available if n.lower() == name.lower()][:1]
    )
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(
        f"{parameter} names {name!r}{hint}, which is not a column of {origin}; columns: {list(available)}"
    )


def _check_named(
    names: Sequence[str], parameter: str, columns: Sequence[tuple[str, ColumnType]], origin: str
) -> None:
    available = [n for n, _ in columns]
    types = dict(columns)
    for name in names:
        if name not in available:
            raise _unknown(parameter, name, origin, available)
        if available.count(name) > 1:
            raise ValueError(f"{parameter} names {name!r}, but {origin} returns several columns of that name")
        if types[name].dtype is None:
            raise TypeError(
                f"{parameter} names {name!r} of type {types[name].text}, which is not numeric; "
                f"cast it in the query or leave it out"
                + ("" if origin == "the query" else ", or convert it in the transform")
                + (_LIST_HINT.format(name=name) if types[name].variable_list else "")
            )


def _default_float() -> np.dtype[Any]:
    """torch's default floating dtype (``torch.get_default_dtype()``) as numpy's, read at planning.

    Raises:
        TypeError: it has no numpy equivalent (``torch.bfloat16``): batches are built in numpy.
    """
    default = torch.get_default_dtype()
    try:
        return numpy_dtype(default)
    except (TypeError, RuntimeError) as exc:
        raise TypeError(
            f"torch's default dtype {default} has no numpy equivalent, and floating columns come out "
            f"in it unless dtype= says otherwise: pass dtype=torch.float32 (and cast on the device)"
        ) from exc


def _tensor_dtype(given: np.dtype[Any] | None, columns: list[np.dtype[Any]]) -> np.dtype[Any]:
    """``dtype=`` if given; else the columns' common type, floating ones in torch's default."""
    if given is not None:
        return given
    promoted: np.dtype[Any] = np.result_type(*columns)
    return _default_float() if promoted.kind == "f" else promoted


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
            raise _unknown("exclude_col", name, origin, names)
    if config.input_col is not None:
        _check_named(config.input_col, "input_col", columns, origin)
        x_names = [n for n in config.input_col if n not in config.exclude_col]
    else:
        # without windows a sample's y is its own row: left in x, the model would read its answer
        target = () if config.windowed else config.target_col
        left_out = {*config.exclude_col, *config.key_col, *keys, *target}
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
        raise ValueError(
            "x has no columns: input_col/exclude_col leave nothing to feed the model"
            + ("" if config.windowed or config.input_col is not None else _TARGET_HINT)
        )
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

    x_dtype = _tensor_dtype(config.x_dtype, [column_dtype(n) for n in x_names])
    y_dtype = _tensor_dtype(config.y_dtype, [column_dtype(n) for n in config.target_col])
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
            raise _unknown("key_col", name, "the query", result_names)
    return key_col


def resolve_columns(
    schema: pa.Schema, config: ColumnChoice, columns_with_nulls: Collection[str], keys: Collection[str] = ()
) -> ColumnLayout:
    """Pick x and y from the query's result schema (no transform).

    y is ``target_col``; x is ``input_col`` if given, else every column but ``keys`` (the result
    columns that ``group_col`` / ``repartition_col`` name), ``key_col`` and — without windows,
    where a sample's y is its own row — ``target_col``; then ``exclude_col`` is removed from x.
    A named non-numeric column is an error; unnamed non-numeric columns are left out of x with
    one warning that names them. Each tensor's dtype is ``dtype=``'s, else its columns' common
    type, a floating one in ``torch.get_default_dtype()`` (integers with nulls and decimals are
    floating).

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
    sample = probe if rows is None else renamed(rows, names).slice(0, PROBE_ROWS)
    try:
        output = transform(sample)
    except Exception as error:
        add_note(error, f"ddbloader was probing transform {transform.name} at planning time on {where}")
        raise
    return _resolve(_describe(output), config, columns_with_nulls, probe.schema, transform, keys)
