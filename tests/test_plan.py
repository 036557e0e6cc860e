"""Planning: scheme discovery and order, exact counts per subquery, warnings, sources.

The reference for every count is the engine itself: the user's full query, run once, with its
rows tallied per (group, repartition) in Python. That tally does not depend on the rewriting, so
a predicate in the wrong place, a wrong counting path or a lost partition all show up.
"""

from __future__ import annotations

import collections
import json
import math
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from planned import views

from ddbloader import DDBDataLoader
from ddbloader._pipeline.batch import batch_count
from ddbloader._sql.plan import MIN_PIECE_ROWS, QueryPlan, pieces
from ddbloader._sql.plan_fingerprint import plan_differences, plan_fingerprint
from ddbloader._sql.read import unit_sql
from tests.conftest import SERIES_SQL, make_series, warnings_containing

pytestmark = [
    pytest.mark.filterwarnings("error"),
    # Most loaders here keep y in x without windows; tests/test_columns.py checks that warning.
    pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning"),
]

PARTS = [[10, 7, 12], [15, 6], [8, 9, 11, 10], [3]]


@pytest.fixture(scope="module")
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    make_series(connection, PARTS)
    # The same rows inserted in a scrambled order, so discovery cannot lean on insertion order.
    connection.execute("CREATE TABLE shuffled AS SELECT * FROM series ORDER BY hash(rid)")
    yield connection
    connection.close()


def tally(con: duckdb.DuckDBPyConnection, sql: str, *keys: str) -> dict[tuple[Any, ...], int]:
    """Rows of the full query per key tuple: the reference for every planned count."""
    relation = con.sql(sql)
    positions = [relation.columns.index(k) for k in keys]
    return dict(collections.Counter(tuple(row[p] for p in positions) for row in relation.fetchall()))


def planned(plan: QueryPlan) -> dict[tuple[Any, ...], int]:
    cells: dict[tuple[Any, ...], int] = {}
    for group in plan.groups:
        for spec in group.partitions:
            cell = tuple(v for v in (group.value, spec.repartition_value) if v is not None)
            cells[cell] = spec.rows
    return cells


def run_all(loader: DDBDataLoader) -> list[tuple[list[Any], list[Any]]]:
    with loader:
        return [(x.tolist(), y.tolist()) for x, y in loader]


# --- schemes --------------------------------------------------------------------------------


def test_none_schemes_discover_sorted_distinct_values(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT gid, part, pos, f0, y FROM shuffled ORDER BY gid, part, pos"
    with DDBDataLoader(db, sql, target_col="y", group_col="gid", repartition_col="part") as loader:
        groups = loader.plan.groups
        assert [g.value for g in groups] == [0, 1, 2, 3]
        for group, sizes in zip(groups, PARTS, strict=True):
            assert [p.repartition_value for p in group.partitions] == list(range(len(sizes)))
            assert [p.position for p in group.partitions] == list(range(len(sizes)))
            assert [p.rows for p in group.partitions] == sizes


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("'g' || (3 - gid)::VARCHAR", ["g0", "g1", "g2", "g3"]),
        ("DATE '2024-01-10' - gid::INTEGER", ["2024-01-07", "2024-01-08", "2024-01-09", "2024-01-10"]),
        ("gid % 2 = 0", [False, True]),
    ],
)
def test_discovered_values_are_sorted_for_any_type(
    db: duckdb.DuckDBPyConnection, expression: str, expected: list[Any]
) -> None:
    sql = "SELECT gid, f0, y FROM shuffled"
    with DDBDataLoader(db, sql, target_col="y", input_col=["f0", "y"], group_col=expression) as loader:
        assert [str(g.value) if "DATE" in expression else g.value for g in loader.plan.groups] == expected


def explicit_loader(
    db: duckdb.DuckDBPyConnection, groups: list[int], parts: list[int], **kwargs: Any
) -> DDBDataLoader:
    """A loader over ``series`` with x = rid, split by gid and part with these schemes."""
    return DDBDataLoader(
        db,
        SERIES_SQL,
        target_col="y",
        input_col=["rid"],
        group_col="gid",
        group_scheme=groups,
        repartition_col="part",
        repartition_scheme=parts,
        **kwargs,
    )


