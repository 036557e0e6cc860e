"""DDBIterableDataset under torch's DataLoader workers and torchdata's StatefulDataLoader.

Workers reopen the source, so the table lives in a DuckDB file. A sample is named by the rid of
its first x row (``x[:, 0, 0]``; rids are unique across groups), so multisets of sample names
show lost and duplicated samples alike.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Any

import duckdb
import pytest
import torch
from conftest import SERIES_SQL
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import ddbloader.dataset
from ddbloader import DDBDataLoader, DDBIterableDataset

pytestmark = [
    pytest.mark.timeout(90),
    # Three workers on a two-core machine is what this test wants, not a mistake.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),  # inside torchdata
]

ARGS: dict[str, Any] = {
    "batch_size": 13,
    "shuffle": True,
    "seed": 3,
    "window_size": 3,
    "input_col": ["f0"],
    "group_col": "gid",
    "repartition_col": "part",
}

Batch = tuple[torch.Tensor, torch.Tensor]


def dataset(source: Any, **overrides: Any) -> DDBIterableDataset:
    return DDBIterableDataset(source, SERIES_SQL, "y", **{**ARGS, **overrides})


def names(batches: Iterable[Batch]) -> list[list[int]]:
    """Per batch, the names of its samples, in order."""
    return [[int(v) for v in x[:, 0, 0].tolist()] for x, _ in batches]


def flat(batches: list[list[int]]) -> Counter[int]:
    return Counter(v for batch in batches for v in batch)


@pytest.fixture
def every_sample(db_path: str) -> Counter[int]:
    """The epoch's samples as one in-process loader serves them (each exactly once)."""
    with DDBDataLoader(db_path, SERIES_SQL, "y", **ARGS) as loader:
        everything = flat(names(loader))
        assert sum(everything.values()) == loader.plan.samples == 79
    assert set(everything.values()) == {1}
    return everything


@pytest.mark.parametrize(
    "num_workers", [0, *(pytest.param(n, marks=pytest.mark.multiprocess) for n in (1, 2, 3))]
)
def test_any_worker_count_serves_every_sample_once(
    db_path: str, every_sample: Counter[int], num_workers: int
) -> None:
    data = dataset(db_path)
    batches = names(DataLoader(data, batch_size=None, num_workers=num_workers))
    assert flat(batches) == every_sample
    assert len(batches) == data.batches(num_workers)
    assert all(0 < len(b) <= ARGS["batch_size"] for b in batches)


