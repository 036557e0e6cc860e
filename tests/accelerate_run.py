"""Accelerate training over ddbloader (tests/test_frameworks.py); not a test module.

``python3 -m torch.distributed.run --nproc_per_node=2 tests/accelerate_run.py DB OUT`` builds the
loaders before ``Accelerator()`` starts the process group and trains three epochs, without
set_epoch calls, through ``accelerator.prepare`` of:

- ``loader``: a DDBDataLoader (it comes back as it is: it shards itself);
- ``dataset``: a torch DataLoader over a DDBIterableDataset (``batch_size=None``), which Accelerate
  wraps in its DataLoaderDispatcher: the main process reads, every process gets its share.

Each rank writes ``OUT/<case>-rank<r>.json``: per epoch, the ``rid`` keys it trained on, and
``len()`` of the prepared loader; and ``OUT/collated-rank<r>.json``: one epoch's x windows of a
dataset with string keys whose ``collate_fn`` leaves them out. Then it records, in
``OUT/refusals-rank<r>.json``, the errors of what the dispatcher would lose or cannot carry:
string keys, DataLoader workers, a DataLoader ``drop_last``, ``split_batches`` with a batch size
that is not a multiple of 2, and ``dispatch_batches=False``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from lightning_run import ARGS, SQL
from torch.utils.data import DataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset


def train(accelerator: Accelerator, loader: Any) -> dict[str, Any]:
    model = torch.nn.Linear(3, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimiser, prepared = accelerator.prepare(model, optimiser, loader)
    seen: dict[int, list[int]] = {}
    for epoch in range(3):
        for x, y, keys in prepared:
            seen.setdefault(epoch, []).extend(int(k) for k in keys["rid"].tolist())
            loss = torch.nn.functional.mse_loss(model(x[:, :, 0] / 1e6), y[:, 0, :] / 1e6)
            accelerator.backward(loss)
            optimiser.step()
            optimiser.zero_grad()
    return {"seen": seen, "planned": len(prepared), "same": prepared is loader}


def one_batch(batches: list[Any]) -> Any:
    return batches[0]  # a DataLoader with batch_size=1 (as HF Trainer builds it) over ddbloader's batches


def without_keys(batch: Any) -> Any:
    x, y, _ = batch
    return x, y


def refusal(accelerator: Accelerator, dataset: DDBIterableDataset, **options: Any) -> str:
    options = {"batch_size": None, **options}
    prepared = accelerator.prepare(DataLoader(dataset, **options))
    try:
        next(iter(prepared))
    except ValueError as error:
        return str(error)
    return "not refused"


def main(db: str, out: Path) -> None:
    loader = DDBDataLoader(db, SQL, "y", **ARGS)
    dataset = DDBIterableDataset(db, SQL, "y", **ARGS)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    for case, data in (("loader", loader), ("dataset", DataLoader(dataset, batch_size=None))):
        (out / f"{case}-rank{rank}.json").write_text(json.dumps(train(accelerator, data)))

    string_keys = SQL.replace("rid,", "CAST(rid AS VARCHAR) AS rid,")
    # a collate_fn that leaves the string keys out: they never reach the dispatcher
    collated = accelerator.prepare(
        DataLoader(DDBIterableDataset(db, string_keys, "y", **ARGS), batch_size=None, collate_fn=without_keys)
    )
    windows = [x[:, :, 0].tolist() for x, _ in collated]
    (out / f"collated-rank{rank}.json").write_text(json.dumps(windows))
    refusals = {
        "strings": refusal(accelerator, DDBIterableDataset(db, string_keys, "y", **ARGS)),
        "workers": refusal(
            accelerator, DDBIterableDataset(db, SQL, "y", num_workers=2, **ARGS), num_workers=2
        ),
    }
    refusals["drop_last"] = refusal(
        accelerator,
        DDBIterableDataset(db, SQL, "y", **ARGS),
        batch_size=1,
        drop_last=True,
        collate_fn=one_batch,
    )
    accelerator.dataloader_config = DataLoaderConfiguration(split_batches=True)
    refusals["split"] = refusal(
        accelerator,
        DDBIterableDataset(db, SQL, "y", **{**ARGS, "batch_size": 7}),
        batch_size=1,
        collate_fn=one_batch,
    )
    accelerator.dataloader_config = DataLoaderConfiguration(dispatch_batches=False)
    refusals["no dispatch"] = refusal(accelerator, DDBIterableDataset(db, SQL, "y", **ARGS))
    (out / f"refusals-rank{rank}.json").write_text(json.dumps(refusals))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
