"""One rank of the elastic torchrun test (tests/test_elastic.py); not a test module itself.

``python3 -m torch.distributed.run --nproc_per_node=N tests/elastic_worker.py SOURCE OUT save K``
has every rank hand out ``K`` batches of epoch 0 (an ``all_reduce`` per step, as training does)
and rank 0 write its state to ``OUT/state.json``; ``... OUT resume`` has every rank load that
state and serve the rest of the epoch, then epoch 1. Each rank writes ``OUT/<mode>-rank<r>.json``:
the keys (``rid`` at each sample's first y row) of every batch, ``len(loader)`` and the seed.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddbloader import DDBDataLoader

SERIES_SQL = "SELECT gid, part, pos, rid, f0, f1, y FROM series ORDER BY gid, part, pos"

#: seed=None: the ranks agree on rank 0's seed, and the state carries it to the new world.
ARGS: dict[str, Any] = {
    "batch_size": 4,
    "shuffle": True,
    "seed": None,
    "window_size": 3,
    "input_col": ["f0", "f1"],
    "group_col": "gid",
    "repartition_col": "part",
    "key_col": "rid",
}


def step() -> None:
    """One training step's collective: a rank out of batches would leave the others waiting."""
    done = torch.ones(1)
    dist.all_reduce(done)
    assert done.item() == dist.get_world_size()


def main(source: str, out: str, mode: str, count: int) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    report: dict[str, Any] = {"rank": rank, "world_size": dist.get_world_size()}
    with DDBDataLoader(source, SERIES_SQL, "y", **ARGS) as loader:
        if mode == "save":
            batches = iter(loader)
            report["keys"] = []
            for _ in range(count):
                report["keys"].append(next(batches)[2]["rid"].tolist())
                step()
            if rank == 0:
                Path(out, "state.json").write_text(json.dumps(loader.state_dict()))
        else:
            loader.load_state_dict(json.loads(Path(out, "state.json").read_text()))
            report["len"] = len(loader)
            report["keys"] = []
            for _, _, keys in loader:
                report["keys"].append(keys["rid"].tolist())
                step()
            report["next"] = [keys["rid"].tolist() for _, _, keys in loader]
        report["seed"] = loader.config.seed
    dist.barrier()
    Path(out, f"{mode}-rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0)
