"""Partition transforms: derived columns in the fetch threads, the ready-made helpers, collate."""

from __future__ import annotations

import pickle
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from conftest import SERIES_SQL, FaultyBackend, make_series
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader
from ddbloader.backends import DuckDBBackend
from ddbloader.transforms import (
    Stats,
    cast,
    column_stats,
    columns_to_table,
    one_hot,
    standardize,
    table_to_tensors,
    tensors,
)

Batch = tuple[torch.Tensor, torch.Tensor]
SPLIT = {"group_col": "gid", "repartition_col": "part"}


def batches(loader: DDBDataLoader) -> list[Batch]:
    return [(x.clone(), y.clone()) for x, y in loader]


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa.nan_to_num(-7.0), xb.nan_to_num(-7.0)) and torch.equal(ya, yb)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )


# --- module-level transforms (picklable) -----------------------------------------------------


def diff_f0(table: pa.Table) -> pa.Table:
    """d0 = f0 - previous f0 within the partition (NULL on a partition's first row)."""
    f0 = table.column("f0").combine_chunks()
    previous = pa.concat_arrays([pa.nulls(min(len(f0), 1), pa.float64()), f0.slice(0, max(len(f0) - 1, 0))])
    return table.append_column("d0", pc.subtract(f0, previous))


def diff_f0_tensors(columns: dict[str, Any]) -> dict[str, Any]:
    f0 = columns["f0"]
    d0 = torch.full_like(f0, float("nan"))
    d0[1:] = f0[1:] - f0[:-1]
    return {**columns, "d0": d0}


def partition_firsts(parts: Sequence[Sequence[int]]) -> set[float]:
    """rid (= f0) of the first row of every partition."""
    firsts: set[float] = set()
    for gid, sizes in enumerate(parts):
        for offset in np.cumsum([0, *sizes[:-1]]):
            firsts.add(float(gid * 1_000_000 + offset))
    return firsts


def expected_starts(parts: Sequence[Sequence[int]], span: int, stride: int) -> Counter[float]:
    starts: Counter[float] = Counter()
    for gid, sizes in enumerate(parts):
        rows = sum(sizes)
        for s in range(0, rows - span + 1, stride):
            starts[float(gid * 1_000_000 + s)] += 1
    return starts


# --- the pull model: derived columns, coverage, determinism ----------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:samples need")
@settings(max_examples=30, deadline=None)
@given(
    parts=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=3),
    window=st.integers(1, 4),
    stride=st.integers(1, 3),
    batch_size=st.integers(1, 7),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    threads=st.integers(1, 3),
    tensor_form=st.booleans(),
)
def test_a_derived_column_is_partition_local_and_every_sample_comes_once_deterministically(
    parts: list[list[int]],
    window: int,
    stride: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
    threads: int,
    tensor_form: bool,
) -> None:
    # a loader that can make no sample is refused at construction (tests/test_plan.py)
    assume(any(sum(sizes) > window for sizes in parts))
    connection = duckdb.connect()
    make_series(connection, parts)
    transform = tensors(diff_f0_tensors) if tensor_form else diff_f0

    def load() -> DDBDataLoader:
        return DDBDataLoader(
            connection,
            SERIES_SQL,
            "y",
            batch_size,
            shuffle,
            window,
            stride,
            input_col=["f0", "d0"],
            seed=seed,
            fetch_threads=threads,
            transform=transform,
            **SPLIT,
        )

    with load() as first, load() as second:
        run = batches(first)
        assert same(run, batches(second))
    span = window + 1
    assert Counter(float(x[i, 0, 0]) for x, _ in run for i in range(len(x))) == expected_starts(
        parts, span, stride
    )
    firsts = partition_firsts(parts)
    for x, _ in run:
        f0, d0 = x[..., 0].flatten().tolist(), x[..., 1].flatten().tolist()
        for rid, derived in zip(f0, d0, strict=True):
            # The lag restarts at every repartition, although the window runs across it.
            assert np.isnan(derived) if rid in firsts else derived == 1.0
    connection.close()


