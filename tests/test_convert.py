"""Converting a fetched partition: its schema matched by name to the planned one, then its block."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader
from ddbloader._io import convert
from ddbloader._io.convert import check_result_schema, to_block
from ddbloader._sql.layout import ColumnLayout

# --- the block conversion -------------------------------------------------------------------


def test_to_block_handles_chunks_nulls_and_promotion() -> None:
    table = pa.table(
        {
            "a": pa.chunked_array([pa.array([1, None], pa.int32()), pa.array([3], pa.int32())]),
            "b": pa.chunked_array([pa.array([0.5]), pa.array([1.5, 2.5])]),
            "c": pa.array([7, 8, 9], pa.int64()),
        }
    )
    layout = ColumnLayout(("b", "a"), ("c",), np.dtype(np.float64), np.dtype(np.int64), frozenset({"a"}))
    block = to_block(table, layout)
    assert block.rows == 3
    assert block.x.flags.c_contiguous
    np.testing.assert_array_equal(block.x, [[0.5, 1.0], [1.5, np.nan], [2.5, 3.0]])
    np.testing.assert_array_equal(block.y, [[7], [8], [9]])
    assert block.y.dtype == np.int64
    edge = block.rows_between(1, 3)
    np.testing.assert_array_equal(edge.y, [[8], [9]])
    assert not np.shares_memory(edge.x, block.x)


def test_nulls_planning_did_not_see_are_refused_instead_of_cast_to_garbage() -> None:
    table = pa.table({"a": pa.array([1, None], pa.int32()), "c": pa.array([7.0, 8.0])})
    layout = ColumnLayout(("a",), ("c",), np.dtype(np.int32), np.dtype(np.float64), frozenset())
    with pytest.raises(ValueError, match=r"column 'a' \(int32\) holds NULL values where planning saw none"):
        to_block(table, layout)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 70),
    cuts=st.lists(st.integers(0, 70), max_size=4),
    span_bytes=st.sampled_from([1, 40, 200, 1 << 24]),
    tile_bytes=st.sampled_from([1, 24, 100, 1 << 19]),
    seed=st.integers(0, 2**16),
)
def test_to_block_in_spans_and_tiles_equals_the_columns_side_by_side(
    rows: int, cuts: list[int], span_bytes: int, tile_bytes: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    bounds = sorted({0, rows, *(c for c in cuts if c < rows)})

    def chunked(values: np.ndarray[Any, Any], mask: np.ndarray[Any, Any] | None = None) -> pa.ChunkedArray:
        return pa.chunked_array(
            [
                pa.array(values[a:b], mask=None if mask is None else mask[a:b])
                for a, b in itertools.pairwise(bounds)
            ],
            pa.from_numpy_dtype(values.dtype),
        )

    nulls = rng.random(rows) < 0.2
    table = pa.table(
        {
            "f": chunked(rng.random(rows).astype(np.float32)),
            "n": chunked(rng.integers(-9, 9, rows).astype(np.int32), nulls),
            "d": chunked(rng.random(rows)),
            "y": chunked(rng.integers(0, 100, rows).astype(np.int64)),
        }
    )
    layout = ColumnLayout(("d", "n", "f"), ("y",), np.dtype(np.float64), np.dtype(np.int64), frozenset({"n"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(convert, "_SPAN_BYTES", span_bytes)
        patch.setattr(convert, "_TILE_BYTES", tile_bytes)
        block = to_block(table, layout)
    expected_x = np.column_stack(
        [
            table.column("d").to_numpy(),
            np.where(nulls, np.nan, table.column("n").to_numpy(zero_copy_only=False)),
            table.column("f").to_numpy().astype(np.float64),
        ]
    ).reshape(rows, 3)
    np.testing.assert_array_equal(block.x, expected_x)
    np.testing.assert_array_equal(block.y, table.column("y").to_numpy().reshape(rows, 1))
    assert block.x.flags.c_contiguous and block.y.flags.c_contiguous


# --- the fetched columns, matched by name to those planning saw -------------------------------

PLANNED = pa.schema([("a", pa.int32()), ("b", pa.float64()), ("label", pa.string()), ("y", pa.float64())])


def planned_layout(**kwargs: Any) -> ColumnLayout:
    arguments: dict[str, Any] = {
        "x_names": ("a", "b"),
        "y_names": ("y",),
        "x_dtype": np.dtype(np.float64),
        "y_dtype": np.dtype(np.float64),
        "as_float64": frozenset(),
        "result_names": tuple(PLANNED.names),
        "result_types": tuple(PLANNED.types),
    }
    arguments.update(kwargs)
    return ColumnLayout(**arguments)


@pytest.mark.parametrize(
    ("fetched", "message"),
    [
        (
            [("b", pa.float64()), ("a", pa.int32()), ("label", pa.string()), ("y", pa.float64())],
            r"returned column 'b' at position 0, where planning saw 'a'",
        ),
        ([("a", pa.int32()), ("label", pa.string()), ("y", pa.float64())], r"returned no column 'b'"),
        (
            [("a", pa.int32()), ("c", pa.float64()), ("label", pa.string()), ("y", pa.float64())],
            r"returned no column 'b'",
        ),
        (
            [
                ("a", pa.int32()),
                ("b", pa.float64()),
                ("label", pa.string()),
                ("y", pa.float64()),
                ("z", pa.int8()),
            ],
            r"returned column 'z', new since planning",
        ),
        (
            [("a", pa.float64()), ("b", pa.float64()), ("label", pa.string()), ("y", pa.float64())],
            r"returned column 'a' as double, where planning saw int32",
        ),
        (
            [("a", pa.int32()), ("b", pa.string()), ("label", pa.string()), ("y", pa.float64())],
            r"returned column 'b' as string, where planning saw double",
        ),
    ],
    ids=["reordered", "missing", "renamed", "added", "int to float", "float to text"],
)
def test_a_changed_result_schema_is_refused_naming_the_column(
    fetched: list[tuple[str, pa.DataType]], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        where = "partition 0 of group 0 (subquery 'Q')"
        check_result_schema(pa.schema(fetched), planned_layout(), lambda: where)
    assert "partition 0 of group 0 (subquery 'Q')" in str(caught.value)
    assert "build the loader again" in str(caught.value)


@pytest.mark.parametrize(
    "fetched",
    [
        PLANNED,
        # a type of no value: a DB-API partition where the column holds only NULLs
        PLANNED.set(1, pa.field("b", pa.null())),
        # a safe numeric cast into the planned dtype
        PLANNED.set(0, pa.field("a", pa.int16())),
        # a column neither x nor y reads may change its type
        PLANNED.set(2, pa.field("label", pa.int64())),
    ],
    ids=["same", "null type", "int16 into int32", "unread column"],
)
def test_an_unchanged_or_compatible_schema_passes(fetched: pa.Schema) -> None:
    check_result_schema(fetched, planned_layout(), lambda: "partition 0")


def test_a_float64_column_planned_for_nulls_may_arrive_as_float64() -> None:
    fetched = PLANNED.set(0, pa.field("a", pa.float64()))  # DolphinDB via pandas: ints with NULLs
    check_result_schema(fetched, planned_layout(as_float64=frozenset({"a"})), lambda: "partition 0")


def test_repeated_names_an_engine_renames_when_wrapped_are_matched_by_position() -> None:
    layout = planned_layout(
        x_names=("a", "a_1"),
        result_names=("a", "a_1", "y"),
        result_types=(pa.int32(), pa.int32(), pa.float64()),
    )
    renamed = pa.schema([("a", pa.int32()), ("a", pa.int32()), ("y", pa.float64())])
    check_result_schema(renamed, layout, lambda: "p")
    with pytest.raises(ValueError, match="returned column 'y' at position 0"):
        check_result_schema(
            pa.schema([("y", pa.float64()), ("a", pa.int32()), ("a", pa.int32())]), layout, lambda: "p"
        )


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_a_column_order_change_between_epochs_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    """Same column count, new order: by position the loader would feed 'b' under the name 'a'."""
    con.execute(
        "CREATE OR REPLACE TABLE swap AS SELECT i::DOUBLE AS a, -i::DOUBLE AS b, i * 0.5 AS y "
        "FROM range(6) r(i)"
    )
    with DDBDataLoader(con, "SELECT * FROM swap", batch_size=6, target_col="y") as loader:
        ((x, _),) = list(loader)
        assert x[:, 0].tolist() == [float(i) for i in range(6)]
        con.execute("CREATE OR REPLACE TABLE swap AS SELECT b, a, y FROM swap")
        with pytest.raises(ValueError, match=r"returned column 'b' at position 0, where planning saw 'a'"):
            list(loader)
    con.execute("DROP TABLE swap")


def test_a_sqlite_column_of_integers_then_floats_is_reported_as_mixed_types(tmp_path: Path) -> None:
    import functools
    import sqlite3

    path = tmp_path / "mixed.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (g INTEGER, x, y REAL)")
    # Planning samples the first 1000 rows (integers); the second group's x are floats.
    con.executemany(
        "INSERT INTO t VALUES (?, ?, ?)",
        [(i // 1500, i if i < 1500 else i + 0.5, float(i)) for i in range(3000)],
    )
    con.commit()
    con.close()
    with (
        warnings.catch_warnings(),
        DDBDataLoader(
            functools.partial(sqlite3.connect, path),
            "SELECT g, x, y FROM t ORDER BY y",
            "y",
            input_col=["x"],
            group_col="g",
            batch_size=500,
            fetch_bytes=0,
        ) as loader,
    ):
        warnings.simplefilter("ignore")  # the fetch unit's failure, retried partition by partition
        with pytest.raises(
            ValueError, match=r"column 'x' as double, where planning saw int64; the column holds"
        ):
            list(loader)
