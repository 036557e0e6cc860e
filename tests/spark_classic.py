"""A classic (in-process JVM) SparkSession as ``source``; run by tests/test_spark.py in a subprocess.

Run as ``python3 tests/spark_classic.py WAREHOUSE``. A classic session cannot share a process with
the Connect sessions of the other tests, hence the subprocess. Exits 0 when a loader over the
session gives DuckDB's batches, and an interrupted query is cancelled while the cursor stays usable.
"""

from __future__ import annotations

import sys
import threading
import time

from pyspark.sql import SparkSession
from test_backends import PARTS, SERIES_SQL, assert_same, batches, reference, series_table

from ddbloader import DDBDataLoader
from ddbloader.backends import connect

STARTED = time.monotonic()


def step(done: str) -> None:
    """Say how far the run got: a parent that times out shows it."""
    print(f"{time.monotonic() - STARTED:.1f} s: {done}", flush=True)


def main(warehouse: str) -> None:
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.sql.warehouse.dir", warehouse)
        .getOrCreate()
    )
    step("session started")
    spark.createDataFrame(series_table(PARTS)).write.saveAsTable("series")
    options = {
        "target_col": "y",
        "input_col": ["f0"],
        "batch_size": 5,
        "shuffle": True,
        "window_size": 3,
        "group_col": "gid",
        "repartition_col": "part",
        "seed": 7,
    }
    got = batches(DDBDataLoader(spark, SERIES_SQL, **options))
    assert_same(got, reference(SERIES_SQL, series_table(PARTS), **options))
    step("the loader gave DuckDB's batches")
    backend = connect(spark)
    assert backend.engine == "spark (session)", backend.engine
    cursor = backend.cursor()
    threading.Timer(2.0, cursor.interrupt).start()
    started = time.monotonic()
    try:
        cursor.fetch("SELECT count(*) AS n FROM range(0, 1000000000000)", [])
        raise AssertionError("the query was not cancelled")
    except Exception as error:  # py4j wraps the JVM's cancellation
        assert "cancel" in str(error).lower(), error
    assert time.monotonic() - started < 60
    step("the query was cancelled")
    assert cursor.fetch("SELECT 1 AS one", []).num_rows == 1
    backend.close()
    assert spark.sql("SELECT 2 AS two").count() == 1  # the user's session stays open
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
