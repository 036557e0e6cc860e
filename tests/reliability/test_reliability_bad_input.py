"""Bad input, table-driven: every case names its culprit in a clear error, before any thread runs.

Complements tests/test_config.py (argument checks): here every parameter gets a value of the
wrong type, and the cases that need the query, the data or the source (unknown columns,
non-numeric and all-null columns, scheme values the engine cannot compare, windows longer than
every group, non-SELECT statements, syntax errors, closed connections, missing files).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from conftest import SERIES_SQL, make_series
from reliability_support import loader_threads, open_files

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(60)

PARTS = [[6, 5], [7, 3]]
MIXED_SQL = "SELECT * FROM mixed"


@dataclass(frozen=True)
class Env:
    con: duckdb.DuckDBPyConnection
    path: Path
    closed: duckdb.DuckDBPyConnection


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    path = tmp_path_factory.mktemp("bad") / "data.duckdb"
    with duckdb.connect(str(path)) as writer:
        make_series(writer, PARTS)
        writer.execute(
            "CREATE TABLE mixed AS SELECT range::INTEGER AS i, range::DOUBLE AS y, 'a' || range AS s, "
            "TIMESTAMP '2020-01-01' + INTERVAL (range) SECOND AS ts, "
            "DATE '2020-01-01' + range::INTEGER AS d, "
            "'\\x00\\x01'::BLOB AS b, NULL::DOUBLE AS n, NULL::INTEGER AS ni FROM range(10)"
        )
    con = duckdb.connect(str(path), read_only=True)
    closed = duckdb.connect()
    closed.close()
    yield Env(con, path, closed)
    con.close()


@dataclass(frozen=True)
class Case:
    """One bad input: the call, the error type it must raise, a regex naming the culprit."""

    id: str
    call: Callable[[Env], object]
    error: type[BaseException]
    pattern: str
    marks: tuple[Any, ...] = field(default=())


@dataclass(frozen=True)
class Build:
    """A loader over the fixture's tables, built over its connection or over another source."""

    sql: str
    arguments: dict[str, Any]

    def __call__(self, env: Env) -> object:
        return self.over(env.con)

    def over(self, source: Any) -> object:
        return DDBDataLoader(source, self.sql, **self.arguments)


def series(**kwargs: Any) -> Build:
    return Build(SERIES_SQL, {"target_col": "y", "input_col": ["f0", "f1"]} | kwargs)


def mixed(**kwargs: Any) -> Build:
    return Build(MIXED_SQL, {"target_col": "y", "input_col": ["i"]} | kwargs)


def query(sql: str, **kwargs: Any) -> Build:
    return Build(sql, {"target_col": "y"} | kwargs)