def test_explicit_schemes_keep_the_users_order(db: duckdb.DuckDBPyConnection) -> None:
    loader = explicit_loader(db, [2, 0, 1], [1, 0, 2], batch_size=1000)
    assert [g.value for g in loader.plan.groups] == [2, 0, 1]
    assert [[p.repartition_value for p in g.partitions] for g in loader.plan.groups] == [
        [1, 0, 2],
        [1, 0, 2],
        [1, 0],
    ]
    ((x, _),) = run_all(loader)
    # Unshuffled, rows come group by group in scheme order, each group's partitions in scheme order.
    expected = [
        rid
        for gid in (2, 0, 1)
        for part in (1, 0, 2)
        for (rid,) in db.execute(
            "SELECT rid FROM series WHERE gid = ? AND part = ? ORDER BY pos", [gid, part]
        ).fetchall()
    ]
    assert [int(r[0]) for r in x] == expected


def test_group_and_repartition_columns_must_be_result_columns(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT f0, y FROM series ORDER BY gid, part, pos"
    with pytest.raises(
        ValueError, match=r"by group_col 'gid'.*'gid' is not one of its result columns; select it"
    ):
        DDBDataLoader(db, sql, target_col="y", group_col="gid", repartition_col="part")
    selected = "SELECT f0, y, gid, part FROM series ORDER BY gid, part, pos"
    with DDBDataLoader(
        db, selected, target_col="y", input_col=["f0", "y"], group_col="gid", repartition_col="part"
    ) as loader:
        assert loader.plan.layout.x_names == ("f0", "y")
        assert planned(loader.plan) == tally(db, SERIES_SQL, "gid", "part")


# --- counts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"group_col": "gid"},
        {"repartition_col": "part"},
        {"group_col": "gid", "repartition_col": "part"},
        {"group_col": "gid", "group_scheme": [3, 1], "repartition_col": "part"},
        {"group_col": "gid", "repartition_col": "part", "repartition_scheme": [0, 2]},
        {"group_col": "gid", "repartition_col": "pos // 4"},
    ],
    ids=lambda kwargs: ",".join(f"{k}={v}" for k, v in kwargs.items()) or "no keys",
)
@pytest.mark.parametrize(
    ("window", "stride", "batch", "drop_last"),
    [(None, None, 7, False), (4, 2, 5, True), ([3, 2], 1, 4, False)],
)
def test_counts_and_len_are_exact_before_iterating(
    db: duckdb.DuckDBPyConnection,
    kwargs: dict[str, Any],
    window: Any,
    stride: Any,
    batch: int,
    drop_last: bool,
) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "samples need")  # group 3 (3 rows) is shorter than windows
        loader = DDBDataLoader(
            db,
            SERIES_SQL,
            target_col="y",
            window_size=window,
            window_stride=stride,
            batch_size=batch,
            drop_last=drop_last,
            **kwargs,
        )
    plan = loader.plan
    for group in plan.groups:
        for spec in group.partitions:
            got = db.execute(f"SELECT count(*) FROM ({spec.sql})", list(spec.params)).fetchall()
            assert got == [(spec.rows,)], spec.describe()
    keys = [
        c
        for c, p in (
            ("gid", "group_col"),
            ("pos // 4" if "pos" in str(kwargs) else "part", "repartition_col"),
        )
        if p in kwargs
    ]
    columns = ", ".join(f"{c} AS k{n}" for n, c in enumerate(keys)) or "1 AS k"
    reference = tally(db, f"SELECT {columns} FROM series", *(f"k{n}" for n in range(len(keys))))
    for scheme, position in (("group_scheme", 0), ("repartition_scheme", len(keys) - 1)):
        if scheme in kwargs:
            reference = {k: n for k, n in reference.items() if k[position] in kwargs[scheme]}
    assert planned(plan) == reference
    span = plan.geometry.span
    stride_rows = plan.geometry.stride
    group_rows = [g.rows for g in plan.groups]
    samples = sum((n - span) // stride_rows + 1 for n in group_rows if n >= span)
    assert plan.samples == samples
    expected_len = batch_count(samples, batch, drop_last)
    assert len(loader) == expected_len
    yielded = run_all(loader)
    assert len(yielded) == expected_len
    assert sum(len(x) for x, _ in yielded) == (samples if not drop_last else expected_len * batch)


@pytest.mark.parametrize(
    "sql",
    [
        # GROUP BY: the rows are groups, so only per-subquery counts are exact.
        "SELECT gid, part, pos // 3 AS bucket, avg(f0) AS f0, max(y) AS y FROM series "
        "GROUP BY gid, part, bucket ORDER BY gid, part, bucket",
        # UNION ALL: every branch filtered, counted per subquery.
        "SELECT gid, part, f0, y FROM series WHERE pos % 2 = 0 "
        "UNION ALL SELECT gid, part, f1, y FROM series WHERE pos % 3 = 0 ORDER BY gid, part",
        "SELECT gid, part, f0, y FROM series UNION SELECT gid, part, f0 + 0.25, y FROM series WHERE pos < 4",
        "SELECT DISTINCT gid, part, pos // 2 AS half, 1.0 AS y FROM series",
        "SELECT * FROM series QUALIFY rank() OVER (PARTITION BY gid, part ORDER BY pos) > 2",
        "WITH s AS (SELECT * FROM series WHERE f0 > 5) SELECT gid, part, f0, y FROM s",
        "SELECT gid, part, f0, y FROM (SELECT * FROM series ORDER BY rid LIMIT 40)",
    ],
    ids=["group-by", "union-all", "union", "distinct", "qualify", "cte", "inner-limit"],
)
@pytest.mark.parametrize("explicit", [False, True], ids=["discovered", "explicit"])
def test_non_groupable_queries_count_like_sql(
    db: duckdb.DuckDBPyConnection, sql: str, explicit: bool
) -> None:
    reference = tally(db, sql, "gid", "part")
    schemes: dict[str, Any] = {}
    if explicit:
        schemes = {"group_scheme": [3, 2, 1, 0], "repartition_scheme": [3, 2, 1, 0]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DDBDataLoader(
            db, sql, target_col="y", group_col="gid", repartition_col="part", exclude_col="y", **schemes
        )
    expected = []
    for position, name in enumerate(("group", "repartition")):
        absent = [
            v for v in schemes.get(f"{name}_scheme", []) if not any(k[position] == v for k in reference)
        ]
        if absent:
            column = ("gid", "part")[position]
            expected.append(
                f"{name}_scheme value(s) {absent!r} match no rows of {name}_col {column!r}, "
                "so they load nothing"
            )
    assert [str(w.message) for w in caught] == expected
    with loader:
        assert planned(loader.plan) == reference
        assert loader.plan.rows == sum(reference.values())
        if explicit:
            assert [g.value for g in loader.plan.groups] == [3, 2, 1, 0]


def test_window_functions_see_the_whole_querys_rows(db: duckdb.DuckDBPyConnection) -> None:
    # Windowed by `gid` alone, the query is split on its result: the numbering runs over each
    # gid's rows whatever the repartition (issue 12: it used to restart in every repartition).
    sql = "SELECT gid, part, y FROM series QUALIFY row_number() OVER (PARTITION BY gid ORDER BY pos) > 2"
    with DDBDataLoader(
        db, sql, target_col="y", input_col="y", group_col="gid", repartition_col="part"
    ) as loader:
        assert planned(loader.plan) == tally(db, sql, "gid", "part")
    with DDBDataLoader(db, sql, target_col="y", input_col="y", group_col="gid") as loader:
        assert planned(loader.plan) == {(g,): sum(sizes) - 2 for g, sizes in enumerate(PARTS)}


def test_empty_partitions_are_skipped(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.warns(UserWarning) as caught:
        loader = explicit_loader(db, [3, 1, 99], [3, 0, 1, 2], window_size=2, batch_size=100)
    assert [str(w.message) for w in caught] == [
        "group_scheme value(s) [99] match no rows of group_col 'gid', so they load nothing",
        "repartition_scheme value(s) [3, 2] match no rows of repartition_col 'part', so they load nothing",
    ]
    cells = [[(p.position, p.repartition_value, p.rows) for p in g.partitions] for g in loader.plan.groups]
    assert cells == [[(0, 0, 3)], [(0, 0, 15), (1, 1, 6)], []]
    assert [g.samples for g in loader.plan.groups] == [1, 19, 0]
    ((x, _),) = run_all(loader)
    assert len(x) == 20


def test_rows_within_a_group_follow_the_querys_order(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT rid, gid, part, y FROM series ORDER BY rid DESC"
    loader = DDBDataLoader(
        db, sql, target_col="y", input_col=["rid"], group_col="gid", repartition_col="part", batch_size=1000
    )
    ((x, _),) = run_all(loader)
    rids = [int(r[0]) for r in x]
    for gid in range(len(PARTS)):
        mine = [r for r in rids if r // 1_000_000 == gid]
        # Repartitions in scheme order (ascending part), rows inside each in the query's order.
        assert mine == sorted(mine, key=lambda r: (_part_of(gid, r % 1_000_000), -r))


def _part_of(gid: int, pos: int) -> int:
    edge = 0
    for part, size in enumerate(PARTS[gid]):
        edge += size
        if pos < edge:
            return part
    raise AssertionError(pos)


def test_dynamic_pivot_query_is_split_with_exact_counts(db: duckdb.DuckDBPyConnection) -> None:
    db.execute(
        "CREATE OR REPLACE TABLE ticks AS SELECT gid, part, pos // 3 AS step, "
        "['a', 'b', 'c'][pos % 3 + 1] AS k, f0 AS v FROM series WHERE NOT (gid = 3 AND pos % 3 = 2)"
    )
    sql = "PIVOT ticks ON k USING sum(v) GROUP BY gid, part, step ORDER BY gid, part, step"
    unordered = sql.split(" ORDER BY", maxsplit=1)[0]
    reference = tally(db, sql, "gid", "part")
    # PIVOT ... GROUP BY ... ORDER BY parses (issue 12: it was refused as unparsable).
    with DDBDataLoader(
        db, sql, target_col="a", input_col=["a", "b", "c"], group_col="gid", repartition_col="part"
    ) as loader:
        assert planned(loader.plan) == reference
        assert loader.plan.layout.x_names == ("a", "b", "c")
        x = [row for batch, _ in loader for row in batch.tolist()]
    # Group 3 has no 'c' values, yet its subquery has the column (all NULL → NaN).
    full = {tuple(r) for r in db.execute(f"SELECT a, b, c FROM ({unordered})").fetchall()}
    assert {tuple(None if math.isnan(v) else v for v in row) for row in x} == full
    assert len(x) == sum(reference.values())


# --- warnings -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nulls() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    connection.execute(
        """
        CREATE TABLE n AS SELECT
            CASE WHEN i % 5 = 0 THEN NULL ELSE i % 3 END AS g,
            CASE WHEN i % 7 = 0 THEN NULL ELSE i % 2 END AS r,
            i * 1.0 AS v
        FROM range(40) t(i)
        """
    )
    yield connection
    connection.close()


NULL_QUERIES = [
    "SELECT g, r, v FROM n ORDER BY v",
    "SELECT g, r, v FROM n UNION ALL SELECT g, r, v + 0.5 FROM n ORDER BY v",
    "SELECT g, r, max(v) AS v FROM n GROUP BY g, r, v ORDER BY v",
]


@pytest.mark.parametrize("sql", NULL_QUERIES, ids=["plain", "union", "group-by"])
def test_null_group_values_warn_with_the_column_and_row_count(
    nulls: duckdb.DuckDBPyConnection, sql: str
) -> None:
    copies = 2 if "UNION" in sql else 1
    with pytest.warns(
        UserWarning, match=rf"^{8 * copies} rows have NULL group_col 'g' and match no subquery"
    ):
        loader = DDBDataLoader(nulls, sql, target_col="v", group_col="g")
    assert [g.value for g in loader.plan.groups] == [0, 1, 2]
    assert loader.plan.rows == 32 * copies
    loader.close()


@pytest.mark.parametrize("sql", NULL_QUERIES, ids=["plain", "union", "group-by"])
def test_null_values_of_both_keys_warn_separately(nulls: duckdb.DuckDBPyConnection, sql: str) -> None:
    copies = 2 if "UNION" in sql else 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DDBDataLoader(nulls, sql, target_col="v", group_col="g", repartition_col="r", window_size=1)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"{6 * copies} rows have NULL repartition_col 'r'")
    assert messages[1].startswith(f"{8 * copies} rows have NULL group_col 'g'")
    assert all(w.filename == __file__ for w in caught)
    # Rows lost: g NULL (8) or r NULL (6), both NULL at i = 0, 35 (2).
    assert loader.plan.rows == (40 - 8 - 6 + 2) * copies
    loader.close()


def test_explicit_scheme_does_not_warn_about_nulls(nulls: duckdb.DuckDBPyConnection) -> None:
    with DDBDataLoader(
        nulls, "SELECT g, v FROM n", target_col="v", input_col="v", group_col="g", group_scheme=[1, 0]
    ) as loader:
        assert [g.rows for g in loader.plan.groups] == [11, 11]


def test_window_larger_than_a_group_warns_naming_it(db: duckdb.DuckDBPyConnection) -> None:
    with pytest.warns(UserWarning, match=r"samples need 6 consecutive rows, more than group\(s\) \[3\] have"):
        loader = DDBDataLoader(db, SERIES_SQL, target_col="y", group_col="gid", window_size=[4, 2])
    assert [g.samples for g in loader.plan.groups] == [29 - 5, 21 - 5, 38 - 5, 0]
    assert len(loader) == 29 + 21 + 38 - 15
    loader.close()


def test_window_larger_than_the_whole_query_is_refused_naming_why(db: duckdb.DuckDBPyConnection) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError) as raised:
            DDBDataLoader(
                db, "SELECT f0, y FROM series WHERE gid = 3 ORDER BY pos", target_col="y", window_size=5
            )
    assert str(raised.value) == (
        "the loader can make no sample: a sample needs 6 consecutive rows (x window 5, y window 1, "
        "offset 5), but the query returns only 3; check the query, the schemes and window_size"
    )
    assert not [str(w.message) for w in caught if "no samples" in str(w.message)]  # one message, not two


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"group_col": "gid"},
        {"group_col": "gid", "repartition_col": "part", "window_size": 3},
        {"group_col": "gid", "group_scheme": [0, 1], "repartition_col": "part"},
        {"repartition_col": "part", "shuffle": True, "seed": 1},
    ],
)
def test_a_query_without_rows_is_refused_at_construction(
    db: duckdb.DuckDBPyConnection, kwargs: dict[str, Any]
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            ValueError, match=r"^the loader can make no sample: the query \(.*\) returns no rows"
        ):
            DDBDataLoader(
                db,
                "SELECT gid, part, f0, y FROM series WHERE f0 < 0",
                target_col="y",
                exclude_col="y",
                **kwargs,
            )
    if "group_scheme" in kwargs:
        assert str(caught[0].message).startswith("group_scheme value(s) [0, 1] match no rows")


