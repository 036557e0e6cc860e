"""Lightning training over ddbloader, as a user writes it (tests/test_frameworks.py); not a test module.

``python3 tests/lightning_run.py DB OUT MODE DEVICES`` trains a tiny model for three epochs with
``Trainer(accelerator="cpu", devices=DEVICES)`` (``strategy="ddp"`` for 2), the loader built before
``fit()`` starts the process group and passed straight to it. MODE: ``loader`` (a DDBDataLoader),
``workers`` / ``persistent`` (a DataLoader with 2 workers over a DDBIterableDataset, persistent or
not). Each rank writes ``OUT/rank<r>.json``: per epoch, the ``rid`` keys of the samples it trained
on, in order, and the batch count Lightning planned. No set_epoch call anywhere: Lightning makes none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset

SQL = "SELECT gid, part, pos, rid, f0, y FROM series ORDER BY gid, part, pos"
ARGS: dict[str, Any] = {
    "batch_size": 8,
    "shuffle": True,
    "window_size": 3,
    "input_col": ["f0"],
    "group_col": "gid",
    "key_col": "rid",
    # seed=None: the ranks agree on rank 0's seed when the first epoch starts
}


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y, keys = batch
        self.seen.setdefault(self.current_epoch, []).extend(int(k) for k in keys["rid"].tolist())
        return torch.nn.functional.mse_loss(self.layer(x[:, :, 0] / 1e6), y[:, 0, :] / 1e6)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(db: str, out: Path, mode: str, devices: int) -> None:
    if mode == "loader":
        train: Any = DDBDataLoader(db, SQL, "y", **ARGS)
    else:
        # a worker process cannot broadcast a seed: with workers under DDP every rank gives one
        data = DDBIterableDataset(db, SQL, "y", num_workers=2, **{**ARGS, "seed": 5})
        train = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=mode == "persistent")
    model = Tiny()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train)
    report = {"seen": model.seen, "planned": trainer.num_training_batches}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
