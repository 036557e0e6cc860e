"""Fetch units: how an epoch's partitions are cut into queries, and how a result splits by key."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import logging
import subprocess
import sys
import textwrap
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import torch
from conftest import SERIES_SQL, FaultyBackend, make_series
from hypothesis import given, settings
from hypothesis import strategies as st
from planned import views
from resume_check import assert_resumes_exactly, assert_same_batches

from ddbloader import DDBDataLoader
from ddbloader._epoch.schedule import BatchSchedule, EventKind
from ddbloader._epoch.shard import epoch_units
from ddbloader._epoch.units import FIRST_UNIT_SHARE, MAX_VALUES, fetch_units
from ddbloader._epoch.visits import partition_visits
from ddbloader._io.convert import to_block
from ddbloader._io.unit_split import split_by_key, unit_blocks
from ddbloader._sql.partition import PartitionSpec, Read
from ddbloader._sql.plan import PIECES_PER_QUERY
from ddbloader._sql.read import unit_sql
from ddbloader.backends import DuckDBBackend

UTC = dt.timezone.utc


def cells(*keys: tuple[Any, ...], rows: list[int]) -> list[PartitionSpec]:
    return [
        PartitionSpec(group=n, position=0, group_value=k[0], repartition_value=None, sql="", params=k, rows=r)
        for n, (k, r) in enumerate(zip(keys, rows, strict=True))
    ]


# --- split_by_key -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, 3) | st.none(), max_size=40))
def test_split_keeps_the_order_within_each_partition_and_drops_rows_of_no_partition(
    keys: list[int | None],
) -> None:
    table = pa.table({"v": pa.array(range(len(keys)), pa.int64()), "_ddb_group": pa.array(keys, pa.int32())})
    values = [0, 1, 2, 3]
    specs = cells(*((v,) for v in values), rows=[keys.count(v) for v in values])
    parts = split_by_key(table, specs)
    assert parts is not None
    for value, part in zip(values, parts, strict=True):
        assert part.column_names == ["v"]
        assert part.column("v").to_pylist() == [i for i, k in enumerate(keys) if k == value]


@pytest.mark.parametrize(
    ("arrow_type", "values"),
    [
        (pa.int8(), [-1, 7]),
        (pa.int64(), [2**40, -(2**41)]),
        (pa.float64(), [0.5, -1.25]),
        (pa.bool_(), [True, False]),
        (pa.string(), ["a", "é中"]),
        (pa.date32(), [dt.date(2024, 1, 2), dt.date(1999, 12, 31)]),
        (
            pa.timestamp("us", tz="UTC"),
            [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), dt.datetime(1970, 1, 1, tzinfo=UTC)],
        ),
        (pa.decimal128(10, 2), [decimal.Decimal("1.25"), decimal.Decimal("-3.50")]),
    ],
)
def test_split_compares_keys_of_many_types(arrow_type: pa.DataType, values: list[Any]) -> None:
    rows = [values[i % len(values)] for i in range(7)]
    table = pa.table({"v": pa.array(range(7)), "_ddb_group": pa.array(rows, arrow_type)})
    specs = cells(*((v,) for v in values), rows=[rows.count(v) for v in values])
    parts = split_by_key(table, specs)
    assert parts is not None
    assert [p.column("v").to_pylist() for p in parts] == [
        [i for i, r in enumerate(rows) if r == v] for v in values
    ]


def test_split_by_two_keys() -> None:
    table = pa.table(
        {
            "v": pa.array(range(6)),
            "_ddb_group": pa.array(["a", "b", "a", "b", "a", "c"]),
            "_ddb_repartition": pa.array([1, 1, 2, 1, 1, 1]),
        }
    )
    specs = cells(("a", 1), ("a", 2), ("b", 1), rows=[2, 1, 2])
    parts = split_by_key(table, specs)
    assert parts is not None
    assert [p.column("v").to_pylist() for p in parts] == [[0, 4], [2], [1, 3]]


def test_split_by_two_keys_whose_cells_skip_combinations() -> None:
    # (a, 1) and (b, 2) are not cells: the codes of the cells are not 0..n-1, so rows are looked up
    table = pa.table(
        {
            "v": pa.array(range(6)),
            "_ddb_group": pa.array(["b", "a", "a", "b", "b", "a"]),
            "_ddb_repartition": pa.array([1, 2, 1, 2, 1, 2]),
        }
    )
    parts = split_by_key(table, cells(("a", 2), ("b", 1), rows=[2, 2]))
    assert parts is not None
    assert [p.column("v").to_pylist() for p in parts] == [[1, 5], [0, 4]]


def test_split_refuses_counts_that_differ_from_planning_and_values_of_another_type() -> None:
    table = pa.table({"v": pa.array(range(3)), "_ddb_group": pa.array(["A", "a", "b"])})
    # 'a' under a case-insensitive collation counted 2 rows; Arrow compares exactly and finds 1.
    assert split_by_key(table, cells(("a",), ("b",), rows=[2, 1])) is None
    assert split_by_key(table, cells(("a",), ("b",), rows=[1, 1])) is not None
    dates = pa.table({"v": pa.array([0]), "_ddb_group": pa.array([dt.date(2024, 1, 2)])})
    assert split_by_key(dates, cells(("not a date",), rows=[1])) is None


def test_split_compares_values_of_another_type_as_arrow_converts_them() -> None:
    # not equal as Python values, so the split converts them to the column's type, as Arrow does
    table = pa.table({"v": pa.array(range(4)), "_ddb_group": pa.array([7, 8, 7, None], pa.int64())})
    parts = split_by_key(table, cells(("7",), ("8",), rows=[2, 1]))
    assert parts is not None
    assert [p.column("v").to_pylist() for p in parts] == [[0, 2], [1]]


@pytest.mark.multiprocess
def test_split_imports_no_pandas() -> None:
    # pyarrow's pa.array and to_numpy import pandas on their first call: a second or more of the
    # first epoch, spent in a fetch thread while the first batch waits for it
    script = textwrap.dedent(
        """
        import sys, duckdb
        from ddbloader._sql.plan import PIECES_PER_QUERY
        from ddbloader._sql.partition import PartitionSpec
        from ddbloader._io.unit_split import split_by_key
        table = duckdb.sql(
            "SELECT i AS v, 'g' || (i % 2) AS _ddb_group, DATE '2024-01-01' + (i % 3)::INT "
            "AS _ddb_repartition FROM range(12) t(i)"
        ).to_arrow_table()
        keys = sorted(set(zip(table.column(1).to_pylist(), table.column(2).to_pylist())))
        specs = [PartitionSpec(n, 0, g, d, "", (g, d), 2) for n, (g, d) in enumerate(keys)]
        assert split_by_key(table, specs) is not None
        print("pandas" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("wanted", [[0, 1, 2, 3, 4, 5], [0, 2, 3], [4]])
def test_unit_blocks_give_each_wanted_partition_the_rows_of_its_own_subquery(
    con: duckdb.DuckDBPyConnection, wanted: list[int]
) -> None:
    """The unit's result interleaves its partitions (ORDER BY pos) and holds rows outside the
    scheme: each wanted partition still gets exactly its own subquery's rows, in their order;
    the unwanted ones and the rows outside are left out."""
    make_series(con, [[4, 3, 5, 2], [6, 2, 3]])
    sql = "SELECT gid, part, pos, f0, y FROM series ORDER BY pos DESC, rid"
    options: dict[str, Any] = {"input_col": ["f0"], "group_col": "gid", "repartition_col": "part"}
    # part 3 is outside the scheme, and only the group key is bound: the query returns its rows
    with DDBDataLoader(con, sql, "y", repartition_scheme=[0, 1, 2], **options) as loader:
        plan = loader.plan
    specs = tuple(p for g in plan.groups for p in g.partitions)
    unit = Read(
        unit_sql(plan, [2, None], lists=False) or "",
        (0, 1),
        specs,
        frozenset(specs[i].key for i in wanted),
    )
    cursor = DuckDBBackend(con).cursor()
    result = cursor.fetch(unit.sql, unit.params)
    assert result.num_rows == sum(s.rows for s in specs) + 2
    assert result.column("_ddb_group").to_pylist() != sorted(result.column("_ddb_group").to_pylist())
    parts = unit_blocks(result, unit, plan.layout)
    assert parts is not None
    assert [s.key for s in parts.specs] == [specs[i].key for i in wanted]
    for n, i in enumerate(wanted):
        alone = to_block(cursor.fetch(specs[i].sql, specs[i].params), plan.layout)
        assert parts.block(n).x.tolist() == alone.x.tolist()
        assert parts.block(n).y.tolist() == alone.y.tolist()


# --- fetch_units --------------------------------------------------------------------------------


def _loader(con: duckdb.DuckDBPyConnection, **kwargs: Any) -> DDBDataLoader:
    # float64: the budgets below count 16-byte rows (f0 and y)
    options: dict[str, Any] = {
        "input_col": ["f0"],
        "group_col": "gid",
        "batch_size": 4,
        "shuffle": True,
        "dtype": torch.float64,
    }
    options.update(kwargs)
    return DDBDataLoader(con, SERIES_SQL, "y", **options)


def test_units_follow_the_epoch_group_order_within_the_budget(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[10]] * 20)  # 20 groups of 10 rows x 16 bytes (f0, y)
    budget = 480 * FIRST_UNIT_SHARE
    with _loader(con, seed=5, group_pool_size=3) as loader:
        plan, config = loader.plan, loader.config
        work = epoch_units(plan, config, 0)
        units = list(fetch_units(plan, work, config, 0, budget=budget))
        # The first unit holds a share of the budget (3 groups), each next one twice as much (6, then
        # 12 would fit) up to the budget.
        assert [sorted(g for g, _ in u.wanted) for u in units] == [
            sorted(w.group.index for w in work[i:j]) for i, j in ((0, 3), (3, 9), (9, 20))
        ]
        shares = [budget // FIRST_UNIT_SHARE, budget // (FIRST_UNIT_SHARE // 2), budget // 2]
        assert all(u.rows * plan.layout.row_bytes <= share for u, share in zip(units, shares, strict=True))
        assert all(u.rows * plan.layout.row_bytes <= budget for u in units)
        assert all(len(u.params) == len(u.wanted) and "IN" in u.sql for u in units)
        assert (
            list(fetch_units(plan, work, config, 0, budget=budget)) == units
        )  # a function of (plan, seed, epoch)
        assert list(fetch_units(plan, epoch_units(plan, config, 1), config, 1, budget=budget)) != units
        assert list(fetch_units(plan, work, config, 0, budget=0)) == []
        assert list(fetch_units(plan, work, config, 0, budget=100)) == []  # a group per query anyway


def test_the_first_unit_holds_the_first_groups_of_a_larger_pool(con: duckdb.DuckDBPyConnection) -> None:
    """A shuffled batch draws from every group of the pool, so the first batch waits for all of
    them: the first unit holds the pool's first groups (one query), not a budget's eighth."""
    make_series(con, [[10]] * 20)  # 20 groups of 10 rows x 16 bytes (f0, y)
    budget = 480 * FIRST_UNIT_SHARE
    with _loader(con, seed=5, group_pool_size=8, batch_size=8) as loader:
        plan, config = loader.plan, loader.config
        work = epoch_units(plan, config, 0)
        units = list(fetch_units(plan, work, config, 0, budget=budget))
        assert sorted(g for g, _ in units[0].wanted) == sorted(w.group.index for w in work[:8])
        assert all(u.rows * plan.layout.row_bytes <= budget for u in units)
        assert sorted(g for u in units for g, _ in u.wanted) == list(range(20))


def test_the_ramp_moves_on_past_groups_fetched_alone(con: duckdb.DuckDBPyConnection) -> None:
    """Groups larger than the first shares are fetched alone (a unit of one partition is left
    out), and the shares still double after each: later units hold several groups."""
    make_series(con, [[10]] * 20)  # 20 groups of 160 bytes
    # a pool of one: the first unit holds the pool's first group, and no more
    with _loader(con, seed=5, group_pool_size=1) as loader:
        plan, config = loader.plan, loader.config
        units = list(fetch_units(plan, epoch_units(plan, config, 0), config, 0, budget=480))
    # shares 60, 120, 240: one group each, fetched alone; then 480: three groups a unit
    assert [len(u.wanted) for u in units] == [3, 3, 3, 3, 3, 2]


def test_a_group_larger_than_the_budget_is_cut_into_runs_of_its_partitions(
    con: duckdb.DuckDBPyConnection,
) -> None:
    make_series(con, [[4] * 10])
    with _loader(con, repartition_col="part", seed=1) as loader:
        plan, config = loader.plan, loader.config
        units = list(fetch_units(plan, epoch_units(plan, config, 0), config, 0, budget=3 * 4 * 16))
    assert [len(u.cells) for u in units] == [3, 3, 3]  # the tenth partition is fetched alone
    assert all(u.params[0] == 0 and len(u.params) == 4 for u in units)
    covered = [k for u in units for k in u.wanted]
    assert len(covered) == len(set(covered)) == 9


def test_the_first_units_are_the_pools_first_claims(con: duckdb.DuckDBPyConnection) -> None:
    """A group within the budget and larger than the first share is one unit, unless it is among
    the pool's first: then its first prepartition_num partitions are a unit, in the order the
    schedule claims them, and the rest another, after the other first groups' heads; later
    groups are whole. The first batch then waits for small queries."""
    make_series(con, [[4] * 5] * 5)  # 5 groups of 5 partitions of 4 rows x 16 bytes
    budget = 2 * 20 * 16  # two groups; the first share (budget // 8) is less than one
    with _loader(con, repartition_col="part", seed=3, group_pool_size=3) as loader:
        plan, config = loader.plan, loader.config
        work = epoch_units(plan, config, 0)
        units = list(fetch_units(plan, work, config, 0, budget=budget))
        samples = sum(u.samples for u in work)
        schedule = BatchSchedule(work, plan.geometry, config, 0, -(-samples // config.batch_size))
        claims = [e.key for b in schedule for e in b.events if e.kind is EventKind.FETCH]
    pool, head = config.group_pool_size, config.prepartition_num
    assert [len(u.cells) for u in units] == [head] * pool + [5 - head] * pool + [5, 5]
    assert [{g for g, _ in u.wanted} for u in units] == [
        {w.group.index} for w in [*work[:pool] * 2, *work[pool:]]
    ]
    assert [set(claims[i * head : (i + 1) * head]) for i in range(pool)] == [u.wanted for u in units[:pool]]
    covered = [k for u in units for k in u.wanted]
    assert len(covered) == len(set(covered)) == 25


@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (1, 2)])
def test_split_first_groups_give_the_batches_of_one_query_per_partition(
    con: duckdb.DuckDBPyConnection, rank: int, world_size: int
) -> None:
    """Windows across the boundary of a head and its tail, shuffled, in two epochs and on a DDP
    rank: the same batches as fetching each partition alone."""
    make_series(con, [[6] * 5] * 5)  # 5 groups of 5 partitions of 6 rows x 16 bytes
    options: dict[str, Any] = {
        "repartition_col": "part",
        "window_size": 4,
        "seed": 7,
        "rank": rank,
        "world_size": world_size,
    }
    with _loader(con, fetch_bytes=0, **options) as alone:
        want = [[(x.clone(), y.clone()) for x, y in alone] for _ in range(2)]
    with _loader(con, fetch_bytes=2 * 30 * 16, **options) as loader:
        got = [[(x.clone(), y.clone()) for x, y in loader] for _ in range(2)]
        assert loader.stats().queries < 5 * 5 / world_size
    for epoch in range(2):
        assert_same_batches(got[epoch], want[epoch], f"epoch {epoch}")


def test_a_unit_binds_at_most_max_values_parameters(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[1]] * (MAX_VALUES + 5))
    with _loader(con) as loader:
        plan, config = loader.plan, loader.config
        units = list(fetch_units(plan, epoch_units(plan, config, 0), config, 0, budget=2**30))
    assert [len(u.params) for u in units] == [MAX_VALUES, 5]


