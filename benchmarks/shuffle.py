"""How well does a shuffled epoch mix the rows, and what does a more uniform shuffle cost?

Usage::

    python benchmarks/shuffle.py              # three workloads, 3 rounds
    python benchmarks/shuffle.py --workloads groups --rounds 5
    python benchmarks/shuffle.py --smoke

Workloads (DuckDB files under ``benchmarks/_work/``), batch 1024, shuffled:

* ``tabular``: 2,000,000 rows x 32 float32, ``SELECT * FROM tab ORDER BY id``, one group.
* ``series``: one group of 2,000,000 rows x 8 float32, ``ORDER BY id``, window 16: a long series
  read in range pieces.
* ``groups``: 200 groups x 2,000 rows x 8 float32 (stored in random order), window 16.

Configurations (each in its own interpreter, interleaved): ``default`` and ``uniform`` (tabular
and series: ``fetch_bytes=0``, the partition read whole; groups: ``group_pool_size`` = every
group). Mixing, from the keys the first epoch delivers (``key_col``): ``blocks`` is the median
number of distinct blocks of 1/20 of the ids (groups: distinct groups) per batch, ``sample_rho``
Spearman's correlation between a sample's position in the epoch and its id (0: no trace of row
order, +1: front to back); ``stats_*`` are the loader's own figures (``loader.stats()``:
``partitions_per_batch``, ``rank_correlation``). Time:
setup, first and warm epoch, CPU seconds, peak RSS.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import harness

WORKLOADS = ("tabular", "series", "groups")


def loader(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from scipy.stats import spearmanr

    from ddbloader import DDBDataLoader

    warnings.simplefilter("ignore")
    workload, uniform = p["workload"], p["label"] == "uniform"
    options: dict[str, Any] = {"batch_size": 1024, "shuffle": True, "seed": 0}
    if workload == "groups":
        path, key = str(harness.groups_db(p["groups"], p["rows"], 8, "FLOAT")), "g"
        sql, target = "SELECT * FROM t ORDER BY g, pos", "target"
        options |= {"group_col": "g", "window_size": 16, "exclude_col": ["g", "pos", "target"]}
        options |= {"group_pool_size": p["groups"]} if uniform else {}
    else:
        path, key = str(harness.tabular_db(p["rows"], 32 if workload == "tabular" else 8)), "id"
        sql, target = "SELECT * FROM tab ORDER BY id", "f0"
        options |= {"exclude_col": ["id"], **({"window_size": 16} if workload == "series" else {})}
        options |= {"fetch_bytes": 0} if uniform else {}
    keys: list[Any] = []
    with DDBDataLoader(path, sql, target, key_col=[key], **options) as first:
        for batch in first:
            keys.append(np.asarray(batch[2][key]))
        stats = first.stats()
    row = harness.passes(lambda: DDBDataLoader(path, sql, target, **options), p["epochs"])
    block = 1 if workload == "groups" else max(p["rows"] // 20, 1)
    every = np.concatenate(keys)
    step = max(len(every) // 200_000, 1)
    return {
        "blocks": float(np.median([len(np.unique(k // block)) for k in keys])),
        "sample_rho": float(spearmanr(np.arange(0, len(every), step), every[::step])[0]),
        "stats_partitions_per_batch": stats.partitions_per_batch,
        "stats_rho": stats.rank_correlation,
        **row,
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, of " + ", ".join(WORKLOADS)
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per contender (the first is cold)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows_of = {"tabular": 2_000_000, "series": 2_000_000, "groups": 2_000}
    rows, ratios, params = [], {}, {}
    for workload in args.workloads.split(","):
        p = {"workload": workload, "rows": 1_000 if args.smoke else rows_of[workload], "groups": 200}
        p |= {"groups": 4} if args.smoke else {}
        p["epochs"] = 2 if args.smoke else args.epochs
        params[workload] = p
        todo = [("loader", {**p, "label": label}) for label in ("default", "uniform")]
        default, uniform = harness.interleaved(args.script, todo, args.rounds)
        default["contender"], uniform["contender"] = f"{workload} default", f"{workload} uniform"
        rows += [default, uniform]
        ratios[f"{workload}: blocks per batch, default / uniform"] = default["blocks"] / uniform["blocks"]
        ratios[f"{workload}: warm epoch, uniform / default"] = uniform["warm_s"] / default["warm_s"]
    return {"params": params, "rows": rows, "ratios": ratios}


if __name__ == "__main__":
    harness.main(__doc__, {"loader": loader}, run, arguments)