# --- sources --------------------------------------------------------------------------------


@pytest.fixture
def database_file(tmp_path: Path) -> Path:
    path = tmp_path / "factors.duckdb"
    writer = duckdb.connect(str(path))
    make_series(writer, [[5, 6], [7]])
    writer.close()
    return path


def test_database_path_is_opened_read_only_and_shared(database_file: Path) -> None:
    sql = "SELECT rid, y, gid, part FROM series ORDER BY rid"
    a = DDBDataLoader(database_file, sql, target_col="y", group_col="gid", batch_size=4)
    b = DDBDataLoader(str(database_file), sql, target_col="y", repartition_col="part", batch_size=5)
    assert "read-only" in a.plan.engine
    assert "read-only" in b.plan.engine
    # A read-write connection to the same file is refused while the loaders hold it read-only.
    with pytest.raises(duckdb.Error, match=r"(?i)different configuration|read.only"):
        duckdb.connect(str(database_file))
    results: dict[str, list[int]] = {}

    def consume(name: str, loader: DDBDataLoader) -> None:
        results[name] = [int(r) for x, _ in loader for r in x[:, 0].tolist()]

    threads = [threading.Thread(target=consume, args=(n, ld)) for n, ld in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    a.close()
    b.close()
    everything = [g * 1_000_000 + p for g, n in ((0, 11), (1, 7)) for p in range(n)]
    assert results["a"] == everything
    assert sorted(results["b"]) == everything
    assert len(a) == 5
    assert len(b) == 4
    # Closed: the file is free for a writer again.
    writer = duckdb.connect(str(database_file))
    assert writer.execute("SELECT count(*) FROM series").fetchall() == [(18,)]
    writer.close()


def test_missing_database_path_is_a_file_not_found_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "absent.duckdb"
    with pytest.raises(FileNotFoundError, match=r"absent\.duckdb"):
        DDBDataLoader(missing, "SELECT 1 AS y", target_col="y")
    assert not missing.exists()
    assert not missing.parent.exists()


def test_discovered_repartitions_are_sorted_in_every_group(db: duckdb.DuckDBPyConnection) -> None:
    # Group 0 has only part 2, group 2 parts 1 and 2: the order must not follow first appearance.
    sql = "SELECT gid, part, y FROM series WHERE gid = 0 AND part = 2 OR gid = 2 AND part IN (1, 2)"
    with DDBDataLoader(
        db, sql, target_col="y", input_col="y", group_col="gid", repartition_col="part"
    ) as loader:
        assert [[s.repartition_value for s in g.partitions] for g in loader.plan.groups] == [[2], [1, 2]]


# --- pieces of a streamed subquery -------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "budget", "sizes"),
    [
        (1000, 0, [1000]),  # fetch_bytes=0: nothing is streamed
        (1000, 16_000, [1000]),  # fits the budget
        (1000, 1600, [100] * 10),
        (1000, 3000, [167] * 4 + [166] * 2),  # 187 rows fit: 6 near-equal pieces
        (1000, 16, [63] * 8 + [62] * 8),  # a budget under MIN_PIECE_ROWS rows counts as that many
        (MIN_PIECE_ROWS, 16, [MIN_PIECE_ROWS]),
    ],
)
def test_pieces_keep_within_the_budget_and_near_equal(rows: int, budget: int, sizes: list[int]) -> None:
    cut = pieces(rows, 16, budget)
    assert sorted(size for _, size in cut) == sorted(sizes)
    assert [first for first, _ in cut] == [sum(s for _, s in cut[:n]) for n in range(len(cut))]
    assert sum(size for _, size in cut) == rows


