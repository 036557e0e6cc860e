"""DDBIterableDataset: the loader as a torch IterableDataset, for DataLoader worker processes."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._epoch.state import merge_worker_states
from ._pipeline.epoch import Delivered, EpochIterator
from .loader import _NO_SOURCE, DDBDataLoader

__all__ = ["DDBIterableDataset"]

#: worker slots of the shared epoch counters (a DataLoader rarely has more than a few dozen)
_MAX_WORKERS = 256


class DDBIterableDataset(IterableDataset[Delivered]):
    """``DDBDataLoader``'s arguments, served through ``torch.utils.data.DataLoader``.

    Use ``DataLoader(dataset, batch_size=None, num_workers=N)``: batching happens here. Each
    worker serves a disjoint, contiguous share of this rank's samples and opens its own
    connection from ``source``, which must then be a database path, a URI or a factory (a
    connection object cannot cross processes). The set of samples of an epoch is the same for
    every ``num_workers``. Give the DataLoader's worker count as ``num_workers=`` here too: each
    worker cuts its own share into batches, so ``len()`` (:meth:`batches` of that count) then
    equals the batches an epoch delivers, and a DataLoader with another count is refused.
    Without it, ``len()`` counts the batches of one worker.

    Workers iterate copies of the dataset; they count epochs in memory shared with this process
    (one slot per worker id), so successive epochs differ without :meth:`set_epoch` calls, with or
    without persistent workers; ``set_epoch(e)`` here pins the next epoch every worker starts.
    ``state_dict``/``load_state_dict``
    follow torchdata's ``Stateful`` protocol, so ``StatefulDataLoader`` resumes it per worker;
    give an explicit ``seed`` then, since a resumed state reaches only the workers' copies and the
    epochs after it are built from this one. torchdata refuses its state under another
    ``num_workers``: load :meth:`merge_worker_states` of it into a new dataset instead, whose
    workers then split the rest of the epoch (an elastic resume, see ``DDBDataLoader``).
    """

    def __init__(
        self,
        source: Any = _NO_SOURCE,
        sql: str = "",
        target_col: Any = None,
        *args: Any,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        if num_workers is not None and (
            isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0
        ):
            raise ValueError(f"num_workers must be an int >= 0 (the DataLoader's), got {num_workers!r}")
        self.num_workers = num_workers
        self.loader = DDBDataLoader(source, sql, target_col, *args, **kwargs)
        # shared memory: a forked or spawned worker writes the slot this process's copy reads
        self._worker_epochs = torch.zeros(_MAX_WORKERS, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def __iter__(self) -> EpochIterator:
        info = get_worker_info()
        workers = 0 if info is None else info.num_workers
        if self.num_workers is not None and workers != self.num_workers:
            raise ValueError(
                f"DDBIterableDataset(num_workers={self.num_workers}) is served by a DataLoader with "
                f"num_workers={workers}: give both the same count, so that len() is the batches delivered"
            )
        if info is None:
            return self.loader.iterate()
        if info.num_workers > _MAX_WORKERS:
            raise ValueError(f"DDBIterableDataset serves at most {_MAX_WORKERS} DataLoader workers")
        slot = info.id
        self.loader.set_epoch(int(self._worker_epochs[slot]))
        return self.loader.iterate(slot, info.num_workers, functools.partial(self._claimed, slot))

    def _claimed(self, slot: int, epoch: int) -> None:
        self._worker_epochs[slot] = epoch + 1

    def __len__(self) -> int:
        """Batches per epoch under a DataLoader with this dataset's ``num_workers`` (default 1)."""
        return self.batches(self.num_workers or 1)

    def batches(self, num_workers: int) -> int:
        """Batches per epoch on this rank when served by ``num_workers`` workers (0 counts as 1)."""
        return self.loader.batches(max(num_workers, 1))

    def set_epoch(self, epoch: int) -> None:
        """Pin the next epoch that starts, here and in every worker (also persistent ones)."""
        self.loader.set_epoch(epoch)
        self._worker_epochs.fill_(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state, except that an ended iteration still names its own epoch.

        StatefulDataLoader snapshots a worker after its share ran out and restores that snapshot
        while the other workers finish the epoch, and after a finished epoch it starts the next
        one itself: a state naming the next epoch would make it serve that epoch too early.
        """
        return self.loader._state(ended_names_next=False)

    merge_worker_states = staticmethod(merge_worker_states)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)
        info = get_worker_info()
        if info is None:
            self._worker_epochs.fill_(self.loader.epoch)
        else:
            self._worker_epochs[info.id] = self.loader.epoch

    def close(self) -> None:
        self.loader.close()

    def __repr__(self) -> str:
        return f"DDBIterableDataset({self.loader!r})"
