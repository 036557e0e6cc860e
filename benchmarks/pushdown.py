"""Pushdown evidence: a wrapped subquery scans what the old injected predicate scanned.

Every subquery is ``SELECT * FROM (Q) AS _ddb_q WHERE key = $1 ...``. This script takes the
loader's own subquery for one symbol-day of two shapes, the scale benchmark's (factors ordered
by time, split by symbol and day) and a PIVOT per day, and runs it beside the query with the
predicate written into Q's WHERE by hand (what the loader used to send). Per engine it prints,
side by side, the filter the table scan applies, the rows the scan returns and the median time
of 5 runs. DuckDB always; PostgreSQL when its server binaries are installed (tests/pgserver.py).

    python benchmarks/pushdown.py
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import duckdb

from ddbloader import DDBDataLoader

ROWS = 2_000_000
SYMBOLS = 50
DAY = datetime.date(2024, 1, 2)


def _scan(node: dict[str, Any]) -> dict[str, Any] | None:
    if node.get("type") in ("SEQ_SCAN", "TABLE_SCAN"):
        return node
    for child in node.get("children", []):
        found = _scan(child)
        if found is not None:
            return found
    return None


def _duckdb_row(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> tuple[str, int, float]:
    profile = json.loads(con.sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params=params).fetchall()[0][1])
    scan = _scan(profile["operator"][0])
    assert scan is not None, "no table scan in the plan"
    times = []
    for _ in range(5):
        started = time.perf_counter()
        con.sql(sql, params=params).fetchall()
        times.append(time.perf_counter() - started)
    filters = scan["extra_info"].get("Filters", "none")
    return (
        " AND ".join(filters) if isinstance(filters, list) else filters,
        scan["intermediate_rows"],
        (statistics.median(times) * 1000),
    )


def _subquery(con: Any, sql: str, target: str = "target", **keys: Any) -> tuple[str, list[Any]]:
    """The loader's own subquery for symbol S0003 on DAY."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DDBDataLoader(con, sql, target, input_col=[target], **keys)
    with loader:
        for group in loader.plan.groups:
            for spec in group.partitions:
                if group.value == "S0003" and spec.repartition_value == DAY:
                    return spec.sql, list(spec.params)
    raise AssertionError("no partition for S0003 on the day")


def duckdb_rows() -> list[tuple[str, ...]]:
    con = duckdb.connect()
    con.execute(
        f"CREATE TABLE bench AS SELECT 'S' || lpad((i % {SYMBOLS})::VARCHAR, 4, '0') AS symbol, "
        f"TIMESTAMP '2024-01-01' + INTERVAL (i // {SYMBOLS}) MINUTE AS ts, random() AS f0, random() AS f1, "
        f"random() AS target FROM range({ROWS}) r(i) ORDER BY ts, symbol"
    )
    con.execute(
        "CREATE TABLE ticks AS SELECT symbol, CAST(ts AS DATE) AS d, ts, "
        "['a', 'b', 'c'][(epoch(ts)::BIGINT % 3 + 1)::INTEGER] AS k, f0 AS target FROM bench"
    )
    keys = {"group_col": "symbol", "repartition_col": "CAST(ts AS DATE)"}
    shapes = [
        (
            "scale (factors by time)",
            "SELECT symbol, ts, f0, f1, target FROM bench ORDER BY ts",
            "SELECT symbol, ts, f0, f1, target FROM bench "
            "WHERE symbol = $1 AND CAST(ts AS DATE) = $2 ORDER BY ts",
            keys,
        ),
        (
            "PIVOT per day",
            "SELECT * FROM (PIVOT ticks ON k IN ('a', 'b', 'c') USING sum(target) GROUP BY symbol, d, ts) "
            "ORDER BY ts",
            "SELECT * FROM (PIVOT (SELECT * FROM ticks WHERE symbol = $1 AND d = $2) ON k IN ('a', 'b', 'c') "
            "USING sum(target) GROUP BY symbol, d, ts) ORDER BY ts",
            {"group_col": "symbol", "repartition_col": "d", "target": "a"},
        ),
    ]
    rows: list[tuple[str, ...]] = []
    for name, sql, injected, shape_keys in shapes:
        wrapped, params = _subquery(con, sql, **shape_keys)
        for form, text in (("wrapped (now)", wrapped), ("injected (before)", injected)):
            filters, out, ms = _duckdb_row(con, text, params)
            rows.append(("duckdb", name, form, filters, str(out), f"{ms:.1f}"))
    con.close()
    return rows


def postgres_rows() -> list[tuple[str, ...]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import pgserver

    bindir = pgserver.find_bindir()
    if bindir is None:
        return [("postgres", "-", "-", "server binaries not installed", "-", "-")]
    from adbc_driver_postgresql import dbapi

    server = pgserver.start()
    try:
        admin = dbapi.connect(server.uri, autocommit=True)
        with admin.cursor() as cursor:
            cursor.execute(
                f"CREATE TABLE bench AS SELECT 'S' || lpad((i % {SYMBOLS})::text, 4, '0') AS symbol, "
                f"TIMESTAMP '2024-01-01' + (i / {SYMBOLS}) * INTERVAL '1 minute' AS ts, random() AS f0, "
                f"random() AS target FROM generate_series(0, {ROWS // 4 - 1}) i"
            )
            cursor.execute("CREATE INDEX ON bench (symbol, ts)")
            cursor.execute("ANALYZE bench")
        sql = "SELECT symbol, ts, f0, target FROM bench ORDER BY ts"
        wrapped, _ = _subquery(server.uri, sql, group_col="symbol", repartition_col="CAST(ts AS DATE)")
        literal = wrapped.replace("$1", "'S0003'").replace("$2", f"DATE '{DAY}'")
        injected = (
            "SELECT symbol, ts, f0, target FROM bench WHERE symbol = 'S0003' "
            f"AND CAST(ts AS DATE) = DATE '{DAY}' ORDER BY ts"
        )
        rows: list[tuple[str, ...]] = []
        for form, text in (("wrapped (now)", literal), ("injected (before)", injected)):
            explain = subprocess.run(
                [
                    str(bindir / "psql"),
                    server.uri,
                    "-At",
                    "-c",
                    f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) {text}",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            scan = next(line.strip() for line in explain if "Scan on bench" in line)
            buffers = next(line.strip() for line in explain if line.strip().startswith("Buffers:"))
            took = next(line.split(":")[1].strip() for line in explain if line.startswith("Execution Time"))
            rows.append(
                ("postgres", "scale (factors by time)", form, f"{scan.split('  (')[0]}; {buffers}", "-", took)
            )
        admin.close()
        return rows
    finally:
        server.stop()


def main() -> None:
    rows = [("engine", "shape", "subquery", "filter at the scan", "scan rows out", "ms"), *duckdb_rows()]
    rows += postgres_rows()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
