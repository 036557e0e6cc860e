"""ddbloader inside the training frameworks users pass it to (Lightning, Accelerate, HF Trainer):
every sample once per epoch, new orders.

Each test runs a helper script in a fresh interpreter (the frameworks start their own processes)
over a DuckDB file, and checks by ``key_col`` what every rank trained on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import series_file

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: 80 windows of 3 rows (+3 target rows): even, so two ranks share them without padding
PARTS = [[10, 7, 12], [15, 6], [8, 9, 11, 11]]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(series_file(tmp_path / "series.duckdb", PARTS))


def every_key(db: str) -> Counter[int]:
    sys.path.insert(0, str(HERE))
    try:
        from lightning_run import ARGS, SQL
    finally:
        sys.path.remove(str(HERE))
    with DDBDataLoader(db, SQL, "y", **{**ARGS, "seed": 0}) as loader:
        keys = Counter(int(k) for _, _, batch_keys in loader for k in batch_keys["rid"].tolist())
    assert set(keys.values()) == {1} and sum(keys.values()) % 2 == 0
    return keys


def run(script: str, *args: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, str(HERE / script), *args]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def reports(out: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def check_epochs(found: list[dict[str, Any]], every: Counter[int], epochs: int = 3) -> None:
    """Every sample exactly once per epoch over all ranks; each epoch in its own order."""
    orders = []
    for epoch in range(epochs):
        per_rank = [r["seen"][str(epoch)] for r in found]
        assert Counter(k for keys in per_rank for k in keys) == every, f"epoch {epoch}"
        orders.append(per_rank)
    assert len({str(o) for o in orders}) == epochs, "every epoch has its own order"


@pytest.mark.parametrize("mode", ["loader", "workers"])
def test_lightning_ddp_shards_a_loader_built_before_the_process_group(
    db: str, tmp_path: Path, mode: str
) -> None:
    every = every_key(db)
    run("lightning_run.py", db, str(tmp_path), mode, "2", cwd=tmp_path)
    found = reports(tmp_path, 2)
    check_epochs(found, every)
    # 40 samples a rank: 5 batches of 8, or two workers' 20 samples as 8 + 8 + 4 each
    per_rank = 5 if mode == "loader" else 6
    assert [r["planned"] for r in found] == [per_rank] * 2, "len() follows the process group"


def test_lightning_with_persistent_workers_runs_new_epochs_without_set_epoch(db: str, tmp_path: Path) -> None:
    """(Non-persistent workers: the DDP test's ``workers`` case.)"""
    every = every_key(db)
    run("lightning_run.py", db, str(tmp_path), "persistent", "1", cwd=tmp_path)
    check_epochs(reports(tmp_path, 1), every)


def torchrun(script: str, *args: str, cwd: Path, processes: int = 2) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
    done = subprocess.run(
        [*command, str(HERE / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[int]]:
    """One torchrun launch of tests/accelerate_run.py (2 processes) for the Accelerate tests."""
    out = tmp_path_factory.mktemp("accelerate")
    db = str(series_file(out / "series.duckdb", PARTS))
    every = every_key(db)
    torchrun("accelerate_run.py", db, str(out), cwd=out)
    return out, every


def test_accelerate_prepare_of_a_ddbdataloader_shards_once(accelerate_run: tuple[Path, Counter[int]]) -> None:
    out, every = accelerate_run
    found = [json.loads((out / f"loader-rank{r}.json").read_text()) for r in range(2)]
    check_epochs(found, every)
    assert [r["planned"] for r in found] == [5, 5]
    assert all(r["same"] for r in found), "prepare() hands a DDBDataLoader back as it is"


def test_accelerate_dispatches_a_dataloader_over_the_dataset_without_losing_samples(
    accelerate_run: tuple[Path, Counter[int]],
) -> None:
    """The dispatcher's main process reads the whole epoch; each process trains on its half."""
    out, every = accelerate_run
    found = [json.loads((out / f"dataset-rank{r}.json").read_text()) for r in range(2)]
    check_epochs(found, every)
    assert [r["planned"] for r in found] == [5, 5], "len() counts the steps of each process"
    assert all(len(r["seen"][str(e)]) == 40 for r in found for e in range(3))


def test_accelerate_dispatches_string_keys_that_a_collate_fn_leaves_out(
    accelerate_run: tuple[Path, Counter[int]],
) -> None:
    out, every = accelerate_run
    ranks = [json.loads((out / f"collated-rank{r}.json").read_text()) for r in range(2)]
    # f0 = rid, and a window's y row follows its 3 x rows: its rid is the last x row's + 1
    found = Counter(int(window[-1]) + 1 for rank in ranks for batch in rank for window in batch)
    assert found == every


def test_accelerate_refuses_what_its_dispatcher_would_lose(accelerate_run: tuple[Path, Counter[int]]) -> None:
    out, _ = accelerate_run
    for rank in range(2):
        refusals = json.loads((out / f"refusals-rank{rank}.json").read_text())
        assert "key_col ['rid'] are delivered as lists" in refusals["strings"]
        assert "dense_rank()" in refusals["strings"]
        assert "use num_workers=0" in refusals["workers"]
        assert "IterableDatasetShard (dispatch_batches=False)" in refusals["no dispatch"]
        assert "give drop_last= to DDBIterableDataset" in refusals["drop_last"]
        assert "batch_size=7 is not a multiple of 2" in refusals["split"]


def test_hf_trainer_under_torchrun_trains_every_sample_once_per_epoch(db: str, tmp_path: Path) -> None:
    """Trainer's DataLoader, prepared by Accelerate, dispatches the dataset's batches (2 processes);
    Trainer's set_epoch calls give each epoch its own order. (One process: README's recipe.)"""
    every = every_key(db)
    torchrun("trainer_run.py", db, str(tmp_path), cwd=tmp_path)
    found = [json.loads((tmp_path / f"trainer-rank{r}.json").read_text()) for r in range(2)]
    check_epochs(found, every)
    assert [r["planned"] for r in found] == [5, 5], "Trainer plans each process's steps"
