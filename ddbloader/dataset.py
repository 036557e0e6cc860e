"""DDBIterableDataset: the loader as a torch IterableDataset, for DataLoader worker processes."""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, default_collate, default_convert, get_worker_info

from ._construction import NO_SOURCE, build_splits
from ._epoch.shard import Sharding
from ._epoch.state import merge_worker_states
from ._pipeline.epoch import Delivered
from ._resources import REPLAN_IN_WORKER
from .loader import DDBDataLoader

__all__ = ["DDBIterableDataset"]

#: worker slots of the shared epoch counters (a DataLoader rarely has more than a few dozen)
_MAX_WORKERS = 256

#: the loader's threads that ran in the parent when this process was forked from it (a forked
#: child has none of them, but inherits the locks they held: an engine's, the allocator's)
_threads_at_fork: list[str] = []


def _note_threads_at_fork() -> None:
    _threads_at_fork[:] = [t.name for t in threading.enumerate() if t.name.startswith("ddbloader-")]


os.register_at_fork(before=_note_threads_at_fork, after_in_parent=_threads_at_fork.clear)


def _warn_if_forked_from_threads() -> None:
    if _threads_at_fork:
        warnings.warn(
            f"this DataLoader worker was forked while {len(_threads_at_fork)} ddbloader threads ran in "
            f"the parent ({', '.join(sorted(set(_threads_at_fork)))}: another loader's iteration, not "
            f"finished or closed): the worker inherits the locks they held and may hang or crash in the "
            f"engine; close earlier iterations first, or give the DataLoader "
            f"multiprocessing_context='forkserver'",
            RuntimeWarning,
            stacklevel=3,
        )
        _threads_at_fork.clear()


