"""Reading ``key_col`` columns of a converted partition into arrays, one per column.

What a batch then carries, and in which dtype, is described in :mod:`ddbloader.keys`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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


def _key_array(column: pa.ChunkedArray, name: str, as_objects: bool) -> np.ndarray[Any, Any]:
    data_type = column.type
    if as_objects:
        values = np.empty(len(column), dtype=object)
        values[:] = column.to_pylist()
        return values
    if pa.types.is_temporal(data_type):
        if column.null_count:
            raise ValueError(f"key_col {name!r} ({data_type}) holds NULL values; a sample key needs a value")
        storage = pa.int32() if data_type.bit_width == 32 else pa.int64()  # date32, time32: 32 bits
        return np.asarray(pc.cast(column, storage).to_numpy()).astype(np.int64)
    if column.null_count and (pa.types.is_integer(data_type) or pa.types.is_boolean(data_type)):
        raise ValueError(
            f"key_col {name!r} ({data_type}) holds NULL values that planning did not see: the data "
            f"changed after the loader was built"
        )
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_boolean(data_type):
        return np.asarray(column.to_numpy())
    values = np.empty(len(column), dtype=object)
    values[:] = column.to_pylist()
    return values


def key_arrays(
    table: pa.Table, names: Sequence[str], objects: Collection[str] = frozenset()
) -> dict[str, np.ndarray[Any, Any]]:
    """The key columns ``names`` of one fetched partition, one array ``[rows]`` each.

    ``objects``: the columns read as Python values whatever the partition holds (decimals, and
    integer or boolean columns with NULL anywhere in the query), so a column's representation is
    the same in every batch.

    Raises:
        ValueError: a temporal key column holds NULL, or an integer/boolean one not in
            ``objects`` does.
    """
    columns = dict(zip(table.column_names, table.columns, strict=True))
    return {name: _key_array(columns[name], name, name in objects) for name in names}