def test_a_subquery_over_fetch_bytes_becomes_consecutive_pieces_of_its_group(
    db: duckdb.DuckDBPyConnection,
) -> None:
    # Rows of x = f0 and y are 16 bytes; 12 * 16 bytes fit 12 rows, which count as 64.
    make_series(db, [[200, 7, 130]], table="wide")
    sql = "SELECT gid, part, pos, rid, f0, f1, y FROM wide ORDER BY gid, part, pos"
    options: dict[str, Any] = {"input_col": ["f0"], "repartition_col": "part"}
    with DDBDataLoader(db, sql, "y", fetch_bytes=12 * 16, **options) as loader:
        partitions = views(loader.plan.groups[0])
        rows = [float(r) for x, _ in loader for r in x[:, 0].tolist()]
    assert [(p.repartition_value, p.piece, p.pieces, p.first_row, p.rows) for p in partitions] == [
        (0, 0, 4, 0, 50),
        (0, 1, 4, 50, 50),
        (0, 2, 4, 100, 50),
        (0, 3, 4, 150, 50),
        (1, 0, 1, 0, 7),
        (2, 0, 3, 0, 44),
        (2, 1, 3, 44, 43),
        (2, 2, 3, 87, 43),
    ]
    assert [p.position for p in partitions] == list(range(8))
    assert rows == [float(r) for r in range(337)]
    with DDBDataLoader(db, sql, "y", fetch_bytes=0, **options) as whole:
        assert [p.rows for p in whole.plan.groups[0].partitions] == [200, 7, 130]


