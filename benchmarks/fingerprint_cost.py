"""What the content fingerprint (``verify=True``) costs on throughput.py's default shape (DuckDB).

A fingerprint per partition is its row count plus the sum (mod 2**64) of an engine hash of every
row. Planning computes it in the grouped count query; each fetch adds one column with each row's
hash, summed by the client and dropped. This script measures both costs against a real epoch of
the loader, in interleaved rounds, side by side in one run:

* epoch: one epoch of ``DDBDataLoader`` as throughput.py builds it (the reference), and the same
  with ``verify=True`` (what a user pays);
* build: the constructor (planning) without and with ``verify=True``;
* fetch: the loader's own 50 subqueries run to Arrow with one cursor, as they are and with
  ``hash(...) AS _ddb_hash`` added (summed with numpy, uint64 wraparound, then dropped), for
  each way DuckDB can hash a row;
* plan: the grouped count over (symbol, day), as it is and with ``sum(hash(_ddb_q)::HUGEINT)``.

    python benchmarks/fingerprint_cost.py [--rounds N] [--no-save]

The table goes to RESULTS.md (a section of its own, kept in results.json beside throughput.py's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
import throughput

SHAPE = throughput.Shape(10, 5, 2000, 100, 50)


def _with_hash(sql: str, row_hash: str) -> str:
    prefix = "SELECT * FROM ("
    if not sql.startswith(prefix):
        raise ValueError(f"a subquery that does not start with {prefix!r}: {sql[:80]!r}")
    return f"SELECT *, {row_hash} AS _ddb_hash" + sql[len("SELECT *") :]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-save", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()
    rounds, save = args.rounds, not args.no_save
    load_before = os.getloadavg()[0]
    warnings.simplefilter("ignore")
    throughput.ensure_data(SHAPE)
    loader = throughput._make_loader(SHAPE)
    specs = [(p.sql, list(p.params)) for g in loader.plan.groups for p in g.partitions]
    connection = duckdb.connect(str(SHAPE.db_path), read_only=True)
    columns = ", ".join(["symbol", "ts", *SHAPE.factor_names, "target"])
    row_hashes = {
        "hash(_ddb_q)": "hash(_ddb_q)",
        "hash(*COLUMNS(*))": "hash(*COLUMNS(*))",
        "hash(c1, ...)": f"hash({columns})",
    }
    grouped = f"FROM ({SHAPE.loader_sql}) AS _ddb_q GROUP BY ALL"
    count_sql = f"SELECT symbol, CAST(ts AS DATE) AS day, count(*) {grouped}"
    fingerprint_sql = (
        f"SELECT symbol, CAST(ts AS DATE) AS day, count(*), sum(hash(_ddb_q)::HUGEINT) {grouped}"
    )

    planned = {
        (symbol, day): int(total) % 2**64
        for symbol, day, _, total in connection.sql(fingerprint_sql).fetchall()
    }
    cursor = connection.cursor()
    for sql, params in specs:
        hashes = (
            cursor.sql(_with_hash(sql, "hash(_ddb_q)"), params=params).to_arrow_table().column("_ddb_hash")
        )
        fetched = int(hashes.to_numpy().sum(dtype=np.uint64))
        if fetched != planned[tuple(params)]:
            raise AssertionError(
                f"fetched rows of {params} sum to {fetched}, planning to {planned[tuple(params)]}"
            )

    verified = throughput._make_loader(SHAPE, verify=True)

    def epoch_of(which: Any) -> Callable[[], None]:
        def run() -> None:
            for _ in which:
                pass

        return run

    def build(**options: Any) -> Callable[[], None]:
        def run() -> None:
            throughput._make_loader(SHAPE, **options).release()

        return run

    def fetch(row_hash: str | None) -> Callable[[], None]:
        def run() -> None:
            cursor = connection.cursor()
            for sql, params in specs:
                table = cursor.sql(
                    sql if row_hash is None else _with_hash(sql, row_hash), params=params
                ).to_arrow_table()
                if row_hash is not None:
                    table.column("_ddb_hash").to_numpy().sum(dtype=np.uint64)
                    table = table.drop_columns(["_ddb_hash"])

        return run

    def plan(sql: str) -> Callable[[], None]:
        def run() -> None:
            connection.sql(sql).to_arrow_table()

        return run

    phases: dict[str, Callable[[], None]] = {
        "epoch (reference)": epoch_of(loader),
        "epoch, verify=True": epoch_of(verified),
        "build, as today": build(),
        "build, verify=True": build(verify=True),
        "fetch, as today": fetch(None),
    }
    phases |= {f"fetch + {name}": fetch(expr) for name, expr in row_hashes.items()}
    phases |= {"plan count, as today": plan(count_sql), "plan count + sum(hash)": plan(fingerprint_sql)}
    times: dict[str, list[float]] = {name: [] for name in phases}
    # the process's CPU seconds (every thread's): steadier than walls on a shared machine
    cpu: dict[str, list[float]] = {name: [] for name in phases}
    for round_ in range(rounds):
        order = list(phases.items())
        for name, phase in order if round_ % 2 == 0 else order[::-1]:  # neither side always first
            started, cpu_started = time.perf_counter(), time.process_time()
            phase()
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    loader.release()
    verified.release()
    median = {name: statistics.median(values) for name, values in times.items()}
    median_cpu = {name: statistics.median(values) for name, values in cpu.items()}
    epoch_s = median["epoch (reference)"]
    kinds = {"fetch": "fetch, as today", "plan": "plan count, as today", "build": "build, as today"}
    rows = []
    for name, seconds in median.items():
        reference = kinds.get(name.split(" ")[0].rstrip(","), "epoch (reference)")
        rows.append(
            {
                "phase": name,
                "ms": seconds * 1e3,
                "ratio": seconds / median[reference],
                "added_pct_of_epoch": (seconds - median[reference]) / epoch_s * 100,
                "cpu_ms": median_cpu[name] * 1e3,
                "cpu_ratio": median_cpu[name] / median_cpu[reference],
            }
        )
    data = {
        "shape": SHAPE.tag,
        "partitions": len(specs),
        "rounds": rounds,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "rows": rows,
        "machine": throughput.machine(None),
    }
    if save:
        throughput.save("fingerprint", data)
    print(render(data))


def render(data: dict[str, Any]) -> str:
    """The RESULTS.md section of one run (throughput.render calls it for results.json's entry)."""
    out = [
        "## Content fingerprint, `verify=True` (`benchmarks/fingerprint_cost.py`)",
        "",
        f"Shape {data['shape']} (throughput.py's default loader), {data['partitions']} partitions, DuckDB; "
        f"every fetched partition's hash sum equalled the planned one. Median of {data['rounds']} "
        f"interleaved rounds (order reversed every other round); load average "
        f"{data['load_before']:.2f} before, {data['load_after']:.2f} after, on {os.cpu_count()} shared "
        "CPUs: read the ratios, and the CPU column before the walls. 'added' is the difference to "
        "the phase's reference row (epoch, build, fetch or plan count), as a share of one epoch.",
        "",
        "| phase | wall ms | × reference | added, % of epoch | CPU ms | CPU × reference |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        out.append(
            f"| {row['phase']} | {row['ms']:.0f} | {row['ratio']:.3f} | {row['added_pct_of_epoch']:.1f} % "
            f"| {row['cpu_ms']:.0f} | {row['cpu_ratio']:.3f} |"
        )
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    main()
