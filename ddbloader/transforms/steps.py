"""Column steps for transform pipelines: one-hot labels, standardisation, casts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
import torch
from sqlglot import exp

from .._core.dtypes import numpy_dtype, torch_dtype
from .._core.errors import add_note
from .._sql.arrow_types import arrow_column_type, arrow_values
from .._sql.query import UserQuery
from ..backends import Backend, connect, is_backend
from .pipeline import Accepts, Columns, Frame, as_tensor, numpy_to_arrow

__all__ = ["Cast", "OneHot", "Standardize", "Stats", "cast", "column_stats", "one_hot", "standardize"]


def _column(frame: Frame, name: str, helper: object) -> Any:
    names = frame.column_names if isinstance(frame, pa.Table) else list(frame)
    if name not in names:
        raise KeyError(f"{helper!r}: no column {name!r} in the partition; columns: {names}")
    return frame.column(name) if isinstance(frame, pa.Table) else frame[name]


def _numeric(value: Any, name: str) -> np.ndarray[Any, Any]:
    if isinstance(value, pa.ChunkedArray):
        return arrow_values(value, name, "nan")
    if isinstance(value, torch.Tensor):
        return value.numpy(force=True)
    return np.asarray(value)


def _replace(frame: Frame, name: str, values: np.ndarray[Any, Any], target: str) -> Frame:
    """``frame`` with column ``target`` set to ``values`` (in ``name``'s place when they agree)."""
    if isinstance(frame, pa.Table):
        array = numpy_to_arrow(values)
        if target in frame.column_names:
            return frame.set_column(frame.column_names.index(target), target, array)
        return frame.append_column(target, array)
    out = dict(frame)
    out[target] = as_tensor(values)
    return out


class OneHot:
    """Replace an integer label column by a one-hot ``[rows, num_classes]`` column (see :func:`one_hot`)."""

    accepts: Accepts = "any"

    def __init__(self, column: str, num_classes: int, name: str | None, dtype: Any) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"one_hot: num_classes must be an int >= 1, got {num_classes!r}")
        self.column = column
        self.num_classes = num_classes
        self.name = name or column
        self.dtype = numpy_dtype(dtype)

    def __repr__(self) -> str:
        suffix = f", name={self.name!r}" if self.name != self.column else ""
        return f"one_hot({self.column!r}, {self.num_classes}{suffix})"

    def __call__(self, frame: Frame) -> Frame:
        labels = _numeric(_column(frame, self.column, self), self.column)
        if labels.ndim != 1:
            raise ValueError(f"{self!r}: column {self.column!r} must hold one label per row")
        if labels.dtype.kind == "f":
            if np.isnan(labels).any():
                raise ValueError(f"{self!r}: column {self.column!r} holds NULL/NaN labels")
            if (labels != np.floor(labels)).any():
                raise ValueError(f"{self!r}: column {self.column!r} holds non-integer labels")
        elif labels.dtype.kind not in "biu":
            raise TypeError(f"{self!r}: column {self.column!r} of dtype {labels.dtype} holds no class labels")
        index = labels.astype(np.int64)
        outside = index[(index < 0) | (index >= self.num_classes)]
        if len(outside):
            raise ValueError(
                f"{self!r}: column {self.column!r} holds label {int(outside[0])}, "
                f"outside [0, {self.num_classes})"
            )
        encoded = np.zeros((len(index), self.num_classes), dtype=self.dtype)
        encoded[np.arange(len(index)), index] = 1
        return _replace(frame, self.column, encoded, self.name)


def one_hot(column: str, num_classes: int, *, name: str | None = None, dtype: Any = np.float32) -> OneHot:
    """A transform step: integer labels ``0 .. num_classes-1`` → one-hot vectors.

    The column ``column`` is replaced (or, with ``name``, a column ``name`` added) by a
    ``[rows, num_classes]`` column of ``dtype``; a y of that one column is ``[B, num_classes]``.
    A label outside the range, or a NULL, raises ValueError naming the step.
    """
    return OneHot(column, num_classes, name, dtype)


class Stats(NamedTuple):
    """Mean and population standard deviation of a column, over its ``n`` non-NULL values."""

    mean: float
    std: float
    n: int


