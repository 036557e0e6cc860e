"""Accelerate training over ddbloader (tests/test_frameworks.py); not a test module.

``python3 -m torch.distributed.run --nproc_per_node=2 tests/accelerate_run.py DB OUT`` builds the
loader before ``Accelerator()`` starts the process group, passes it through
``accelerator.prepare`` with the model and optimiser (a DDBDataLoader comes back as it is: it
shards itself) and trains three epochs without set_epoch calls. Each rank writes
``OUT/rank<r>.json``: per epoch, the ``rid`` keys it trained on, and ``len(loader)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from lightning_run import ARGS, SQL

from ddbloader import DDBDataLoader


def main(db: str, out: Path) -> None:
    loader = DDBDataLoader(db, SQL, "y", **ARGS)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1, dtype=torch.float64)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimiser, prepared = accelerator.prepare(model, optimiser, loader)
    assert prepared is loader
    seen: dict[int, list[int]] = {}
    for epoch in range(3):
        for x, y, keys in prepared:
            seen.setdefault(epoch, []).extend(int(k) for k in keys["rid"].tolist())
            loss = torch.nn.functional.mse_loss(model(x[:, :, 0] / 1e6), y[:, 0, :] / 1e6)
            accelerator.backward(loss)
            optimiser.step()
            optimiser.zero_grad()
    report = {"seen": seen, "planned": len(prepared)}
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
