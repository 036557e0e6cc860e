"""Time splits (``split_col`` + ``split_range``, ``DDBDataLoader.split``).

The oracle is the user's query run whole by the engine: its rows per group in its order, cut into
windows here (sample ``i`` at row ``i * stride``), and a sample kept by a split when all its y
rows' ``ts`` lie in the split's range. Each row's value ``v = g * 1000 + ts`` names its row, so a
sample is identified by its values.
"""

from __future__ import annotations

import datetime as dt
import itertools
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from conftest import examples, table_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader
from ddbloader._construction import split_ranges

SQL = "SELECT g, ts, v FROM t ORDER BY g, ts"
#: rows per group: unequal, so groups reach each cut at another row
LENGTHS = (23, 31, 17)
#: the series' ts values (two apart, odd in odd groups): cuts between and on values
CUTS = (14, 31)

Sample = tuple[tuple[float, ...], tuple[float, ...]]


def series_table(lengths: tuple[int, ...] = LENGTHS) -> pa.Table:
    rows = [(g, 2 * i + g % 2) for g, n in enumerate(lengths) for i in range(n)]
    return pa.table(
        {
            "g": pa.array([g for g, _ in rows], pa.int32()),
            "ts": pa.array([ts for _, ts in rows], pa.int64()),
            "v": pa.array([float(g * 1000 + ts) for g, ts in rows], pa.float64()),
        }
    )


