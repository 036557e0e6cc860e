"""The demo: a real factor table in DuckDB, a real model, the same loss on every run."""

from __future__ import annotations

import argparse

import duckdb
import pytest

from ddbloader import demo

SMALL = ["--symbols", "3", "--days", "2", "--rows", "60", "--factors", "4", "--window", "8", "--steps", "12"]


def small_run() -> float:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return demo.run(parser.parse_args(SMALL))


@pytest.mark.slow
def test_the_demo_prints_the_same_loss_on_every_run() -> None:
    first, second = small_run(), small_run()
    assert first == second
    assert first < 1.0


def test_the_factor_table_is_the_same_on_every_run_and_keeps_the_thread_setting() -> None:
    tables = []
    for _ in range(2):
        with duckdb.connect() as con:
            con.execute("SET threads = 2")
            demo.build_factor_table(con, symbols=4, days=3, rows=500, factors=3)
            tables.append(con.sql("SELECT * FROM factors ORDER BY symbol, ts").fetchall())
            assert con.execute("SELECT current_setting('threads')").fetchone() == (2,)
    assert tables[0] == tables[1]
    assert len(tables[0]) == 4 * 3 * 500
