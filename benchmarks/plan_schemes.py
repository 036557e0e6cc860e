"""Planning time of an explicit scheme: one count query per value (before issue 12) vs one query.

    python benchmarks/plan_schemes.py [--values 4000] [--rows-per-value 100] [--repeats 3]

Builds an in-memory DuckDB table with ``--values`` symbols of ``--rows-per-value`` rows each and
plans ``SELECT ... ORDER BY sym, ts`` split by ``group_col="sym"`` with every symbol listed in
``group_scheme``. Contenders, side by side in one run (median of ``--repeats``):

- *per-value counts*: what planning did before issue 12: ``count(*)`` of the partition subquery,
  one query per scheme value (run here with the same derived SQL the loader fetches with);
- *ddbloader plan*: the loader's constructor, whose plan counts every subquery in one query
  (scheme values bound as a VALUES list joined to the query's keys).

Prints a Markdown table; results go in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import duckdb

from ddbloader import DDBDataLoader
from ddbloader._sql.query import UserQuery

SQL = "SELECT sym, ts, f, y FROM ticks ORDER BY sym, ts"


def make_table(values: int, rows: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(
        f"""
        CREATE TABLE ticks AS
        SELECT 'S' || lpad(CAST(i // {rows} AS VARCHAR), 6, '0') AS sym, i % {rows} AS ts,
               random() AS f, random() AS y
        FROM range({values * rows}) t(i)
        """
    )
    return con


def per_value_counts(con: duckdb.DuckDBPyConnection, scheme: list[str]) -> None:
    query = UserQuery(SQL, "duckdb")
    count = query.count(query.filtered([query.column("sym", "group_col")]))
    cursor = con.cursor()
    for value in scheme:
        cursor.execute(count, [value]).fetchall()
    cursor.close()


def loader_plan(con: duckdb.DuckDBPyConnection, scheme: list[str]) -> None:
    DDBDataLoader(con, SQL, "y", input_col=["f"], group_col="sym", group_scheme=scheme).close()


def median_seconds(run: Callable[[], None], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--values", type=int, default=4000)
    parser.add_argument("--rows-per-value", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    con = make_table(args.values, args.rows_per_value)
    scheme = [r[0] for r in con.execute("SELECT DISTINCT sym FROM ticks ORDER BY sym DESC").fetchall()]
    before = median_seconds(lambda: per_value_counts(con, scheme), args.repeats)
    after = median_seconds(lambda: loader_plan(con, scheme), args.repeats)
    print(f"{args.values} explicit group_scheme values × {args.rows_per_value} rows (DuckDB, in memory)\n")
    print("| contender | median s | best s |")
    print("|---|---:|---:|")
    print(f"| per-value count queries (before issue 12) | {before[0]:.2f} | {before[1]:.2f} |")
    print(f"| ddbloader plan (one counting query) | {after[0]:.2f} | {after[1]:.2f} |")
    print(f"\nratio before ÷ after (median): {before[0] / after[0]:.1f}×")
    con.close()


if __name__ == "__main__":
    main()
