"""What a loader shows a person: the plan's repr and HTML, the planning bar, readable errors.

The ``series`` fixture has groups of 3, 2 and 4 partitions with 29, 21 and 38 rows (88 in all).
"""

from __future__ import annotations

import html
import re
import traceback
from collections.abc import Callable
from typing import Any

import duckdb
import pytest
import torch
from conftest import SERIES_SQL, FaultyBackend, make_series, series_loader
from planned import views

from ddbloader import DDBDataLoader
from ddbloader._core.display import compact_traceback, human_bytes, readable_in_notebooks

pytestmark = pytest.mark.timeout(60)

GROUP_ROWS = (29, 21, 38)


def windowed(source: Any, **kwargs: Any) -> DDBDataLoader:
    """Windows of 4 rows → the next 2, batches of 8, grouped by gid, repartitioned by part."""
    return series_loader(source, **{"window_size": [4, 2], "seed": 3, **kwargs})


def expected_windows(x_window: int = 4, y_window: int = 2) -> int:
    span = x_window + y_window  # offset defaults to the x window
    return sum(rows - span + 1 for rows in GROUP_ROWS)


def test_repr_shows_the_plan(series: duckdb.DuckDBPyConnection) -> None:
    with windowed(series, dtype=torch.float32) as loader:
        text = repr(loader)
    windows = expected_windows()
    batches = -(-windows // 8)
    # x [8, 4, 2] and y [8, 2, 1] in float32
    batch_bytes = 8 * (4 * 2 * 4 + 2 * 1 * 4)
    assert text.startswith("DDBDataLoader(engine: duckdb, ")
    assert "groups × repartitions: 3 groups × 2–4 repartitions = 9 partitions" in text
    assert "grouped by: gid" in text
    assert "repartitioned by: part" in text
    assert "rows: 88," in text
    assert f"windows per epoch: {windows:,}," in text
    assert f"batches per epoch: {batches:,}," in text
    assert len(loader) == batches
    assert "x: [8, 4, 2] float32" in text
    assert "y: [8, 2, 1] float32" in text
    assert f"bytes per batch: {batch_bytes} B" in text
    assert "shuffle=False, seed=3" in text


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ({"group_col": "gid"}, "3 groups × whole group = 3 partitions"),
        ({"group_col": "gid", "repartition_col": "gid"}, "3 groups × 1 repartition = 3 partitions"),
        ({"repartition_col": "part", "repartition_scheme": [1]}, "1 group × 1 repartition = 1 partition"),
    ],
    ids=["no-repartition-column", "one-per-group", "one-scheme-value"],
)
def test_repr_names_one_repartition_in_the_singular_and_an_unsplit_group_whole(
    series: duckdb.DuckDBPyConnection, split: dict[str, Any], expected: str
) -> None:
    with DDBDataLoader(series, SERIES_SQL, "y", input_col=["f0"], **split) as loader:
        assert f"groups × repartitions: {expected}," in repr(loader)


def test_repr_counts_subqueries_and_the_pieces_of_those_streamed(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[300, 5], [10]])  # 8-byte rows (float32 x and y): 300 of them are 3 pieces of 100
    options: dict[str, Any] = {"group_col": "gid", "repartition_col": "part", "fetch_bytes": 800}
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], **options) as loader:
        expected = "2 groups × 1–2 repartitions = 3 partitions (1 streamed in 3 pieces)"
        assert f"groups × repartitions: {expected}," in repr(loader)


def test_repr_counts_range_pieces_apart_from_streamed_ones(con: duckdb.DuckDBPyConnection) -> None:
    make_series(con, [[300, 5], [10]])
    options: dict[str, Any] = {"group_col": "gid", "repartition_col": "part", "fetch_bytes": 1600}
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], shuffle=True, seed=0, **options) as loader:
        ranged = sum(p.ranges is not None for p in views(loader.plan))
        partitions = sum(len(g.partitions) for g in loader.plan.groups)
        expected = f"= {partitions} partitions ({ranged} range pieces of the order key)"
        assert ranged > 1 and expected in repr(loader) and "streamed" not in repr(loader)