def oracle(values: list[float], window: Any, stride: int, bounds: tuple[Any, Any]) -> Counter[Sample]:
    """The samples of the whole query's rows ``values`` (in its order) whose y rows' ts all lie
    in ``bounds``."""
    wx, wy = (1, 1) if window is None else (window, 1) if isinstance(window, int) else window
    offset = 0 if window is None else wx
    lo, hi = bounds
    found: Counter[Sample] = Counter()
    for _, rows in itertools.groupby(values, key=lambda v: v // 1000):
        series = list(rows)
        for start in range(0, len(series) - max(wx, offset + wy) + 1, stride):
            x = tuple(series[start : start + wx])
            y = tuple(series[start + offset : start + offset + wy])
            if all((lo is None or v % 1000 >= lo) and (hi is None or v % 1000 < hi) for v in y):
                found[x, y] += 1
    return found


def oracle_values(data: pa.Table) -> list[float]:
    """``v`` of the whole query's rows in its order (``ORDER BY g, ts``), run by DuckDB."""
    con = duckdb.connect()
    con.register("data", data)
    return [float(v) for (v,) in con.execute("SELECT v FROM data ORDER BY g, ts").fetchall()]


def served(loader: DDBDataLoader) -> Counter[Sample]:
    """Every sample one epoch of ``loader`` yields, counted; checks ``len`` on the way."""
    found: Counter[Sample] = Counter()
    batches, expected = 0, len(loader)
    for x, y in loader:
        batches += 1
        for a, b in zip(x.reshape(len(x), -1).tolist(), y.reshape(len(y), -1).tolist(), strict=True):
            found[tuple(a), tuple(b)] += 1
    assert batches == expected
    return found


def split_loader(source: Any, window: Any = None, stride: int | None = None, **options: Any) -> DDBDataLoader:
    arguments: dict[str, Any] = {
        "input_col": ["v"],
        "group_col": "g",
        "batch_size": 5,
        "seed": 3,
        "window_size": window,
        "window_stride": stride,
        **options,
    }
    return DDBDataLoader(source, SQL, "v", **arguments)


def ranges(cuts: tuple[Any, ...] = CUTS) -> list[tuple[Any, Any]]:
    return split_ranges(list(cuts))


@pytest.mark.parametrize("engine_name", ["duckdb", "postgres", "sqlite"])
@pytest.mark.parametrize(
    ("window", "stride", "repartition", "shuffle"),
    [
        (None, None, None, False),
        (None, None, "ts - ts % 9", True),
        (3, None, None, False),
        (3, 1, "ts - ts % 9", True),
        ([3, 2], 2, "ts - ts % 9", False),
        (4, 3, None, True),
    ],
)
def test_each_split_serves_exactly_its_samples(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    engine_name: str,
    window: Any,
    stride: int | None,
    repartition: str | None,
    shuffle: bool,
) -> None:
    with table_engine(request, tmp_path, engine_name, series_table()) as engine:
        values = [float(v) for v in engine.run("SELECT v FROM t ORDER BY g, ts")]
        options: dict[str, Any] = {"shuffle": shuffle, "fetch_bytes": 64}
        if repartition:
            options["repartition_col"] = repartition
        whole = oracle(values, window, stride or 1, (None, None))
        parts = []
        for bounds in ranges():
            with split_loader(
                engine.source, window, stride, split_col="ts", split_range=bounds, **options
            ) as loader:
                got = served(loader)
                assert got == oracle(values, window, stride or 1, bounds), bounds
                assert loader.plan.samples == sum(got.values())
            parts.append(got)
        union = sum(parts, Counter())
        assert max(union.values()) == 1  # disjoint
        straddling = whole - union
        wy = 2 if isinstance(window, list) else 1
        assert (not straddling) == (wy == 1)  # only samples whose y straddles a cut are in none
        for (_, y), _count in straddling.items():
            assert any(y[0] % 1000 < cut <= y[-1] % 1000 for cut in CUTS)


def test_splits_under_ddp_ranks_and_elastic_resume(tmp_path: Path) -> None:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = [float(v) for (v,) in con.execute("SELECT v FROM t ORDER BY g, ts").fetchall()]
    bounds = (CUTS[0], None)
    expected = oracle(values, 3, 2, bounds)
    # stride 2: no look-back floor, so the groups' samples start at first_sample > 0
    options: dict[str, Any] = {"split_col": "ts", "split_range": bounds, "shuffle": True, "fetch_bytes": 64}
    ranks: Counter[Sample] = Counter()
    for rank in range(3):
        with split_loader(con, 3, 2, rank=rank, world_size=3, even_batches="drop", **options) as loader:
            ranks += served(loader)
    assert max(ranks.values()) == 1 and set(ranks) <= set(expected)
    assert len(expected) - len(ranks) < 3  # "drop": fewer than one sample per rank left out
    # stop two ranks after two batches each, resume the rest of the epoch on one rank
    handed: Counter[Sample] = Counter()
    states = []
    for rank in range(2):
        with split_loader(con, 3, 2, rank=rank, world_size=2, **options) as loader:
            batches = iter(loader)
            for _ in range(2):
                x, y = next(batches)
                for a, b in zip(x.reshape(len(x), -1).tolist(), y.reshape(len(y), -1).tolist(), strict=True):
                    handed[tuple(a), tuple(b)] += 1
            states.append(loader.state_dict())
    with split_loader(con, 3, 2, **options) as resumed:
        resumed.load_state_dict(states[0])
        rest = served(resumed)
    # "pad" may have handed a sample twice (a rank's share topped up); the rest is every other one
    assert set(handed) | set(rest) == set(expected) and not set(handed) & set(rest)
    assert max(rest.values()) == 1


def test_resume_of_a_split_continues_its_epoch() -> None:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    options: dict[str, Any] = {"split_col": "ts", "split_range": CUTS, "shuffle": True, "fetch_bytes": 64}
    with split_loader(con, 3, 2, **options) as loader:
        whole = [(x.tolist(), y.tolist()) for x, y in loader]
        loader.set_epoch(0)
        batches = iter(loader)
        next(batches)
        next(batches)
        state = loader.state_dict()
    with split_loader(con, 3, 2, **options) as resumed:
        resumed.load_state_dict(state)
        assert [(x.tolist(), y.tolist()) for x, y in resumed] == whole[2:]


def test_the_engine_reads_only_the_rows_a_split_uses() -> None:
    con = duckdb.connect()
    # group 2 ends long before lo: it serves nothing there, and must not pull the look-back back
    data = series_table((400, 400, 50))  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    lo, hi = 300, 500  # group 0: ts 300..498 are rows 150..249
    with split_loader(con, 8) as whole, split_loader(con, 8, split_col="ts", split_range=(lo, hi)) as split:
        assert whole.plan.rows == 850
        # rows at or after hi are not read; before lo only the 8 rows of the first window's x
        assert split.plan.rows == 2 * (100 + 8)
        assert split.plan.samples == 2 * 100
    with split_loader(con, None, split_col="ts", split_range=(lo, hi)) as tabular:
        assert tabular.plan.rows == 2 * 100  # without windows no look-back
    with split_loader(con, 8, 3, split_col="ts", split_range=(lo, hi)) as strided:
        # a stride above 1 reads each series from its start (see ddbloader._sql.splits), not past hi
        assert strided.plan.rows == 2 * 250 + 50


def test_split_builds_train_validation_test_with_a_gap() -> None:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = [float(v) for (v,) in con.execute("SELECT v FROM t ORDER BY g, ts").fetchall()]
    loaders = DDBDataLoader.split(
        con, SQL, "v", split_col="ts", at=list(CUTS), gap=4, shuffle=True,
        input_col=["v"], group_col="g", window_size=3, seed=1, batch_size=4,
    )  # fmt: skip
    try:
        assert [loader.config.shuffle for loader in loaders] == [True, False, False]
        assert [loader.config.split_range for loader in loaders] == [(None, 14), (18, 31), (35, None)]
        for loader, bounds in zip(loaders, [(None, 14), (18, 31), (35, None)], strict=True):
            assert served(loader) == oracle(values, 3, 1, bounds)
    finally:
        for loader in loaders:
            loader.close()


def test_datetime_split_with_a_timedelta_gap() -> None:
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE t AS SELECT g, TIMESTAMP '2024-01-01' + i * INTERVAL 1 HOUR AS at, "
        "(g * 1000 + i)::DOUBLE AS v FROM range(2) a(g), range(48) b(i)"
    )
    sql = "SELECT g, at, v FROM t ORDER BY g, at"
    noon = dt.datetime(2024, 1, 1, 12)
    train, test = DDBDataLoader.split(
        con, sql, "v", split_col="at", at=[noon], gap=dt.timedelta(hours=2),
        input_col=["v"], group_col="g", window_size=2, batch_size=8,
    )  # fmt: skip
    with train, test:
        train_y = {int(b[0]) % 1000 for _, y in train for b in y.reshape(len(y), -1).tolist()}
        test_y = {int(b[0]) % 1000 for _, y in test for b in y.reshape(len(y), -1).tolist()}
    assert train_y == set(range(2, 12))
    assert test_y == set(range(14, 48))