def test_a_lag_computed_in_a_cte_crosses_repartition_boundaries(
    series: duckdb.DuckDBPyConnection,
) -> None:
    sql = (
        "WITH t AS (SELECT *, f0 - LAG(f0) OVER (PARTITION BY gid ORDER BY pos) AS d0 FROM series) "
        "SELECT * FROM t ORDER BY gid, pos"
    )
    with DDBDataLoader(series, sql, "y", 100, input_col=["f0", "d0"], **SPLIT) as loader:
        x = torch.cat([x for x, _ in loader])
    group_firsts = {0.0, 1_000_000.0, 2_000_000.0}
    for rid, derived in x.tolist():
        assert np.isnan(derived) if rid in group_firsts else derived == 1.0


def test_transforms_run_in_the_fetch_threads(series: duckdb.DuckDBPyConnection) -> None:
    threads: list[str] = []

    def record(table: pa.Table) -> pa.Table:
        threads.append(threading.current_thread().name)
        return table

    with DDBDataLoader(series, SERIES_SQL, "y", 4, transform=record, input_col="f0", **SPLIT) as loader:
        planning = list(threads)
        assert len(list(loader)) == len(loader)
    assert planning == ["MainThread"]  # the probe on the empty result
    fetched = threads[1:]
    assert len(fetched) == loader.plan.partitions
    assert all(name.startswith("ddbloader-fetch") for name in fetched)


def test_a_transform_list_runs_in_order(series: duckdb.DuckDBPyConnection) -> None:
    def double_f0(table: pa.Table) -> pa.Table:
        return table.set_column(table.column_names.index("f0"), "f0", pc.multiply(table.column("f0"), 2))

    sql = "SELECT * FROM series WHERE gid = 0 ORDER BY pos"
    with DDBDataLoader(
        series, sql, "y", 100, input_col=["f0", "d0"], transform=[double_f0, diff_f0]
    ) as loader:
        (x, _), *_ = list(loader)
    assert x[1:, 1].tolist() == [2.0] * (len(x) - 1)  # d0 saw the doubled f0
    assert "double_f0, " in loader.plan.layout.transform.name  # type: ignore[union-attr]


def fail_on_group_one(table: pa.Table) -> pa.Table:
    if table.num_rows and table.column("gid")[0].as_py() == 1:
        raise ArithmeticError("bad partition")
    return table


def test_a_failing_transform_names_itself_and_the_partition(series: duckdb.DuckDBPyConnection) -> None:
    loader = DDBDataLoader(series, SERIES_SQL, "y", 4, input_col="f0", transform=fail_on_group_one, **SPLIT)
    with loader, pytest.raises(ArithmeticError, match="bad partition") as info:
        list(loader)
    notes = "\n".join(info.value.__notes__)
    assert "transform fail_on_group_one" in notes
    assert "of group 1 " in notes and "partition" in notes


def test_a_transform_that_fails_on_every_partition_fails_planning_naming_the_probe(
    series: duckdb.DuckDBPyConnection,
) -> None:
    def broken(table: pa.Table) -> pa.Table:
        return table.append_column("z", table.column("no_such_column"))

    with pytest.raises(KeyError) as info:
        DDBDataLoader(series, SERIES_SQL, "y", 4, transform=broken, **SPLIT)
    notes = "\n".join(info.value.__notes__)
    assert "transform " in notes and "broken" in notes
    assert "probing" in notes and "subquery" in notes


def test_a_transform_that_needs_rows_is_probed_on_the_smallest_partition(
    series: duckdb.DuckDBPyConnection,
) -> None:
    probed: list[int] = []

    def width_from_data(table: pa.Table) -> dict[str, Any]:
        if table.num_rows == 0:
            raise ValueError("needs rows")
        probed.append(table.num_rows)
        width = int(table.column("gid")[0].as_py()) * 0 + 3  # known only from rows
        f0 = torch.tensor(table.column("f0").to_numpy())
        return {
            "wide": f0[:, None].expand(-1, width).clone(),
            "y": torch.tensor(table.column("y").to_numpy()),
        }

    with DDBDataLoader(
        series, SERIES_SQL, "y", 5, input_col="wide", transform=width_from_data, **SPLIT
    ) as loader:
        assert loader.plan.layout.x_shape == (3,)
        assert probed == [6]  # the smallest partition of the fixture has 6 rows
        x, _ = next(iter(loader))
    assert x.shape == (5, 3)
    assert torch.equal(x[:, 0], x[:, 2])


