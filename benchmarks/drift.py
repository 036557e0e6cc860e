"""Does a shuffled epoch of one big table drift? Per seed, Spearman's correlation of a batch's
index in the epoch with its mean id, and the distinct blocks of 1/20 of the ids per batch.

Usage::

    python benchmarks/drift.py                 # 2,000,000 rows x 32 float32, batch 1024, seeds 0-3
    python benchmarks/drift.py --rows 200000 --seeds 8

The table is ``harness.tabular_db`` (``SELECT * FROM tab ORDER BY id``, defaults otherwise, so
one group cut into combed range pieces). Under a uniform shuffle the correlation's spread is
``1 / sqrt(batches - 1)`` (0.023 at 1,953 batches).
"""

from __future__ import annotations

import argparse
import warnings

import harness
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    from ddbloader import DDBDataLoader

    warnings.simplefilter("ignore")
    path = str(harness.tabular_db(args.rows, 32))
    for seed in range(args.seeds):
        options = {"batch_size": args.batch, "shuffle": True, "seed": seed, "exclude_col": ["id"]}
        with DDBDataLoader(path, "SELECT * FROM tab ORDER BY id", "f0", key_col=["id"], **options) as loader:
            pieces = len(loader.plan.groups[0].partitions)
            ids = [np.asarray(keys["id"]) for _, _, keys in loader]
        means = [float(k.mean()) for k in ids]
        rho = float(np.corrcoef(np.arange(len(means)), np.argsort(np.argsort(means)))[0, 1])
        blocks = [len(np.unique(k * 20 // args.rows)) for k in ids[:-1]]
        print(
            f"seed {seed}: {pieces} partitions, {len(ids)} batches, rho {rho:+.3f}, "
            f"blocks per batch median {np.median(blocks):.0f} min {min(blocks)}"
        )


if __name__ == "__main__":
    main()
