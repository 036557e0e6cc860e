"""Range pieces (ddbloader/_sql/pieces.py, range_cutter.py): the layout, pure, and the pieces against engines.

The layout is checked without an engine: tiles are computed from a list of keys as the ranking
query computes them (``(rank - 1) * tiles // rows``), and every row must land in exactly one
piece, ties together, in the query's order for contiguous pieces. Against DuckDB, PostgreSQL and
SQLite, a shuffled loader over one big partition must cut it into range pieces and serve every
window (or row) of the query run whole exactly once, with windows across pieces, ties and NULLs
on the order key.
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from conftest import ENGINES, TableEngine, assert_units_split_as_read_alone, examples, table_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from planned import views
from resume_check import assert_resumes_exactly
from sqlglot import exp

from ddbloader import DDBDataLoader
from ddbloader._epoch.shard import epoch_units
from ddbloader._epoch.units import fetch_units
from ddbloader._sql.pieces import KeyRanges, combed_count, layout
from ddbloader._sql.plan import PIECES_PER_QUERY
from ddbloader._sql.range_cutter import OrderKey
from ddbloader._sql.tuple_order import Point

# --- the layout, pure --------------------------------------------------------------------------


def _tiles(keys: list[int], count: int) -> list[tuple[Point, int]]:
    """``(first row's tuple, rows)`` per non-empty tile of one ascending term, as the ranking
    query computes them."""
    ordered = sorted(keys)
    tiles: dict[int, list[int]] = {}
    for key in ordered:
        rank = ordered.index(key)  # RANK() - 1: equal keys share the first position
        tiles.setdefault(rank * count // len(ordered), []).append(key)
    return [((min(v),), len(v)) for _, v in sorted(tiles.items())]


def _holds(piece: KeyRanges, key: int | None) -> bool:
    """Whether one ascending, never-NULL term's ``key`` lies in ``piece``."""
    if key is None:
        return False
    return any((lo is None or (key,) >= lo) and (hi is None or (key,) < hi) for lo, hi in piece.spans)


@settings(max_examples=examples(300), deadline=None)
@given(
    keys=st.lists(st.integers(0, 40), min_size=1, max_size=200),
    pieces=st.integers(1, 12),
    stripes=st.integers(1, 6),
    band=st.sampled_from([1, 2, 3, 64]),
)
def test_layout_puts_every_row_in_exactly_one_piece_ties_together_in_order(
    keys: list[int], pieces: int, stripes: int, band: int
) -> None:
    tiles = _tiles(keys, pieces * stripes)
    cut = layout(tiles, (False,), pieces, band)
    owners = {key: [i for i, (piece, _) in enumerate(cut) if _holds(piece, key)] for key in set(keys)}
    assert all(len(found) == 1 for found in owners.values()), owners  # exactly once; ties together
    for index, (piece, planned) in enumerate(cut):
        assert planned == sum(owners[key] == [index] for key in keys)  # the planned count is exact
        assert planned > 0
        assert list(piece.spans) == sorted(piece.spans, key=lambda r: (-1,) if r[0] is None else r[0])
    assert len(cut) <= pieces
    if band == 1 or pieces == 1:  # contiguous: the pieces in plan order are the rows in the query's order
        served = [key for piece, _ in cut for key in sorted(k for k in keys if _holds(piece, k))]
        assert served == sorted(keys)
        assert all(len(piece.spans) <= 1 for piece, _ in cut)


#: Every pair of ``a`` and ``b`` in 0..3 or NULL, twice: rows the ORDER BY ties.
_PAIRS = (
    "SELECT a, b FROM (SELECT UNNEST([0, 1, 2, 3, NULL]) AS a), (SELECT UNNEST([0, 1, 2, 3, NULL]) AS b), "
    "range(2)"
)


@settings(max_examples=examples(150), deadline=None)
@given(
    cuts=st.lists(st.integers(0, 50), min_size=1, max_size=8, unique=True),
    directions=st.tuples(st.booleans(), st.booleans()),
    nulls_first=st.tuples(st.booleans(), st.booleans()),
    open_low=st.booleans(),
    open_high=st.booleans(),
    without_nulls=st.booleans(),
)
def test_the_predicate_holds_exactly_the_rows_the_engine_orders_into_the_ranges(
    cuts: list[int],
    directions: tuple[bool, bool],
    nulls_first: tuple[bool, bool],
    open_low: bool,
    open_high: bool,
    without_nulls: bool,
) -> None:
    """Ranges over the whole ORDER BY tuple ``(a, b)``, each term with its own direction and NULL
    placement: a piece's predicate holds exactly the rows between its ends in DuckDB's ORDER BY
    of the tuple (ties, which share their tuple, together)."""
    terms = [
        OrderKey(exp.column(name), desc, first, name)
        for name, desc, first in zip("ab", directions, nulls_first, strict=True)
    ]
    order = ", ".join(
        f"{t.text} {'DESC' if t.descending else 'ASC'} NULLS {'FIRST' if t.nulls_first else 'LAST'}"
        for t in terms
    )
    with duckdb.connect() as con:
        where = " WHERE a IS NOT NULL AND b IS NOT NULL" if without_nulls else ""
        con.execute(f"CREATE TABLE v AS SELECT * FROM ({_PAIRS}){where}")
        ordered = con.execute(
            f"SELECT a, b, RANK() OVER (ORDER BY {order}) - 1 FROM v ORDER BY {order}"
        ).fetchall()
        starts = sorted({ordered[c % len(ordered)][2] for c in cuts})  # cut where a tie starts
        ends = [(start, tuple(ordered[start][:2])) for start in starts]
        if len(ends) % 2:
            ends = ends[:-1] if len(ends) > 1 else [*ends, (len(ordered), None)]
        ranges = [[ends[i], ends[i + 1]] for i in range(0, len(ends), 2)]
        if open_low:
            ranges[0][0] = (0, None)
        if open_high:
            ranges[-1][1] = (len(ordered), None)
        ranges = [r for r in ranges if r[0][0] < r[1][0]]
        if not ranges:
            return
        piece = KeyRanges(tuple((lo[1], hi[1]) for lo, hi in ranges), (not without_nulls, not without_nulls))
        sql = exp.select("a", "b").from_("v").where(piece.predicate(terms, 1)).sql(dialect="duckdb")
        held = sorted(con.execute(sql, list(piece.bounds())).fetchall(), key=repr)
    expected = [tuple(row[:2]) for lo, hi in ranges for row in ordered[lo[0] : hi[0]]]
    assert held == sorted(expected, key=repr)


def test_combed_pieces_spread_over_their_band() -> None:
    tiles = [((k * 10,), 10) for k in range(64)]  # 640 distinct keys, 16 tiles per piece
    cut = layout(tiles, (False,), 4, 64)
    assert [rows for _, rows in cut] == [160] * 4
    # one tile of every pass of 4, the deal rotated by one every 4 passes: a piece's tile at the
    # end of one pass meets its tile at the start of the next where the deal turns round
    assert [len(piece.spans) for piece, _ in cut] == [16, 15, 15, 15]
    for piece, _ in cut:
        assert piece.band == 0
        # every piece's rows sit at the band's middle on average: no piece leans to one end
        assert sum((first + (rows - 1) / 2) * rows for first, rows in piece.runs) / 160 == 319.5
    assert cut[0][0].spans[0][0] is None and cut[0][0].spans[-1][1] is None  # dealt 3 on, last


@settings(max_examples=examples(300), deadline=None)
@given(
    pieces=st.integers(1, 70),
    stripes=st.sampled_from([1, 2, 5, 8, 32]),
    per_tile=st.integers(1, 9),
    extra=st.integers(0, 400),
    slack=st.integers(0, 60),
)
def test_combed_pieces_fit_the_budget_spread_evenly_and_sit_at_the_middle(
    pieces: int, stripes: int, per_tile: int, extra: int, slack: int
) -> None:
    """Rows the ORDER BY does not tie: every combed piece holds at most ``limit`` rows, what the
    budget holds (at least ``ceil(rows / pieces)``: ``pieces`` is the count the budget asks
    for), and no more pieces are cut than that takes. Over tiles of equal rows (``extra == 0``), a piece's
    next tile lies at most a pass (``pieces`` tiles) and ``pieces / stripes`` tiles on, and
    its rows' mean position is the middle of the band within ``pieces / stripes / 2 + 1`` tiles.
    (Tiles dealt alike every pass: off by up to ``(pieces - 1) / 2`` tiles.)"""
    rows = pieces * stripes * per_tile + extra
    limit = -(-rows // pieces) + slack
    count = combed_count(rows, pieces, stripes, limit)
    tiles = _tiles(list(range(rows)), count * stripes)
    cut = layout(tiles, (False,), count, 64)
    assert sum(size for _, size in cut) == rows
    assert max(size for _, size in cut) <= limit
    if count > pieces:  # one piece fewer would not do: its tiles could hold more than the limit
        assert stripes * -(-rows // ((count - 1) * stripes)) > limit
    if extra or pieces > 64:  # unequal tiles, or several bands
        return
    assert len(cut) == pieces
    for piece, size in cut:
        starts = [first // per_tile for first, n in piece.runs for first in range(first, first + n, per_tile)]
        assert max((b - a for a, b in itertools.pairwise(starts)), default=0) <= pieces + -(
            -pieces // stripes
        )
        mean = sum((first + (n - 1) / 2) * n for first, n in piece.runs) / size
        assert abs(mean - (rows - 1) / 2) <= (pieces / stripes / 2 + 1) * per_tile, (mean, piece.runs)


def test_a_tie_larger_than_a_piece_stays_whole() -> None:
    tiles = [((0,), 5), ((1,), 100), ((2,), 5)]
    cut = layout(tiles, (False,), 4, 1)
    assert sum(rows for _, rows in cut) == 110
    assert any(rows >= 100 and any(lo == (1,) or (lo is None) for lo, _ in p.spans) for p, rows in cut)


# --- against the engines -----------------------------------------------------------------------

ROWS = 900
#: ``f`` and ``y`` (DOUBLE, loaded as torch's default float32) are 8 bytes a row: 100 rows fit
#: fetch_bytes, so the 900-row query is cut.
FETCH_BYTES = 100 * 8


def _table() -> pa.Table:
    """``k``: the order key, with ties (runs of equal values, one of 150 rows) and 40 NULLs;
    ``id`` makes the order total; ``f`` = ``id`` as float; ``u``: a unique key stored out of its
    order (a permutation of the ids)."""
    rng = np.random.default_rng(3)
    k: list[int | None] = [int(v) for v in rng.integers(0, 200, ROWS)]
    for i in range(300, 450):
        k[i] = 77
    for i in rng.choice(ROWS, 40, replace=False):
        k[int(i)] = None
    ids = list(range(ROWS))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array(k, pa.int64()),
            "f": pa.array([float(i) for i in ids], pa.float64()),
            "y": pa.array([float(i) + 0.5 for i in ids], pa.float64()),
            "u": pa.array(rng.permutation(ROWS), pa.int64()),
        }
    )


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TableEngine]:
    with table_engine(request, tmp_path, request.param, _table()) as engine:
        yield engine


ORDERS = ["k, id", "k DESC, id", "k NULLS FIRST, id", "k DESC NULLS LAST, id"]


@pytest.mark.parametrize("order", ORDERS)
def test_windows_across_range_pieces_are_the_whole_querys_each_once(engine: TableEngine, order: str) -> None:
    sql = f"SELECT id, k, f, y FROM t ORDER BY {order}"
    options: dict[str, Any] = {
        "input_col": ["f"],
        "batch_size": 32,
        "shuffle": True,
        "seed": 11,
        "window_size": 5,
        "key_col": ["id"],
        "fetch_bytes": FETCH_BYTES,
    }
    with DDBDataLoader(engine.source, sql, "y", **options) as loader:
        partitions = views(loader.plan.groups[0])
        got = list(loader)
    assert len(partitions) > 5 and all(p.ranges is not None for p in partitions)
    # the whole tuple (k, id) is distinct, NULLs of k and all: the pieces are combed
    assert any(len(p.ranges.spans) > 1 for p in partitions if p.ranges)
    whole = [int(i) for i in engine.run(f"SELECT id FROM ({sql}) AS q")]
    position = {row: n for n, row in enumerate(whole)}
    firsts = []
    for x, y, keys in got:
        for window, target, key in zip(
            x[:, :, 0].tolist(), y[:, 0, 0].tolist(), keys["id"].tolist(), strict=True
        ):
            start = position[int(window[0])]
            assert [int(v) for v in window] == whole[start : start + 5]  # consecutive rows of the whole query
            assert key == whole[start + 5] and target == key + 0.5
            firsts.append(start)
    assert sorted(firsts) == list(range(ROWS - 5))  # every window once, across pieces, ties and NULLs
    assert firsts != sorted(firsts)


def test_rows_of_combed_pieces_are_the_whole_querys_each_once(engine: TableEngine) -> None:
    sql = "SELECT id, k, f, y FROM t ORDER BY k, id"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 2}
    with DDBDataLoader(engine.source, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        partitions = views(loader.plan.groups[0])
        got = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
    assert len(partitions) > 5 and any(len(p.ranges.spans) > 1 for p in partitions if p.ranges)
    assert got == list(range(ROWS))


#: ``(select list, ORDER BY, the result column it orders by)``: the reader must sort by the
#: column the engine resolves the term to: an alias shadowing a column of ``t`` (``-u AS u``), an
#: ordinal, a quoted mixed-case alias, an unquoted name folded to a quoted one.
READER_ORDERS = [
    ("id, k, f, y, u", "u", "u"),
    ("id, k, f, y, u", "u DESC", "u"),
    ("-u AS u, id, k, f, y", "u", "u"),
    ("id, k, f, y, -u AS u", "u DESC", "u"),
    ("-u AS nu, id, k, f, y", "1", "nu"),
    ("id, k, f, y, -u AS nu", "5 DESC", "nu"),
    ('id, k, f, y, -u AS "Nu"', '"Nu"', "Nu"),
    ("id, k, f, y, -u AS Nu", "nu DESC", "nu"),
]


@pytest.mark.parametrize(("select", "order", "column"), READER_ORDERS)
def test_combed_pieces_the_reader_orders_hold_the_querys_rows_in_order(
    engine: TableEngine, select: str, order: str, column: str
) -> None:
    """A single integer ORDER BY term never NULL: the combed pieces' queries have no ORDER BY, and
    the reader puts their rows in the query's order, here from storage out of that order."""
    sql = f"SELECT {select} FROM t ORDER BY {order}"
    if engine.name != "postgres" and column == "nu" and "Nu" in select:
        column = "Nu"  # DuckDB and SQLite keep an unquoted alias's case; PostgreSQL folds it
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 2}
    with DDBDataLoader(engine.source, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        partitions = views(loader.plan.groups[0])
        got = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
        assert loader._backend is not None
        cursor = loader._backend.cursor()
        pieces = [(p, p.ranges.in_order(cursor.fetch(p.sql, p.params))) for p in partitions if p.ranges]
        cursor.close()
    assert got == list(range(ROWS))
    keyed = [(p, table) for p, table in pieces if p.ranges and p.pieces == 1]
    assert len(keyed) > 5 and all(p.ranges and p.ranges.sort is not None for p, _ in keyed)
    assert all("ORDER BY" not in p.sql.upper() for p, _ in keyed)
    whole_ids = [int(v) for v in engine.run(f"SELECT id FROM ({sql}) AS q")]
    for _, table in keyed:  # the very rows of the query run whole, in its order
        ids = [int(v) for v in table.column("id").to_pylist()]
        assert ids == [i for i in whole_ids if i in set(ids)]


@pytest.mark.parametrize("order", ["k", "k DESC NULLS FIRST"])
def test_a_key_holding_null_is_ordered_by_the_engine(engine: TableEngine, order: str) -> None:
    """``k`` holds NULLs and ties: its pieces keep the engine's ORDER BY, and every row comes once."""
    sql = f"SELECT id, k, f, y FROM t ORDER BY {order}"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 2}
    with DDBDataLoader(engine.source, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        ranged = [p for p in views(loader.plan.groups[0]) if p.ranges]
        got = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
    assert got == list(range(ROWS))
    assert len(ranged) > 5 and all(p.ranges and p.ranges.sort is None and "ORDER BY" in p.sql for p in ranged)


@pytest.mark.parametrize("order", ["k, id", "f", "CAST(id AS TEXT)", "id + 0", "-id"])
def test_the_engine_orders_combed_pieces_unless_one_integer_column_does(
    con: duckdb.DuckDBPyConnection, order: str
) -> None:
    con.register("_incoming", _table())
    con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    sql = f"SELECT id, k, f, y, CAST(id AS TEXT) AS s FROM t ORDER BY {order}"
    loader = DDBDataLoader(con, sql, "y", input_col=["f"], shuffle=True, fetch_bytes=FETCH_BYTES)
    ranged = [p for p in views(loader.plan.groups[0]) if p.ranges is not None]
    assert len(ranged) > 5
    assert all(p.ranges is not None and p.ranges.sort is None and "ORDER BY" in p.sql for p in ranged)


@pytest.mark.parametrize("engine", ["postgres"], indirect=True)
def test_an_unquoted_order_by_name_folds_as_the_engine_folds_it(engine: TableEngine) -> None:
    """PostgreSQL folds ``ORDER BY U`` to ``u``: the query is ordered by the column ``u``, not by
    the column ``"U"`` selected before it (which a case-insensitive match would take), so the
    windows across contiguous pieces and the reader's sort of combed ones follow ``u``."""
    sql = 'SELECT -u AS "U", id, k, f, y, u FROM t ORDER BY U'
    whole = [int(i) for i in engine.run(f"SELECT id FROM ({sql}) AS q")]
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 32, "shuffle": True, "seed": 3}
    with DDBDataLoader(engine.source, sql, "y", fetch_bytes=FETCH_BYTES, window_size=3, **options) as loader:
        windows = [[int(v) for v in w] for x, _ in loader for w in x[:, :, 0].tolist()]
    position = {row: n for n, row in enumerate(whole)}
    assert sorted(position[w[0]] for w in windows) == list(range(ROWS - 3))
    assert all(w == whole[position[w[0]] : position[w[0]] + 3] for w in windows)
    with DDBDataLoader(engine.source, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        sorts = {p.ranges.sort for p in views(loader.plan.groups[0]) if p.ranges}
    assert sorts == {(5, False)}  # the column u, the sixth


@pytest.mark.slow
def test_combed_pieces_the_reader_orders_over_extreme_and_zoned_keys(con: duckdb.DuckDBPyConnection) -> None:
    """Integer extremes (signed and unsigned), dates and zoned timestamps across a daylight-saving
    change under a non-UTC session: Arrow's order is the engine's, piece by piece, and every row
    comes once."""
    con.execute("SET TimeZone = 'America/New_York'")
    con.execute(
        "CREATE TABLE t AS SELECT i AS id, i * 1.0 AS f, i * 1.0 AS y, (i * 7919) % 3000 AS u "
        "FROM range(3000) r(i)"
    )
    keys = [
        "CAST(u AS SMALLINT) - 32000",
        "CAST(u AS BIGINT) - 9223372036854775000",
        "CAST(u AS UBIGINT) + 18446744073709540000",
        "DATE '2000-01-01' + CAST(u AS INTEGER)",
        "TIMESTAMPTZ '2024-11-03 04:00:00+00' + INTERVAL (u) MINUTE",
        "TIMESTAMP '2024-03-10 01:00:00' + INTERVAL (u) SECOND",
    ]
    for key in keys:
        for direction in ("", " DESC"):
            sql = f"SELECT id, f, y, {key} AS sk FROM t ORDER BY sk{direction}"
            with DDBDataLoader(
                con, sql, "y", input_col=["f"], shuffle=True, seed=1, fetch_bytes=2048, key_col=["id"]
            ) as loader:
                partitions = views(loader.plan.groups[0])
                got = sorted(int(i) for _, _, k in loader for i in k["id"].tolist())
                cursor = loader._backend.cursor()  # type: ignore[union-attr]
                read = [(p, p.ranges.in_order(cursor.fetch(p.sql, p.params))) for p in partitions if p.ranges]
                cursor.close()
            assert got == list(range(3000)), sql
            sorts = {p.ranges.sort for p, _ in read if p.ranges}
            assert len(read) > 5 and sorts == {(3, bool(direction))}, sql
            whole = [int(i) for (i,) in con.execute(f"SELECT id FROM ({sql}) AS q").fetchall()]
            for _, table in read:
                ids = set(table.column("id").to_pylist())
                assert table.column("id").to_pylist() == [i for i in whole if i in ids], sql


@pytest.mark.slow
def test_the_reader_orders_each_subquery_by_the_term_after_its_keys(con: duckdb.DuckDBPyConnection) -> None:
    """With group_col and repartition_col, the ORDER BY's one other term is the reader's sort
    wherever it stands among them; each piece holds its subquery's rows in the query's order."""
    con.execute(
        "CREATE TABLE t AS SELECT i AS id, i % 2 AS g, i % 3 AS r, (i * 7919) % 6000 AS u, i * 1.0 AS f, "
        "i * 1.0 AS y FROM range(6000) s(i)"
    )
    for order in ("g, r, u DESC", "u DESC, g, r", "r, u DESC, g"):
        sql = f"SELECT id, g, r, u, f, y FROM t ORDER BY {order}"
        options: dict[str, Any] = {"input_col": ["f"], "shuffle": True, "seed": 1, "key_col": ["id"]}
        with DDBDataLoader(
            con, sql, "y", group_col="g", repartition_col="r", fetch_bytes=2048, **options
        ) as loader:
            got = sorted(int(i) for _, _, k in loader for i in k["id"].tolist())
            read = [p for p in views(loader.plan) if p.ranges]
            cursor = loader._backend.cursor()  # type: ignore[union-attr]
            tables = [(p, p.ranges.in_order(cursor.fetch(p.sql, p.params))) for p in read if p.ranges]
            cursor.close()
        assert got == list(range(6000)), order
        assert len(tables) > 12 and all(p.ranges and p.ranges.sort == (3, True) for p, _ in tables), order
        whole = [tuple(row) for row in con.execute(f"SELECT g, r, id FROM ({sql}) AS q").fetchall()]
        for p, table in tables:
            ids = set(table.column("id").to_pylist())
            assert table.column("id").to_pylist() == [i for g, r, i in whole if i in ids], order
            assert set(table.column("g").to_pylist()) == {p.params[0]}


@pytest.mark.slow
def test_reader_ordered_pieces_resume_exactly_and_verify(con: duckdb.DuckDBPyConnection) -> None:
    """Pieces the reader orders resume mid-epoch to the same samples and pass ``verify=True``."""
    con.register("_incoming", _table())
    con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    sql = "SELECT id, k, f, y, u FROM t ORDER BY u DESC"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 16, "shuffle": True, "seed": 4}
    with DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, verify=True, **options) as verified:
        assert all(p.ranges and p.ranges.sort == (4, True) for p in views(verified.plan.groups[0]))
        assert sorted(int(v) for x, _ in verified for v in x[:, 0].tolist()) == list(range(ROWS))
    assert_resumes_exactly(lambda: DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, **options), epochs=2)


