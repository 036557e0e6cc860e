"""Engines side by side: windows/s of one loader on the scale shapes, per engine, in one run.

Usage::

    python benchmarks/engines.py                 # DuckDB, DataFusion, ClickHouse (chDB), Flight SQL (Sail)
    python benchmarks/engines.py --rows 40000 --rounds 3 --engines duckdb,datafusion

The data are ``benchmarks/scale.py``'s ``groups`` table (8 float64 factors and a target, stored
in random order, no index), by default at a tenth of its size (``--rows`` rows in all) so a
round fits a shared 2-core machine: as few big groups (10 groups) and as many small ones
(``rows / 100`` groups of 100 rows). The loader is scale.py's too: window 20, batch 256,
shuffled, default ``fetch_bytes`` (fetch units), ordered by the row's position in its group.

Each engine runs in its own interpreter (chDB holds one database per process), loads the same
Arrow table (DuckDB: a table; DataFusion: a registered record batch table; chDB: a MergeTree
table through its ADBC driver; Sail: a Parquet table read through its Flight SQL server in the
child), and reports the plan's seconds and the median windows/s of ``--epochs`` epochs after the
first (which pays cold caches). ``--rounds`` rounds of all engines one after the other; the table
gives each engine's median round and its ratio to DuckDB in the same round (median of the rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scale  # noqa: E402 -- the scale benchmark's table, loader and epoch

ENGINES = ("duckdb", "datafusion", "clickhouse", "flightsql")


def _source(engine: str, data: Any, directory: Path) -> tuple[Any, str]:
    """A loader source holding ``data`` as table ``t``, and what keeps it alive."""
    if engine == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute("CREATE TABLE t AS SELECT * FROM data")
        return con, con
    if engine == "datafusion":
        from datafusion import SessionContext

        ctx = SessionContext()
        ctx.register_record_batches("t", [data.to_batches()])
        return ctx, ctx
    if engine == "clickhouse":
        from adbc_driver_chdb import dbapi

        uri = f"chdb://{directory / 'chdb'}"
        admin = dbapi.connect(uri)
        with admin.cursor() as cursor:
            cursor.adbc_ingest("t", data, mode="create")
        return uri, admin
    if engine == "flightsql":
        import pyarrow.parquet as pq
        from adbc_driver_flightsql import dbapi
        from pysail.flight import FlightSqlServer

        from ddbloader.backends import FlightSQLBackend

        server = FlightSqlServer("127.0.0.1", 0)
        server.start(background=True)
        host, port = server.listening_address
        (directory / "t").mkdir()
        pq.write_table(data, directory / "t" / "part-0.parquet")
        uri = f"grpc://{host}:{port}"
        with dbapi.connect(uri, autocommit=True) as admin, admin.cursor() as cursor:
            cursor.execute(f"CREATE TABLE t USING parquet LOCATION '{directory / 't'}'")
            cursor.fetch_arrow_table()
        return (lambda: FlightSQLBackend(uri, dialect="spark")), server
    raise ValueError(f"unknown engine {engine!r}; choose from {ENGINES}")


def measure(engine: str, groups: int, rows: int, epochs: int) -> dict[str, Any]:
    """One engine, one shape: plan seconds and the median windows/s of the epochs after the first."""
    import ddbloader  # noqa: F401 -- imported before the clock starts, as a training script has it

    data = scale._groups_table(groups, rows)
    with tempfile.TemporaryDirectory(prefix="ddbloader-engines-") as directory:
        source, keep = _source(engine, data, Path(directory))
        started = time.perf_counter()
        loader = scale._groups_loader(source() if callable(source) else source, "t")
        plan = time.perf_counter() - started
        with loader:
            scale._epoch(loader)
            runs = [scale._epoch(loader) for _ in range(epochs)]
            queries = loader.stats().queries
        del keep
    seconds = statistics.median(s for s, _ in runs)
    return {"plan_s": plan, "windows_per_s": runs[0][1] / seconds, "queries": queries}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=40_000, help="rows in all, per shape")
    parser.add_argument("--epochs", type=int, default=3, help="epochs measured after the first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = measure(*json.loads(args.child))
        print(scale.MARKER + json.dumps(result), flush=True)
        return
    engines = args.engines.split(",")
    shapes = ((10, args.rows // 10), (args.rows // 100, 100))
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for groups, rows in shapes:
            for engine in engines:
                results.setdefault((engine, groups), []).append(_spawn(engine, groups, rows, args.epochs))
    print(
        f"rows per shape: {args.rows:,}; window {scale.WINDOW}, batch {scale.BATCH}, shuffled; "
        f"median of {args.rounds} rounds, {args.epochs} epochs each after the first"
    )
    print("| engine | shape | plan s | windows/s | queries/epoch | x DuckDB (median of rounds) |")
    print("|---|---|---|---|---|---|")
    for groups, rows in shapes:
        for engine in engines:
            rounds = results[(engine, groups)]
            ratios = [
                r["windows_per_s"] / d["windows_per_s"]
                for r, d in zip(rounds, results.get(("duckdb", groups), rounds), strict=True)
            ]
            plan = statistics.median(r["plan_s"] for r in rounds)
            speed = statistics.median(r["windows_per_s"] for r in rounds)
            print(
                f"| {engine} | {groups:,} x {rows:,} | {plan:.2f} | {speed:,.0f} | {rounds[0]['queries']} | "
                f"{statistics.median(ratios):.2f} |"
            )


def _spawn(engine: str, groups: int, rows: int, epochs: int) -> dict[str, Any]:
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(scale.REPO), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps([engine, groups, rows, epochs]),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(scale.MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{engine} {groups}x{rows} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(scale.MARKER) :])
    print(f"  {engine} {groups} x {rows}: {result}", file=sys.stderr, flush=True)
    return result


if __name__ == "__main__":
    main()
