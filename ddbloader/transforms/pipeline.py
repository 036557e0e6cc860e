"""Transform pipelines: steps run in order on a partition, converting between Arrow and tensors."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, Union

import numpy as np
import pyarrow as pa
import torch

from .._core.errors import add_note, step_name
from .._sql.arrow_types import arrow_column_type, arrow_values

__all__ = [
    "Accepts",
    "Columns",
    "Frame",
    "Pipeline",
    "as_pipeline",
    "as_tensor",
    "columns_to_table",
    "numpy_to_arrow",
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


def as_tensor(values: np.ndarray[Any, Any]) -> torch.Tensor:
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
            columns[name] = as_tensor(arrow_values(column, name, "nan"))
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
        return {k: as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in value.items()}
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
