"""Arrow column types: numeric columns as numpy, tensors per row, nulls, extension types."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import torch

from ddbloader import DDBDataLoader
from ddbloader._sql.arrow_types import arrow_column_type, arrow_values


def test_arrow_values_reads_tensor_columns_across_chunks_and_when_empty() -> None:
    images = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
    chunk = pa.FixedShapeTensorArray.from_numpy_ndarray(images)
    column = pa.chunked_array([chunk, chunk])
    np.testing.assert_array_equal(arrow_values(column, "t", "error"), np.concatenate([images, images]))
    empty = arrow_values(pa.chunked_array([], column.type), "t", "error")
    assert empty.shape == (0, 2, 3) and empty.dtype == np.uint8
    lists = pa.chunked_array([pa.array([[1, None]], pa.list_(pa.int64(), 2))])
    np.testing.assert_array_equal(arrow_values(lists, "l", "nan"), [[1.0, np.nan]])
    with pytest.raises(ValueError, match="holds NULL values"):
        arrow_values(lists, "l", "error")


class _Label(pa.ExtensionType):
    """A user extension type defined as pyarrow's docs show, without ``__hash__``."""

    def __init__(self) -> None:
        super().__init__(pa.string(), "test.label")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _Label:
        return cls()


def test_an_unhashable_extension_column_beside_x_and_y_is_left_alone(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(TypeError):
        hash(_Label())

    def add_label(table: pa.Table) -> pa.Table:
        labels = pa.ExtensionArray.from_storage(_Label(), pa.array(["a"] * table.num_rows, pa.string()))
        return table.append_column("label", labels)

    con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS f0, i * 2.0 AS y FROM range(20) r(i)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DDBDataLoader(
            con,
            "SELECT f0, y FROM t ORDER BY f0",
            "y",
            batch_size=4,
            window_size=2,
            input_col=["f0"],
            transform=add_label,
        )
    with loader:
        xs = torch.cat([x for x, _ in loader])
    assert xs[:, 0, 0].tolist() == [float(i) for i in range(18)]
    assert arrow_column_type(_Label()).dtype is None


NUMERIC_TYPES = [pa.bool_(), pa.float16(), pa.float32(), pa.float64()] + [
    getattr(pa, f"{sign}int{bits}")() for sign in ("", "u") for bits in (8, 16, 32, 64)
]


@pytest.mark.parametrize("data_type", NUMERIC_TYPES, ids=str)
def test_numeric_columns_get_pyarrows_numpy_dtype(data_type: pa.DataType) -> None:
    # named from the width: pyarrow < 26 imports pandas in to_pandas_dtype
    assert arrow_column_type(data_type).dtype == np.dtype(data_type.to_pandas_dtype())


@pytest.mark.multiprocess
def test_an_epoch_imports_neither_pandas_nor_a_framework() -> None:
    """One fresh interpreter for both checks (tests/test_modes.py's modes import their framework)."""
    # pyarrow's to_numpy imports pandas on first use: seconds in a fetch thread, once per process
    # (fetch units, fetch_bytes > 0, still convert Python values with pa.array, which imports it)
    script = (
        "import sys, duckdb, ddbloader\n"
        "con = duckdb.connect()\n"
        "con.execute('CREATE TABLE t AS SELECT range AS ts, range % 3 AS g, range::DOUBLE AS a, "
        "range::INTEGER AS b, range::FLOAT AS y FROM range(100)')\n"
        "with ddbloader.DDBDataLoader(con, 'SELECT * FROM t ORDER BY ts', 'y', batch_size=8, group_col='g',"
        " window_size=3, exclude_col=['ts'], fetch_bytes=0) as loader:\n"
        "    assert sum(len(x) for x, _ in loader) > 0\n"
        "print('pandas' in sys.modules)\n"
        "con.execute('CREATE TABLE u AS SELECT 1.0 AS a, 2.0 AS y')\n"
        "list(ddbloader.DDBDataLoader(con, 'SELECT * FROM u', 'y'))\n"
        "list(ddbloader.DDBDataLoader(con, 'SELECT * FROM u', 'y', mode='numpy'))\n"
        "frameworks = {'jax', 'jaxlib', 'tensorflow', 'keras'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in frameworks))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.stdout.split() == ["False", "[]"]
