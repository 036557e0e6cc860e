"""One rank of the torchrun test (tests/test_distributed.py); not a test module itself.

Run as ``python3 -m torch.distributed.run --nproc_per_node=2 tests/ddp_worker.py SOURCE OUT``, where
SOURCE is a DuckDB file or a Spark Connect URI (``sc://...``) holding the ``series`` table. Each rank
reads its rank and world size from torch.distributed (gloo, CPU), then writes ``OUT/rank<r>.json``:
for three loaders the sample names of every batch (the rid of each sample's first x row), the
loader's ``len`` and seed; and the steps, losses and final weights of a tiny DDP model trained for
one epoch on the first loader, with an ``all_reduce`` every step (a rank that ran out of batches
would leave the other waiting in it until the gloo timeout).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddbloader import DDBDataLoader

SERIES_SQL = "SELECT gid, part, pos, rid, f0, f1, y FROM series ORDER BY gid, part, pos"

COMMON: dict[str, Any] = {
    "window_size": 3,
    "input_col": ["f0"],
    "group_col": "gid",
    "repartition_col": "part",
    "prefetch_batch": 2,
}
LOADERS: dict[str, dict[str, Any]] = {
    # seed=None: the ranks must agree on rank 0's seed, or their shards would overlap.
    "shuffled_pad": {"batch_size": 6, "shuffle": True, "seed": None, "even_batches": "pad"},
    "ordered_pad": {"batch_size": 7, "shuffle": False, "even_batches": "pad"},
    "shuffled_drop": {"batch_size": 5, "shuffle": True, "seed": 11, "even_batches": "drop"},
}


def sample_names(x: torch.Tensor) -> list[int]:
    return [int(v) for v in x[:, 0, 0].tolist()]


def train_one_epoch(loader: DDBDataLoader) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, losses = 0, []
    for x, y in loader:
        # rids are up to ~2e6: scale them so one SGD step stays finite.
        inputs, target = x[:, :, 0] / 1e6, y[:, 0, :] / 1e6
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        step = torch.ones(1)
        dist.all_reduce(step)
        assert step.item() == dist.get_world_size()
        steps += 1
        losses.append(loss.item())
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    return {"steps": steps, "losses": losses, "weights": weights}


def main(source: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    report: dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size(), "loaders": {}}
    for name, arguments in LOADERS.items():
        with DDBDataLoader(source, SERIES_SQL, "y", **COMMON, **arguments) as loader:
            entry: dict[str, Any] = {
                "len": len(loader),
                "seed": loader.config.seed,
                "sharding": [loader.sharding.rank, loader.sharding.world_size],
            }
            if name == "shuffled_pad":
                loader.set_epoch(1)
                entry["training"] = train_one_epoch(loader)
                loader.set_epoch(1)
            entry["batches"] = [sample_names(x) for x, _ in loader]
            report["loaders"][name] = entry
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