@pytest.mark.multiprocess
def test_len_with_the_worker_count_is_the_batches_delivered_without_torchs_warning(
    db_path: str, every_sample: Counter[int]
) -> None:
    data = dataset(db_path, num_workers=3, batch_size=10)
    assert len(data) == data.batches(3) > data.batches(1)  # three partial last batches
    loader = DataLoader(data, batch_size=None, num_workers=3)
    assert len(loader) == len(data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        served = names(loader)
    assert len(served) == len(data)
    assert flat(served) == every_sample
    assert not [w for w in caught if "Length of IterableDataset" in str(w.message)]


def test_a_dataloader_with_another_worker_count_is_refused(db_path: str) -> None:
    data = dataset(db_path, num_workers=2)
    with pytest.raises(ValueError, match=r"num_workers=2\) is served by a DataLoader with num_workers=0"):
        next(iter(DataLoader(data, batch_size=None, num_workers=0)))
    with pytest.raises(ValueError, match="num_workers must be an int >= 0"):
        dataset(db_path, num_workers=-1)


@pytest.mark.multiprocess
def test_set_epoch_reaches_the_workers(db_path: str, every_sample: Counter[int]) -> None:
    data = dataset(db_path)
    loader = DataLoader(data, batch_size=None, num_workers=2)
    data.set_epoch(0)
    first = names(loader)
    data.set_epoch(1)
    second = names(loader)
    data.set_epoch(0)
    again = names(loader)
    assert flat(second) == flat(first) == every_sample
    assert second != first, "epoch 1 must be shuffled differently"
    assert again == first, "the same epoch must come out the same"


@pytest.mark.multiprocess
def test_persistent_workers_count_epochs_themselves(db_path: str, every_sample: Counter[int]) -> None:
    data = dataset(db_path)
    loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
    first, second = names(loader), names(loader)
    assert flat(first) == flat(second) == every_sample
    assert second != first, "the workers' copies moved on to epoch 1"
    data.set_epoch(1)
    assert names(DataLoader(data, batch_size=None, num_workers=2)) == second


@pytest.mark.multiprocess
def test_spawned_workers_reopen_the_path(db_path: str, every_sample: Counter[int]) -> None:
    """Under spawn (and forkserver, the default from Python 3.14) the dataset is pickled.

    One worker: a spawned process imports torch afresh, which is slow on a busy machine.
    """
    data = dataset(db_path, batch_size=40)
    loader = DataLoader(data, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    assert flat(names(loader)) == every_sample


def _iterate_in_child(data: DDBIterableDataset, report: Any) -> None:
    try:
        next(iter(data))
        report.put("no error")
    except Exception as error:
        report.put(f"{type(error).__name__}: {error}")


@pytest.mark.multiprocess
def test_a_worker_refuses_to_deliver_batches_on_a_device(db_path: str) -> None:
    data = dataset(db_path, device="meta", num_workers=1)
    with pytest.raises(ValueError, match=r"device='meta' in a DataLoader worker process: .*device='cpu'"):
        next(iter(DataLoader(data, batch_size=None, num_workers=1)))


@pytest.mark.multiprocess
def test_a_connection_object_cannot_serve_workers(db_path: str) -> None:
    """The error names the fix, whether the worker is forked or the dataset pickled (spawn).

    The fork case runs in a plain forked process: torch's DataLoader takes 5 s to shut down a
    worker whose ``iter()`` raised (it waits for the worker out), which this suite cannot afford.
    """
    fix = "give source as a database path, a URI or a factory"
    with duckdb.connect(db_path, read_only=True) as con:
        data = dataset(con)
        assert len(names(DataLoader(data, batch_size=None, num_workers=0))) == data.batches(0)
        with pytest.raises(TypeError, match=fix), pytest.warns(UserWarning, match="pickle error"):
            list(DataLoader(data, batch_size=None, num_workers=1, multiprocessing_context="spawn"))
        fork = multiprocessing.get_context("fork")
        report = fork.Queue()
        child = fork.Process(target=_iterate_in_child, args=(data, report))
        child.start()
        message = report.get(timeout=30)
        child.join(timeout=30)
        assert message.startswith("RuntimeError: this loader's connection belongs to another process")
        assert fix in message
        data.close()


@pytest.mark.parametrize("num_workers", [1, 2, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 4, 13, 100])
def test_batches_counts_what_the_workers_yield(db_path: str, num_workers: int, batch_size: int) -> None:
    data = dataset(db_path, batch_size=batch_size, drop_last=batch_size == 4)
    per_worker = [len(list(data.loader.iterate(w, num_workers))) for w in range(num_workers)]
    assert sum(per_worker) == data.batches(num_workers)
    assert data.batches(1) == len(data)
    data.close()


def run_stateful(db_path: str, num_workers: int, cut: int | None, state: Any = None) -> tuple[Any, ...]:
    """Epochs 0 and 1 through a StatefulDataLoader, optionally stopping after ``cut`` batches.

    Returns (epoch 0 batches, epoch 1 batches) or, with ``cut``, (batches before it, state).
    """
    data = dataset(db_path)
    loader = StatefulDataLoader(data, batch_size=None, num_workers=num_workers)
    if state is not None:
        loader.load_state_dict(state)
    data.set_epoch(0)
    if cut is None:
        epoch0 = names(loader)
        data.set_epoch(1)
        return epoch0, names(loader)
    iterator = iter(loader)
    taken = names(next(iterator) for _ in range(cut))
    snapshot = pickle.loads(pickle.dumps(loader.state_dict()))
    del iterator
    return taken, snapshot


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_stateful_dataloader_resumes_mid_epoch(
    db_path: str, every_sample: Counter[int], num_workers: int
) -> None:
    epoch0, epoch1 = run_stateful(db_path, num_workers, None)
    assert flat(epoch0) == flat(epoch1) == every_sample
    # 39 + 40 samples in batches of 13: the workers serve 3 and 4 batches, so at the last cut
    # worker 0 has run out while worker 1 was still serving.
    for cut in sorted({1, len(epoch0) // 2, len(epoch0) - 1, len(epoch0)}):
        taken, state = run_stateful(db_path, num_workers, cut)
        assert taken == epoch0[:cut]
        rest, following = run_stateful(db_path, num_workers, None, state)
        assert rest == epoch0[cut:], f"cut after {cut}"
        assert following == epoch1, f"the epoch after a cut after {cut}"


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_stateful_dataloader_resumes_after_a_finished_epoch(db_path: str, num_workers: int) -> None:
    """StatefulDataLoader starts the next epoch itself after a finished one: it must be epoch 1."""
    _, epoch1 = run_stateful(db_path, num_workers, None)
    data = dataset(db_path)
    loader = StatefulDataLoader(data, batch_size=None, num_workers=num_workers)
    data.set_epoch(0)
    names(loader)
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    data = dataset(db_path)
    resumed = StatefulDataLoader(data, batch_size=None, num_workers=num_workers)
    resumed.load_state_dict(state)
    data.set_epoch(1)
    assert names(resumed) == epoch1


@pytest.mark.multiprocess
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_epochs_differ_without_set_epoch(
    db_path: str, every_sample: Counter[int], persistent: bool
) -> None:
    """Workers count epochs in memory shared with the main process: no set_epoch needed."""
    data = dataset(db_path)
    reference = []
    for epoch in range(3):
        data.set_epoch(epoch)
        reference.append(names(DataLoader(data, batch_size=None, num_workers=2)))
    data.set_epoch(0)
    loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=persistent)
    epochs = [names(loader) for _ in range(3)]
    assert epochs == reference
    assert len({str(e) for e in epochs}) == 3, "each epoch has its own order"
    assert all(flat(e) == every_sample for e in epochs)
    data.set_epoch(1)
    assert names(loader) == reference[1], "set_epoch reaches the workers, persistent ones too"
    data.close()


def _set_epoch_warnings_are_errors(_: int) -> None:
    warnings.filterwarnings("error", message="set_epoch")


def test_epochs_after_a_resume_under_workers_are_whole_and_warn_nothing(
    db_path: str, every_sample: Counter[int]
) -> None:
    """Workers are copies of the dataset made before each epoch, holding the loaded position: once
    the resumed epoch is served, the next must not warn that set_epoch drops it (nothing is dropped,
    and the advice, set_epoch of the loaded epoch, would serve its rest again)."""
    with DDBDataLoader(db_path, SERIES_SQL, "y", **ARGS) as single:
        iterator = iter(single)
        taken = names(next(iterator) for _ in range(2))
        state = single.state_dict()
    data = dataset(db_path, num_workers=2)
    data.load_state_dict(state)
    loader = DataLoader(data, batch_size=None, num_workers=2, worker_init_fn=_set_epoch_warnings_are_errors)
    rest = names(loader)
    assert flat(taken) + flat(rest) == every_sample
    for _ in range(2):
        assert flat(names(loader)) == every_sample


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_dataloader_that_would_batch_the_batches_again_is_refused(db_path: str, num_workers: int) -> None:
    data = dataset(db_path)
    # Workers from a fork server: this test's subject is the refusal, and a worker forked from the
    # test process could inherit an engine lock held by a thread of an earlier test's abandoned
    # iterator (a DataLoader worker segfaulted here now and then when the whole suite ran).
    context = {"multiprocessing_context": "forkserver"} if num_workers else {}
    for options in ({}, {"batch_size": 4}):
        with pytest.raises(
            ValueError, match=r"default_collate would stack .* DataLoader\(dataset, batch_size=None\)"
        ):
            next(iter(DataLoader(data, num_workers=num_workers, **context, **options)))
    # a collate_fn of the user's takes the list of batches itself (HF Trainer's data collator)
    x, _ = next(iter(DataLoader(data, batch_size=1, num_workers=num_workers, collate_fn=_first, **context)))
    assert x.shape == (13, 3, 1)
    x, _ = next(iter(DataLoader(data, batch_size=None, num_workers=num_workers, **context)))
    assert x.shape == (13, 3, 1)


def _first(batches: list[Any]) -> Any:
    return batches[0]


def _fork_warnings_are_errors(_: int) -> None:
    warnings.filterwarnings("error", message="this DataLoader worker was forked")


def test_a_worker_forked_while_another_loader_iterates_is_warned(db_path: str) -> None:
    """A forked worker inherits the locks the parent's fetch threads held (an engine's): it is
    told which threads ran and how to avoid it, before it touches an engine."""
    rows = duckdb.connect()
    rows.execute("CREATE TABLE t AS SELECT range AS id, range * 0.5 AS y FROM range(200000)")
    # 50,000 batches: the iteration's threads wait on its bounded buffers until it is closed
    with DDBDataLoader(rows, "SELECT id, y FROM t ORDER BY id", "y", batch_size=4) as other:
        running = iter(other)
        next(running)
        assert any(t.name.startswith("ddbloader-") for t in threading.enumerate())
        forked = DataLoader(
            dataset(db_path),
            batch_size=None,
            num_workers=1,
            multiprocessing_context="fork",
            worker_init_fn=_fork_warnings_are_errors,
        )
        with pytest.raises(RuntimeWarning, match=r"forked while \d+ ddbloader threads .*forkserver"):
            next(iter(forked))
        running.close()
    # Closed: no loader thread is left to be inherited, so a fork records none. The child only reads
    # what the fork hook recorded and leaves by os._exit: a worker that read an engine here could
    # crash on the locks of the engine's own threads (DuckDB's, which this warning does not cover;
    # a forked worker segfaulted so in CI).
    assert not any(t.name.startswith("ddbloader-") for t in threading.enumerate())
    child = os.fork()
    if child == 0:
        os._exit(len(ddbloader.dataset._threads_at_fork))
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
