"""Columns and dtypes: which columns become x and y, in what order, and as which tensor dtype."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
import torch

from ddbloader import DDBDataLoader

# Most queries here keep y in x without windows; test_target_stays_in_x_unless_excluded expects it.
pytestmark = pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")

ROWS = 6
NULL_ROWS = (0, 3)  # rows where the nullable columns hold NULL


@pytest.fixture(scope="module")
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    """``d``: one row per i in 0..5, one column per SQL type, each derived from i."""
    connection = duckdb.connect()
    connection.execute(
        f"""
        CREATE TABLE d AS SELECT
            i::INTEGER AS i32, i::BIGINT AS i64, i::SMALLINT AS i16, i::TINYINT AS i8, i::UBIGINT AS u64,
            i::HUGEINT AS huge, i * 0.5 AS f64, (i * 0.25)::FLOAT AS f32,
            CASE WHEN i IN {NULL_ROWS} THEN NULL ELSE i * 10 END::INTEGER AS inull,
            CASE WHEN i IN {NULL_ROWS} THEN NULL ELSE i * 10 END::BIGINT AS bnull,
            (i / 4)::DECIMAL(10, 2) AS dec, i % 2 = 0 AS flag,
            CASE WHEN i IN {NULL_ROWS} THEN NULL ELSE i % 2 = 1 END AS flagnull,
            'v' || i AS txt, DATE '2024-01-01' + i::INTEGER AS day,
            TIMESTAMP '2024-01-01' + INTERVAL (i) HOUR AS ts, ('b' || i)::BLOB AS raw, [i, i] AS pair
        FROM range({ROWS}) r(i)
        """
    )
    yield connection
    connection.close()


def load(db: duckdb.DuckDBPyConnection, sql: str = "SELECT * FROM d", **kwargs: Any) -> DDBDataLoader:
    return DDBDataLoader(db, sql, batch_size=ROWS, **kwargs)


def first_batch(loader: DDBDataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    with loader:
        batches = list(loader)
    assert len(batches) == 1
    return batches[0]


# --- dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "dtype", "values"),
    [
        (["i32"], torch.int32, [[i] for i in range(ROWS)]),
        (["i64"], torch.int64, [[i] for i in range(ROWS)]),
        (["i16", "i8"], torch.int16, [[i, i] for i in range(ROWS)]),
        (["i32", "f64"], torch.float32, [[i, i * 0.5] for i in range(ROWS)]),
        (["i32", "f32"], torch.float32, [[i, i * 0.25] for i in range(ROWS)]),
        (["f32"], torch.float32, [[i * 0.25] for i in range(ROWS)]),
        (["u64", "i64"], torch.float32, [[i, i] for i in range(ROWS)]),
        (["dec"], torch.float32, [[round(i / 4, 2)] for i in range(ROWS)]),
        (["huge"], torch.float32, [[i] for i in range(ROWS)]),
        (["flag"], torch.bool, [[i % 2 == 0] for i in range(ROWS)]),
        (["flag", "i8"], torch.int8, [[int(i % 2 == 0), i] for i in range(ROWS)]),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, list) and isinstance(v[0], str) else None,
)
def test_column_types_map_to_one_common_dtype(
    db: duckdb.DuckDBPyConnection, columns: list[str], dtype: torch.dtype, values: list[list[Any]]
) -> None:
    loader = load(db, target_col=columns[-1], input_col=columns)
    x, y = first_batch(loader)
    assert x.dtype == dtype
    assert x.tolist() == values
    assert y.tolist() == [row[-1:] for row in values]


@pytest.mark.parametrize(("column", "scale"), [("inull", 10), ("bnull", 10), ("flagnull", None)])
def test_integer_or_boolean_column_with_nulls_becomes_floating_with_nan(
    db: duckdb.DuckDBPyConnection, column: str, scale: int | None
) -> None:
    x, y = first_batch(load(db, target_col=column, input_col=[column, "i32"]))
    assert x.dtype == torch.float32
    assert y.dtype == torch.float32
    for i in range(ROWS):
        if i in NULL_ROWS:
            assert math.isnan(x[i, 0]) and math.isnan(y[i, 0])
        else:
            expected = i * scale if scale is not None else float(i % 2 == 1)
            assert x[i, 0].item() == y[i, 0].item() == expected
        assert x[i, 1].item() == i


def test_nulls_only_promote_the_tensor_that_holds_them(db: duckdb.DuckDBPyConnection) -> None:
    x, y = first_batch(load(db, target_col="i64", input_col=["inull", "i32"]))
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert y[:, 0].tolist() == list(range(ROWS))


def test_integer_column_without_nulls_in_a_nullable_query_stays_integer(
    db: duckdb.DuckDBPyConnection,
) -> None:
    # The nulls are filtered out by the query, so no row of the result has one.
    sql = f"SELECT inull FROM d WHERE i32 NOT IN {NULL_ROWS}"
    x, _ = first_batch(load(db, sql, target_col="inull", input_col="inull"))
    assert x.dtype == torch.int32
    assert x[:, 0].tolist() == [10, 20, 40, 50]


@pytest.mark.parametrize(
    ("dtype", "x_dtype", "y_dtype"),
    [
        (torch.float32, torch.float32, torch.float32),
        (torch.float16, torch.float16, torch.float16),
        ((torch.float32, torch.int64), torch.float32, torch.int64),
        ((None, torch.int16), torch.float32, torch.int16),
        (torch.float64, torch.float64, torch.float64),
        ("float32", torch.float32, torch.float32),
    ],
)
def test_dtype_override(
    db: duckdb.DuckDBPyConnection, dtype: Any, x_dtype: torch.dtype, y_dtype: torch.dtype
) -> None:
    x, y = first_batch(load(db, target_col="i32", input_col=["i32", "f64", "inull"], dtype=dtype))
    assert (x.dtype, y.dtype) == (x_dtype, y_dtype)
    assert x[:, 0].tolist() == list(range(ROWS))
    assert x[:, 1].tolist() == [i * 0.5 for i in range(ROWS)]
    assert [math.isnan(v) for v in x[:, 2].tolist()] == [i in NULL_ROWS for i in range(ROWS)]
    assert y[:, 0].tolist() == list(range(ROWS))


@pytest.mark.parametrize("default", [torch.float64, torch.float16])
def test_floating_columns_come_out_in_torchs_default_dtype(
    db: duckdb.DuckDBPyConnection, default: torch.dtype
) -> None:
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        x, y = first_batch(load(db, target_col="f64", input_col=["i32", "f32"]))
    finally:
        torch.set_default_dtype(before)
    assert (x.dtype, y.dtype) == (default, default)
    assert x[:, 1].tolist() == [i * 0.25 for i in range(ROWS)]


def test_floating_x_feeds_a_linear_layer_without_a_cast(db: duckdb.DuckDBPyConnection) -> None:
    x, y = first_batch(load(db, target_col="f64", input_col=["f64", "i32", "dec"]))
    assert torch.nn.Linear(3, 1)(x).shape == (ROWS, 1)
    assert y.dtype == torch.get_default_dtype()


def test_a_default_dtype_without_a_numpy_equivalent_is_refused_naming_the_way_out(
    db: duckdb.DuckDBPyConnection,
) -> None:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with pytest.raises(TypeError, match=r"default dtype torch.bfloat16 .* pass dtype=torch.float32"):
            load(db, target_col="f64", input_col=["i32"])
        x, _ = first_batch(load(db, target_col="f64", input_col=["i32"], dtype=torch.float32))
    finally:
        torch.set_default_dtype(before)
    assert x.dtype == torch.float32


# --- which columns ----------------------------------------------------------------------------

NON_NUMERIC = ["txt", "day", "ts", "raw", "pair"]


def test_unnamed_non_numeric_columns_are_left_out_with_one_warning(db: duckdb.DuckDBPyConnection) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = load(db, "SELECT i32, txt, f64, day, ts, raw, pair FROM d", target_col="f64")
    ours = [w for w in caught if "non-numeric" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    for name in NON_NUMERIC:
        assert repr(name) in message
    assert ours[0].filename == __file__  # points at the caller's line
    x, y = first_batch(loader)
    assert loader.plan.layout.x_names == ("i32",)  # without windows the target is not in x
    assert x.tolist() == [[i] for i in range(ROWS)]
    assert y.tolist() == [[i * 0.5] for i in range(ROWS)]


@pytest.mark.filterwarnings("error")
def test_excluding_the_non_numeric_columns_silences_the_warning(db: duckdb.DuckDBPyConnection) -> None:
    loader = load(
        db,
        "SELECT i32, txt, f64, day FROM d ORDER BY i32",
        target_col="f64",
        exclude_col=["txt", "day"],
        window_size=2,
    )
    assert loader.plan.layout.x_names == ("i32", "f64")
    loader.close()


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    ("kwargs", "x_names"),
    [
        ({}, ("i32",)),
        ({"exclude_col": "f64"}, ("i32",)),
        ({"input_col": ["i32", "f64"]}, ("i32", "f64")),  # DolphinDB's rule, one argument away
        ({"window_size": 2}, ("i32", "f64")),  # with windows the target's past is a feature
    ],
    ids=["default", "excluded", "named", "windowed"],
)
def test_without_windows_the_target_is_in_x_only_when_input_col_names_it(
    db: duckdb.DuckDBPyConnection, kwargs: dict[str, Any], x_names: tuple[str, ...]
) -> None:
    loader = load(db, "SELECT i32, f64 FROM d ORDER BY i32", target_col="f64", **kwargs)
    assert loader.plan.layout.x_names == x_names
    x, y = first_batch(loader)
    if "window_size" not in kwargs:
        assert x.tolist() == [[i, i * 0.5][: len(x_names)] for i in range(ROWS)]
        assert y.tolist() == [[i * 0.5] for i in range(ROWS)]


def test_a_query_of_only_the_target_says_how_to_feed_it(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"x has no columns.*name it in input_col"):
        load(db, "SELECT f64 FROM d", target_col="f64")


@pytest.mark.parametrize("parameter", ["input_col", "target_col"])
@pytest.mark.parametrize(
    ("column", "type_name"),
    [("txt", "string"), ("day", "date32"), ("ts", "timestamp"), ("raw", "binary"), ("pair", "list")],
)
def test_named_non_numeric_column_is_a_type_error(
    db: duckdb.DuckDBPyConnection, parameter: str, column: str, type_name: str
) -> None:
    kwargs: dict[str, Any] = {"target_col": "i32", "input_col": ["i32"]}
    kwargs[parameter] = [column] if parameter == "input_col" else column
    with pytest.raises(TypeError, match=rf"{parameter} names '{column}' of type {type_name}.*not numeric"):
        load(db, **kwargs)


@pytest.mark.parametrize("grouped", [{}, {"group_col": "i16"}], ids=["ungrouped", "group_col"])
@pytest.mark.parametrize(
    ("kwargs", "parameter", "bad", "close"),
    [
        ({"target_col": "nope"}, "target_col", "nope", None),
        ({"target_col": ["i32", "f46"]}, "target_col", "f46", "f64"),
        ({"target_col": "i32", "input_col": ["i32", "f6"]}, "input_col", "f6", "f64"),
        ({"target_col": "i32", "exclude_col": ["i_32"]}, "exclude_col", "i_32", "i32"),
        ({"target_col": "i32", "key_col": ["i326"]}, "key_col", "i326", "i32"),
        ({"target_col": "I32"}, "target_col", "I32", "i32"),  # names are case-sensitive
    ],
)
def test_unknown_column_is_a_value_error_naming_the_argument_and_the_closest_column(
    db: duckdb.DuckDBPyConnection,
    kwargs: dict[str, Any],
    parameter: str,
    bad: str,
    close: str | None,
    grouped: dict[str, Any],
) -> None:
    """The same error with or without group_col (it used to blame group_col, as a ValueError)."""
    hint = rf" \(did you mean '{close}'\?\)" if close else ""
    message = rf"^{parameter} names '{bad}'{hint}, which is not a column of the query"
    with pytest.raises(ValueError, match=message):
        load(db, "SELECT i16, i32, f64 FROM d", **kwargs, **grouped)


@pytest.mark.parametrize("grouped", [{}, {"group_col": "i16"}], ids=["ungrouped", "group_col"])
def test_a_named_string_column_is_a_type_error_with_or_without_group_col(
    db: duckdb.DuckDBPyConnection, grouped: dict[str, Any]
) -> None:
    with pytest.raises(TypeError, match=r"^input_col names 'txt' of type string, which is not numeric"):
        load(db, "SELECT i16, i32, txt FROM d", target_col="i32", input_col=["txt"], **grouped)


def test_column_order_follows_input_col(db: duckdb.DuckDBPyConnection) -> None:
    loader = load(db, target_col=["f64", "i32"], input_col=["f64", "i16", "i32"])
    x, y = first_batch(loader)
    assert loader.plan.layout.x_names == ("f64", "i16", "i32")
    assert loader.plan.layout.y_names == ("f64", "i32")
    assert x.tolist() == [[i * 0.5, i, i] for i in range(ROWS)]
    assert y.tolist() == [[i * 0.5, i] for i in range(ROWS)]


def test_column_order_follows_the_query_without_input_col(db: duckdb.DuckDBPyConnection) -> None:
    loader = load(db, "SELECT f64, i16, i32 FROM d", target_col="i32")
    x, _ = first_batch(loader)
    assert loader.plan.layout.x_names == ("f64", "i16")
    assert x.tolist() == [[i * 0.5, i] for i in range(ROWS)]


def test_target_stays_in_x_with_windows_unless_excluded(db: duckdb.DuckDBPyConnection) -> None:
    kept = load(db, "SELECT i32, f64 FROM d ORDER BY i32", target_col="f64", window_size=2)
    assert kept.plan.layout.x_names == ("i32", "f64")
    kept.close()
    dropped = load(db, "SELECT i32, f64 FROM d", target_col="f64", exclude_col="f64")
    x, y = first_batch(dropped)
    assert dropped.plan.layout.x_names == ("i32",)
    assert x.tolist() == [[i] for i in range(ROWS)]
    assert y.tolist() == [[i * 0.5] for i in range(ROWS)]
    with pytest.warns(UserWarning, match="exclude_col=\\['f64'\\] is ignored because input_col is given"):
        named = load(
            db, "SELECT i32, f64 FROM d", target_col="f64", input_col=["f64", "i32"], exclude_col=["f64"]
        )
    assert named.plan.layout.x_names == ("f64", "i32")  # as in DolphinDB: input_col wins
    named.close()


def test_excluding_every_column_leaves_x_empty_and_is_refused(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"x has no columns"):
        load(db, "SELECT i32, f64 FROM d", target_col="f64", exclude_col=["i32", "f64"])


def test_a_column_the_query_returns_twice_loads_under_the_planned_names(
    db: duckdb.DuckDBPyConnection,
) -> None:
    # DuckDB names the second `i32` `i32_1` once the query is wrapped (as planning wraps it); the
    # partitions, fetched unwrapped, must still line up with those names.
    loader = load(db, "SELECT i32, i32 * 2, i32, f64 FROM d ORDER BY i32", target_col="i32_1")
    assert loader.plan.layout.x_names == ("i32", "(i32 * 2)", "f64")
    x, y = first_batch(loader)
    assert x.tolist() == [[i, 2 * i, i * 0.5] for i in range(ROWS)]
    assert y.tolist() == [[i] for i in range(ROWS)]


# --- columns that hold a tensor per row -------------------------------------------------------

ARRAYS_SQL = (
    "SELECT [i, 10 * i]::INTEGER[2] AS v, [[i, i + 1], [i + 2, i + 3], [i + 4, i + 5]]::DOUBLE[2][3] AS m, "
    "i * 0.5 AS f FROM range(6) r(i) ORDER BY i"
)


STACK_SQL = (
    "SELECT i, [i, i + 0.5, i + 0.25]::DOUBLE[3] AS bid, [-i, -i - 0.5, -i - 0.25]::DOUBLE[3] AS ask, "
    "[10 * i, 10 * i + 1]::DOUBLE[2] AS two, [i, 2 * i, 3 * i]::DOUBLE[3] AS label, i * 0.5 AS f "
    "FROM range(6) r(i) ORDER BY i"
)


def test_array_columns_stack_into_columns_by_length_as_dolphindb_shapes_them(
    db: duckdb.DuckDBPyConnection,
) -> None:
    """C array columns of length L: x [B, C, L] without windows, [B, W, C, L] with; y likewise."""
    plain = load(db, STACK_SQL, target_col="label", input_col=["bid", "ask"])
    assert (plain.plan.layout.x_shape, plain.plan.layout.y_shape) == ((2, 3), (1, 3))
    x, y = first_batch(plain)
    assert x.shape == (ROWS, 2, 3) and y.shape == (ROWS, 1, 3)
    assert x[4].tolist() == [[4, 4.5, 4.25], [-4, -4.5, -4.25]]
    assert y[4, 0].tolist() == [4, 8, 12]
    windowed = load(db, STACK_SQL, target_col="label", input_col=["ask", "bid"], window_size=2)
    x, y = first_batch(windowed)
    assert x.shape == (ROWS - 2, 2, 2, 3) and y.shape == (ROWS - 2, 1, 1, 3)
    assert x[1, 1].tolist() == [[-2, -2.5, -2.25], [2, 2.5, 2.25]]  # column order follows input_col
    assert y[1, 0, 0].tolist() == [3, 6, 9]
    assert "x: [6, 2, 2, 3] float32" in repr(windowed)


def test_array_and_scalar_columns_do_not_mix(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"x mixes array columns \['bid'\] with scalar columns \['f'\]"):
        load(db, STACK_SQL, target_col="label", input_col=["bid", "f"])
    with pytest.raises(ValueError, match=r"y mixes array columns \['label'\] with scalar columns \['f'\]"):
        load(db, STACK_SQL, target_col=["label", "f"], input_col=["bid"])


def test_array_columns_of_different_lengths_do_not_stack(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"different lengths \{'bid': 3, 'two': 2\}"):
        load(db, STACK_SQL, target_col="label", input_col=["bid", "two"])


def test_a_variable_length_list_column_is_refused_with_the_cast_that_fixes_it(
    db: duckdb.DuckDBPyConnection,
) -> None:
    with pytest.raises(TypeError, match=r"variable-length lists.*CAST\(pair AS DOUBLE\[L\]\)"):
        load(db, target_col="f64", input_col=["pair"])


def test_a_matrix_column_keeps_its_shape_per_sample(db: duckdb.DuckDBPyConnection) -> None:
    loader = load(db, ARRAYS_SQL, target_col="v", input_col="m", window_size=[2, 1])
    assert (loader.plan.layout.x_shape, loader.plan.layout.y_shape) == ((3, 2), (1, 2))
    with loader:
        x, y = next(iter(loader))
    assert x.shape == (4, 2, 3, 2) and y.shape == (4, 1, 1, 2)
    assert x[1, 1].tolist() == [[2, 3], [4, 5], [6, 7]]  # row 2 of the second sample's window
    assert y[1, 0, 0].tolist() == [3, 30]


def test_a_matrix_column_must_be_the_only_column_of_its_tensor(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"x combines 'm', which holds a \[3, 2\] tensor per row"):
        load(db, ARRAYS_SQL, target_col="f", input_col=["m", "f"])


def test_a_null_array_row_is_refused(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT CASE WHEN i = 2 THEN NULL ELSE [i, i]::INTEGER[2] END AS v, i * 1.0 AS f FROM range(4) r(i)"
    with (
        load(db, sql, target_col="f", input_col="v") as loader,
        pytest.raises(ValueError, match=r"'v'.*NULL rows"),
    ):
        list(loader)
