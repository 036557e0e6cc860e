"""The Spark backend against a real Spark Connect server (tests/sparkserver.py).

The backend contract (split correctness, exactly-once windows, determinism against DuckDB,
dtypes, nulls, hostile values, errors) runs in tests/test_backends.py with ``spark`` among its
engines, and two torchrun ranks read one Spark server in tests/test_distributed.py. Here: what is
Spark's own — sessions and their settings, cancelling, quiet errors, transient errors, resume.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sparkserver
from resume_check import assert_resumes_exactly
from test_backends import SERIES_SQL, SparkEngine, _everything, series_table

from ddbloader import DDBDataLoader
from ddbloader.backends import SparkBackend, connect
from ddbloader.backends.spark import MAX_FIELDS

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def spark(spark_server: sparkserver.SparkServer) -> Iterator[SparkEngine]:
    made = SparkEngine(spark_server.uri)
    yield made
    made.close()


def test_connect_takes_a_uri_or_a_session_and_closes_only_its_own(spark: SparkEngine) -> None:
    backend = connect(spark.uri)
    assert isinstance(backend, SparkBackend)
    assert backend.engine == f"spark connect ({spark.uri.removeprefix('sc://')})"
    cursor = backend.cursor()
    assert cursor.fetch("SELECT 41 + $1 AS v", [1]).column("v").to_pylist() == [42]
    backend.close()
    backend.close()  # idempotent
    passed = connect(spark.admin)
    assert isinstance(passed, SparkBackend) and passed.engine == "spark connect (session)"
    passed.close()
    assert spark.rows("SELECT 1 AS one") == [(1,)]  # the user's session is left open
    with pytest.raises(ValueError, match="sc://"):
        SparkBackend("postgresql://u:pw@h/db")


def test_a_session_the_loader_opens_reads_wide_tables_with_the_vectorised_reader(spark: SparkEngine) -> None:
    """Beyond ``spark.sql.codegen.maxFields`` columns (100 by default) Spark scans row by row."""
    spark.create("wide", pa.table({f"c{i}": pa.array([float(i)] * 3) for i in range(150)}))
    explain = "EXPLAIN SELECT * FROM wide"
    backend = SparkBackend(spark.uri)
    assert backend.cursor().fetch("SET spark.sql.codegen.maxFields", []).column(1).to_pylist() == [
        str(MAX_FIELDS)
    ]
    assert "Batched: true" in backend.cursor().fetch(explain, []).column(0)[0].as_py()
    backend.close()
    assert "Batched: false" in spark.rows(explain)[0][0]  # a default session: the gotcha itself


def test_interrupt_cancels_the_running_query(spark: SparkEngine) -> None:
    backend = SparkBackend(spark.uri)
    cursor, other = backend.cursor(), backend.cursor()
    cursor.interrupt()  # idle: nothing to stop, and the next query still runs
    assert cursor.fetch("SELECT 1 AS one", []).num_rows == 1
    timer = threading.Timer(2.0, cursor.interrupt)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Exception, match="OPERATION_CANCELED"):
        cursor.fetch("SELECT count(*) AS n FROM range(0, 1000000000000)", [])
    assert time.monotonic() - started < 60
    timer.join()
    assert other.fetch("SELECT 2 AS two", []).num_rows == 1  # only the cursor's own query stopped
    assert not SparkBackend.is_transient(Exception("cancelled"))
    backend.close()


def test_server_errors_are_raised_with_their_message_and_not_logged(
    spark: SparkEngine, capfd: pytest.CaptureFixture[str]
) -> None:
    backend = SparkBackend(spark.uri)
    capfd.readouterr()
    with pytest.raises(Exception, match="nosuch_col") as caught:
        backend.cursor().fetch("SELECT nosuch_col FROM range(1)", [])
    assert "JVM stacktrace" not in str(caught.value)
    assert not SparkBackend.is_transient(caught.value)
    assert "nosuch_col" not in capfd.readouterr().err
    backend.close()


@pytest.mark.slow
def test_an_unreachable_server_fails_soon_as_transient_without_its_token() -> None:
    started = time.monotonic()
    with (
        pytest.raises(Exception) as caught,
        pytest.warns(UserWarning, match="RETRIES_EXCEEDED"),  # the Connect client's own retries
    ):
        SparkBackend("sc://127.0.0.1:9/;token=secret-token-xyz")
    assert time.monotonic() - started < 60
    assert SparkBackend.is_transient(caught.value)
    assert "secret-token-xyz" not in _everything(caught.value)


def test_a_loader_over_a_passed_session_resumes_exactly(spark: SparkEngine) -> None:
    spark.create("series", series_table([[4, 3], [5]]))
    options: dict[str, Any] = {
        "batch_size": 3,
        "shuffle": True,
        "seed": 3,
        "window_size": 2,
        "input_col": ["f0"],
        "group_col": "gid",
        "repartition_col": "part",
    }
    assert_resumes_exactly(lambda: DDBDataLoader(spark.admin, SERIES_SQL, "y", **options), epochs=1)


@pytest.mark.multiprocess
def test_a_classic_session_reads_and_cancels(spark_server: sparkserver.SparkServer, tmp_path: Path) -> None:
    """In a subprocess (tests/spark_classic.py): a classic session runs its JVM in the process.

    ``spark_server`` is here for its check that pyspark and Java are installed (skip or fail).
    """
    # Connect sessions made in this process set SPARK_CONNECT_MODE_ENABLED (and maybe SPARK_REMOTE),
    # which would make the child's builder ask for a Connect URL.
    connect_mode = {"SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"}
    env = {k: v for k, v in os.environ.items() if k not in connect_mode}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    try:
        done = subprocess.run(
            [sys.executable, str(REPO / "tests" / "spark_classic.py"), str(tmp_path / "warehouse")],
            check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:  # its output says how far it got
        output = [(o or b"").decode(errors="replace")[-3000:] for o in (expired.stdout, expired.stderr)]
        pytest.fail("spark_classic.py still ran after 240 s:\n" + "\n".join(output))
    assert done.returncode == 0, f"spark_classic.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
