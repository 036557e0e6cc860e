"""Argument handling: DolphinDB aliases, unknown keywords, and clear errors for bad input.

Every loader here is real: it plans against an in-memory DuckDB table, so an alias that maps to
the wrong parameter or a check that runs too late shows up as a wrong plan or a wrong error.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pytest
import torch

from ddbloader import DDB_ALIASES, DDBDataLoader
from tests.conftest import SERIES_SQL, make_series

pytestmark = [
    pytest.mark.filterwarnings("error"),
    # Most loaders here keep y in x without windows; tests/test_columns.py checks that warning.
    pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning"),
]


@pytest.fixture(scope="module")
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    make_series(connection, [[6, 5, 4], [7, 3], [5, 5, 5]])
    yield connection
    connection.close()


def load(db: duckdb.DuckDBPyConnection, **kwargs: Any) -> DDBDataLoader:
    kwargs.setdefault("target_col", "y")
    return DDBDataLoader(db, SERIES_SQL, **kwargs)


def batches(loader: DDBDataLoader) -> list[tuple[list[Any], list[Any]]]:
    with loader:
        return [(x.tolist(), y.tolist()) for x, y in loader]


# (alias, value, extra snake_case arguments it needs, config attribute(s) and expected value(s))
ALIAS_CASES: list[tuple[str, Any, dict[str, Any], dict[str, Any]]] = [
    ("targetCol", ["y", "f0"], {"target_col": None}, {"target_col": ("y", "f0")}),
    ("batchSize", 4, {}, {"batch_size": 4}),
    ("windowSize", [3, 2], {}, {"windowed": True, "x_window": 3, "y_window": 2, "offset": 3}),
    ("windowStride", 2, {"window_size": 2}, {"stride": 2}),
    ("inputCol", ["f1", "f0"], {}, {"input_col": ("f1", "f0")}),
    ("excludeCol", ["rid", "pos"], {}, {"exclude_col": ("rid", "pos")}),
    ("repartitionCol", "part", {}, {"repartition_col": "part", "repartition_scheme": None}),
    ("repartitionScheme", [2, 0], {"repartition_col": "part"}, {"repartition_scheme": (2, 0)}),
    ("groupCol", "gid", {}, {"group_col": "gid", "group_scheme": None}),
    ("groupScheme", [2, 1], {"group_col": "gid"}, {"group_scheme": (2, 1)}),
    ("dropLast", True, {}, {"drop_last": True}),
    ("prefetchBatch", 3, {}, {"prefetch_batch": 3}),
    ("prepartitionNum", 4, {}, {"prepartition_num": 4}),
    ("groupPoolSize", 5, {}, {"group_pool_size": 5}),
]


def test_alias_table_covers_every_alias() -> None:
    # ddbSession (the source) has its own test below
    assert {case[0] for case in ALIAS_CASES} | {"ddbSession"} == set(DDB_ALIASES)
    parameters = inspect.signature(DDBDataLoader.__init__).parameters
    for alias, name in DDB_ALIASES.items():
        assert name in parameters, f"{alias} maps to {name}, which DDBDataLoader does not take"


@pytest.mark.parametrize(
    ("alias", "value", "extra", "expected"), ALIAS_CASES, ids=[c[0] for c in ALIAS_CASES]
)
def test_alias_sets_its_parameter(
    db: duckdb.DuckDBPyConnection, alias: str, value: Any, extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    with load(db, **extra, **{alias: value}) as loader:
        for attribute, wanted in expected.items():
            assert getattr(loader.config, attribute) == wanted, attribute


def test_alias_plan_matches_snake_case(db: duckdb.DuckDBPyConnection) -> None:
    snake: dict[str, Any] = {
        "batch_size": 3,
        "window_size": [3, 2],
        "window_stride": 2,
        "input_col": ["f0", "rid"],
        "repartition_col": "part",
        "repartition_scheme": [2, 1, 0],
        "group_col": "gid",
        "group_scheme": [2, 0],
        "drop_last": True,
        "prefetch_batch": 2,
        "prepartition_num": 2,
        "group_pool_size": 2,
    }
    camel = {name: snake[key] for name, key in DDB_ALIASES.items() if key in snake}
    a = load(db, seed=7, shuffle=True, **snake)
    b = DDBDataLoader(db, SERIES_SQL, targetCol="y", seed=7, shuffle=True, **camel)
    assert a.config == b.config
    assert len(a) == len(b) > 0
    assert batches(a) == batches(b)


@pytest.mark.parametrize(
    ("keyword", "suggestion"),
    [
        ("batchsize", "batch_size"),
        ("window_sizes", "window_size"),
        ("groupcol", "group_col"),
        ("drop_lst", "drop_last"),
        ("pinMemory", "pin_memory"),
        ("prefetch", "prefetchBatch"),
        ("sampler", None),
        ("collate_fn", "collate"),
    ],
)
def test_unknown_keyword_is_refused_with_a_suggestion(
    db: duckdb.DuckDBPyConnection, keyword: str, suggestion: str | None
) -> None:
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'") as info:
        load(db, **{keyword: 1})
    if suggestion is None:
        assert "did you mean" not in str(info.value)
    else:
        assert f"did you mean '{suggestion}'" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_col": "y", "targetCol": "y"},
        {"batch_size": 4, "batchSize": 4},
        {"batch_size": 4, "batchSize": 8},
        {"group_col": "gid", "groupCol": "gid"},
        {"window_size": 3, "windowSize": 3},
        {"input_col": ["f0"], "inputCol": ["f1"]},
        {"drop_last": True, "dropLast": True},
    ],
    ids="+".join,
)
def test_name_and_alias_together_is_refused(db: duckdb.DuckDBPyConnection, kwargs: dict[str, Any]) -> None:
    name, alias = kwargs
    with pytest.raises(TypeError, match=rf"got '{name}' twice: as '{name}' and as its alias '{alias}'"):
        DDBDataLoader(db, SERIES_SQL, **({"target_col": "y"} | kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{"drop_last": False, "dropLast": True}, {"batch_size": 1, "batchSize": 8}],
    ids="+".join,
)
def test_explicit_default_and_alias_together_is_refused(
    db: duckdb.DuckDBPyConnection, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(TypeError, match=r"twice"):
        load(db, **kwargs)


#: (arguments, error type, regex of the message, which names the culprit)
BAD_INPUT: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"target_col": None}, TypeError, r"target_col is required"),
    ({"target_col": []}, ValueError, r"target_col must name at least one column"),
    ({"target_col": 3}, TypeError, r"target_col must be a column name"),
    ({"input_col": ["f0", "f0"]}, ValueError, r"input_col names \['f0'\] more than once"),
    ({"exclude_col": [1]}, TypeError, r"exclude_col must be a column name"),
    ({"batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0"),
    ({"batch_size": -2}, ValueError, r"batch_size must be >= 1, got -2"),
    ({"batch_size": 2.0}, TypeError, r"batch_size must be an int, got float"),
    ({"batch_size": True}, TypeError, r"batch_size must be an int, got bool"),
    ({"offset": -1}, ValueError, r"offset must be >= 0"),
    ({"offset": 1.5}, TypeError, r"offset must be an int"),
    ({"prefetch_batch": -1}, ValueError, r"prefetch_batch must be >= 0, got -1"),
    ({"prepartition_num": 0}, ValueError, r"prepartition_num must be >= 1"),
    ({"group_pool_size": 0}, ValueError, r"group_pool_size must be >= 1"),
    ({"fetch_threads": 0}, ValueError, r"fetch_threads must be >= 1"),
    ({"window_size": 2.5}, TypeError, r"window_size must be an int, got float"),
    ({"window_size": "3"}, TypeError, r"window_size must be an int, got str"),
    ({"window_size": 0}, ValueError, r"window_size must be >= 1, got 0"),
    ({"window_size": [3, 0]}, ValueError, r"window_size must be >= 1, got 0"),
    ({"window_size": [3]}, ValueError, r"window_size must be an int or a pair"),
    ({"window_size": [1, 2, 3]}, ValueError, r"window_size must be an int or a pair"),
    ({"window_size": [2, None]}, TypeError, r"window_size must be an int, got NoneType"),
    ({"window_size": 3, "window_stride": 0}, ValueError, r"window_stride must be >= 1, got 0"),
    ({"window_size": 3, "window_stride": 1.0}, TypeError, r"window_stride must be an int, got float"),
    ({"window_size": 3, "window_stride": (1, 1, 1)}, ValueError, r"window_stride must be an int or a pair"),
    ({"group_scheme": [0, 1]}, ValueError, r"group_scheme was given without group_col"),
    ({"repartition_scheme": [0]}, ValueError, r"repartition_scheme was given without repartition_col"),
    (
        {"repartition_col": "part", "group_scheme": [0]},
        ValueError,
        r"group_scheme was given without group_col",
    ),
    (
        {"group_col": "gid", "repartition_scheme": [0]},
        ValueError,
        r"repartition_scheme was given without repartition_col",
    ),
    ({"group_col": "gid", "group_scheme": []}, ValueError, r"group_scheme is empty"),
    ({"repartition_col": "part", "repartition_scheme": ()}, ValueError, r"repartition_scheme is empty"),
    ({"group_col": "gid", "group_scheme": "01"}, TypeError, r"group_scheme must be a list of values"),
    ({"group_col": "gid", "group_scheme": 1}, TypeError, r"group_scheme must be a list of values"),
    ({"group_col": "gid", "group_scheme": [0, None]}, ValueError, r"group_scheme contains None"),
    ({"group_col": "gid", "group_scheme": [0, 2, 0]}, ValueError, r"group_scheme lists \[0\] more than once"),
    (
        {"repartition_col": "part", "repartition_scheme": ["a", "b", "b", "a"]},
        ValueError,
        r"repartition_scheme lists \['b', 'a'\] more than once",
    ),
    ({"group_col": 3}, TypeError, r"group_col must be a column name or SQL expression"),
    ({"repartition_col": "  "}, TypeError, r"repartition_col must be a column name or SQL expression"),
    ({"seed": -1}, ValueError, r"seed must be a non-negative int"),
    ({"seed": 1.5}, TypeError, r"seed must be a non-negative int"),
    ({"seed": True}, TypeError, r"seed must be a non-negative int"),
    ({"timeout": 0}, ValueError, r"timeout must be a positive number of seconds, got 0"),
    ({"timeout": -1.0}, ValueError, r"timeout must be a positive number of seconds"),
    ({"timeout": float("nan")}, ValueError, r"timeout must be a positive number of seconds, got nan"),
    ({"timeout": "10"}, TypeError, r"timeout must be a number of seconds, got str"),
    ({"shuffle": 1}, TypeError, r"shuffle must be a bool"),
    ({"drop_last": "yes"}, TypeError, r"drop_last must be a bool"),
    ({"verify": "yes"}, TypeError, r"verify must be a bool"),
    ({"dtype": (torch.float32,)}, ValueError, r"dtype must be one dtype or a pair"),
    ({"dtype": (torch.float32, torch.int64, torch.int64)}, ValueError, r"dtype must be one dtype or a pair"),
    ({"dtype": (torch.float32, "nonsense")}, TypeError, r"dtype\[1\]='nonsense' has no numpy equivalent"),
    ({"dtype": ("nonsense", torch.float32)}, TypeError, r"dtype\[0\]='nonsense' has no numpy equivalent"),
    ({"dtype": str}, TypeError, r"dtype=<class 'str'> is not a numeric dtype"),
    ({"dtype": (torch.float32, object)}, TypeError, r"dtype\[1\]=<class 'object'> is not a numeric dtype"),
    ({"pin_memory": "yes"}, TypeError, r"pin_memory must be True, False or 'auto'"),
    ({"device": "gpu0"}, ValueError, r"device='gpu0' is not a torch device"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"), BAD_INPUT, ids=[repr(case[0])[:48] for case in BAD_INPUT]
)
def test_bad_input_names_the_parameter(
    db: duckdb.DuckDBPyConnection, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        load(db, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"), BAD_INPUT[:12], ids=[repr(c[0]) for c in BAD_INPUT[:12]]
)
def test_arguments_are_checked_before_the_source_is_opened(
    tmp_path: Any, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    missing = tmp_path / "absent.duckdb"
    with pytest.raises(error, match=message):
        DDBDataLoader(missing, SERIES_SQL, **({"target_col": "y"} | kwargs))
    assert not missing.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only machine")
def test_pin_memory_true_without_cuda_is_refused(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"pin_memory=True needs a CUDA device.*pin_memory='auto'"):
        load(db, pin_memory=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only machine")
def test_cuda_device_without_cuda_is_refused_before_iteration(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match=r"device='cuda' needs CUDA"):
        load(db, device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only machine")
def test_pin_memory_auto_on_cpu_pins_nothing_and_still_loads(db: duckdb.DuckDBPyConnection) -> None:
    loader = load(db, pin_memory="auto", batch_size=8)
    assert loader.config.pin_memory is False
    with loader:
        x, y = next(iter(loader))
    assert not x.is_pinned()
    assert not y.is_pinned()
    assert x.shape == (8, 6)


def test_offset_defaults_to_the_x_window_with_windows_and_zero_without(db: duckdb.DuckDBPyConnection) -> None:
    with (
        load(db) as plain,
        load(db, window_size=[4, 2]) as windowed,
        load(db, window_size=4, offset=1) as shifted,
    ):
        assert (plain.config.offset, plain.config.windowed) == (0, False)
        assert (windowed.config.offset, windowed.config.span) == (4, 6)
        assert (shifted.config.offset, shifted.config.span) == (1, 4)


def test_second_stride_value_is_accepted_and_does_not_move_y(db: duckdb.DuckDBPyConnection) -> None:
    common: dict[str, Any] = {
        "window_size": [3, 2],
        "batch_size": 64,
        "input_col": ["f0"],
        "group_col": "gid",
    }
    one = batches(load(db, window_stride=2, **common))
    two = batches(load(db, window_stride=[2, 5], **common))
    assert one == two
    x, y = one[0]
    # y starts where x ends (offset = x window) in every sample, whatever the second stride.
    assert all(sy[0][0] == sx[-1][0] + 1.5 for sx, sy in zip(x, y, strict=True))


def test_numpy_scalars_are_accepted(db: duckdb.DuckDBPyConnection) -> None:
    with load(
        db,
        batch_size=np.int64(5),
        window_size=np.int32(2),
        seed=np.uint32(3),
        group_col="gid",
        group_scheme=np.array([2, 0]),
        timeout=np.float32(9.5),
    ) as loader:
        assert loader.config.batch_size == 5
        assert type(loader.config.batch_size) is int
        assert loader.config.group_scheme == (2, 0)
        assert all(type(v) is int for v in loader.config.group_scheme)
        assert loader.config.seed == 3
        assert loader.config.timeout == 9.5


def test_seed_none_draws_a_non_negative_seed(db: duckdb.DuckDBPyConnection) -> None:
    with load(db) as a, load(db) as b:
        assert a.config.seed >= 0
        assert b.config.seed >= 0
        assert a.config.seed != b.config.seed


@pytest.mark.parametrize(
    ("dtype", "x_dtype", "y_dtype"),
    [
        (torch.float32, np.float32, np.float32),
        ("float16", np.float16, np.float16),
        ((torch.float32, torch.int64), np.float32, np.int64),
        ((None, torch.float32), None, np.float32),
    ],
)
def test_dtype_single_or_pair(db: duckdb.DuckDBPyConnection, dtype: Any, x_dtype: Any, y_dtype: Any) -> None:
    with load(db, dtype=dtype) as loader:
        assert loader.config.x_dtype == (None if x_dtype is None else np.dtype(x_dtype))
        assert loader.config.y_dtype == np.dtype(y_dtype)


def test_unknown_keyword_error_matches_python_wording(db: duckdb.DuckDBPyConnection) -> None:
    # The same wording Python uses for a plain function, so tools that parse it keep working.
    with pytest.raises(TypeError) as info:
        load(db, shufle=True)
    assert re.search(r"^DDBDataLoader\(\) got an unexpected keyword argument 'shufle'", str(info.value))
    assert "did you mean 'shuffle'" in str(info.value)


# --- DolphinDB code that runs unchanged ----------------------------------------------------------


def test_ddb_session_keyword_is_the_source(db: duckdb.DuckDBPyConnection) -> None:
    ported = DDBDataLoader(
        ddbSession=db, sql=SERIES_SQL, targetCol=["y"], batchSize=4, excludeCol=["y"], seed=2
    )
    with ported, load(db, batch_size=4, exclude_col="y", seed=2) as native:
        assert ported.config == native.config
        assert batches(ported) == batches(native)
    with pytest.raises(TypeError, match="'source' twice"):
        DDBDataLoader(db, SERIES_SQL, "y", ddbSession=db)
    with pytest.raises(TypeError, match="needs a source"):
        DDBDataLoader(sql=SERIES_SQL, target_col="y")


def test_empty_exclude_col_excludes_nothing(db: duckdb.DuckDBPyConnection) -> None:
    with load(db, exclude_col=[], window_size=2) as empty, load(db, window_size=2) as default:
        assert empty.config.exclude_col == ()
        assert empty.plan.layout.x_names == default.plan.layout.x_names


@pytest.mark.parametrize(
    ("keys", "x_names"),
    [
        ({}, ("gid", "part", "pos", "rid", "f0", "f1")),
        ({"group_col": "gid"}, ("part", "pos", "rid", "f0", "f1")),
        ({"group_col": "GID", "repartition_col": "part"}, ("pos", "rid", "f0", "f1")),
        ({"group_col": '"gid"', "repartition_col": "part % 2"}, ("part", "pos", "rid", "f0", "f1")),
    ],
    ids=["no-keys", "group", "group-and-repartition", "quoted-and-expression"],
)
def test_a_derived_x_leaves_the_key_columns_out(
    db: duckdb.DuckDBPyConnection, keys: dict[str, str], x_names: tuple[str, ...]
) -> None:
    # A key naming a result column is an id, not a feature; a key expression leaves its columns in.
    with load(db, exclude_col="y", **keys) as loader:
        assert loader.plan.layout.x_names == x_names


def test_a_key_named_in_input_col_stays_in_x(db: duckdb.DuckDBPyConnection) -> None:
    with load(db, input_col=["gid", "f0"], group_col="gid", repartition_col="part") as loader:
        assert loader.plan.layout.x_names == ("gid", "f0")
        x, _ = next(iter(loader))
        assert x[:, 0].tolist() == [0.0]


def test_exclude_col_is_ignored_with_input_col_and_says_so(db: duckdb.DuckDBPyConnection) -> None:
    ignored = r"exclude_col=\['f0'\] is ignored because input_col is given"
    with pytest.warns(UserWarning, match=ignored) as caught:
        loader = load(db, input_col=["f0", "f1"], exclude_col=["f0"])
    assert len(caught) == 1
    with loader:
        assert loader.plan.layout.x_names == ("f0", "f1")


def test_window_stride_without_window_size_is_ignored_and_says_so(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.warns(UserWarning, match=r"window_stride=3 is ignored without window_size") as caught:
        loader = load(db, window_stride=3, exclude_col="y", seed=0)
    assert len(caught) == 1
    with loader, load(db, exclude_col="y", seed=0) as plain:
        assert loader.config == plain.config
        assert len(loader) == len(plain)


def test_mode_pytorch_and_verbose_are_accepted_and_unknown_modes_refused(
    db: duckdb.DuckDBPyConnection,
) -> None:
    with load(db, mode="pytorch", verbose=True) as loader:
        assert len(loader) > 0
    with pytest.raises(
        ValueError, match=r"mode='mxnet' is not one of \['jax', 'numpy', 'pytorch', 'tensorflow'\]"
    ):
        load(db, mode="mxnet")
    with pytest.raises(TypeError, match="verbose must be a bool"):
        load(db, verbose="yes")


def test_device_none_is_torchs_default_device(db: duckdb.DuckDBPyConnection) -> None:
    with load(db, device=None) as loader:
        assert loader.config.device == torch.device("cpu")
        x, _ = next(iter(loader))
    assert x.device == torch.device("cpu")


def test_release_closes_the_loader(db: duckdb.DuckDBPyConnection) -> None:
    loader = load(db)
    next(iter(loader))
    loader.release()
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


@pytest.mark.parametrize("keyword", ["num_workers", "persistent_workers"])
def test_dataloader_worker_keywords_point_to_the_iterable_dataset(
    db: duckdb.DuckDBPyConnection, keyword: str
) -> None:
    with pytest.raises(TypeError, match=rf"takes no '{keyword}': .*DDBIterableDataset.*num_workers=N"):
        load(db, **{keyword: 2})


def test_torch_style_read_only_attributes(db: duckdb.DuckDBPyConnection) -> None:
    with load(db, batch_size=5, drop_last=True, shuffle=True, seed=1) as loader:
        assert (loader.batch_size, loader.drop_last, loader.shuffle) == (5, True, True)
        with pytest.raises(AttributeError):
            loader.batch_size = 6  # type: ignore[misc]
