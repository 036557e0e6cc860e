"""What ``verify=True`` costs on ClickHouse (chDB): epochs and constructors with and without it.

fingerprint_cost_pg.py's data (200,000 rows × 19 columns, 10 symbols × 5 days: 50 partitions;
the loader windows 16 float columns) in a chDB database in a temporary directory. chDB runs in
this process, so its hashing (``cityHash64(tuple(*))``) shows in the client's CPU too. Rounds
alternate which side runs first.

    python benchmarks/fingerprint_cost_chdb.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

from fingerprint_cost_pg import ARGS, SQL, _table

from ddbloader import DDBDataLoader


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    warnings.simplefilter("ignore")
    from adbc_driver_chdb import dbapi

    with tempfile.TemporaryDirectory() as directory:
        uri = f"chdb://{directory}"
        admin = dbapi.connect(uri)
        with admin.cursor() as cursor:
            cursor.adbc_ingest("bench", _table(), mode="create")
        load_before = os.getloadavg()[0]
        loaders = {v: DDBDataLoader(uri, SQL, "target", verify=v, **ARGS) for v in (False, True)}
        walls: dict[str, list[float]] = {}
        for round_ in range(rounds):
            for verify in (False, True) if round_ % 2 == 0 else (True, False):
                started, cpu = time.perf_counter(), time.process_time()
                DDBDataLoader(uri, SQL, "target", verify=verify, **ARGS).close()
                walls.setdefault(f"build, verify={verify}", []).append(time.perf_counter() - started)
                walls.setdefault(f"build CPU, verify={verify}", []).append(time.process_time() - cpu)
                started, cpu = time.perf_counter(), time.process_time()
                for _ in loaders[verify]:
                    pass
                walls.setdefault(f"epoch, verify={verify}", []).append(time.perf_counter() - started)
                walls.setdefault(f"epoch CPU, verify={verify}", []).append(time.process_time() - cpu)
        plan = loaders[True].plan
        for loader in loaders.values():
            loader.close()
        admin.close()
    median = {name: statistics.median(values) for name, values in walls.items()}
    print(
        f"ClickHouse (chDB), {plan.rows:,} rows in {plan.partitions} partitions, median of {rounds} "
        f"rounds, load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"{'phase':24s} {'off s':>8s} {'on s':>8s} {'on ÷ off':>9s}")
    for phase in ("epoch", "epoch CPU", "build", "build CPU"):
        off, on = median[f"{phase}, verify=False"], median[f"{phase}, verify=True"]
        print(f"{phase:24s} {off:8.3f} {on:8.3f} {on / off:9.3f}")


if __name__ == "__main__":
    main()