def column_stats(source: Any, sql: str, columns: str | Sequence[str]) -> dict[str, Stats]:
    """Mean and standard deviation of ``columns`` over the whole query, in ONE aggregate query.

    ``source`` is anything :class:`~ddbloader.DDBDataLoader` accepts (a DuckDB connection or
    path, a URI, a backend, ...); a backend given is not closed, one opened here is. The engine
    computes ``avg`` and ``stddev_pop`` of every column over the query's rows at once (NULLs left
    out), so the statistics are global, not per partition, and are computed once: give the
    result to :func:`standardize`.

    Raises:
        ValueError: a column without a non-NULL value, or an unusable query.
        TypeError: a backend without SQL (DolphinDB's own scripts): compute the statistics there.
        Exception: an engine error, with a note naming the aggregate query.
    """
    names = [columns] if isinstance(columns, str) else list(columns)
    if not names:
        raise ValueError("column_stats needs at least one column")
    owned = not is_backend(source)
    backend: Backend = connect(source)
    try:
        if callable(getattr(backend, "query", None)):
            raise TypeError(
                f"column_stats builds its aggregate in SQL, which the {backend.engine} backend does not "
                f"take; compute the means and standard deviations there and pass them to standardize()"
            )
        dialect = backend.dialect
        UserQuery(sql, dialect)  # the same read-only checks as the loader's query
        selects: list[exp.Expr] = []
        for j, name in enumerate(names):
            column = exp.column(name, quoted=True)
            selects += [
                exp.Avg(this=column.copy()).as_(f"m{j}"),
                exp.StddevPop(this=column.copy()).as_(f"s{j}"),
                exp.Count(this=column.copy()).as_(f"n{j}"),
            ]
        inner = sqlglot.parse_one(sql, read=dialect)
        subquery = exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("_ddb_stats")))
        stats_sql = exp.select(*selects).from_(subquery).sql(dialect=dialect)
        cursor = backend.cursor()
        try:
            row = cursor.fetch(stats_sql, ()).to_pylist()[0]
        except Exception as error:
            add_note(error, f"ddbloader was computing column statistics: {stats_sql!r}")
            raise
        finally:
            cursor.close()
    finally:
        if owned:
            backend.close()
    stats: dict[str, Stats] = {}
    for j, name in enumerate(names):
        if not row[f"n{j}"]:
            raise ValueError(f"column_stats: column {name!r} has no non-NULL value in the query")
        stats[name] = Stats(float(row[f"m{j}"]), float(row[f"s{j}"]), int(row[f"n{j}"]))
    return stats


class Standardize:
    """``(value - mean) / std`` per column (see :func:`standardize`)."""

    accepts: Accepts = "any"

    def __init__(self, columns: Sequence[str], stats: Mapping[str, Any]) -> None:
        self.stats: dict[str, tuple[float, float]] = {}
        for name in columns:
            if name not in stats:
                raise ValueError(f"standardize: stats has no entry for column {name!r}")
            entry = stats[name]
            mean, std = float(entry[0]), float(entry[1])
            if not (math.isfinite(mean) and math.isfinite(std) and std >= 0):
                raise ValueError(
                    f"standardize: column {name!r} has mean {mean} and std {std}; need finite, std >= 0"
                )
            # A constant column has std 0: leave it centred, as scikit-learn's StandardScaler does.
            self.stats[name] = (mean, std or 1.0)

    def __repr__(self) -> str:
        return f"standardize({list(self.stats)})"

    def __call__(self, frame: Frame) -> Frame:
        for name, (mean, std) in self.stats.items():
            values = _numeric(_column(frame, name, self), name)
            dtype = np.result_type(values.dtype, np.float32) if values.dtype.kind != "f" else values.dtype
            scaled = (values.astype(dtype, copy=False) - dtype.type(mean)) / dtype.type(std)
            frame = _replace(frame, name, scaled, name)
        return frame


def standardize(columns: str | Sequence[str], stats: Mapping[str, Any]) -> Standardize:
    """A transform step: ``(value - mean) / std`` for each of ``columns``.

    ``stats`` maps each column to ``(mean, std)`` (e.g. :class:`Stats`): take them from
    :func:`column_stats`, one SQL aggregate over the whole query computed once, so every
    partition is scaled alike. A float column keeps its dtype; an integer one becomes float
    (float64, as numpy promotes). A std of 0 divides by 1.
    """
    return Standardize([columns] if isinstance(columns, str) else list(columns), stats)


class Cast:
    """Cast numeric columns to one dtype (see :func:`cast`)."""

    accepts: Accepts = "any"

    def __init__(self, dtype: Any, columns: Sequence[str] | None) -> None:
        self.dtype = numpy_dtype(dtype)
        if self.dtype.kind not in "biuf":
            raise TypeError(f"cast: {dtype!r} is not a numeric dtype")
        self.columns = None if columns is None else list(columns)

    def __repr__(self) -> str:
        suffix = "" if self.columns is None else f", {self.columns}"
        return f"cast({self.dtype.name}{suffix})"

    def __call__(self, frame: Frame) -> Frame:
        if isinstance(frame, pa.Table):
            table: Any = frame
            names = self.columns or [
                f.name for f in table.schema if arrow_column_type(f.type).dtype is not None
            ]
            target = pa.from_numpy_dtype(self.dtype)
            for name in names:
                column = _column(table, name, self)
                if arrow_column_type(column.type).shape:
                    table = _replace(table, name, _numeric(column, name).astype(self.dtype), name)
                else:
                    index = table.column_names.index(name)
                    table = table.set_column(index, name, pc.cast(column, target, safe=False))
            return table
        out: Columns = dict(frame)
        target_dtype = torch_dtype(self.dtype)
        names = self.columns or [n for n, v in out.items() if isinstance(v, (torch.Tensor, np.ndarray))]
        for name in names:
            value = _column(out, name, self)
            out[name] = (value if isinstance(value, torch.Tensor) else as_tensor(np.asarray(value))).to(
                target_dtype
            )
        return out


def cast(dtype: Any, columns: str | Sequence[str] | None = None) -> Cast:
    """A transform step: cast ``columns`` (default: every numeric column) to ``dtype``.

    ``dtype`` is a torch or numpy dtype. Like ``Tensor.to``, floats cast to integers truncate.
    """
    return Cast(dtype, [columns] if isinstance(columns, str) else columns)