#: A value of the wrong type for every parameter of DDBDataLoader.
WRONG_TYPES: list[Case] = [
    Case(
        "source=int",
        lambda env: DDBDataLoader(42, SERIES_SQL, "y"),
        TypeError,
        r"source must be a DuckDB connection or path.*got builtins\.int",
    ),
    Case(
        "sql=int",
        lambda env: DDBDataLoader(env.con, 42, "y"),
        TypeError,
        r"sql must be a non-empty query string, got 42",
    ),
    Case(
        "target_col=float",
        series(target_col=3.5),
        TypeError,
        r"target_col must be a column name or a list of names, got 3\.5",
    ),
    Case("batch_size=str", series(batch_size="4"), TypeError, r"batch_size must be an int, got str '4'"),
    Case("shuffle=str", series(shuffle="yes"), TypeError, r"shuffle must be a bool, got 'yes'"),
    Case(
        "window_size=dict", series(window_size={"x": 2}), TypeError, r"window_size must be an int, got dict"
    ),
    Case(
        "window_stride=str",
        series(window_size=2, window_stride="1"),
        TypeError,
        r"window_stride must be an int, got str '1'",
    ),
    Case(
        "input_col=int",
        series(input_col=3),
        TypeError,
        r"input_col must be a column name or a list of names, got 3",
    ),
    Case(
        "exclude_col=dict",
        series(input_col=None, exclude_col={"f0": 1}),
        TypeError,
        r"exclude_col must be a column name or a list of names",
    ),
    Case(
        "repartition_col=int",
        series(repartition_col=5),
        TypeError,
        r"repartition_col must be a column name or SQL expression string, got 5",
    ),
    Case(
        "repartition_scheme=int",
        series(repartition_col="part", repartition_scheme=5),
        TypeError,
        r"repartition_scheme must be a list of values, got int 5",
    ),
    Case(
        "group_col=list",
        series(group_col=["gid"]),
        TypeError,
        r"group_col must be a column name or SQL expression string, got \['gid'\]",
    ),
    Case(
        "group_scheme=set",
        series(group_col="gid", group_scheme={0, 1}),
        TypeError,
        r"group_scheme must be a list of values, got set",
    ),
    Case("seed=str", series(seed="1"), TypeError, r"seed must be a non-negative int or None, got str '1'"),
    Case("drop_last=int", series(drop_last=1), TypeError, r"drop_last must be a bool, got 1"),
    Case(
        "offset=float", series(window_size=2, offset=1.0), TypeError, r"offset must be an int, got float 1\.0"
    ),
    Case("device=float", series(device=3.5), ValueError, r"device=3\.5 is not a torch device"),
    Case(
        "prefetch_batch=float",
        series(prefetch_batch=1.5),
        TypeError,
        r"prefetch_batch must be an int, got float 1\.5",
    ),
    Case(
        "prepartition_num=str",
        series(prepartition_num="2"),
        TypeError,
        r"prepartition_num must be an int, got str '2'",
    ),
    Case(
        "group_pool_size=float",
        series(group_pool_size=2.0),
        TypeError,
        r"group_pool_size must be an int, got float 2\.0",
    ),
    Case("dtype=int", series(dtype=42), TypeError, r"dtype=42 has no numpy equivalent"),
    Case(
        "pin_memory=int", series(pin_memory=1), TypeError, r"pin_memory must be True, False or 'auto', got 1"
    ),
    Case(
        "fetch_threads=bool",
        series(fetch_threads=True),
        TypeError,
        r"fetch_threads must be an int, got bool True",
    ),
    Case("timeout=str", series(timeout="1"), TypeError, r"timeout must be a number of seconds, got str '1'"),
    Case("retries=float", series(retries=1.5), TypeError, r"retries must be an int, got float 1\.5"),
    Case(
        "retry_backoff=str",
        series(retry_backoff="0.1"),
        TypeError,
        r"retry_backoff must be a number of seconds, got str '0\.1'",
    ),
    Case("rank=str", series(rank="0", world_size=2), TypeError, r"rank must be an int, got '0'"),
    Case("world_size=str", series(rank=0, world_size="2"), TypeError, r"world_size must be an int, got '2'"),
    Case(
        "even_batches=int", series(even_batches=3), ValueError, r"even_batches must be 'pad' or 'drop', got 3"
    ),
    Case(
        "transform=int",
        series(transform=42),
        TypeError,
        r"transform must be a callable or a list of callables, got 42",
    ),
    Case("key_col=int", series(key_col=3), TypeError, r"key_col must be a column name or a list of names"),
    Case(
        "split_col=int",
        series(split_col=3, split_range=(1, 5)),
        TypeError,
        r"split_col must be a column name or SQL expression string, got 3",
    ),
    Case(
        "split_range=int",
        series(split_col="ts", split_range=5),
        TypeError,
        r"split_range must be a pair \(lo, hi\), either end None, got 5",
    ),
    Case("replan=int", series(replan=3), ValueError, r"replan must be 'never' or 'epoch', got 3"),
    Case("collate=int", series(collate=42), TypeError, r"collate must be a callable .*got 42"),
    Case(
        "mode=int",
        series(mode=1),
        ValueError,
        r"mode=1 is not one of \['jax', 'numpy', 'pytorch', 'tensorflow'\]",
    ),
    Case("verbose=str", series(verbose="yes"), TypeError, r"verbose must be a bool, got str 'yes'"),
    Case(
        "fetch_bytes=float",
        series(fetch_bytes=1e6),
        TypeError,
        r"fetch_bytes must be an int, got float 1000000\.0",
    ),
    Case(
        "window_on_device=str",
        series(window_on_device="yes"),
        TypeError,
        r"window_on_device must be a bool, got 'yes'",
    ),
    Case(
        "cache_bytes=str", series(cache_bytes="1GB"), TypeError, r"cache_bytes must be an int, got str '1GB'"
    ),
    Case(
        "progress=str",
        series(progress="yes"),
        TypeError,
        r"progress must be a bool",
    ),
    Case("verify=str", series(verify="yes"), TypeError, r"verify must be a bool, got 'yes'"),
]

