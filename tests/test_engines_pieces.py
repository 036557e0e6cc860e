"""Range pieces on engines whose ORDER BY the cutter must take as it is: DataFusion's and Sail's
floats (NaN, -0.0 and 0.0), chDB's LEAD past the last row (0, not NULL) and its UInt8 CASE.

Each case is served whole, every row or window of the query run whole exactly once, or falls back
to one streamed read with a warning naming why: never a mid-epoch "the data changed".
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_backends import ClickHouseEngine, FlightSQLEngine

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(300)

ROWS = 3000
#: ``f`` and ``y`` are 16 bytes a row: 300 rows fit, so the 3,000-row query is cut.
FETCH_BYTES = 300 * 16


def _floats(nan: bool = True) -> pa.Table:
    """``k``: a float key holding NaN (unless not ``nan``), -0.0 and 0.0 (and ties), ``id`` the
    row, ``f`` = ``id``."""
    rng = np.random.default_rng(5)
    k = rng.integers(-50, 50, ROWS).astype(np.float64)
    k[rng.choice(ROWS, 40, replace=False)] = np.nan if nan else 7.0
    k[rng.choice(ROWS, 30, replace=False)] = -0.0
    k[rng.choice(ROWS, 30, replace=False)] = 0.0
    ids = np.arange(ROWS)
    return pa.table({"id": ids, "k": k, "f": ids.astype(np.float64), "y": ids + 0.5})


def _served(source: Any, sql: str, **options: Any) -> tuple[list[int], list[str]]:
    """Every row's id as one shuffled epoch serves it, and the warnings raised."""
    options = {"fetch_bytes": FETCH_BYTES, **options}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DDBDataLoader(source, sql, "y", input_col=["f"], shuffle=True, seed=1, **options) as loader:
            ids = [int(v) for x, _ in loader for v in x[:, 0].tolist()]
    return ids, [str(w.message) for w in caught]


@pytest.fixture
def datafusion_context() -> Any:
    datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
    context = datafusion.SessionContext()
    context.register_record_batches("t", [_floats().to_batches()])
    context.register_record_batches("zeros", [_floats(nan=False).to_batches()])
    return context


@pytest.mark.parametrize("table", ["t", "zeros"], ids=["nan-and-zeros", "signed-zeros"])
@pytest.mark.parametrize("order", ["k, id", "k DESC, id", "k"])
def test_datafusion_floats_with_nan_and_signed_zeros_serve_every_row_once(
    datafusion_context: Any, order: str, table: str
) -> None:
    ids, warned = _served(datafusion_context, f"SELECT id, k, f, y FROM {table} ORDER BY {order}")
    assert sorted(ids) == list(range(ROWS))
    # cut exactly, or read front to back saying why (DataFusion's comparisons of -0.0 and NaN
    # disagree with its ORDER BY)
    assert all("do not agree with its own ORDER BY" in w for w in warned if "fetch_bytes" in w), warned


@pytest.mark.parametrize(("order", "nan"), [("k, id", True), ("k DESC, id", True), ("k, id", False)])
def test_sail_flight_sql_floats_with_nan_and_signed_zeros_serve_every_row_once(
    flight_sql_uri: str, tmp_path: Path, order: str, nan: bool
) -> None:
    """Sail (DataFusion behind Spark SQL over Flight SQL): the same floats, the same outcome."""
    sail = FlightSQLEngine(flight_sql_uri, tmp_path)
    try:
        sail.create("t", _floats(nan))
        ids, warned = _served(sail.source(), f"SELECT id, k, f, y FROM t ORDER BY {order}")
    finally:
        sail.close()
    assert sorted(ids) == list(range(ROWS))
    assert all("do not agree with its own ORDER BY" in w for w in warned if "fetch_bytes" in w), warned


@pytest.fixture
def clickhouse(chdb_uri: str) -> Iterator[ClickHouseEngine]:
    made = ClickHouseEngine(chdb_uri)
    yield made
    made.close()


def test_chdb_windows_over_a_big_shuffled_series_are_the_whole_querys_each_once(
    clickhouse: ClickHouseEngine,
) -> None:
    """ClickHouse's LEAD past the last row is 0 on a column that is not Nullable: the last stripe's
    context must still run to the end (cut at ``[key, 0)`` it held no row, and the epoch died
    "the data changed" after 600 of 2,995 windows)."""
    ids = np.arange(ROWS)
    ddl = "CREATE TABLE w (id Int64, f Float64, y Float64) ENGINE = MergeTree ORDER BY tuple()"
    clickhouse.create("w", pa.table({"id": ids, "f": ids.astype(np.float64), "y": ids + 0.5}), ddl)
    sql = "SELECT id, f, y FROM w ORDER BY id"
    options: dict[str, Any] = {"input_col": ["f"], "shuffle": True, "seed": 1, "window_size": 5}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cut into pieces: no fallback to one streamed read
        with DDBDataLoader(clickhouse.uri, sql, "y", fetch_bytes=FETCH_BYTES, **options) as loader:
            windows = [[int(v) for v in w] for x, _ in loader for w in x[:, :, 0].tolist()]
    assert sorted(windows) == [list(range(s, s + 5)) for s in range(ROWS - 5)]


def test_chdb_tagged_pieces_are_split_by_their_tags_without_a_refetch(
    clickhouse: ClickHouseEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """ClickHouse types the tag's CASE UInt8: it must still mark a row of no piece (no overflow).

    Pieces of 1,000 rows within a budget of 1,000: neighbouring pieces are read by one query
    whose rows are tagged with their piece (marking a missing tag -1 overflowed UInt8, and each
    such unit was fetched again piece by piece with a WARNING)."""
    ids = np.arange(ROWS)
    clickhouse.create("r", pa.table({"id": ids, "f": ids.astype(np.float64), "y": ids + 0.5}))
    with caplog.at_level(logging.WARNING, logger="ddbloader"):
        served, warned = _served(clickhouse.uri, "SELECT id, f, y FROM r ORDER BY id", fetch_bytes=1000 * 16)
    assert sorted(served) == list(range(ROWS))
    assert not warned, warned
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