def test_an_empty_query_with_a_transform_that_needs_rows_fails_clearly(
    con: duckdb.DuckDBPyConnection,
) -> None:
    make_series(con, [[3]])

    def needs_rows(table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            raise ValueError("needs rows")
        return table

    with pytest.raises(ValueError, match="needs rows") as info:
        DDBDataLoader(con, "SELECT * FROM series WHERE false", "y", transform=needs_rows, input_col="f0")
    assert any("the query has no rows" in note for note in info.value.__notes__)


def keep_half(table: pa.Table) -> pa.Table:
    return table.slice(0, table.num_rows // 2)


@pytest.mark.parametrize("step", [keep_half, tensors(lambda c: {k: v[:1] for k, v in c.items()})])
def test_a_transform_must_keep_every_row(series: duckdb.DuckDBPyConnection, step: Any) -> None:
    loader = DDBDataLoader(series, SERIES_SQL, "y", 4, input_col="f0", transform=step, **SPLIT)
    with loader, pytest.raises(ValueError, match="must keep every row"):
        list(loader)


def test_a_transform_must_return_a_table_or_columns(series: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(TypeError, match="must return an Arrow table or a dict"):
        DDBDataLoader(series, SERIES_SQL, "y", transform=lambda table: table.to_pandas(), input_col="f0")


def test_a_per_row_shape_that_changes_between_partitions_is_refused(
    series: duckdb.DuckDBPyConnection,
) -> None:
    def width_by_group(table: pa.Table) -> dict[str, Any]:
        width = 1 + (int(table.column("gid")[0].as_py()) if table.num_rows else 0)
        y = torch.tensor(table.column("y").to_numpy())
        return {"v": y[:, None].expand(-1, width).clone(), "y": y}

    loader = DDBDataLoader(series, SERIES_SQL, "y", 4, input_col="v", transform=width_by_group, **SPLIT)
    assert loader.plan.layout.x_shape == (1,)
    with loader, pytest.raises(ValueError, match=r"per-row shape \[2\], but planning saw \[1\]") as info:
        list(loader)
    assert any("width_by_group" in note for note in info.value.__notes__)


def test_nulls_in_a_derived_integer_column_are_refused_by_name(series: duckdb.DuckDBPyConnection) -> None:
    def lagged_pos(table: pa.Table) -> pa.Table:
        pos = table.column("pos").combine_chunks()
        lagged = pa.concat_arrays(
            [pa.nulls(min(len(pos), 1), pa.int64()), pos.slice(0, max(len(pos) - 1, 0))]
        )
        return table.append_column("prev", lagged)

    loader = DDBDataLoader(series, SERIES_SQL, "y", 4, input_col="prev", transform=lagged_pos, **SPLIT)
    assert loader.plan.layout.x_dtype == np.int64
    with loader, pytest.raises(ValueError, match=r"column 'prev' \(int64\) holds NULL values"):
        list(loader)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (42, TypeError, "must be a callable"),
        ([], ValueError, "empty list"),
        ([diff_f0, "x"], TypeError, "'x'"),
    ],
)
def test_transform_argument_is_validated(
    series: duckdb.DuckDBPyConnection, value: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        DDBDataLoader(series, SERIES_SQL, "y", transform=value)


def test_a_loader_with_transforms_pickles(tmp_path: Path) -> None:
    path = tmp_path / "series.duckdb"
    with duckdb.connect(str(path)) as connection:
        make_series(connection, [[5, 6], [7]])
    transform = [diff_f0, standardize("f1", {"f1": (0.0, 2.0)}), one_hot("gid", 2), cast(torch.float32)]
    loader = DDBDataLoader(
        str(path), SERIES_SQL, "gid", 3, True, input_col=["d0", "f1"], seed=3, transform=transform
    )
    copy = pickle.loads(pickle.dumps(loader))
    with loader, copy:
        assert same(batches(loader), batches(copy))
        assert copy.plan.layout.y_shape == (2,)


# --- one_hot -----------------------------------------------------------------------------------


def test_one_hot_makes_y_a_vector_per_sample(series: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT gid, f0 FROM series ORDER BY gid, pos"
    with DDBDataLoader(series, sql, "gid", 200, input_col="f0", transform=one_hot("gid", 3)) as loader:
        assert loader.plan.layout.y_shape == (3,)
        ((x, y),) = list(loader)
    assert y.dtype == torch.float32 and y.shape == (len(x), 3)
    gids = (x[:, 0] // 1_000_000).long()
    assert torch.equal(y, torch.nn.functional.one_hot(gids, 3).float())


@pytest.mark.parametrize("form", ["arrow", "tensors"])
def test_one_hot_works_on_both_forms_and_can_add_a_column(form: str) -> None:
    table = pa.table({"label": pa.array([2, 0, 1], pa.int32())})
    step = one_hot("label", 3, name="onehot", dtype=torch.int64)
    frame: Any = table if form == "arrow" else table_to_tensors(table)
    out = step(frame)
    columns = table_to_tensors(out) if form == "arrow" else out
    assert columns["label"].tolist() == [2, 0, 1]
    assert columns["onehot"].tolist() == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert columns["onehot"].dtype == torch.int64


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ([0, 3], "holds label 3, outside"),
        ([0, -1], "holds label -1"),
        ([0, None], "NULL/NaN"),
        ([0.5], "non-integer"),
    ],
)
def test_one_hot_refuses_bad_labels(labels: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        one_hot("label", 3)(pa.table({"label": labels}))


def test_one_hot_out_of_range_fails_the_epoch_naming_the_step_and_the_partition(
    series: duckdb.DuckDBPyConnection,
) -> None:
    loader = DDBDataLoader(series, SERIES_SQL, "gid", 4, input_col="f0", transform=one_hot("gid", 2), **SPLIT)
    with loader, pytest.raises(ValueError, match=r"one_hot\('gid', 2\).*holds label 2") as info:
        list(loader)
    assert any("of group 2 " in note for note in info.value.__notes__)


# --- standardize and column_stats ------------------------------------------------------------


def test_column_stats_is_one_aggregate_over_the_whole_query(series: duckdb.DuckDBPyConnection) -> None:
    backend = FaultyBackend(DuckDBBackend(series))
    backend.planning = False  # count every query
    stats = column_stats(backend, SERIES_SQL, ["f0", "y", "pos"])
    assert backend.fetches == 1
    f0 = series.execute("SELECT f0 FROM series").fetchnumpy()["f0"]
    assert stats["f0"] == pytest.approx(Stats(float(f0.mean()), float(f0.std()), len(f0)))
    assert stats["pos"].n == len(f0)
    series.execute("SELECT 1")  # the caller's connection is still open


def test_column_stats_refuses_a_writing_query_and_names_a_failing_aggregate(
    series: duckdb.DuckDBPyConnection,
) -> None:
    with pytest.raises(ValueError, match="read-only"):
        column_stats(series, "DELETE FROM series", "f0")
    with pytest.raises(duckdb.BinderException) as info:
        column_stats(series, SERIES_SQL, "nope")
    assert any("computing column statistics" in note for note in info.value.__notes__)
    with pytest.raises(ValueError, match="no non-NULL value"):
        column_stats(series, "SELECT NULL::DOUBLE AS v", "v")


def test_standardize_uses_the_global_stats_in_every_partition(series: duckdb.DuckDBPyConnection) -> None:
    stats = column_stats(series, SERIES_SQL, ["f0", "pos"])
    transform = standardize(["f0", "pos"], stats)
    with DDBDataLoader(
        series, SERIES_SQL, "y", 1000, input_col=["f0", "pos"], transform=transform, **SPLIT
    ) as loader:
        ((x, _),) = list(loader)
    assert x.dtype == torch.float32
    assert x.mean(0).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert x.std(0, unbiased=False).tolist() == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("form", ["arrow", "tensors"])
def test_standardize_keeps_float32_and_leaves_a_constant_column_centred(form: str) -> None:
    table = pa.table({"a": pa.array([1.0, 3.0], pa.float32()), "c": pa.array([5, 5], pa.int32())})
    step = standardize(["a", "c"], {"a": (2.0, 1.0), "c": Stats(5.0, 0.0, 2)})
    out = step(table if form == "arrow" else table_to_tensors(table))
    columns = table_to_tensors(out) if form == "arrow" else out
    assert columns["a"].dtype == torch.float32 and columns["a"].tolist() == [-1.0, 1.0]
    assert columns["c"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("stats", "match"),
    [({}, "no entry for column 'a'"), ({"a": (0.0, -1.0)}, "std -1.0"), ({"a": (float("nan"), 1)}, "finite")],
)
def test_standardize_validates_its_stats(stats: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        standardize("a", stats)


# --- cast and the two forms -------------------------------------------------------------------


@pytest.mark.parametrize("form", ["arrow", "tensors"])
def test_cast_changes_the_numeric_columns_and_leaves_the_others(form: str) -> None:
    table = pa.table({"f": [1.7, -2.2], "i": pa.array([1, 2], pa.int8()), "s": ["a", "b"]})
    out = cast(torch.int32)(table if form == "arrow" else table_to_tensors(table))
    columns = table_to_tensors(out) if form == "arrow" else out
    assert columns["f"].dtype == columns["i"].dtype == torch.int32
    assert columns["f"].tolist() == [1, -2]  # truncates, like Tensor.to
    assert columns["s"] == ["a", "b"]
    only = cast("float16", "i")(table)
    assert only.schema.field("i").type == pa.float16() and only.schema.field("f").type == pa.float64()


def test_the_two_forms_convert_both_ways_keeping_shapes_and_nulls() -> None:
    image = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 1, 3, 4)
    columns = {
        "img": torch.from_numpy(image),
        "vec": np.array([[1.0, 2.0], [3.0, 4.0]]),
        "n": torch.tensor([1, 2]),
        "s": ["a", None],
    }
    table = columns_to_table(columns)
    assert isinstance(table.schema.field("img").type, pa.FixedShapeTensorType)
    assert pa.types.is_fixed_size_list(table.schema.field("vec").type)
    back = table_to_tensors(table)
    assert torch.equal(back["img"], columns["img"]) and back["vec"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert back["n"].tolist() == [1, 2] and back["s"] == ["a", None]
    with_null = table_to_tensors(pa.table({"i": pa.array([1, None], pa.int32())}))
    assert with_null["i"].dtype == torch.float64 and with_null["i"][1].isnan()


# --- collate ------------------------------------------------------------------------------------


def test_collate_runs_on_every_assembled_batch_in_the_background(series: duckdb.DuckDBPyConnection) -> None:
    threads: set[str] = set()

    def scale(batch: Batch) -> Batch:
        threads.add(threading.current_thread().name)
        x, y = batch
        return x * 10, y[..., 0]

    with DDBDataLoader(
        series, SERIES_SQL, "y", 8, window_size=2, input_col="f0", collate=scale
    ) as with_collate:
        changed = batches(with_collate)
    with DDBDataLoader(series, SERIES_SQL, "y", 8, window_size=2, input_col="f0") as plain:
        reference = batches(plain)
    assert len(changed) == len(reference) == len(with_collate)
    for (x, y), (rx, ry) in zip(changed, reference, strict=True):
        assert torch.equal(x, rx * 10) and torch.equal(y, ry[..., 0])
    assert threads == {"ddbloader-assemble"}


@pytest.mark.parametrize(
    ("collate", "error", "match"),
    [
        (lambda batch: 1 / 0, ZeroDivisionError, "division"),
        (lambda batch: batch[0], TypeError, "must return an \\(x, y\\) pair"),
        (lambda batch: (batch[0], "y"), TypeError, "must return an \\(x, y\\) pair"),
    ],
)
def test_a_failing_collate_names_itself(
    series: duckdb.DuckDBPyConnection, collate: Callable[[Batch], Any], error: type[Exception], match: str
) -> None:
    loader = DDBDataLoader(series, SERIES_SQL, "y", 8, input_col="f0", collate=collate)
    with loader, pytest.raises(error, match=match) as info:
        list(loader)
    assert "collate" in str(info.value) + "".join(getattr(info.value, "__notes__", []))


def test_collate_must_be_callable(series: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(TypeError, match="collate must be a callable"):
        DDBDataLoader(series, SERIES_SQL, "y", collate="stack")
