"""A reusable check that a DDBDataLoader resumes exactly from ``state_dict()``.

Tests import it: ``assert_resumes_exactly(lambda: DDBDataLoader(...))``. ``make_loader`` must build
a fresh loader with the same arguments every time; ``seed=None`` is fine, since every loader here
first loads the reference's initial state, which carries the seed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ddbloader import DDBDataLoader

Batch = tuple[torch.Tensor, torch.Tensor]
MakeLoader = Callable[[], DDBDataLoader]

STATE_KEYS = {
    "version",
    "epoch",
    "batches",
    "seed",
    "samples",
    "world_size",
    "rank",
    "batch_size",
    "shuffle",
    "drop_last",
    "even_batches",
    "group_pool_size",
    "partitions",
    "plan",
    "worker",
    "num_workers",
    "resumed",
}


def json_roundtrip(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` after a trip through JSON text, as a checkpoint file would hold it."""
    return dict(json.loads(json.dumps(state)))


def assert_small_state(state: Mapping[str, Any]) -> None:
    """The state is a dict of scalars (and the short list of an epoch's earlier stretches, each a
    world's ``[world_size, even_batches, [batches per worker]]``): O(1) in the data size and
    JSON-serialisable."""
    assert set(state) == STATE_KEYS, sorted(state)
    scalars = {k: v for k, v in state.items() if k != "resumed"}
    assert all(isinstance(v, (int, str, bool)) for v in scalars.values()), state
    assert all(len(stretch) == 3 for stretch in state["resumed"]), state
    assert len(json.dumps(scalars)) < 360
    assert json_roundtrip(state) == dict(state)


def assert_same_batches(got: Sequence[Batch], want: Sequence[Batch], what: str) -> None:
    """Bitwise equality of two batch sequences (shapes, dtypes and values)."""
    assert len(got) == len(want), f"{what}: {len(got)} batches, expected {len(want)}"
    for index, ((gx, gy), (wx, wy)) in enumerate(zip(got, want, strict=True)):
        same = (
            gx.dtype == wx.dtype
            and gy.dtype == wy.dtype
            and gx.shape == wx.shape
            and gy.shape == wy.shape
            and torch.equal(gx, wx)
            and torch.equal(gy, wy)
        )
        assert same, f"{what}: batch {index} differs"


def _resumed(make_loader: MakeLoader, state: Mapping[str, Any]) -> DDBDataLoader:
    loader = make_loader()
    loader.load_state_dict(json_roundtrip(state))
    return loader


def _cut(
    loader: DDBDataLoader, reference: Sequence[Sequence[Batch]], epoch: int, start: int, stop: int
) -> dict[str, Any]:
    """Take batches ``[start, stop)`` of ``epoch`` from a new iteration; return the state there."""
    iterator = iter(loader)
    assert iterator.epoch == epoch
    assert len(iterator) == len(reference[epoch]) - start
    taken = [next(iterator) for _ in range(stop - start)]
    assert_same_batches(taken, reference[epoch][start:stop], f"epoch {epoch} batches {start}..{stop}")
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (epoch, stop), state
    assert_small_state(state)
    iterator.close()
    return state


def _assert_rest(
    make_loader: MakeLoader, state: Mapping[str, Any], reference: Sequence[Sequence[Batch]], where: str
) -> None:
    """A fresh loader given ``state`` serves the rest of its epoch, then every later epoch."""
    epoch, done = state["epoch"], state["batches"]
    with _resumed(make_loader, state) as loader:
        assert loader.state_dict() == dict(state), "a loaded state must read back unchanged"
        assert_same_batches(list(loader), reference[epoch][done:], f"{where}: rest of epoch {epoch}")
        for later in range(epoch + 1, len(reference)):
            assert_same_batches(list(loader), reference[later], f"{where}: epoch {later}")


def assert_resumes_exactly(make_loader: MakeLoader, epochs: int = 2, *, every_cut: bool = True) -> None:
    """Cut an epoch anywhere, resume in a fresh loader: the batches continue bitwise unchanged.

    Cuts after the first, the middle and the last batch of epoch 0, in the middle of epoch 1 and
    between the epochs (after the iteration ended); then resumes twice in a row. Without
    ``every_cut``, only the cut in the middle of epoch 0: where a source's queries, not the
    loader's counting, are what is checked. Every state goes through JSON. Needs at least one
    batch per epoch.
    """
    with make_loader() as first:
        origin = first.state_dict()
        assert (origin["epoch"], origin["batches"]) == (0, 0)
        reference = [list(first) for _ in range(epochs)]
        after_all = first.state_dict()
    assert (after_all["epoch"], after_all["batches"]) == (epochs, 0), "a finished epoch names the next"
    assert all(reference), "the check needs at least one batch per epoch"
    batches = len(reference[0])

    if not every_cut:
        with _resumed(make_loader, origin) as loader:
            state = _cut(loader, reference, 0, 0, max(1, batches // 2))
        _assert_rest(make_loader, state, reference, f"cut after batch {state['batches']} of epoch 0")
        return
    cuts = sorted({(0, 1), (0, max(1, batches // 2)), (0, batches)})
    if epochs > 1:
        cuts.append((1, max(1, len(reference[1]) // 2)))
    for epoch, done in cuts:
        with _resumed(make_loader, origin) as loader:
            for earlier in range(epoch):
                assert_same_batches(list(loader), reference[earlier], f"epoch {earlier} before the cut")
            state = _cut(loader, reference, epoch, 0, done)
        _assert_rest(make_loader, state, reference, f"cut after batch {done} of epoch {epoch}")

    if epochs > 1:
        with _resumed(make_loader, origin) as loader:
            list(loader)
            between = loader.state_dict()
        assert (between["epoch"], between["batches"]) == (1, 0)
        _assert_rest(make_loader, between, reference, "cut between epochs 0 and 1")

    # Resume, cut again, resume again: the counts add up across resumes.
    if batches >= 3:
        middle, later = batches // 3, 2 * batches // 3
        with _resumed(make_loader, origin) as loader:
            state = _cut(loader, reference, 0, 0, middle)
        with _resumed(make_loader, state) as loader:
            state = _cut(loader, reference, 0, middle, later)
        _assert_rest(make_loader, state, reference, f"second resume after batch {later}")


def assert_state_counts_handed_out(loader: DDBDataLoader, taken: int) -> None:
    """After ``taken`` batches, with the assembler free to run ahead, the state still says ``taken``.

    Give ``loader`` a ``prefetch_batch`` larger than its epoch; the check waits until every
    partition has been fetched (the assembler is then far ahead of the consumer).
    """
    iterator = iter(loader)
    for _ in range(taken):
        next(iterator)
    deadline = time.monotonic() + 10.0
    while loader.stats().partitions_fetched < loader.plan.partitions and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, taken), state
    iterator.close()