# --- tagged pieces: neighbouring combed pieces read by one query -------------------------------


@pytest.mark.parametrize("order", ["u", "u DESC", "id"])
def test_neighbouring_combed_pieces_share_a_query_split_exactly_as_read_alone(
    engine: TableEngine, order: str
) -> None:
    """Each fetch unit of tagged pieces reads up to PIECES_PER_QUERY neighbours with one query; the
    split gives every piece the very rows, in the very order, of its own query read alone (``u``:
    stored out of its order, so the reader sorts each piece after the split)."""
    sql = f"SELECT id, k, f, y, u FROM t ORDER BY {order}"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 2}
    with DDBDataLoader(engine.source, sql, "y", fetch_bytes=FETCH_BYTES, key_col=["id"], **options) as loader:
        plan, config = loader.plan, loader.config
        partitions = views(plan.groups[0])
        assert len(partitions) > 5 and all(p.tagged for p in partitions)
        for epoch in range(2):
            units = list(
                fetch_units(plan, epoch_units(plan, config, epoch), config, epoch, config.fetch_bytes)
            )
            assert units and all(u.split == "cells" and 2 <= len(u.cells) <= PIECES_PER_QUERY for u in units)
            assert all(
                plan.groups[0].read_together(a.position, b.position)
                for u in units
                for a, b in itertools.pairwise(u.cells)
            )
            assert_units_split_as_read_alone(loader, units)
        got_ids = sorted(int(v) for _, _, keys in loader for v in keys["id"].tolist())
        stats = loader.stats()
    assert got_ids == list(range(ROWS))
    assert stats.partitions_fetched == len(partitions) and stats.queries < len(partitions)


