"""Does a shuffled epoch of one big table drift? Per seed, Spearman's correlation of a batch's
index in the epoch with its mean id, and the distinct blocks of 1/20 of the ids per batch.

Usage::

    python benchmarks/drift.py                 # 2,000,000 rows x 32 float32, batch 1024, seeds 0-3
    python benchmarks/drift.py --rows 200000 --seeds 8
    python benchmarks/drift.py --smoke

The table is ``harness.tabular_db`` (``SELECT * FROM tab ORDER BY id``, defaults otherwise, so
one group cut into combed range pieces). Under a uniform shuffle the correlation's spread is
``1 / sqrt(batches - 1)`` (0.023 at 1,953 batches).
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import harness
import numpy as np


def seed(p: dict[str, Any]) -> dict[str, Any]:
    """One shuffled epoch at ``p["seed"]``: the drift statistic and the blocks per batch."""
    from ddbloader import DDBDataLoader

    warnings.simplefilter("ignore")
    path = str(harness.tabular_db(p["rows"], 32))
    options = {"batch_size": p["batch"], "shuffle": True, "seed": p["seed"], "exclude_col": ["id"]}
    with DDBDataLoader(path, "SELECT * FROM tab ORDER BY id", "f0", key_col=["id"], **options) as loader:
        partitions = len(loader.plan.groups[0].partitions)
        ids = [np.asarray(keys["id"]) for _, _, keys in loader]
    means = [float(k.mean()) for k in ids]
    blocks = [len(np.unique(k * 20 // p["rows"])) for k in ids[:-1]]
    return {
        "partitions": partitions,
        "batches": len(ids),
        "rho": float(np.corrcoef(np.arange(len(means)), np.argsort(np.argsort(means)))[0, 1]),
        "uniform_sd": 1 / float(np.sqrt(len(ids) - 1)),
        "blocks_median": float(np.median(blocks)),
        "blocks_min": min(blocks),
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seeds", type=int, default=4)


def run(args: argparse.Namespace) -> dict[str, Any]:
    p = {"rows": 40_000 if args.smoke else 2_000_000, "batch": 256 if args.smoke else args.batch}
    seeds = 1 if args.smoke else args.seeds
    rows = harness.interleaved(
        args.script, [("seed", {**p, "seed": s, "label": str(s)}) for s in range(seeds)], 1
    )
    return {"params": {**p, "seeds": seeds}, "rows": rows}


if __name__ == "__main__":
    harness.main(__doc__, {"seed": seed}, run, arguments)