@pytest.mark.parametrize("ordered", [True, False])
def test_pieces_of_a_query_without_order_by_are_warned_about(
    db: duckdb.DuckDBPyConnection, ordered: bool
) -> None:
    """A piece read again (resume, retry, another rank) gets the engine's order of that run."""
    make_series(db, [[200, 7]], table="wide")
    sql = "SELECT gid, part, f0, y FROM wide" + (" ORDER BY gid, part, pos" if ordered else "")
    options: dict[str, Any] = {"input_col": ["f0"], "repartition_col": "part", "fetch_bytes": 12 * 16}
    about_order = warnings_containing("no ORDER BY", lambda: DDBDataLoader(db, sql, "y", **options).close())
    if ordered:
        assert about_order == []
    else:
        assert len(about_order) == 1
        assert about_order[0].startswith("1 subquery is read in pieces (more than fetch_bytes each;")
        assert "partition 0 of group 0" in about_order[0]


def test_unit_queries_are_rendered_once_per_shape_and_kept_bounded(
    db: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every epoch cuts units of the same shapes; an IN list of a thousand parameters costs
    milliseconds to render, so the plan keeps the text of each shape (a bounded number)."""
    with explicit_loader(db, [0, 1, 2, 3], [0, 1, 2, 3]) as loader:
        plan = loader.plan
        assert plan.query is not None
        keys = [expression for _, expression in plan.keys]
        first = unit_sql(plan, [3, None], lists=False)
        assert first == plan.query.filtered_many(keys, [3, None]) and first is not None and "IN" in first
        assert unit_sql(plan, [3, None], lists=False) is first
        assert unit_sql(plan, [2, 4], lists=False) == plan.query.filtered_many(keys, [2, 4])
        # with lists the text depends only on which keys are bound
        assert unit_sql(plan, [5, None], lists=True) is unit_sql(plan, [7, None], lists=True)
        assert unit_sql(plan, [5, None], lists=True) == plan.query.filtered_many(keys, [5, None], lists=True)
        monkeypatch.setattr("ddbloader._sql.read.UNIT_SQL_SHAPES", 3)
        for count in range(1, 8):
            assert unit_sql(plan, [count, None], lists=False) == plan.query.filtered_many(keys, [count, None])
            assert len(plan.rendered) <= 3


# --- the state names its plan -------------------------------------------------------------------


def test_a_state_from_another_plan_is_refused_naming_what_differs(db: duckdb.DuckDBPyConnection) -> None:
    # The same samples, partitions and counts per group in another order: 90 of 384 samples served
    # twice when only counts identified the plan.
    def made(scheme: list[int] | None, sql: str = SERIES_SQL) -> DDBDataLoader:
        return DDBDataLoader(
            db, sql, "y", input_col=["f0"], group_col="gid", group_scheme=scheme, window_size=2
        )

    with made([0, 1, 2, 3]) as saved:
        state = json.loads(json.dumps(saved.state_dict()))
    with made([0, 1, 2, 3]) as same:
        same.load_state_dict(state)  # the same plan resumes
    with (
        made([1, 0, 2, 3]) as reordered,
        pytest.raises(ValueError, match=r"differs in the group and repartition"),
    ):
        reordered.load_state_dict(state)
    with (
        made([0, 1, 2, 3], SERIES_SQL + " , rid") as requery,
        pytest.raises(ValueError, match=r"differs in the query text\)"),
    ):
        requery.load_state_dict(state)
    with made([0, 1, 2, 3]) as again:
        assert plan_differences(state["plan"], plan_fingerprint(again.plan)) == []
