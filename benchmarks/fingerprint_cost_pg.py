"""What ``verify=True`` costs on PostgreSQL: epochs and constructors with and without it.

A throwaway server (tests/pgserver.py) holds 200,000 rows × 19 columns (10 symbols, 5 days each:
50 partitions); the loader windows 16 float columns. Rounds alternate which side runs first.
PostgreSQL hashes each row's text (``hashtextextended``) in its own process, so the client's CPU
barely moves: the walls carry the cost.

    python benchmarks/fingerprint_cost_pg.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import pgserver  # tests/pgserver.py, found through the path above

from ddbloader import DDBDataLoader

ROWS = 200_000
SQL = "SELECT * FROM bench ORDER BY id"
ARGS = {
    "batch_size": 64,
    "shuffle": True,
    "window_size": 32,
    "group_col": "sym",
    "repartition_col": "day",
    "input_col": [f"f{k}" for k in range(16)],
    "seed": 0,
}


def _table() -> pa.Table:
    ids = np.arange(ROWS)
    columns = {"id": ids, "sym": ids % 10, "day": ids // 40_000}
    columns |= {f"f{k}": np.sin(ids * (k + 1) * 0.001) for k in range(16)}
    columns["target"] = np.cos(ids * 0.002)
    return pa.table(columns)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    warnings.simplefilter("ignore")
    server = pgserver.start()
    try:
        from adbc_driver_postgresql import dbapi

        with dbapi.connect(server.uri, autocommit=True) as admin, admin.cursor() as cursor:
            cursor.adbc_ingest("bench", _table(), mode="create")
        load_before = os.getloadavg()[0]
        loaders = {v: DDBDataLoader(server.uri, SQL, "target", verify=v, **ARGS) for v in (False, True)}
        walls: dict[str, list[float]] = {}
        for round_ in range(rounds):
            for verify in (False, True) if round_ % 2 == 0 else (True, False):
                started = time.perf_counter()
                DDBDataLoader(server.uri, SQL, "target", verify=verify, **ARGS).close()
                walls.setdefault(f"build, verify={verify}", []).append(time.perf_counter() - started)
                started, cpu = time.perf_counter(), time.process_time()
                for _ in loaders[verify]:
                    pass
                walls.setdefault(f"epoch, verify={verify}", []).append(time.perf_counter() - started)
                walls.setdefault(f"epoch client CPU, verify={verify}", []).append(time.process_time() - cpu)
        plan = loaders[True].plan
        for loader in loaders.values():
            loader.close()
    finally:
        server.stop()
    median = {name: statistics.median(values) for name, values in walls.items()}
    print(
        f"PostgreSQL, {plan.rows:,} rows in {plan.partitions} partitions, median of {rounds} rounds, "
        f"load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"{'phase':24s} {'off s':>8s} {'on s':>8s} {'on ÷ off':>9s}")
    for phase in ("epoch", "epoch client CPU", "build"):
        off, on = median[f"{phase}, verify=False"], median[f"{phase}, verify=True"]
        print(f"{phase:24s} {off:8.3f} {on:8.3f} {on / off:9.3f}")


if __name__ == "__main__":
    main()