def test_the_pieces_of_a_streamed_subquery_are_visited_together_in_order_and_join_no_unit(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # Partitions 0 and 3 exceed fetch_bytes (64 rows of 16 bytes): streamed in pieces; the small
    # ones join units as before. Ordered by a DECIMAL, whose values do not bind back exactly, the
    # query cannot be cut into range pieces (see ddbloader._sql.pieces), so the big partitions are
    # streamed even with shuffle.
    make_series(con, [[200, 4, 4, 150, 4, 4]])
    sql = "SELECT gid, part, rid, f0, y FROM series ORDER BY gid, part, CAST(pos AS DECIMAL(18, 3))"
    with pytest.warns(UserWarning, match="cannot be cut into pieces"):
        made = DDBDataLoader(
            con,
            sql,
            "y",
            input_col=["f0"],
            group_col="gid",
            batch_size=4,
            shuffle=True,
            repartition_col="part",
            window_size=3,
            fetch_bytes=64 * 16,
            dtype=torch.float64,
        )
    with made as loader:
        plan, config = loader.plan, loader.config
        group = plan.groups[0]
        assert [group.heads.count(h) for h in group.heads] == [4] * 4 + [1, 1] + [3] * 3 + [1, 1]
        orders = set()
        for epoch in range(6):
            work = epoch_units(plan, config, epoch)
            visits = partition_visits(work[0], config, plan.geometry, epoch)
            assert sorted(visits) == list(range(len(group.partitions)))
            heads = [group.heads[p] for p in visits]
            runs = [h for n, h in enumerate(heads) if n == 0 or h != heads[n - 1]]
            assert len(runs) == len(set(runs)), f"the pieces of a subquery are split up: {visits}"
            assert all(p == q + 1 for q, p in itertools.pairwise(visits) if group.heads[p] == group.heads[q])
            orders.add(tuple(runs))
            units = list(fetch_units(plan, work, config, epoch, config.fetch_bytes))
            assert units and not any(plan.groups[c.group].reads[c.position] for u in units for c in u.cells)
        assert len(orders) > 1  # the subqueries themselves are still shuffled


def test_neighbouring_tagged_pieces_are_visited_one_after_the_other_and_share_a_unit(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Combed range pieces the reader orders (one integer ORDER BY column) are tagged: runs of up
    to PIECES_PER_QUERY neighbours are visited one after the other, in a shuffled order of runs,
    and each run is one fetch unit; no piece is in two units."""
    # 7 pieces of 2,048 rows of 8 bytes (float32 f and y): three units of two, the last piece alone
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(7 * 2048) r(i)")
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 1}
    with DDBDataLoader(con, "SELECT * FROM big ORDER BY id", "y", fetch_bytes=2048 * 8, **options) as loader:
        plan, config = loader.plan, loader.config
        group = plan.groups[0]
        count = len(group.partitions)
        assert count == 7 and all(p.tagged for p in views(group))
        paired = count // PIECES_PER_QUERY * PIECES_PER_QUERY  # the last one, if odd, is read alone
        orders = set()
        for epoch in range(4):
            work = epoch_units(plan, config, epoch)
            visits = list(partition_visits(work[0], config, plan.geometry, epoch))
            assert sorted(visits) == list(range(count))
            units = list(fetch_units(plan, work, config, epoch, config.fetch_bytes))
            assert len(units) == count // PIECES_PER_QUERY
            held = [c.position for u in units for c in u.cells]
            assert sorted(held) == list(range(paired))
            for unit in units:
                at = visits.index(unit.cells[0].position)
                assert visits[at : at + len(unit.cells)] == [c.position for c in unit.cells]
                assert all(
                    group.read_together(a.position, b.position) for a, b in itertools.pairwise(unit.cells)
                )
            orders.add(tuple(visits))
        assert len(orders) > 1


def test_read_runs_end_where_a_subquery_ends_and_units_never_cross_them(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """The read runs are planned per subquery: the tagged pieces of three repartitions make three
    runs (each starting at its first piece), one query never reads pieces of two, and no
    partition of a run is one a key-list query may read."""
    con.execute(
        "CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y, i // 6144 AS d "
        "FROM range(3 * 6144) r(i)"
    )
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 1}
    sql = "SELECT * FROM big ORDER BY id"
    with DDBDataLoader(
        con, sql, "y", fetch_bytes=2048 * 8, repartition_col="d", repartition_scheme=None, **options
    ) as loader:
        plan, config = loader.plan, loader.config
        group = plan.groups[0]
        assert group.read_runs == (0, 0, 0, 3, 3, 3, 6, 6, 6)
        assert not any(group.keyed)
        assert not group.read_together(2, 3) and group.read_together(3, 4) and not group.read_together(3, 5)
        for epoch in range(3):
            units = list(
                fetch_units(plan, epoch_units(plan, config, epoch), config, epoch, config.fetch_bytes)
            )
            assert units and all(u.split == "cells" for u in units)
            assert all(len({group.read_runs[c.position] for c in u.cells}) == 1 for u in units)


# --- the fetch path -----------------------------------------------------------------------------


def _epochs(loader: DDBDataLoader, count: int = 2) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    with loader:
        return [list(loader) for _ in range(count)]


@pytest.mark.parametrize("fetch_bytes", [200, 2**20])
def test_units_resume_exactly(con: duckdb.DuckDBPyConnection, fetch_bytes: int) -> None:
    make_series(con, [[5, 6], [7], [3, 9, 4], [8, 2]])
    assert_resumes_exactly(
        lambda: _loader(con, repartition_col="part", window_size=3, seed=9, fetch_bytes=fetch_bytes)
    )


def test_a_result_that_does_not_split_is_fetched_partition_by_partition(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Keys equal under the engine's collation but not in Arrow: the engine's subqueries decide."""
    con.execute("CREATE TABLE cased (k VARCHAR COLLATE NOCASE, f0 DOUBLE, y DOUBLE)")
    con.execute("INSERT INTO cased SELECT ['a', 'A', 'b', 'B'][i % 4 + 1], i, i + 0.5 FROM range(20) t(i)")
    sql = "SELECT * FROM cased ORDER BY f0"
    options: dict[str, Any] = {"input_col": ["f0"], "group_col": "k", "batch_size": 3, "seed": 4}
    want = _epochs(DDBDataLoader(con, sql, "y", fetch_bytes=0, **options), 1)
    with DDBDataLoader(con, sql, "y", **options) as loader:
        got = list(loader)
        stats = loader.stats()
    assert_same_batches(got, want[0], "after the split fell back")
    assert (stats.queries, stats.partitions_fetched) == (1 + 2, 2)
    assert sorted(torch.cat([x[:, 0] for x, _ in got]).tolist()) == [float(i) for i in range(20)]


def test_a_failed_unit_query_falls_back_to_one_query_per_partition(
    con: duckdb.DuckDBPyConnection, caplog: pytest.LogCaptureFixture
) -> None:
    make_series(con, [[5, 6], [7], [3, 9]])
    want = _epochs(_loader(con, repartition_col="part", seed=2, fetch_bytes=0), 1)
    backend = FaultyBackend(DuckDBBackend(con), fail_on=[1], error=lambda: ValueError("unit query refused"))
    loader = _loader(backend, repartition_col="part", seed=2)
    backend.planning = False
    with caplog.at_level(logging.WARNING, logger="ddbloader"):
        got = _epochs(loader, 1)
    assert_same_batches(got[0], want[0], "after the fallback")
    assert backend.fetches == 1 + 5
    assert "fetching its partitions one by one" in caplog.text
