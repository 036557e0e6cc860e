"""ColumnLayout: which columns become x and y, their dtypes and per-sample shapes.

A column of x or y is numeric and holds either one value per row (one feature) or one
fixed-shape tensor per row: an Arrow ``fixed_size_list`` or ``fixed_shape_tensor`` column, or a
``[rows, *shape]`` tensor that a transform returns. Several columns concatenate their flattened
features; a column with two or more dimensions per row (an image ``[C, H, W]``) must be the only
column of its tensor, and the sample keeps its shape. Blocks stay 2-D ``[rows, features]`` either
way (windows and edge stitching never look inside a row); :func:`~ddbloader._pipeline.batch.gather` gives
the batch its per-row shape.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from .._core.config import PartitionTransform
from .arrow_types import Shape

__all__ = ["ColumnChoice", "ColumnLayout"]


class ColumnChoice(Protocol):
    """The arguments that choose x and y (:class:`ddbloader._core.config.LoaderConfig` has them).

    A protocol: resolving the columns reads these arguments and no other of the configuration.
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