class DDBIterableDataset(IterableDataset[Delivered]):
    """``DDBDataLoader``'s arguments, served through ``torch.utils.data.DataLoader``.

    Use ``DataLoader(dataset, batch_size=None, num_workers=N)``: batching happens here; a DataLoader
    that would batch again with torch's default collate (any other ``batch_size``, 1 by default) is
    refused at ``iter()``, naming ``batch_size=None``. Each
    worker serves a disjoint, contiguous share of this rank's samples and opens its own
    connection from ``source``, which must then be a database path, a URI or a factory (a
    connection object cannot cross processes). The set of samples of an epoch is the same for
    every ``num_workers``. Give the DataLoader's worker count as ``num_workers=`` here too: each
    worker cuts its own share into batches, so ``len()`` (:meth:`batches` of that count) then
    equals the batches an epoch delivers, and a DataLoader with another count is refused.
    Without it, ``len()`` counts the batches of one worker.

    Under DDP, a dataset built before ``init_process_group`` agrees with the other ranks (seed,
    plan; on PostgreSQL rank 0's snapshot) in the main process at its first ``len()`` or
    :meth:`set_epoch` after it, collectives to call on every rank (Lightning calls ``len()``):
    worker processes cannot talk to the other ranks, and a worker whose dataset has not agreed
    is refused, naming that fix.

    Workers deliver host batches, unpinned (give the DataLoader ``pin_memory=True`` to pin them
    in the main process); a ``device`` other than ``"cpu"`` is refused in a worker.

    Workers iterate copies of the dataset; they count epochs in memory shared with this process
    (one slot per worker id), so successive epochs differ without :meth:`set_epoch` calls, with or
    without persistent workers; ``set_epoch(e)`` here pins the next epoch every worker starts.
    ``state_dict``/``load_state_dict``
    follow torchdata's ``Stateful`` protocol, so ``StatefulDataLoader`` resumes it per worker;
    give an explicit ``seed`` then, since a resumed state reaches only the workers' copies and the
    epochs after it are built from this one. torchdata refuses its state under another
    ``num_workers``: load :meth:`merge_worker_states` of it into a new dataset instead, whose
    workers then split the rest of the epoch (an elastic resume, see ``DDBDataLoader``).

    Under ``accelerator.prepare`` (Accelerate, and so HF ``Trainer``), whose
    ``DataLoaderDispatcher`` reads batches in the main process only and splits each group of
    ``num_processes`` of them between the processes, the dataset notices the dispatcher when it
    calls ``len()``, ``set_epoch`` or ``iter()`` and serves it the whole epoch (rank 0 of 1) in the
    main process and nothing elsewhere, so every sample is dispatched once per epoch (Accelerate
    pads the last step with at most ``num_processes - 1`` repeats). What the dispatcher would
    lose or cannot carry is refused before the epoch starts: DataLoader workers with several
    processes, keys that are lists (strings) under torch's default ``collate_fn``,
    ``split_batches`` with a batch size that is not a multiple of the process count, a DataLoader
    ``drop_last``, and ``dispatch_batches=False`` (its ``IterableDatasetShard`` would shard what
    ddbloader already shards).
    """

    def __init__(
        self,
        source: Any = NO_SOURCE,
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
        if str(kwargs.get("mode", "pytorch")).lower() != "pytorch":
            raise ValueError(
                f"DDBIterableDataset feeds torch's DataLoader, which makes tensors of what it is given: "
                f"mode={kwargs['mode']!r} needs DDBDataLoader(..., mode={kwargs['mode']!r}) itself"
            )
        if num_workers and kwargs.get("replan") == "epoch":
            raise ValueError(f"DDBIterableDataset(num_workers={num_workers}) with {REPLAN_IN_WORKER}")
        self.loader = DDBDataLoader(source, sql, target_col, *args, **kwargs)
        # shared memory: a forked or spawned worker writes the slot this process's copy reads
        self._worker_epochs = torch.zeros(_MAX_WORKERS, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        #: under Accelerate's DataLoaderDispatcher: whether this is its main process (which reads)
        self._dispatched: bool | None = None

    def __iter__(self) -> Iterator[Delivered]:
        _refuse_batching_again(self)
        info = get_worker_info()
        if info is None and self._under_dispatcher() and not self._dispatched:
            return iter(())  # a dispatcher's other processes receive their batches from the main one
        workers = 0 if info is None else info.num_workers
        if self.num_workers is not None and workers != self.num_workers:
            raise ValueError(
                f"DDBIterableDataset(num_workers={self.num_workers}) is served by a DataLoader with "
                f"num_workers={workers}: give both the same count, so that len() is the batches delivered"
            )
        if info is None:
            return self.loader.iterate()
        _warn_if_forked_from_threads()
        if info.num_workers > _MAX_WORKERS:
            raise ValueError(f"DDBIterableDataset serves at most {_MAX_WORKERS} DataLoader workers")
        slot = info.id
        epoch = int(self._worker_epochs[slot])
        if self.loader._resume is not None and epoch > self.loader.epoch:
            # this copy was made before an earlier worker in this slot claimed the loaded epoch:
            # that position is served, not dropped (set_epoch would warn that it is)
            self.loader._resume = None
        self.loader.set_epoch(epoch)
        return self.loader.iterate(slot, info.num_workers, functools.partial(self._claimed, slot))

    def _claimed(self, slot: int, epoch: int) -> None:
        self._worker_epochs[slot] = epoch + 1

    def __len__(self) -> int:
        """The batches the next iteration yields under a DataLoader with this dataset's
        ``num_workers`` (default 1): a whole epoch, or the rest of a resumed one (see
        :meth:`DDBDataLoader.batches`).

        Under Accelerate's dispatcher: the whole epoch's (it yields them all in the main process
        and counts ``num_processes`` of them as one step).
        """
        self._agree_here()
        return self.batches(self.num_workers or 1)

    def batches(self, num_workers: int) -> int:
        """Batches per epoch on this rank when served by ``num_workers`` workers (0 counts as 1)."""
        return self.loader.batches(max(num_workers, 1))

    def set_epoch(self, epoch: int) -> None:
        """Pin the next epoch that starts, here and in every worker (also persistent ones)."""
        self._agree_here()
        self.loader.set_epoch(epoch)
        self._worker_epochs.fill_(epoch)

    def _agree_here(self) -> None:
        """In the main process: adapt to Accelerate's dispatcher, and agree with the other ranks
        now where the process group has appeared since construction (a collective, once: a rank
        that read another PostgreSQL snapshot than rank 0 reads rank 0's and plans again; the
        ranks check that they share one plan), so that DataLoader workers, which cannot talk to
        the other ranks, inherit a checked plan."""
        if get_worker_info() is None:
            self._under_dispatcher()
            self.loader._agree(self.loader.sharding)

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

    @classmethod
    def split(
        cls, *args: Any, split_col: str, at: Sequence[Any], gap: Any = None, **kwargs: Any
    ) -> tuple[DDBIterableDataset, ...]:
        """Train, validation, test (...) datasets of one query, as :meth:`DDBDataLoader.split`
        builds loaders (``args``: source, sql, target_col; ``shuffle`` only on the first)."""
        return build_splits(cls, args, split_col, at, gap, kwargs)

    def __repr__(self) -> str:
        return f"DDBIterableDataset({self.loader!r})"

    def _under_dispatcher(self) -> bool:
        """Whether Accelerate's DataLoaderDispatcher serves this dataset; adapt to it or refuse.

        Called from the dataset's entry points in the main process. The first call that finds the
        dispatcher checks what it would lose, then fixes the loader's place to rank 0 of 1 for
        good (a prepared DataLoader stays prepared): the main process reads the whole epoch.

        Raises:
            ValueError: ``dispatch_batches=False`` (Accelerate shards this dataset again), or a
                dispatcher setting under which samples would be lost or could not be carried.
        """
        if self._dispatched is not None:
            return True
        wrapper = _accelerate_wrapper(self)
        if wrapper is None:
            return False
        if wrapper.dataset is not self:
            raise ValueError(
                "accelerator.prepare wrapped this DDBIterableDataset in IterableDatasetShard "
                "(dispatch_batches=False), which would shard again the samples ddbloader already splits "
                "by rank, and lose them: keep Accelerate's default dispatch_batches (None or True), or "
                "pass a DDBDataLoader to accelerator.prepare (it comes back as it is)"
            )
        if not isinstance(wrapper, sys.modules["accelerate.data_loader"].DataLoaderDispatcher):
            return False  # one process, dispatch_batches=False: Accelerate only moves batches
        self._check_dispatch(wrapper)
        loader = self.loader
        loader._fixed_sharding = Sharding(0, 1, loader._even_batches)
        self._dispatched = wrapper.state.process_index == 0
        return True

    def _check_dispatch(self, dispatcher: Any) -> None:
        processes = int(dispatcher.state.num_processes)
        batch_size = self.loader.config.batch_size
        # a collate_fn of the user's may leave the keys out (HF Trainer's collator builds the
        # model's arguments); torch's default ones keep them
        listed = (
            _listed_keys(self.loader) if dispatcher.collate_fn in (default_convert, default_collate) else []
        )
        fix = "or pass a DDBDataLoader to accelerator.prepare (it comes back as it is and shards itself)"
        if listed:
            raise ValueError(
                f"key_col {listed} are delivered as lists (strings and other non-numeric values), which "
                f"Accelerate's DataLoaderDispatcher cannot concatenate or broadcast: give key_col numeric "
                f"or temporal columns (select an integer id, e.g. dense_rank() OVER (ORDER BY symbol)), "
                f"{fix}"
            )
        if processes > 1 and dispatcher.num_workers:
            raise ValueError(
                f"Accelerate's DataLoaderDispatcher reads every batch in the main process and splits "
                f"each {processes} batches between the {processes} processes; the final partial batches "
                f"of {dispatcher.num_workers} DataLoader workers would be split unevenly and lose "
                f"samples: use num_workers=0 (ddbloader fetches in background threads), {fix}"
            )
        if processes > 1 and dispatcher.split_batches and batch_size % processes:
            raise ValueError(
                f"split_batches=True splits every batch between {processes} processes: batch_size="
                f"{batch_size} is not a multiple of {processes}, so each batch would lose samples; "
                f"give a batch_size that is"
            )
        if processes > 1 and getattr(dispatcher, "_drop_last", False):
            raise ValueError(
                "the DataLoader's drop_last=True makes Accelerate's dispatcher drop the last step's "
                "batches of every epoch: leave the DataLoader's drop_last off and give drop_last= to "
                "DDBIterableDataset"
            )


def _refuse_batching_again(dataset: DDBIterableDataset) -> None:
    """Refuse a DataLoader that would batch this dataset's batches with torch's default collate.

    ``DataLoader(dataset)`` batches automatically (``batch_size=1`` by default): its fetcher, which
    calls ``iter()`` here in the main process or in a worker, would stack batches of
    ``batch_size`` samples into a tensor with an extra leading dimension. Refused rather than
    adapted: serving it single samples would silently change what the DataLoader's
    ``batch_size`` or ddbloader's means. A ``collate_fn`` of the user's (HF ``Trainer``'s) takes
    the list of batches itself and is left alone.

    Raises:
        ValueError: the calling fetcher batches automatically with ``default_collate``.
    """
    fetch = sys.modules.get("torch.utils.data._utils.fetch")
    frame: Any = sys._getframe(2)
    for _ in range(4):  # the fetcher calls iter(dataset) in its __init__
        if frame is None or fetch is None:
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, fetch._IterableDatasetFetcher) and owner.dataset is dataset:
            if owner.auto_collation and owner.collate_fn is default_collate:
                raise ValueError(
                    "DataLoader(DDBIterableDataset(...)) batches automatically (its batch_size is not "
                    "None; the default is 1), so torch's default_collate would stack ddbloader's batches "
                    "and add a leading dimension: the dataset batches itself (its batch_size=), so give "
                    "DataLoader(dataset, batch_size=None)"
                )
            return
        frame = frame.f_back


def _accelerate_wrapper(dataset: DDBIterableDataset) -> Any:
    """The Accelerate loader (DataLoaderDispatcher or DataLoaderShard) calling into ``dataset``.

    Accelerate gives a dataset no sign of the loader it wraps it in, but that loader calls
    ``len()``, ``set_epoch()`` and ``iter()`` on the dataset from its own methods: one of the
    frames above holds it as ``self``. None when Accelerate is not imported or no such frame is
    found.
    """
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    kinds = (module.DataLoaderDispatcher, module.DataLoaderShard)
    # the whole stack, not a few frames: a wrapper deeper than expected must not be missed (it
    # runs on iter(), len() and set_epoch only)
    frame: Any = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, kinds):
            inner = owner.dataset
            if inner is dataset or getattr(inner, "dataset", None) is dataset:
                return owner
        frame = frame.f_back
    return None


def _listed_keys(loader: DDBDataLoader) -> list[str]:
    """The ``key_col`` columns a batch carries as lists (see ddbloader.keys): all but numbers,
    booleans and temporal columns, and those read as Python values (decimals, nullable ints)."""
    layout = loader.plan.layout
    types = dict(zip(layout.result_names, layout.result_types, strict=True))
    tensors = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_temporal)
    return [
        name
        for name in layout.key_names
        if name in layout.key_objects or not any(kind(types[name]) for kind in tensors)
    ]