ALL_NULL_FLOAT = pytest.mark.xfail(
    strict=True,
    reason="a float column's NULLs need no dtype change, so planning does not scan float columns "
    "(that would cost every loader a full pass over the query): an all-NULL float column feeds NaN",
)

#: Bad columns, schemes, windows, queries and sources.
BAD_DATA: list[Case] = [
    Case(
        "input_col unknown",
        series(input_col=["f0", "nope"]),
        ValueError,
        r"input_col names 'nope', which is not a column of the query",
    ),
    Case(
        "exclude_col unknown",
        series(input_col=None, exclude_col=["nope"]),
        ValueError,
        r"exclude_col names 'nope', which is not a column",
    ),
    Case(
        "target_col not in query",
        query("SELECT f0, f1 FROM series"),
        ValueError,
        r"target_col names 'y', which is not a column of the query; columns: \['f0', 'f1'\]",
    ),
    Case(
        "target_col misspelt",
        series(target_col="Y"),
        ValueError,
        r"target_col names 'Y' \(did you mean 'y'\?\), which is not a column",
    ),
    Case(
        "target_col duplicated",
        series(target_col=["y", "f0", "y"]),
        ValueError,
        r"target_col names \['y'\] more than once",
    ),
    Case(
        "input_col duplicated",
        series(input_col=["f1", "f0", "f1", "f0"]),
        ValueError,
        r"input_col names \['f0', 'f1'\] more than once",
    ),
    Case(
        "exclude leaves nothing",
        series(input_col=None, exclude_col=["gid", "part", "pos", "rid", "f0", "f1", "y"]),
        ValueError,
        r"x has no columns",
    ),
    Case(
        "string input column",
        mixed(input_col=["i", "s"]),
        TypeError,
        r"input_col names 's' of type string, which is not numeric",
    ),
    Case(
        "string target column",
        mixed(target_col="s"),
        TypeError,
        r"target_col names 's' of type string, which is not numeric",
    ),
    Case("timestamp column", mixed(input_col=["ts"]), TypeError, r"input_col names 'ts' of type timestamp"),
    Case("date column", mixed(input_col=["d"]), TypeError, r"input_col names 'd' of type date32"),
    Case("blob column", mixed(input_col=["i", "b"]), TypeError, r"input_col names 'b' of type binary"),
    Case("all-null integer input column", mixed(input_col=["i", "ni"]), ValueError, r"'ni'.*NULL"),
    Case("all-null integer target column", mixed(target_col="ni"), ValueError, r"'ni'.*NULL"),
    Case(
        "all-null float input column",
        mixed(input_col=["i", "n"]),
        ValueError,
        r"'n'.*NULL",
        (ALL_NULL_FLOAT,),
    ),
    Case("all-null float target column", mixed(target_col="n"), ValueError, r"'n'.*NULL", (ALL_NULL_FLOAT,)),
    Case(
        "empty group_scheme", series(group_col="gid", group_scheme=[]), ValueError, r"group_scheme is empty"
    ),
    Case(
        "empty repartition_scheme array",
        series(repartition_col="part", repartition_scheme=np.array([], dtype=np.int64)),
        ValueError,
        r"repartition_scheme is empty",
    ),
    Case(
        "scheme value of the wrong type",
        series(group_col="gid", group_scheme=[0, "one"]),
        duckdb.ConversionException,
        r"Could not convert string 'one' to INT32(.|\n)*group_scheme \[0, 'one'\] with the key's values",
    ),
    Case(
        "scheme value not a SQL value",
        series(repartition_col="part", repartition_scheme=[0, object()]),
        duckdb.NotImplementedException,
        r"Unable to transform python value of type '<class 'object'>'",
    ),
    Case(
        "window longer than every group",
        series(group_col="gid", window_size=20),
        ValueError,
        r"can make no sample: a sample needs 21 consecutive rows .* but the longest group has only 11",
    ),
    Case(
        "offset beyond every group",
        series(group_col="gid", window_size=2, offset=11),
        ValueError,
        r"can make no sample: a sample needs 12 consecutive rows .*offset 11\), but the longest group",
    ),
    Case(
        "DELETE",
        query("DELETE FROM series"),
        ValueError,
        r"sql must be a read-only query .*refusing its DELETE",
    ),
    Case("CREATE TABLE AS", query("CREATE TABLE t AS SELECT 1.0 AS y"), ValueError, r"refusing its CREATE"),
    Case(
        "two statements",
        query("SELECT 1.0 AS y; SELECT 2.0 AS y"),
        ValueError,
        r"sql must be exactly one query, got 2 statements",
    ),
    Case("syntax error", query("SELEC y FROM series"), ValueError, r"sql does not parse as duckdb SQL"),
    Case(
        "dangling WHERE", query("SELECT y FROM series WHERE"), ValueError, r"sql does not parse as duckdb SQL"
    ),
    Case("unknown table", query("SELECT y FROM nosuch"), duckdb.CatalogException, r"nosuch does not exist"),
    Case(
        "group_col not a column",
        series(group_col="nosuch"),
        ValueError,
        r"by group_col 'nosuch'.*'nosuch' is not one of its result columns; select it",
    ),
    Case(
        "group_col two statements",
        series(group_col="gid; DROP TABLE series"),
        ValueError,
        r"group_col='gid; DROP TABLE series' must be one SQL expression",
    ),
    Case(
        "repartition_col broken expression",
        series(repartition_col="part +"),
        ValueError,
        r"repartition_col='part \+' is not a valid SQL expression",
    ),
    Case(
        "closed connection",
        lambda env: DDBDataLoader(env.closed, "SELECT 1.0 AS y", "y"),
        duckdb.ConnectionException,
        r"Connection (has )?already (been )?closed",
    ),
    Case(
        "missing database file",
        lambda env: DDBDataLoader(env.path.with_name("absent.duckdb"), "SELECT 1.0 AS y", "y"),
        FileNotFoundError,
        r"DuckDB database file '.*absent\.duckdb' does not exist",
    ),
    Case("batch_size 0", series(batch_size=0), ValueError, r"batch_size must be >= 1, got 0"),
    Case("negative prefetch", series(prefetch_batch=-2), ValueError, r"prefetch_batch must be >= 0, got -2"),
    Case("negative retries", series(retries=-1), ValueError, r"retries must be >= 0, got -1"),
    Case("negative fetch_bytes", series(fetch_bytes=-1), ValueError, r"fetch_bytes must be >= 0, got -1"),
    Case(
        "negative retry_backoff",
        series(retry_backoff=-0.5),
        ValueError,
        r"retry_backoff must be a finite number of seconds >= 0, got -0\.5",
    ),
    Case(
        "infinite retry_backoff",
        series(retry_backoff=float("inf")),
        ValueError,
        r"retry_backoff must be a finite number .*got inf",
    ),
]

