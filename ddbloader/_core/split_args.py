"""The arguments of a time split (``split_col``, ``split_range``) checked before planning.

What a split serves, and how the query is narrowed for it, is :mod:`ddbloader._sql.splits`.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["SPLIT_VALUE_TYPES", "split_args"]

#: The Python types a ``split_range`` end may have: each becomes a literal of the engine's dialect.
SPLIT_VALUE_TYPES = (int, float, decimal.Decimal, str, dt.date)


def split_args(
    column: Any, bounds: Any, windowed: bool, x_window: int, y_window: int, offset: int
) -> dict[str, Any]:
    """``split_col`` and ``split_range`` checked: a column with a pair ``(lo, hi)`` of values of one
    kind, either None, ``lo < hi``; a window whose x reaches past its y is refused (its x would
    read rows after ``hi``, which belong to the next split)."""
    if column is None:
        if bounds is not None:
            raise ValueError("split_range was given without split_col: name the column it bounds")
        return {}
    if not isinstance(column, str) or not column.strip():
        raise TypeError(f"split_col must be a column name or SQL expression string, got {column!r}")
    if bounds is None:
        raise ValueError(f"split_col={column!r} needs split_range=(lo, hi) (either end None)")
    if isinstance(bounds, (str, bytes)) or not isinstance(bounds, Sequence) or len(bounds) != 2:
        raise TypeError(f"split_range must be a pair (lo, hi), either end None, got {bounds!r}")
    ends = tuple(
        v.item() if isinstance(v, np.generic) and not isinstance(v, np.datetime64) else v for v in bounds
    )
    for end in ends:
        if end is None:
            continue
        if isinstance(end, bool) or not isinstance(end, SPLIT_VALUE_TYPES):
            raise TypeError(
                f"split_range ends must be numbers, strings, dates or datetimes (or None), got "
                f"{type(end).__name__} {end!r}"
            )
        if isinstance(end, float) and not math.isfinite(end):
            raise ValueError(f"split_range ends must be finite, got {end!r}; use None for an open end")
    lo, hi = ends
    if lo is not None and hi is not None:
        try:
            ordered = lo < hi
        except TypeError as error:
            raise TypeError(
                f"split_range ends {lo!r} and {hi!r} cannot be compared: give values of one kind"
            ) from error
        if not ordered:
            raise ValueError(f"split_range=({lo!r}, {hi!r}) is empty: lo must be below hi")
    if windowed and x_window > offset + y_window:
        raise ValueError(
            f"split_col needs y to end a sample, but x (window {x_window}) reaches past y (offset {offset}, "
            f"window {y_window}): those x rows would come after y, where the next split's rows lie; "
            f"give an offset of at least {x_window - y_window}"
        )
    return {"split_col": column, "split_range": (lo, hi)}
