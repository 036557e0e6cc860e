"""The DataFusion backend's own behaviour: read-only queries, the session it shares, interrupts.

The backend contract (exactly-once windows, determinism against DuckDB, dtypes, nulls, hostile
values, errors, fetch units, streams) runs in tests/test_backends.py with ``datafusion`` among
its engines.
"""

from __future__ import annotations

import threading

import pyarrow as pa
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
