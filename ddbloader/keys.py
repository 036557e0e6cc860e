"""Sample keys (``key_col=``): the values of some columns at each sample's first y row.

A batch then carries a third element, a dict ``{name: values}``, so predictions can be joined
back to the rows they predict. The keys are read from the query's own columns (before any
transform) when a partition is converted, ride along with the partition's rows (edges and
segments included), and are gathered with the same row numbers as y
(:func:`ddbloader._pipeline.batch.gather_keys`, with the batch's other tensors). Without ``key_col`` none
of this runs: blocks carry no keys and the batch stays ``(x, y)``.

Representation, per column: numbers and booleans become a tensor ``[B]`` of their dtype
(integers or booleans with NULLs become float64 with NaN, DECIMAL float64); temporal columns
become an int64 tensor of their Arrow unit since the epoch (a DuckDB TIMESTAMP: microseconds,
a DATE: days); every other type (strings, symbols, blobs) becomes a ``list`` of Python values.
Keys stay on the host (they are for joining predictions back, not for the model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = ["KeyArrays", "Keys", "key_arrays"]

#: A block's key columns: name → numpy array ``[rows]`` (object dtype for non-numeric columns).
KeyArrays = Mapping[str, np.ndarray[Any, Any]]
#: A batch's keys: name → tensor ``[B]``, or a list of ``B`` Python values.
Keys = dict[str, torch.Tensor | list[Any]]


def _key_array(column: pa.ChunkedArray, name: str) -> np.ndarray[Any, Any]:
    data_type = column.type
    if pa.types.is_temporal(data_type):
        if column.null_count:
            raise ValueError(f"key_col {name!r} ({data_type}) holds NULL values; a sample key needs a value")
        storage = pa.int32() if data_type.bit_width == 32 else pa.int64()  # date32, time32: 32 bits
        return np.asarray(pc.cast(column, storage).to_numpy()).astype(np.int64)
    if pa.types.is_decimal(data_type) or (
        column.null_count and (pa.types.is_integer(data_type) or pa.types.is_boolean(data_type))
    ):
        return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False))
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_boolean(data_type):
        return np.asarray(column.to_numpy())
    values = np.empty(len(column), dtype=object)
    values[:] = column.to_pylist()
    return values


def key_arrays(table: pa.Table, names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
    """The key columns ``names`` of one fetched partition, one array ``[rows]`` each.

    Raises:
        ValueError: a temporal key column holds NULL.
    """
    columns = dict(zip(table.column_names, table.columns, strict=True))
    return {name: _key_array(columns[name], name) for name in names}
