"""How well does a shuffled epoch mix the rows, and what does a more uniform shuffle cost?

Usage::

    python benchmarks/shuffle.py              # four workloads, 3 rounds
    python benchmarks/shuffle.py --workloads mixing   # the default's mixing (issue 43)
    python benchmarks/shuffle.py --workloads groups --rounds 5
    python benchmarks/shuffle.py --smoke

Workloads (DuckDB files under ``benchmarks/_work/``), batch 1024 unless said, shuffled:

* ``tabular``: 2,000,000 rows x 32 float32, ``SELECT * FROM tab ORDER BY id``, one group.
* ``series``: one group of 2,000,000 rows x 8 float32, ``ORDER BY id``, window 16: a long series
  read in range pieces.
* ``groups``: 200 groups x 2,000 rows x 8 float32 (stored in random order), window 16.
* ``mixing``: 200 groups x 500 rows x 8 float32, window 16, batch 64: what the default
  ``shuffle=True`` mixes against a uniform shuffle of every window, and what mixing costs.

Configurations (each in its own interpreter, interleaved): ``default`` and ``uniform`` (tabular
and series: ``fetch_bytes=0``, the partition read whole; groups and mixing: ``group_pool_size``
= every group); mixing also ``pool3`` (``group_pool_size=3``, DolphinDB's pool). ``permutation``
(groups and mixing) is no loader: the median distinct groups per batch of a uniform permutation
of every window, the reference the default's mixing is held to.

Mixing, from the keys the first epoch delivers (``key_col``): ``blocks`` is the median number of
distinct blocks of 1/20 of the ids (groups: distinct groups) per batch, ``sample_rho`` Spearman's
correlation between a sample's position in the epoch and its id (0: no trace of row order, +1:
front to back); ``stats_*`` are the loader's own figures (``loader.stats()``:
``partitions_per_batch``, ``rank_correlation``). Time: setup, first and warm epoch, CPU seconds,
peak RSS.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import harness

WORKLOADS = ("tabular", "series", "groups", "mixing")
GROUPED = ("groups", "mixing")


def permutation(p: dict[str, Any]) -> dict[str, Any]:
    """Median distinct groups per batch of a uniform permutation of every window (no loader)."""
    import numpy as np

    per = p["rows"] - 16
    order = np.random.default_rng(0).permutation(p["groups"] * per) // per
    batches = np.split(order, range(p["batch"], len(order), p["batch"]))
    return {"blocks": float(np.median([len(np.unique(b)) for b in batches]))}


def loader(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from scipy.stats import spearmanr

    from ddbloader import DDBDataLoader

    warnings.simplefilter("ignore")
    workload, uniform = p["workload"], p["label"] == "uniform"
    options: dict[str, Any] = {"batch_size": p["batch"], "shuffle": True, "seed": 0}
    grouped = workload in GROUPED
    if grouped:
        path, key = str(harness.groups_db(p["groups"], p["rows"], 8, "FLOAT")), "g"
        sql, target = "SELECT * FROM t ORDER BY g, pos", "target"
        options |= {"group_col": "g", "window_size": 16, "exclude_col": ["g", "pos", "target"]}
        options |= {"group_pool_size": p["groups"]} if uniform else {}
        options |= {"group_pool_size": 3} if p["label"] == "pool3" else {}
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
    block = 1 if grouped else max(p["rows"] // 20, 1)
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
    rows_of = {"tabular": 2_000_000, "series": 2_000_000, "groups": 2_000, "mixing": 500}
    rows, ratios, params = [], {}, {}
    for workload in args.workloads.split(","):
        p = {"workload": workload, "rows": 1_000 if args.smoke else rows_of[workload], "groups": 200}
        p |= {"groups": 4} if args.smoke else {}
        p["batch"] = 64 if workload == "mixing" else 1024
        p["epochs"] = 2 if args.smoke else args.epochs
        params[workload] = p
        labels = ("default", "pool3", "uniform") if workload == "mixing" else ("default", "uniform")
        todo = [("loader", {**p, "label": label}) for label in labels]
        results = harness.interleaved(args.script, todo, args.rounds)
        if workload in GROUPED:
            results += harness.interleaved(args.script, [("permutation", p)], 1)
        for row in results:
            row["contender"] = f"{workload} {row['contender'].removeprefix('loader ')}"
        rows += results
        by = {row["contender"].removeprefix(f"{workload} "): row for row in results}
        default, uniform = by["default"], by["uniform"]
        reference = by.get("permutation", uniform)
        ratios[f"{workload}: blocks per batch, default / {reference['contender']}"] = (
            default["blocks"] / reference["blocks"]
        )
        for label, row in by.items():
            if label not in ("default", "permutation"):
                for figure in ("first_epoch_s", "warm_s"):
                    ratios[f"{workload}: {figure}, {label} / default"] = row[figure] / default[figure]
    return {"params": params, "rows": rows, "ratios": ratios}


if __name__ == "__main__":
    harness.main(__doc__, {"loader": loader, "permutation": permutation}, run, arguments)
