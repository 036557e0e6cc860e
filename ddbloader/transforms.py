"""Partition transforms: derived columns, computed in the fetch threads when a partition is pulled.

``DDBDataLoader(..., transform=f)`` calls ``f`` on every partition right after it is fetched, in
the fetch thread, so it overlaps training; nothing runs until a partition is pulled (CCV's
pull-model dataframe ``map``). A transform

* receives the partition as an Arrow table of the query's columns, or, wrapped in
  :func:`tensors`, as a dict of column name → tensor ``[rows, ...]`` (non-numeric columns as
  lists of Python values);
* returns an Arrow table or a dict of tensors / numpy arrays with the same number of rows: the
  plan counted every partition's rows, so a transform that adds or drops rows would break
  ``len()`` and exactly-once coverage, and is refused (filter rows in the SQL instead);
* may add, replace or drop columns: ``input_col``, ``target_col`` and ``exclude_col`` name its
  output. A column may hold a fixed-shape tensor per row (a one-hot vector, an image).

``transform=[f, g, ...]`` runs the steps in order, converting between the two forms as each step
asks. :func:`one_hot`, :func:`standardize` and :func:`cast` accept either form.

Invariants and consequences:

* **Partition-local.** A transform sees one partition (one group in one repartition) at a time.
  A derived column that looks at neighbouring rows (a lag, a log-return, a rolling mean) is
  computed per partition: the first rows of every partition have no predecessor there. Windows
  still continue across repartitions, over the transformed rows. A lag that must cross
  repartition boundaries belongs in the SQL, inside a CTE or subquery (``WITH t AS (SELECT *,
  x - LAG(x) OVER (PARTITION BY g ORDER BY t) AS dx FROM ...) SELECT * FROM t``): the loader
  injects its partition filter into the outer WHERE, so the window function sees whole series.
* **Pure.** The batches stay a pure function of (plan, seed, epoch) only if every transform is a
  pure function of its partition: several fetch threads run it concurrently, in any order.
  Random augmentations draw from torch's global generator, which the training thread shares:
  batch order and coverage stay deterministic, the drawn values do not.
* **Planned.** Planning probes the transform on the query's empty result (or on a few rows of
  the smallest partition, if it fails on none) to learn the output's columns, dtypes and per-row
  shapes; every partition must then give the same.
* **Picklable** when its steps are (module-level functions and these helpers; not lambdas), so
  the loader still travels to DataLoader worker processes.

Errors: a failing step raises its own exception with a note naming the step; the fetch thread
adds the partition (its group, repartition, subquery and parameters).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
import torch
from sqlglot import exp

from ._core.dtypes import numpy_dtype, torch_dtype
from ._core.errors import add_note, step_name
from ._sql.query import UserQuery
from ._sql.source import arrow_column_type, arrow_values
from .backends import Backend, connect, is_backend

__all__ = [
    "Cast",
    "Columns",
    "Frame",
    "OneHot",
    "Pipeline",
    "Standardize",
    "Stats",
    "as_pipeline",
    "cast",
    "column_stats",
    "columns_to_table",
    "one_hot",
    "standardize",
    "table_to_tensors",
    "tensors",
]

#: A partition as a dict: column name → tensor ``[rows, ...]`` (or a list, for non-numeric columns).
Columns = dict[str, Any]
#: A partition as a transform sees or returns it.
Frame: TypeAlias = Union[pa.Table, Columns]  # noqa: UP007 -- pa.Table is untyped: no `|` at runtime
Accepts = Literal["arrow", "tensors", "any"]


class Pipeline:
    """Transform steps run in order on one partition. Immutable; as thread-safe as its steps.

    Every step's output must keep the partition's row count. A step's ``accepts`` attribute
    (``"arrow"``, the default, ``"tensors"`` or ``"any"``) says which form it receives.
    """

    def __init__(self, steps: Sequence[Callable[..., Any]]) -> None:
        self.steps = tuple(steps)

    @property
    def name(self) -> str:
        """The steps, named for messages."""
        names = [step_name(s) for s in self.steps]
        return names[0] if len(names) == 1 else "[" + ", ".join(names) + "]"

    def __repr__(self) -> str:
        return f"Pipeline({self.name})"

    def __call__(self, table: pa.Table) -> Frame:
        """Run every step on ``table`` (one partition).

        Raises:
            Exception: what a step raised, with a note naming it.
            TypeError / ValueError: a step returned something else than a table or a dict of
                columns, or changed the row count.
        """
        rows = table.num_rows
        value: Frame = table
        for number, step in enumerate(self.steps, start=1):
            label = (
                step_name(step)
                if len(self.steps) == 1
                else f"{step_name(step)} (step {number} of {len(self.steps)})"
            )
            try:
                value = step(_as_form(value, getattr(step, "accepts", "arrow")))
            except Exception as error:
                add_note(error, f"ddbloader was applying transform {label}")
                raise
            _check_rows(value, rows, label)
        return value


def as_pipeline(value: Any) -> Pipeline | None:
    """``transform=`` as a :class:`Pipeline`: None, a callable, or a list of callables.

    Raises:
        TypeError: something that is not callable.
        ValueError: an empty list.
    """
    if value is None or isinstance(value, Pipeline):
        return value
    steps = list(value) if isinstance(value, (list, tuple)) else [value]
    if not steps:
        raise ValueError("transform is an empty list; give None for no transform")
    for step in steps:
        if not callable(step):
            raise TypeError(f"transform must be a callable or a list of callables, got {step!r}")
    return Pipeline(steps)


def _check_rows(value: Any, rows: int, label: str) -> None:
    if isinstance(value, pa.Table):
        if value.num_rows != rows:
            raise ValueError(
                f"transform {label} returned {value.num_rows} rows for a partition of {rows}: a transform "
                f"must keep every row (the plan counted them); filter rows in the SQL instead"
            )
        return
    if not isinstance(value, Mapping):
        raise TypeError(
            f"transform {label} returned {type(value).__name__}; it must return an Arrow table or a dict "
            f"of column name → tensor"
        )
    for name, column in value.items():
        if not isinstance(name, str):
            raise TypeError(f"transform {label} returned a column named {name!r}; names must be strings")
        shape = getattr(column, "shape", None)
        if shape is not None and len(shape) == 0:
            raise ValueError(
                f"transform {label} returned column {name!r} as a scalar; it needs one row per row"
            )
        length = shape[0] if shape is not None else len(column)
        if length != rows:
            raise ValueError(
                f"transform {label} returned column {name!r} with {length} rows for a partition of {rows}: "
                f"a transform must keep every row (the plan counted them); filter rows in the SQL instead"
            )


def _tensor(values: np.ndarray[Any, Any]) -> torch.Tensor:
    # torch.from_numpy warns on read-only arrays (Arrow's zero-copy views are); a step may write.
    return torch.from_numpy(values if values.flags.writeable else values.copy())


def table_to_tensors(table: pa.Table) -> Columns:
    """An Arrow table as a dict of tensors ``[rows, ...]``; non-numeric columns become lists.

    Integer and boolean columns with nulls become float64 with NaN.
    """
    columns: Columns = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if arrow_column_type(column.type).dtype is None:
            columns[name] = column.to_pylist()
        else:
            columns[name] = _tensor(arrow_values(column, name, "nan"))
    return columns


def numpy_to_arrow(values: np.ndarray[Any, Any]) -> pa.Array:
    """``[rows]`` → a plain array, ``[rows, k]`` → ``fixed_size_list``, more → ``fixed_shape_tensor``."""
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    width = math.prod(values.shape[1:])
    storage = pa.FixedSizeListArray.from_arrays(flat, width)
    if values.ndim == 2:
        return storage
    tensor_type = pa.fixed_shape_tensor(flat.type, list(values.shape[1:]))
    return pa.ExtensionArray.from_storage(tensor_type, storage)


def columns_to_table(columns: Mapping[str, Any]) -> pa.Table:
    """A dict of tensors / arrays / lists as an Arrow table (see :func:`numpy_to_arrow`)."""
    arrays: dict[str, pa.Array] = {}
    for name, value in columns.items():
        values = value.numpy(force=True) if isinstance(value, torch.Tensor) else value
        arrays[name] = numpy_to_arrow(values) if isinstance(values, np.ndarray) else pa.array(list(values))
    return pa.table(arrays)


def _as_form(value: Frame, accepts: Accepts) -> Frame:
    if accepts == "any":
        return value
    if accepts == "tensors":
        if isinstance(value, pa.Table):
            return table_to_tensors(value)
        return {k: _tensor(v) if isinstance(v, np.ndarray) else v for k, v in value.items()}
    return value if isinstance(value, pa.Table) else columns_to_table(value)


class _TensorStep:
    accepts: Accepts = "tensors"

    def __init__(self, function: Callable[[Columns], Columns]) -> None:
        self.function = function

    def __call__(self, columns: Columns) -> Columns:
        return self.function(columns)

    def __repr__(self) -> str:
        return f"tensors({step_name(self.function)})"


def tensors(function: Callable[[Columns], Columns]) -> Callable[[Columns], Columns]:
    """Make ``function`` a transform step that receives a dict of tensors instead of an Arrow table.

    ``function(columns)`` gets column name → tensor ``[rows, ...]`` (integers with nulls as
    float64 NaN; non-numeric columns as lists) and returns such a dict (tensors or numpy arrays).
    """
    return _TensorStep(function)


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
    out[target] = _tensor(values)
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
            out[name] = (value if isinstance(value, torch.Tensor) else _tensor(np.asarray(value))).to(
                target_dtype
            )
        return out


def cast(dtype: Any, columns: str | Sequence[str] | None = None) -> Cast:
    """A transform step: cast ``columns`` (default: every numeric column) to ``dtype``.

    ``dtype`` is a torch or numpy dtype. Like ``Tensor.to``, floats cast to integers truncate.
    """
    return Cast(dtype, [columns] if isinstance(columns, str) else columns)