def test_repr_of_an_unsplit_query_without_windows(series: duckdb.DuckDBPyConnection) -> None:
    with DDBDataLoader(series, SERIES_SQL, "y", batch_size=10, input_col=["f0"], drop_last=True) as loader:
        text = repr(loader)
    assert "1 group × whole group = 1 partition" in text
    assert "grouped by" not in text and "repartitioned by" not in text
    assert "windows per epoch: 88," in text
    assert "batches per epoch: 8 (drop_last)" in text
    assert "x: [10, 1] float32" in text
    assert "bytes per batch: 80 B" in text


def test_repr_of_a_rank_names_it(series: duckdb.DuckDBPyConnection) -> None:
    with windowed(series, rank=1, world_size=2) as loader:
        assert "rank: 1 of 2" in repr(loader)
    with windowed(series) as loader:
        assert "rank" not in repr(loader)


def test_html_repr_holds_the_same_rows_and_the_columns(series: duckdb.DuckDBPyConnection) -> None:
    with windowed(series) as loader:
        page = loader._repr_html_()
    assert page.startswith("<table") and page.endswith("</table>")
    cells = dict(re.findall(r"<th[^>]*>(.*?)</th><td[^>]*>(.*?)</td>", page))
    assert cells["engine"] == "duckdb"
    assert html.unescape(cells["groups × repartitions"]) == "3 groups × 2–4 repartitions = 9 partitions"
    assert cells["rows"] == "88"
    assert cells["windows per epoch"] == f"{expected_windows():,}"
    assert cells["x columns"] == "f0, f1"
    assert cells["y columns"] == "y"


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_html_repr_escapes_column_names(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""CREATE TABLE t AS SELECT i::DOUBLE AS "<b>x</b>", i::DOUBLE AS "a&b" FROM range(5) r(i)""")
    with DDBDataLoader(con, "SELECT * FROM t", "a&b", input_col=["<b>x</b>", "a&b"]) as loader:
        page = loader._repr_html_()
    assert "<b>x</b>" not in page
    assert "&lt;b&gt;x&lt;/b&gt;, a&amp;b" in page


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_html_repr_shortens_long_column_lists(con: duckdb.DuckDBPyConnection) -> None:
    columns = ", ".join(f"i::DOUBLE AS c{k}" for k in range(30))
    con.execute(f"CREATE TABLE wide AS SELECT {columns} FROM range(3) r(i)")
    with DDBDataLoader(con, "SELECT * FROM wide", "c0") as loader:
        page = loader._repr_html_()
    assert "c12, … (29 columns)" in page  # c0, the target, is not in x
    assert "c13" not in page


def test_rendering_fetches_nothing(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    backend = faulty(series)
    loader = windowed(backend, shuffle=True)
    backend.planning = False
    for _ in range(3):
        repr(loader)
        loader._repr_html_()
        str(loader)
    assert backend.fetches == 0
    next(iter(loader))  # the counter does count fetches
    assert backend.fetches > 0
    loader.close()


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.00 kB"),
        (12_345, "12.3 kB"),
        (263_000, "263 kB"),
        (4_100_000, "4.10 MB"),
        (7.5e9, "7.50 GB"),
        (3e15, "3000 TB"),
    ],
)
def test_human_bytes(n: float, text: str) -> None:
    assert human_bytes(n) == text


# --------------------------------------------------------------------------------- progress bar


def test_progress_bar_appears_when_planning_is_slow_with_the_true_total(
    series: duckdb.DuckDBPyConnection,
    faulty: Callable[..., FaultyBackend],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Explicit schemes: the schema, the keys' types, then every (group, repartition) cell counted
    # in one query.
    backend = faulty(series, hang_on=range(1, 100), hang_seconds=0.6)
    backend.planning = False
    loader = windowed(backend, group_scheme=[0, 1, 2], repartition_scheme=[0, 1, 2, 3], progress=True)
    err = capsys.readouterr().err
    assert "ddbloader: planning" in err
    assert re.search(r"\d+/3 ", err)
    assert backend.fetches == 3
    loader.close()


def test_progress_bar_stays_silent_when_planning_is_quick(
    series: duckdb.DuckDBPyConnection, capsys: pytest.CaptureFixture[str]
) -> None:
    windowed(series, progress=True).close()
    assert capsys.readouterr().err == ""


def test_no_progress_bar_unless_asked(
    series: duckdb.DuckDBPyConnection,
    faulty: Callable[..., FaultyBackend],
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend = faulty(series, hang_on=[1], hang_seconds=1.2)
    backend.planning = False
    windowed(backend).close()
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------- readable errors


def _fetch_error(con: duckdb.DuckDBPyConnection) -> Exception:
    """A real engine error that only a partition fetch meets: one day holds an uncastable value."""
    con.execute(
        "CREATE TABLE quotes AS SELECT i // 10 AS day, "
        "CASE WHEN i = 25 THEN 'n/a' ELSE i::VARCHAR END AS txt, i::DOUBLE AS y FROM range(50) r(i)"
    )
    loader = DDBDataLoader(
        con,
        "SELECT CAST(txt AS DOUBLE) AS x, y, day FROM quotes ORDER BY y",
        "y",
        input_col=["x", "y"],
        batch_size=4,
        repartition_col="day",
    )
    with pytest.raises(duckdb.ConversionException) as caught:
        for _ in loader:
            pass
    loader.close()
    return caught.value


def test_an_error_from_a_fetch_thread_renders_compactly_in_ipython(con: duckdb.DuckDBPyConnection) -> None:
    error = _fetch_error(con)
    lines = error._render_traceback_()  # type: ignore[attr-defined]
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
    assert plain[0] == "ConversionException in ddbloader:"
    # the culprit first: the subquery and its parameters, then the cause
    assert re.fullmatch(
        r"↳ raised in thread 'ddbloader-fetch-\d' while fetching partition 2 of group 0 "
        r"\(subquery '.*WHERE day = \$1.*' with parameters \[2\]\)",
        plain[1],
    )
    cause = next(i for i, line in enumerate(plain) if line.startswith("cause: "))
    assert "Could not convert string 'n/a' to DOUBLE" in plain[cause]
    assert all(line.startswith("↳ ") for line in plain[1:cause])
    assert any(line.startswith("raised at ") for line in plain)
    assert any(line.startswith("reached your code at ") and "test_display.py" in line for line in plain)
    assert "frames hidden by ddbloader" in plain[-1]
    assert len("\n".join(plain).splitlines()) < 15
    # plain Python keeps the whole story: every frame and the notes
    full = "".join(traceback.format_exception(error))
    assert "_run_job" in full
    assert "while fetching partition 2 of group 0" in full


def test_an_error_without_notes_renders_as_type_and_message() -> None:
    try:
        raise ValueError("bad <value>")
    except ValueError as caught:
        error = caught
    readable_in_notebooks(error)
    lines = error._render_traceback_()  # type: ignore[attr-defined]
    assert re.sub(r"\x1b\[[0-9;]*m", "", lines[0]) == "ValueError: bad <value>"
    assert lines == compact_traceback(error)


def test_a_chained_cause_is_named() -> None:
    try:
        try:
            raise OSError("connection reset")
        except OSError as inner:
            raise RuntimeError("fetch failed") from inner
    except RuntimeError as caught:
        lines = compact_traceback(caught)
    assert "caused by OSError: connection reset" in lines


def test_keyboard_interrupt_keeps_ipythons_rendering() -> None:
    interrupt = KeyboardInterrupt()
    readable_in_notebooks(interrupt)
    assert not hasattr(interrupt, "_render_traceback_")
