"""HF Trainer training over ddbloader, as README's recipe writes it (tests/test_frameworks.py).

``python3 tests/trainer_run.py DB OUT`` (or under ``torch.distributed.run``) trains a tiny model
for three epochs with ``transformers.Trainer``, a ``DDBIterableDataset`` as ``train_dataset``:
``per_device_train_batch_size=1`` and a collator that unwraps the one ddbloader batch the
Trainer's DataLoader hands over. Each rank writes ``OUT/trainer-rank<r>.json``: per epoch, the
``rid`` keys it trained on, in order, and the steps Trainer planned per epoch. Not a test module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from lightning_run import ARGS, SQL
from transformers import Trainer, TrainerCallback, TrainingArguments

from ddbloader import DDBIterableDataset


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: list[list[int]] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor, rid: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen[-1].extend(int(k) for k in rid.tolist())
        return {"loss": torch.nn.functional.mse_loss(self.layer(x[:, :, 0] / 1e6), labels[:, 0, :] / 1e6)}


class Epochs(TrainerCallback):
    def __init__(self, model: Tiny) -> None:
        self.model = model

    def on_epoch_begin(self, *args: Any, **kwargs: Any) -> None:
        self.model.seen.append([])


def collate(items: list[Any]) -> dict[str, torch.Tensor]:
    (x, y, keys) = items[0]  # per_device_train_batch_size=1: one ddbloader batch
    return {"x": x, "labels": y, "rid": keys["rid"]}


def main(db: str, out: Path) -> None:
    # seed=None: the main process reads the whole epoch under Trainer's dispatcher
    dataset = DDBIterableDataset(db, SQL, "y", **ARGS)
    model = Tiny()
    arguments = TrainingArguments(
        str(out / "trainer"),
        per_device_train_batch_size=1,
        num_train_epochs=3,
        learning_rate=0.01,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model, arguments, train_dataset=dataset, data_collator=collate, callbacks=[Epochs(model)]
    )
    trainer.train()
    report = {
        "seen": {str(e): keys for e, keys in enumerate(model.seen)},
        "planned": len(trainer.get_train_dataloader()),
    }
    (out / f"trainer-rank{trainer.args.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