def test_a_tagged_piece_whose_rows_changed_is_refused_naming_it(con: duckdb.DuckDBPyConnection) -> None:
    """A row added after planning: the unit does not split into the planned counts, its pieces
    are fetched one by one, and the one that changed is refused by name, before it is served."""
    con.register("_incoming", _table())
    con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    sql = "SELECT id, k, f, y, u FROM t ORDER BY u"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 16, "shuffle": True, "seed": 3}
    with DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        assert all(p.tagged for p in views(loader.plan.groups[0]))
        con.execute("INSERT INTO t VALUES (900, 1, 900.0, 900.5, 450)")
        with pytest.raises(ValueError, match=r"order key in .* returned \d+ rows, but planning") as info:
            for _ in loader:
                pass
    found = re.search(r"returned (\d+) rows, but planning counted (\d+)", str(info.value))
    assert found and int(found[1]) == int(found[2]) + 1  # the one row added
    assert "up to the end of this piece" not in str(
        info.value
    )  # refused by the unit's fallback, not a stream


@pytest.mark.slow
def test_tagged_pieces_resume_exactly_and_shard_each_sample_once(con: duckdb.DuckDBPyConnection) -> None:
    con.register("_incoming", _table())
    con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    sql = "SELECT id, k, f, y, u FROM t ORDER BY u"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 16, "shuffle": True, "seed": 4}
    assert_resumes_exactly(lambda: DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, **options), epochs=2)
    seen: list[int] = []
    for rank in range(2):
        with DDBDataLoader(
            con, sql, "y", fetch_bytes=FETCH_BYTES, rank=rank, world_size=2, even_batches="drop", **options
        ) as shard:
            seen += [int(v) for x, _ in shard for v in x[:, 0].tolist()]
    assert sorted(seen) == list(range(ROWS))