def test_tabular_split_needs_no_order() -> None:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    sql = "SELECT g, ts, v FROM t"  # no ORDER BY: each row is a sample
    parts = []
    for bounds in ranges():
        with DDBDataLoader(
            con, sql, "v", input_col=["ts"], batch_size=8, split_col="ts", split_range=bounds
        ) as loader:
            parts.append(sorted(y for _, ys in loader for y in ys.flatten().tolist()))
    assert sorted(itertools.chain(*parts)) == sorted(
        float(v) for (v,) in con.execute("SELECT v FROM t").fetchall()
    )


@pytest.fixture
def refusals() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    con.execute("CREATE TABLE n AS SELECT g, ts, v, CASE WHEN ts = 7 THEN NULL ELSE ts END AS s FROM t")
    return con


@pytest.mark.parametrize(
    ("sql", "options", "message"),
    [
        (
            "SELECT g, ts, v, 100 - ts AS down FROM t ORDER BY g, ts",
            {"split_col": "down", "window_size": 3},
            r"split_col 'down' decreases along the series in group 0 \(in \d+ row",
        ),
        (
            "SELECT g, ts, v, (ts // 10) * -1 + ts % 10 AS saw FROM t ORDER BY g, ts",
            {"split_col": "saw", "window_size": 3, "repartition_col": "ts // 10"},
            r"split_col 'saw' decreases along the series in group 0, repartition 1 "
            r"\(from 8 \(repartition 0\) to -1\)",
        ),
        (
            "SELECT g, ts, v, s FROM n ORDER BY g, ts",
            {"split_col": "s"},
            r"split_col 's' is NULL in 1 row\(s\) in group 1",
        ),
        (
            "SELECT g, v FROM t ORDER BY g, v",
            {"split_col": "ts"},
            r"cannot split this query by split_col 'ts'.*'ts' is not one of its result columns",
        ),
        (
            "SELECT g, ts, v FROM t",
            {"split_col": "ts", "window_size": 3},
            r"split_col 'ts' with window_size needs the query's ORDER BY",
        ),
    ],
)
def test_refusals_name_the_cause(
    refusals: duckdb.DuckDBPyConnection, sql: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DDBDataLoader(refusals, sql, "v", group_col="g", input_col=["v"], split_range=(10, 30), **options)


def test_a_decreasing_column_is_fine_without_windows(refusals: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT g, ts, v, 100 - ts AS down FROM t ORDER BY g, ts"
    with DDBDataLoader(refusals, sql, "v", input_col=["v"], split_col="down", split_range=(60, 80)) as loader:
        assert sorted(y for _, ys in loader for y in ys.flatten().tolist()) == sorted(
            float(v)
            for (v,) in refusals.execute("SELECT v FROM t WHERE 100 - ts >= 60 AND 100 - ts < 80").fetchall()
        )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"split_range": (1, 2)}, ValueError, "split_range was given without split_col"),
        ({"split_col": "ts"}, ValueError, r"split_col='ts' needs split_range=\(lo, hi\)"),
        ({"split_col": "ts", "split_range": (5, 5)}, ValueError, r"split_range=\(5, 5\) is empty"),
        ({"split_col": "ts", "split_range": (5,)}, TypeError, "split_range must be a pair"),
        ({"split_col": "ts", "split_range": (1, "a")}, TypeError, "cannot be compared"),
        ({"split_col": "ts", "split_range": (float("nan"), None)}, ValueError, "must be finite"),
        ({"split_col": "ts", "split_range": ([1], None)}, TypeError, "numbers, strings, dates"),
        (
            {"split_col": "ts", "split_range": (1, 9), "window_size": [4, 1], "offset": 2},
            ValueError,
            "x \\(window 4\\) reaches past y",
        ),
    ],
)
def test_argument_refusals(options: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        DDBDataLoader(None, "SELECT 1 AS ts, 2.0 AS v", "v", **options)


@pytest.mark.parametrize(
    ("at", "gap", "message"),
    [
        ([], None, "non-empty list"),
        ([3, 3], None, "strictly ascending"),
        ([1, 3], -1, "must not be negative"),
        ([1, 3], 2, "leaves the split from 3 to 3 empty"),
        ([dt.date(2024, 1, 1)], 1, "cannot be added"),
        ([dt.date(2024, 1, 1)], dt.timedelta(hours=12), "is not whole days"),
    ],
)
def test_split_ranges_refusals(at: list[Any], gap: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        split_ranges(at, gap)


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    window=st.one_of(st.none(), st.integers(1, 5), st.tuples(st.integers(1, 4), st.integers(1, 3)).map(list)),
    stride=st.integers(1, 3),
    cuts=st.lists(st.integers(-2, 64), min_size=1, max_size=3, unique=True).map(sorted),
    repartitioned=st.booleans(),
    shuffle=st.booleans(),
    fetch_bytes=st.sampled_from([0, 48, 8 * 2**20]),
)
def test_splits_are_disjoint_and_cover_the_unsplit_samples(
    lengths: list[int],
    window: Any,
    stride: int,
    cuts: list[int],
    repartitioned: bool,
    shuffle: bool,
    fetch_bytes: int,
) -> None:
    con = duckdb.connect()
    data = series_table(tuple(lengths))  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = [float(v) for (v,) in con.execute("SELECT v FROM t ORDER BY g, ts").fetchall()]
    step = stride if window is not None else 1
    options: dict[str, Any] = {"shuffle": shuffle, "fetch_bytes": fetch_bytes}
    if repartitioned:
        options["repartition_col"] = "ts - ts % 7"
    for bounds in split_ranges(cuts):
        expected = oracle(values, window, step, bounds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # groups too short for a window: the oracle has none of them
            if not expected:
                with pytest.raises(
                    ValueError, match=r"can make no sample: no sample's y rows all lie in split_range"
                ):
                    split_loader(
                        con, window, stride if window else None, split_col="ts", split_range=bounds, **options
                    )
                continue
            loader = split_loader(
                con, window, stride if window else None, split_col="ts", split_range=bounds, **options
            )
        with loader:
            assert served(loader) == expected


@pytest.mark.parametrize("engine_name", ["datafusion", "clickhouse"])
def test_splits_on_more_engines(request: pytest.FixtureRequest, engine_name: str) -> None:
    data = series_table()
    values = oracle_values(data)
    if engine_name == "datafusion":
        datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
        source: Any = datafusion.SessionContext()
        source.register_record_batches("t", [data.to_batches()])
    else:
        source = request.getfixturevalue("chdb_uri")
        from adbc_driver_chdb import dbapi

        with dbapi.connect(source) as admin, admin.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS t")
            cursor.adbc_ingest("t", data, mode="create")
    for bounds in ranges():
        with split_loader(
            source, 3, split_col="ts", split_range=bounds, repartition_col="ts - ts % 9"
        ) as loader:
            assert served(loader) == oracle(values, 3, 1, bounds)


def test_a_query_ordered_by_a_column_it_does_not_select() -> None:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = oracle_values(series_table())
    sql = "SELECT g, v, ts + 0 AS s FROM t ORDER BY g, ts"  # ts is carried as a hidden column
    for bounds in ranges():
        options: dict[str, Any] = {
            "split_col": "s",
            "split_range": bounds,
            "shuffle": True,
            "fetch_bytes": 64,
        }
        with DDBDataLoader(
            con, sql, "v", input_col=["v"], group_col="g", window_size=3, verify=True, **options
        ) as loader:
            assert served(loader) == oracle(values, 3, 1, bounds)


@pytest.mark.multiprocess
def test_splits_under_dataloader_workers(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from ddbloader import DDBIterableDataset

    path = str(tmp_path / "series.duckdb")
    with duckdb.connect(path) as con:
        data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
        con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = oracle_values(series_table())
    datasets = DDBIterableDataset.split(
        path, SQL, "v", split_col="ts", at=list(CUTS), input_col=["v"], group_col="g", window_size=3,
        batch_size=4, shuffle=True, seed=5, num_workers=2,
    )  # fmt: skip
    assert [d.loader.config.shuffle for d in datasets] == [True, False, False]
    for bounds, dataset in zip(ranges(), datasets, strict=True):
        found: Counter[Sample] = Counter()
        batches, expected = 0, len(dataset)
        for x, y in DataLoader(dataset, batch_size=None, num_workers=2):
            batches += 1
            for a, b in zip(x.reshape(len(x), -1).tolist(), y.reshape(len(y), -1).tolist(), strict=True):
                found[tuple(a), tuple(b)] += 1
        assert found == oracle(values, 3, 1, bounds)
        assert batches == expected
        dataset.close()


def test_explicit_schemes_are_checked_and_warned_about_once() -> None:
    con = duckdb.connect()
    data = series_table()  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = oracle_values(series_table())
    bounds = (CUTS[0], None)
    schemes: dict[str, Any] = {"group_scheme": [2, 7, 0, 1], "repartition_col": "ts - ts % 9"}
    with pytest.warns(UserWarning, match=r"group_scheme value\(s\) \[7\] match no rows") as caught:
        loader = split_loader(
            con,
            3,
            repartition_scheme=[0, 9, 18, 27, 36, 45, 54],
            split_col="ts",
            split_range=bounds,
            **schemes,
        )
    assert len(caught) == 1
    with loader:
        assert served(loader) == oracle(values, 3, 1, bounds)
    # a series is its repartitions in scheme order: here ts falls from one to the next
    with pytest.raises(
        ValueError, match=r"split_col 'ts' decreases along the series in group 2, repartition 18 "
    ):
        split_loader(
            con, 3, repartition_scheme=[27, 18, 9, 0, 36, 45], split_col="ts", split_range=bounds, **schemes
        )


@settings(max_examples=examples(300), deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), min_size=1, max_size=5),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
)
def test_ranks_and_workers_share_exactly_each_groups_samples_from_its_first(
    groups: list[tuple[int, int]], world: int, workers: int
) -> None:
    """Pure: the shards of groups whose samples start at ``first_sample`` hold samples
    ``[first_sample, sample_stop)`` of each, once (``even_batches="drop"`` leaves out fewer than
    one per rank), and an elastic remainder's ids never collide across groups."""
    from ddbloader._epoch.shard import split_units
    from ddbloader._sql.partition import PartitionSpec
    from ddbloader._sql.plan import GroupPlan

    plans = [
        GroupPlan(i, i, (PartitionSpec(i, 0, i, None, "", (), first + samples + 2),), samples, first)
        for i, (samples, first) in enumerate(groups)
    ]
    held: Counter[tuple[int, int]] = Counter()
    for rank in range(world):
        for worker in range(workers):
            for unit in split_units(plans, rank, world, worker, workers, "drop"):
                held.update((unit.group.index, s) for s in range(unit.first, unit.stop))
    every = {(g.index, s) for g in plans for s in range(g.first_sample, g.sample_stop)}
    assert set(held) <= every and max(held.values(), default=1) == 1
    assert len(every) - len(held) < world
    offsets = np.cumsum([0] + [g.sample_stop for g in plans])
    ids = {int(offsets[g]) + s for g, s in every}
    assert len(ids) == len(every)  # elastic resume's sample ids (offsets by sample stops) are distinct


@pytest.mark.parametrize("window", [None, 3])
def test_a_query_without_groups_is_one_series(window: int | None) -> None:
    con = duckdb.connect()
    data = series_table((40,))  # noqa: F841 -- read by DuckDB's replacement scan
    con.execute("CREATE TABLE t AS SELECT * FROM data")
    values = oracle_values(series_table((40,)))
    for bounds in ranges():
        with DDBDataLoader(
            con, "SELECT ts, v FROM t ORDER BY ts", "v", input_col=["v"], window_size=window, verify=True,
            split_col="ts", split_range=bounds,
        ) as loader:  # fmt: skip
            assert served(loader) == oracle(values, window, 1, bounds)
