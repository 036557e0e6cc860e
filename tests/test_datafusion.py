"""The DataFusion backend's own behaviour: read-only queries, the session it shares, interrupts,
text views read as plain strings.

The backend contract (exactly-once windows, determinism against DuckDB, dtypes, nulls, hostile
values, errors, fetch units, streams) runs in tests/test_backends.py with ``datafusion`` among
its engines.
"""

from __future__ import annotations

import logging
import threading
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ddbloader import DDBDataLoader
from ddbloader.backends import DataFusionBackend, connect
from ddbloader.backends.datafusion import QueryInterrupted

datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ctx() -> datafusion.SessionContext:
    context = datafusion.SessionContext()
    context.register_record_batches(
        "t", [[pa.record_batch({"g": pa.array([1, 1, 2], pa.int32()), "y": [0.5, 1.5, 2.5]})]]
    )
    return context


def test_connect_takes_a_session_context_and_leaves_it_open(ctx: datafusion.SessionContext) -> None:
    backend = connect(ctx)
    assert isinstance(backend, DataFusionBackend) and backend.dialect == "postgres"
    assert backend.cursor().fetch("SELECT 41 + $1 AS v", [1]).column("v").to_pylist() == [42]
    backend.close()
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 3}]
    with pytest.raises(TypeError, match="SessionContext"):
        DataFusionBackend(object())


@pytest.mark.parametrize(
    ("statement", "refused"),
    [
        ("INSERT INTO t VALUES (3, 3.5)", "DML not supported"),
        ("CREATE TABLE u AS SELECT 1 AS a", "DDL not supported"),
        ("SET datafusion.execution.batch_size = 1", "Statement not supported"),
    ],
)
def test_the_engine_refuses_what_is_not_a_query(
    ctx: datafusion.SessionContext, statement: str, refused: str
) -> None:
    cursor = DataFusionBackend(ctx).cursor()
    with pytest.raises(Exception, match=refused):
        cursor.fetch(statement, [])
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 3}]
    assert not ctx.table_exist("u")


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_the_loader_reads_the_views_of_the_passed_context(ctx: datafusion.SessionContext) -> None:
    ctx.sql("CREATE VIEW doubled AS SELECT g, y * 2 AS y FROM t").collect()
    sql = "SELECT g, y FROM doubled ORDER BY y"
    with DDBDataLoader(ctx, sql, "y", batch_size=3, input_col="y", group_col="g") as loader:
        assert [y[:, 0].tolist() for _, y in loader] == [[1.0, 3.0, 5.0]]
        assert [p.rows for g in loader.plan.groups for p in g.partitions] == [2, 1]


def test_interrupt_stops_a_stream_at_its_next_batch(ctx: datafusion.SessionContext) -> None:
    cursor = DataFusionBackend(ctx).cursor()
    cursor.interrupt()  # idle: the next query still runs
    assert cursor.fetch("SELECT 1 AS one", []).num_rows == 1
    endless = cursor.batches("SELECT value FROM range(0, 1000000000000)", [], 1000)
    assert next(endless).num_rows > 0
    threading.Thread(target=cursor.interrupt).start()
    with pytest.raises(QueryInterrupted):
        for _ in endless:
            pass


def test_an_empty_result_keeps_the_engine_schema(ctx: datafusion.SessionContext) -> None:
    table = DataFusionBackend(ctx).cursor().fetch("SELECT g, y FROM t WHERE g = $1", [99])
    assert table.num_rows == 0
    assert table.schema.types == [pa.int32(), pa.float64()]


@pytest.fixture
def parquet_text(tmp_path: Path) -> datafusion.SessionContext:
    """``p``: a Parquet table whose text column ``s`` DataFusion reads as ``string_view``."""
    rows = 600
    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.table(
            {
                "s": [f"s{i % 3}" for i in range(rows)],
                "id": list(range(rows)),
                "y": [i + 0.5 for i in range(rows)],
            }
        ),
        path,
    )
    context = datafusion.SessionContext()
    context.register_parquet("p", str(path))
    assert context.sql("SELECT s FROM p").schema().field("s").type == pa.string_view()
    return context


def test_text_comes_out_as_plain_strings(parquet_text: datafusion.SessionContext) -> None:
    cursor = DataFusionBackend(parquet_text).cursor()
    assert cursor.fetch("SELECT s, CAST(id AS VARCHAR) AS t FROM p", []).schema.types == [pa.string()] * 2
    assert cursor.fetch("SELECT s FROM p WHERE id < 0", []).schema.types == [pa.string()]
    assert [t.schema.types for t in cursor.batches("SELECT s FROM p LIMIT 1", [], 1)] == [[pa.string()]]


def test_text_keys_are_split_by_fetch_units_and_cut_into_pieces(
    parquet_text: datafusion.SessionContext, caplog: pytest.LogCaptureFixture
) -> None:
    """A text group key: one fetch unit splits its groups (pyarrow has no take for string_view:
    each unit failed and was fetched again group by group, with a WARNING); a text ORDER BY key:
    range pieces (a string_view key was refused as not binding back exactly)."""
    with caplog.at_level(logging.WARNING, logger="ddbloader"), warnings.catch_warnings():
        warnings.simplefilter("error")
        with DDBDataLoader(
            parquet_text, "SELECT s, id, y FROM p ORDER BY id", "y", input_col=["id"], group_col="s"
        ) as loader:
            grouped = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
        sql = "SELECT CAST(id AS VARCHAR) AS t, id, y FROM p ORDER BY t"
        options = {"shuffle": True, "seed": 1, "fetch_bytes": 16 * 64}
        with DDBDataLoader(parquet_text, sql, "y", input_col=["id"], **options) as loader:
            cut = sorted(int(v) for x, _ in loader for v in x[:, 0].tolist())
    assert grouped == cut == list(range(600))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