def test_in_order_sorts_stably_and_leaves_sorted_rows_alone() -> None:
    table = pa.table({"k": [3, 1, 2, 1, 3], "v": [0, 1, 2, 3, 4]})
    ascending = KeyRanges(((None, None),), (False,), sort=(0, False)).in_order(table)
    assert ascending.column("v").to_pylist() == [1, 3, 2, 0, 4]  # ties in their arrival order
    descending = KeyRanges(((None, None),), (False,), sort=(0, True)).in_order(table)
    assert descending.column("v").to_pylist() == [0, 4, 2, 1, 3]
    assert KeyRanges(((None, None),), (False,), sort=(0, False)).in_order(ascending) is ascending
    assert KeyRanges(((None, None),), (False,)).in_order(table) is table


@pytest.mark.parametrize(
    ("sql", "window", "combed"),
    [
        ("SELECT id, k, f, y FROM t ORDER BY k", 3, False),  # ties: contiguous
        ("SELECT id, k, f, y FROM t ORDER BY k, id", 3, True),  # a distinct tuple, NULLs and all: combed
        ("SELECT id, u, f, y FROM t ORDER BY u DESC", [3, 2], True),  # a distinct key: combed windows
    ],
)
def test_range_pieces_resume_exactly_and_refuse_another_layout(
    con: duckdb.DuckDBPyConnection, sql: str, window: Any, combed: bool
) -> None:
    con.register("_incoming", _table())
    con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    options: dict[str, Any] = {
        "input_col": ["f"],
        "batch_size": 16,
        "shuffle": True,
        "seed": 4,
        "window_size": window,
    }
    with DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        assert loader.plan.groups[0].combed_windows == combed
    assert_resumes_exactly(lambda: DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, **options), epochs=2)
    loader = DDBDataLoader(con, sql, "y", fetch_bytes=FETCH_BYTES, **options)
    next(iter(loader))
    state = loader.state_dict()
    other = DDBDataLoader(con, sql, "y", fetch_bytes=2 * FETCH_BYTES, **options)
    with pytest.raises(ValueError, match=r"fetch_bytes|plan"):
        other.load_state_dict(state)