CASES = WRONG_TYPES + BAD_DATA


def test_the_matrix_is_big_and_gives_every_parameter_a_wrong_type() -> None:
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)
    parameters = set(inspect.signature(DDBDataLoader.__init__).parameters) - {"self", "aliases"}
    covered = {case.id.split("=")[0] for case in WRONG_TYPES}
    assert covered == parameters, f"parameters without a wrong-type case: {sorted(parameters - covered)}"
    print(f"figure: bad_inputs={len(CASES)} wrong_types={len(WRONG_TYPES)} bad_data={len(BAD_DATA)}")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input_raises_a_clear_error_naming_the_culprit(env: Env, case: Case) -> None:
    with warnings.catch_warnings():
        # a warning is how the loader reports an empty epoch; here it must be the one raised
        warnings.simplefilter("error")
        with pytest.raises(case.error, match=case.pattern):
            case.call(env)
    assert not loader_threads()


#: Cases over the fixture's tables: given a path, the loader opens the file itself.
OVER_A_PATH = [c for c in BAD_DATA if isinstance(c.call, Build) and c.error is not UserWarning]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in OVER_A_PATH])
def test_a_loader_that_fails_over_a_path_releases_the_file(env: Env, case: Case, tmp_path: Path) -> None:
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(env.path.read_bytes())
    assert isinstance(case.call, Build)
    with pytest.raises(case.error, match=case.pattern):
        case.call.over(str(copy))
    # whether it failed checking arguments or planning, nothing holds the file open
    assert open_files(str(copy)) == 0
    assert not loader_threads()
