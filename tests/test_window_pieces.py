"""Combed pieces of windows (ddbloader/_sql/window_pieces.py): the layout, pure, and against engines.

The layout is checked without an engine, from a list of distinct keys ranked as the ranking query
ranks them: every row starts windows in exactly one piece, and a piece's key ranges select exactly
its runs, which hold every row its windows read. Against DuckDB, PostgreSQL and SQLite, a shuffled
windowed loader over one long series must comb it and serve every window of the query run whole
exactly once, mixing the series in every batch; where combing would not be exact (keys shared by
several rows, NULL keys, a series of several subqueries) the pieces stay contiguous.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from conftest import ENGINES, TableEngine, examples, table_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from planned import views

from ddbloader import DDBDataLoader
from ddbloader._epoch.slots import RUNS_FROM
from ddbloader._sql.pieces import KeyRanges
from ddbloader._sql.window_pieces import WindowTile, window_layout

# --- the layout, pure --------------------------------------------------------------------------


def _window_tiles(keys: list[int], count: int, edge: int) -> list[WindowTile]:
    """The tiles of distinct ``keys`` (in the query's order) as the ranking query reports them:
    per tile its first row's tuple, rows, and the tuple ``edge`` rows after its first row (past
    the last row a value the engine makes up, as ClickHouse's LEAD gives 0: never used)."""
    n = len(keys)
    members: dict[int, list[int]] = {}
    for rank in range(n):
        members.setdefault(rank * count // n, []).append(rank)
    return [
        WindowTile((keys[ranks[0]],), len(ranks), (keys[ranks[0] + edge] if ranks[0] + edge < n else 0,))
        for _, ranks in sorted(members.items())
    ]


def _selects(ranges: KeyRanges, key: int, descending: bool) -> bool:
    def before(a: int, b: int) -> bool:
        return a > b if descending else a < b

    return any(
        (lo is None or not before(key, lo[0])) and (hi is None or before(key, hi[0]))
        for lo, hi in ranges.spans
    )


@settings(max_examples=examples(300), deadline=None)
@given(
    keys=st.lists(st.integers(-1000, 1000), min_size=2, max_size=250, unique=True),
    pieces=st.integers(1, 12),
    stripes=st.integers(1, 6),
    band=st.sampled_from([2, 3, 64]),
    span=st.integers(1, 12),
    stride=st.integers(1, 4),
    descending=st.booleans(),
)
def test_every_window_is_read_whole_by_exactly_one_piece(
    keys: list[int], pieces: int, stripes: int, band: int, span: int, stride: int, descending: bool
) -> None:
    keys = sorted(keys, reverse=descending)
    n = len(keys)
    cut = window_layout(_window_tiles(keys, pieces * stripes, span - 1), (False,), pieces, band, span, stride)
    owner = np.full(n, -1)
    for index, (ranges, rows) in enumerate(cut):
        windows = ranges.windows
        assert windows is not None
        # the rows the piece's query returns, as rows of the series (in the query's order)
        selected = [r for r in range(n) if _selects(ranges, keys[r], descending)]
        runs = [row for first, length in windows.runs for row in range(first, first + length)]
        assert selected == runs and len(runs) == rows
        assert all(a[0] + a[1] < b[0] for a, b in zip(windows.runs, windows.runs[1:], strict=False))
        for low, high in windows.starts:
            assert (owner[low:high] == -1).all()
            owner[low:high] = index
            run_end = next(first + length for first, length in windows.runs if first <= low < first + length)
            assert min(high - 1 + span, n) <= run_end, "every window starting in a stripe lies in its run"
        starts = windows.samples(0, n) * stride
        assert starts.tolist() == [
            row for low, high in windows.starts for row in range(low, high) if row % stride == 0
        ]
        assert windows.block_rows(starts).tolist() == [runs.index(row) for row in starts.tolist()]
    assert (owner >= 0).all(), "every row starts its windows in exactly one piece"


# --- against the engines -----------------------------------------------------------------------

ROWS = 3000
#: ``f`` and ``y`` (float32, torch's default) are 8 bytes a row: 300 rows fit fetch_bytes, so the
#: 3,000-row series is cut.
FETCH_BYTES = 300 * 8


def _table() -> pa.Table:
    """``u``: a distinct key stored out of its order; ``k``: a key with ties; ``g``: two groups;
    ``f`` = ``id`` as float, ``y`` = ``f + 0.5``."""
    rng = np.random.default_rng(5)
    ids = rng.permutation(ROWS).tolist()
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "u": pa.array([3 * i - 1000 for i in ids], pa.int64()),
            "k": pa.array([i // 3 for i in ids], pa.int64()),
            "g": pa.array([i % 2 for i in ids], pa.int64()),
            "f": pa.array([float(i) for i in ids], pa.float64()),
            "y": pa.array([float(i) + 0.5 for i in ids], pa.float64()),
        }
    )


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TableEngine]:
    with table_engine(request, tmp_path, request.param, _table()) as engine:
        yield engine


#: ``(ORDER BY, window_size, window_stride, offset, group_col)``
SHAPES = [
    ("u", 5, None, None, None),
    ("u DESC", 5, None, None, None),
    ("u", [4, 2], 3, 6, None),
    ("u DESC", [4, 2], 2, 1, None),
    ("g, u", 7, None, None, "g"),
    # one-row samples every other row: combed by their series rows, with no context
    ("u", [1, 1], 2, 0, None),
    ("k, u", [1, 1], 3, 0, None),  # ties on the cut key do not matter without a context
]

#: The key with one NULL: ``v``.
SELECT = "id, u, k, g, f, y, CASE WHEN id = 17 THEN NULL ELSE u END AS v"


def _check_windows(
    engine: TableEngine,
    order: str,
    window: Any,
    stride: int | None = None,
    offset: int | None = None,
    group: str | None = None,
    **more: Any,
) -> tuple[DDBDataLoader, list[list[int]]]:
    """A shuffled loader's windows are consecutive rows of the query run whole, its y where the
    offset says, each window once: returns the (closed) loader and each batch's windows' first rows."""
    sql = f"SELECT {SELECT} FROM t ORDER BY {order}"
    options: dict[str, Any] = {
        "input_col": ["f"],
        "batch_size": 32,
        "shuffle": True,
        "seed": 11,
        "window_size": window,
        "window_stride": stride,
        "offset": offset,
        "group_col": group,
        "fetch_bytes": FETCH_BYTES,
        **more,
    }
    x_window, y_window = (window, 1) if isinstance(window, int) else window
    shift = x_window if offset is None else offset
    span = max(x_window, shift + y_window)
    whole = [int(i) for i in engine.run(f"SELECT id FROM (SELECT {SELECT} FROM t ORDER BY {order}) AS q")]
    series = [whole] if group is None else [[i for i in whole if i % 2 == g] for g in (0, 1)]
    expected = [
        (rows[s : s + x_window], rows[s + shift : s + shift + y_window])
        for rows in series
        for s in range(0, len(rows) - span + 1, stride or 1)
    ]
    with DDBDataLoader(engine.source, sql, "y", **options) as loader:
        batches = [
            [
                ([int(v) for v in w], [int(v - 0.5) for v in t])
                for w, t in zip(x[:, :, 0].tolist(), y[:, :, 0].tolist(), strict=True)
            ]
            for x, y in loader
        ]
    assert sorted(w for batch in batches for w in batch) == sorted(expected), "every window, once"
    return loader, [[w[0] for w, _ in batch] for batch in batches]


@pytest.mark.parametrize(("order", "window", "stride", "offset", "group"), SHAPES)
def test_combed_windows_are_the_whole_querys_each_once(
    engine: TableEngine, order: str, window: Any, stride: int | None, offset: int | None, group: str | None
) -> None:
    loader, firsts = _check_windows(engine, order, window, stride, offset, group)
    groups = loader.plan.groups
    assert all(g.combed_windows and len(g.partitions) > 2 for g in groups)
    assert all(p.ranges is not None and p.ranges.band is not None for g in groups for p in views(g))
    if group is None:  # a batch mixes the series: most of its ten blocks of 300 ids
        assert np.median([len({i // 300 for i in batch}) for batch in firsts]) >= 7


@pytest.mark.parametrize("cache", [None, 2**24])
def test_a_pool_that_draws_in_runs_maps_combed_windows(engine: TableEngine, cache: int | None) -> None:
    """A pool of 8 slots or more draws batches in runs (ddbloader/_epoch/slots.py) and turns them
    into arena rows by one offset per step; a combed piece's rows need its runs' mapping."""
    loader, _ = _check_windows(engine, "g, u", 7, group="g", group_pool_size=8, cache_bytes=cache)
    assert loader.config.group_pool_size >= RUNS_FROM
    assert all(g.combed_windows for g in loader.plan.groups)


@pytest.mark.parametrize(("window", "stripes"), [(5, 15), (40, 1)])
def test_stripes_thin_out_as_windows_grow_so_a_piece_stays_near_its_budget(
    table: duckdb.DuckDBPyConnection, window: int, stripes: int
) -> None:
    """Each stripe reads the window's span - 1 rows after it: a piece of 300 rows takes at most
    300 / (4 (span - 1)) stripes, so contexts add at most a quarter to it."""
    sql = "SELECT id, u, f, y FROM t ORDER BY u"
    options: dict[str, Any] = {"input_col": ["f"], "shuffle": True, "window_size": window}
    with DDBDataLoader(table, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
        partitions = views(loader.plan.groups[0])
        assert loader.plan.groups[0].combed_windows
        assert max(len(p.windows.starts) for p in partitions if p.windows) == stripes
        assert max(p.rows for p in partitions) <= 1.3 * ROWS / len(partitions)
        assert sum(len(x) for x, _ in loader) == ROWS - window


@pytest.mark.parametrize("order", ["k, u", "v", "v DESC NULLS FIRST"])
def test_a_distinct_order_by_tuple_combs_windows_over_ties_of_a_leading_term_and_nulls(
    engine: TableEngine, order: str
) -> None:
    """The whole ORDER BY tuple is what must be distinct: ties of ``k`` broken by ``u``, and a
    NULL of ``v`` (one, placed as the query places it) comb like any other tuple."""
    loader, _ = _check_windows(engine, order, 5, None, None)
    assert all(g.combed_windows for g in loader.plan.groups)


@pytest.mark.parametrize(
    ("order", "window", "stride", "repartition", "why"),
    [
        ("g, u", 5, None, "g", "a series of two subqueries"),
        ("g, u", [1, 1], 2, "g", "one-row samples every other row of a series of two subqueries"),
    ],
)
def test_where_combing_would_not_be_exact_pieces_stay_contiguous(
    engine: TableEngine, order: str, window: Any, stride: int | None, repartition: str | None, why: str
) -> None:
    offset = 0 if stride else None
    loader, _ = _check_windows(engine, order, window, stride, offset, repartition_col=repartition)
    partitions = views(loader.plan)
    assert not any(g.combed_windows for g in loader.plan.groups), why
    assert sum(p.ranges is not None for p in partitions) > 2, "still cut into range pieces"


@pytest.fixture
def table(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """DuckDB holding :func:`_table` as ``t``."""
    con.register("_incoming", _table())
    con.execute("CREATE TABLE t AS SELECT * FROM _incoming")
    return con


def test_verify_checks_each_combed_piece_of_windows(table: duckdb.DuckDBPyConnection) -> None:
    """Each piece's rows (stripes and contexts) are hashed at planning and checked at its fetch;
    resuming and refusing another layout: tests/test_pieces.py."""
    sql = "SELECT id, u, f, y FROM t ORDER BY u DESC"
    options: dict[str, Any] = {"input_col": ["f"], "shuffle": True, "window_size": [3, 2], "verify": True}
    with DDBDataLoader(table, sql, "y", fetch_bytes=FETCH_BYTES, batch_size=16, **options) as verified:
        assert verified.plan.groups[0].combed_windows
        assert all(p.fingerprint is not None for p in verified.plan.groups[0].partitions)
        assert sum(len(x) for x, _ in verified) == ROWS - 4


def test_ranks_share_the_windows_of_a_combed_series(table: duckdb.DuckDBPyConnection) -> None:
    """Three ranks serve the epoch's windows between them, each once (but for even batches'
    padding), each reading about a third of the pieces."""
    con = table
    sql = "SELECT id, u, f, y FROM t ORDER BY u"
    options: dict[str, Any] = {
        "input_col": ["f"],
        "batch_size": 16,
        "shuffle": True,
        "seed": 9,
        "window_size": 4,
    }
    firsts: list[int] = []
    for rank in range(3):
        with DDBDataLoader(
            con, sql, "y", fetch_bytes=FETCH_BYTES, rank=rank, world_size=3, **options
        ) as loader:
            pieces = len(loader.plan.groups[0].partitions)
            assert loader.plan.groups[0].combed_windows
            firsts += [int(v) for x, _ in loader for v in x[:, 0, 0].tolist()]
            # a rank's share is the windows of a third of the pieces (cut piece by piece), not a
            # third of the series, which would start windows in every piece
            assert loader.stats().queries <= pieces // 3 + 2
    whole = [int(i) for (i,) in con.execute(f"SELECT id FROM ({sql}) AS q").fetchall()]
    assert set(firsts) == set(whole[: ROWS - 4])
    assert len(firsts) - len(set(firsts)) < 3, "only the padding of even batches repeats"