def _spearman(values: list[float]) -> float:
    ranks = np.argsort(np.argsort(values))
    return float(np.corrcoef(np.arange(len(values)), ranks)[0, 1])


def test_a_shuffled_epoch_of_one_big_partition_is_not_in_row_order(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(100000) r(i)")
    with DDBDataLoader(
        con,
        "SELECT * FROM big ORDER BY id",
        "y",
        input_col=["f"],
        batch_size=256,
        shuffle=True,
        seed=0,
        fetch_bytes=50_000,  # 8-byte rows (float32 f and y): pieces of 6,250 rows
        key_col=["id"],
    ) as loader:
        ids = [int(v) for _, _, keys in loader for v in keys["id"].tolist()]
        stats = loader.stats()
    assert sorted(ids) == list(range(100000))
    assert abs(_spearman(ids)) < 0.2  # a walk front to back: +0.99
    blocks = [len({i // 10000 for i in ids[b : b + 256]}) for b in range(0, len(ids), 256)]
    assert np.median(blocks) >= 9  # 10 blocks of 10,000 ids: nearly every batch holds all of them
    assert abs(stats.rank_correlation) < 0.2


def test_no_order_by_falls_back_with_a_warning_naming_the_fixes(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(20000) r(i)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DDBDataLoader(
            con,
            "SELECT * FROM big",
            "y",
            input_col=["f"],
            batch_size=256,
            shuffle=True,
            seed=0,
            fetch_bytes=50_000,
        )
    texts = [str(w.message) for w in caught if "cannot be cut into pieces" in str(w.message)]
    assert len(texts) == 1 and "no ORDER BY" in texts[0] and "fetch_bytes=0" in texts[0]
    assert all(p.ranges is None for p in views(loader.plan.groups[0]))
    assert views(loader.plan.groups[0])[0].pieces > 1  # streamed front to back, as before
    loader.close()


def test_without_shuffle_nothing_is_cut_by_ranges(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(20000) r(i)")
    with DDBDataLoader(
        con, "SELECT * FROM big ORDER BY id", "y", input_col=["f"], fetch_bytes=50_000
    ) as loader:
        assert all(p.ranges is None for p in views(loader.plan.groups[0]))


def _update(engine: TableEngine, sql: str) -> None:
    if engine.name == "duckdb":
        engine.source.execute(sql)
        return
    from adbc_driver_postgresql import dbapi

    with dbapi.connect(engine.source, autocommit=True) as admin, admin.cursor() as cursor:
        cursor.execute(sql)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["duckdb", "postgres"], indirect=True)
@pytest.mark.parametrize(
    ("window_size", "order"),
    [(None, "k, id"), (3, "k, id"), (None, "u"), (3, "u")],
    ids=["combed", "contiguous", "tagged", "reader-ordered windows"],
)
def test_verify_checks_each_range_piece(engine: TableEngine, window_size: int | None, order: str) -> None:
    """With verify=True every range piece carries its own fingerprint: a value changed in place
    (the same row count) is an error naming the piece's subquery, not a silent change; tagged
    pieces too, read two to a query (``ORDER BY u`` without windows), and combed pieces of
    windows, each read alone."""
    sql = f"SELECT id, k, f, y, u FROM t ORDER BY {order}"
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 5}
    with (
        DDBDataLoader(
            engine.source, sql, "y", fetch_bytes=FETCH_BYTES, window_size=window_size, verify=True, **options
        ) as verified,
        DDBDataLoader(
            engine.source, sql, "y", fetch_bytes=FETCH_BYTES, window_size=window_size, **options
        ) as plain,
    ):
        pieces = [p for p in views(verified.plan.groups[0]) if p.ranges is not None]
        assert len(pieces) > 5 and all(p.fingerprint is not None for p in pieces)
        tagged = order == "u" and window_size is None
        assert all(p.tagged for p in pieces) == tagged
        assert [(x.tolist(), y.tolist()) for x, y in verified] == [(x.tolist(), y.tolist()) for x, y in plain]
        if tagged:  # read two to a query
            assert verified.stats().queries <= len(pieces) // PIECES_PER_QUERY + 1
        before = [(x.tolist(), y.tolist()) for x, y in plain]
        _update(engine, "UPDATE t SET y = y + 1 WHERE id = 123")
        if engine.name == "postgres":  # the loader reads its own snapshot (backends/postgres.py)
            assert [(x.tolist(), y.tolist()) for x, y in verified] == before
            return
        with pytest.raises(
            ValueError, match=r"returned the \d+ rows planning counted, but their content differs"
        ):
            for _ in verified:
                pass


def _windows(con: duckdb.DuckDBPyConnection, sql: str, fetch_bytes: int) -> list[tuple[float, ...]]:
    options: dict[str, Any] = {"input_col": ["idf"], "batch_size": 64, "shuffle": True, "seed": 1}
    with DDBDataLoader(con, sql, "y", fetch_bytes=fetch_bytes, window_size=4, **options) as loader:
        return sorted(tuple(r.reshape(-1).tolist()) for x, _ in loader for r in x)


@pytest.mark.parametrize("null_order", ["nulls_first", "nulls_last"])
def test_null_keys_go_where_the_session_orders_them(con: duckdb.DuckDBPyConnection, null_order: str) -> None:
    """The NULL piece sits where the engine puts NULLs, asked of it, not where the dialect's default
    would (DuckDB's ``default_null_order`` changes it): windows across it are the whole query's."""
    con.execute(f"SET default_null_order = '{null_order}'")
    con.execute(
        "CREATE TABLE t AS SELECT i AS id, i * 1.0 AS idf, i * 1.0 AS y, CASE WHEN i % 37 = 0 THEN NULL "
        "WHEN i % 53 = 0 THEN 'NaN'::DOUBLE ELSE (i % 97) * 1.5 END AS fk FROM range(3000) r(i)"
    )
    sql = "SELECT * FROM t ORDER BY fk, id"
    assert _windows(con, sql, 3000) == _windows(con, sql, 0)


def test_a_key_without_a_python_value_falls_back_with_the_reason(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE TABLE t AS SELECT i AS id, i * 1.0 AS y, CASE WHEN i < 2500 THEN TIMESTAMP '2024-01-01' "
        "+ INTERVAL (i) MINUTE ELSE 'infinity'::TIMESTAMP END AS tk FROM range(3000) r(i)"
    )
    with pytest.warns(UserWarning, match=r"the order key 'tk' has no Python value"):
        loader = DDBDataLoader(
            con, "SELECT * FROM t ORDER BY tk, id", "y", input_col=["y"], shuffle=True, fetch_bytes=2000
        )
    with loader:
        assert all(p.ranges is None for p in views(loader.plan.groups[0]))
        assert sum(len(x) for x, _ in loader) == 3000


def test_the_plan_fingerprint_of_zoned_keys_is_the_same_in_every_time_zone(
    con: duckdb.DuckDBPyConnection,
) -> None:
    con.execute(
        "CREATE TABLE t AS SELECT i AS id, i * 1.0 AS y, TIMESTAMPTZ '2024-03-31 00:00:00+00' "
        "+ INTERVAL (i % 300) MINUTE AS tk FROM range(3000) r(i)"
    )
    options: dict[str, Any] = {"input_col": ["y"], "shuffle": True, "seed": 1, "fetch_bytes": 2000}
    states = []
    for zone in ("UTC", "Europe/Paris"):
        con.execute(f"SET TimeZone = '{zone}'")
        with DDBDataLoader(con, "SELECT * FROM t ORDER BY tk, id", "y", **options) as loader:
            assert any(p.ranges is not None for p in views(loader.plan.groups[0]))
            states.append(loader.state_dict())
    with DDBDataLoader(con, "SELECT * FROM t ORDER BY tk, id", "y", **options) as loader:
        loader.load_state_dict(states[0])  # saved under UTC, resumed under Paris
    assert states[0]["plan"] == states[1]["plan"]


def test_a_subquery_ordered_by_a_term_it_does_not_select_is_cut_by_that_term(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """``ORDER BY event_ts`` where the query does not select ``event_ts``: the term is carried as a
    hidden result column, and each group's subquery is cut into range pieces by it (it was read
    front to back, with a warning that named the hidden column, not ``event_ts``); each piece
    holds its group's rows in the query's order, and every row comes once."""
    con.execute(
        "CREATE TABLE ob AS SELECT i AS id, i * 7 % 480 AS event_ts, i % 3 AS g, i * 1.0 AS y "
        "FROM range(480) r(i)"
    )
    sql = "SELECT g, id, y FROM ob ORDER BY event_ts"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot be cut into pieces"
        loader = DDBDataLoader(con, sql, "y", input_col=["id"], group_col="g", shuffle=True, fetch_bytes=320)
    with loader:
        partitions = views(loader.plan)
        got = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
        cursor = loader._backend.cursor()  # type: ignore[union-attr]
        tables = [(p, cursor.fetch(p.sql, p.params)) for p in partitions]
        cursor.close()
    assert got == list(range(480))
    assert len(partitions) > 3 and all(p.ranges is not None and p.ranges.sort is None for p in partitions)
    assert any(p.ranges and len(p.ranges.spans) > 1 for p in partitions)  # combed
    whole = [tuple(r) for r in con.execute(f"SELECT g, id FROM ({sql}) AS q").fetchall()]
    for p, table in tables:  # the very rows of the query run whole, in its order
        ids = table.column("id").to_pylist()
        assert table.num_rows == p.rows and "_ddb_order" not in ",".join(table.column_names)
        assert ids == [i for g, i in whole if g == p.params[0] and i in set(ids)]


def test_a_carried_term_that_cannot_be_cut_is_named_as_written(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE TABLE ob AS SELECT i AS id, i * 7 % 480 AS event_ts, i % 3 AS g, i * 1.0 AS y "
        "FROM range(480) r(i)"
    )
    sql = "SELECT g, id, y FROM ob ORDER BY CAST(event_ts AS DECIMAL(18, 3))"  # no exact binding
    with pytest.warns(UserWarning, match="cannot be cut into pieces") as caught:
        DDBDataLoader(con, sql, "y", input_col=["id"], group_col="g", shuffle=True, fetch_bytes=320).close()
    message = next(str(w.message) for w in caught if "cannot be cut" in str(w.message))
    assert "'CAST(event_ts AS DECIMAL(18, 3))'" in message and "_ddb_order" not in message, message
