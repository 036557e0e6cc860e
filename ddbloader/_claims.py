"""Claiming epochs: the bookkeeping by which a loader's iterations take, report and give back epochs.

An iteration (:class:`Iteration`, one ``iter(loader)``) claims the next epoch at its first batch:
the claim fixes the epoch's work units for this (rank, worker) under the world size of that
moment (an elastic resume's remainder, or the epoch's own), the batches to skip, and where it
started; every step reports its progress, so a state saved at any point names where the epoch
stands. An iteration abandoned after its first batch only (a peek) gives its epoch back. Ranks
read rank 0's PostgreSQL snapshot, agree on the seed and check that they share one plan; under
``replan="epoch"`` an iteration (or ``len()`` between epochs) that starts a new epoch plans it
anew first.
:class:`EpochClaims` is a base of :class:`~ddbloader.DDBDataLoader`, which sets the attributes
declared there; one consumer thread claims at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch.utils.data import get_worker_info

from ._core.config import LoaderConfig
from ._core.errors import warn_caller
from ._diagnostics.mixing import MixingWatch
from ._epoch.elastic import Stretch, epoch_remainder
from ._epoch.shard import (
    Sharding,
    agree_ranks,
    distributed_world_size,
    epoch_units,
    part_range,
    refuse_a_rank_without_a_process_group,
    shard_samples,
    share_units,
)
from ._epoch.state import Resume
from ._io.cache import PartitionCache
from ._pipeline.arena import Arena, arena_for
from ._pipeline.batch import batch_count
from ._pipeline.device import DeviceStage
from ._pipeline.epoch import EpochRun
from ._resources import REPLAN_IN_WORKER
from ._sql.plan import QueryPlan, WorkUnit
from ._sql.plan_fingerprint import plan_fingerprint
from .backends import Backend
from .stats import StatsRecorder

__all__ = ["EpochClaims", "Iteration"]

_log = logging.getLogger("ddbloader")


class EpochClaims:
    """The epoch-claim bookkeeping of :class:`~ddbloader.DDBDataLoader` (see the module docstring).

    It holds no state of its own: the loader sets the attributes declared here.
    """

    plan: QueryPlan
    config: LoaderConfig
    _epoch: int
    _resume: Resume | None
    _running: Resume | None
    _left: tuple[tuple[int, int, tuple[Stretch, ...]], list[WorkUnit]] | None
    _progress: tuple[int, int, bool] | None
    _recorder: StatsRecorder | None
    _mixing: MixingWatch
    _closed: bool
    _arena: Arena | None
    _cache: PartitionCache | None
    _peek: tuple[int, int, Resume] | None
    _fixed_sharding: Sharding | None
    _seed_given: bool
    _agreed_world: int
    #: ``replan="epoch"``; and whether the current plan has served an epoch
    _replans: bool
    _plan_served: bool
    _iterator: weakref.ref[Any] | None
    #: whether the latest claimed iteration has not yet ended
    _serving: bool
    sql: str

    if TYPE_CHECKING:  # the loader's own, used here

        @property
        def sharding(self) -> Sharding: ...
        def _backend_here(self) -> Backend: ...
        def _plan_now(self, backend: Backend, sql: str, progress: bool = False) -> None: ...
        def _follow_rank0(self, sharding: Sharding) -> bool: ...
        def _shelve(self, arena: Arena) -> None: ...

    def _agree(self, sharding: Sharding, again: bool = False) -> None:
        """Agree among ``sharding``'s ranks, once per world size (or ``again`` after a new plan):
        a rank that reads another PostgreSQL snapshot than rank 0 reads rank 0's and plans again
        (see :meth:`_follow_rank0`); then the ranks agree on the seed and check that they share
        one plan (collectives, in the main process). A DataLoader worker cannot talk to the other
        ranks: it serves only a plan its main process agreed on. Warns of an unordered query.

        Raises:
            RuntimeError: a rank's plan differs from rank 0's (see :func:`agree_ranks`), or a
                DataLoader worker's loader was never agreed under this world size.
        """
        world = sharding.world_size
        if world == 1 or (world == self._agreed_world and not again):
            return
        if get_worker_info() is not None:
            raise RuntimeError(
                f"this DataLoader worker serves rank {sharding.rank} of {world}, but its dataset was built "
                f"before init_process_group and has not been checked against rank 0's plan since (a "
                f"worker process cannot talk to the other ranks, and ranks that planned different data "
                f"lose or repeat samples silently): call len(dataset) or dataset.set_epoch(epoch) on every "
                f"rank before iterating the DataLoader (the main process checks then, a collective), or "
                f"build the dataset after init_process_group"
            )
        if self._follow_rank0(sharding):
            self._plan_anew()
        shuffled = self.config.shuffle and not self._seed_given
        content = sum(
            p.fingerprint.content for g in self.plan.groups for p in g.partitions if p.fingerprint is not None
        )
        shared = agree_ranks(self.config.seed, plan_fingerprint(self.plan), sharding, shuffled, content)
        if not self._seed_given:
            self.config = dataclasses.replace(self.config, seed=shared)
        if world == self._agreed_world:
            return
        self._agreed_world = world
        query = self.plan.query
        if query is not None and not query.is_ordered():
            warn_caller(
                f"world_size={world} splits groups between ranks, and the query has no "
                f"ORDER BY: a partition that two ranks both read may come back in another order on each, "
                f"losing or repeating rows across ranks; add an ORDER BY that orders the rows totally"
            )

    def _replan_if_due(self) -> None:
        """Under ``replan="epoch"``, before an iteration that starts a new epoch once the current
        plan has served one (not one that resumes a started epoch): plan again on a fresh
        snapshot where the backend pins one, rank 0's on every rank where the ranks can talk (a
        collective), and check that the ranks' plans agree.

        Raises:
            ValueError: in a DataLoader worker process (see :func:`replans`).
            RuntimeError: a rank's new plan differs from rank 0's (see :func:`agree_ranks`).
        """
        if not self._replans or not self._plan_served or (self._resume is not None and self._resume.started):
            return
        if get_worker_info() is not None:
            raise ValueError(REPLAN_IN_WORKER)
        backend, sharding = self._backend_here(), self.sharding
        fresh = getattr(backend, "fresh_snapshot", None)
        if fresh is not None and getattr(backend, "snapshot", None) is not None:
            fresh()
            self._follow_rank0(sharding)
        self._plan_anew()
        self._plan_served = False
        self._agree(sharding, again=True)
        _log.info("epoch %d planned anew: %d samples", self._epoch, self.plan.samples)

    def _replan_before_len(self) -> None:
        """Under ``replan="epoch"``, plan the next epoch at ``len()`` too, so that ``len()`` before
        ``iter()`` counts the batches that epoch yields (Lightning asks before each epoch) — unless
        an iteration of the current plan is still running (neither ended nor dropped): a new
        snapshot would change the rows under it, so ``len()`` counts the next epoch on the
        current plan, and ``iter()`` plans it."""
        running = self._iterator() if self._iterator is not None else None
        if running is None or not self._serving:
            self._replan_if_due()

    def _plan_anew(self) -> None:
        """Plan the query again on what this process's backend reads now."""
        self._plan_now(self._backend_here(), self.sql)
        self._left = None
        self._mixing = MixingWatch(self.plan, self.config)

    def _pending(self, worker: int, num_workers: int) -> tuple[int, int]:
        """``(epoch, batches)`` an iteration of this worker would serve if it started now."""
        sharding = self.sharding
        stretches, skip = self._next_run(sharding, worker, num_workers)
        if stretches:
            share = sum(u.samples for u in self._units(self._epoch, stretches, sharding, worker, num_workers))
        else:
            samples = shard_samples(self.plan.samples, sharding.world_size, sharding.even_batches)
            share = len(part_range(samples, num_workers, worker))
        batches = batch_count(share, self.config.batch_size, self.config.drop_last)
        return self._epoch, batches - min(skip, batches)

    def _next_batches(self, num_workers: int) -> int:
        """The batches the next iteration yields on this rank, summed over ``num_workers`` workers:
        a whole epoch's, or the rest of a resumed one, as each worker's claim would count them (a
        worker whose place a single other worker's state cannot tell is counted whole).

        Raises:
            ValueError: a single worker's state under another world or worker count (as the
                iteration would: see :meth:`~ddbloader._epoch.state.Resume.continued_by`).
        """
        sharding = self.sharding
        total = 0
        for worker in range(num_workers):
            try:
                total += self._pending(worker, num_workers)[1]
            except ValueError:
                resume = self._resume
                place = (sharding.world_size, sharding.even_batches, num_workers)
                if resume is None or (resume.world_size, resume.even_batches, resume.num_workers) != place:
                    raise
                samples = shard_samples(self.plan.samples, sharding.world_size, sharding.even_batches)
                share = len(part_range(samples, num_workers, worker))
                total += batch_count(share, self.config.batch_size, self.config.drop_last)
        return total

    def _next_run(self, sharding: Sharding, worker: int, num_workers: int) -> tuple[tuple[Stretch, ...], int]:
        """The stretches of the next epoch served before it and the batches of its own schedule to
        skip (see :meth:`~ddbloader._epoch.state.Resume.continued_by`); none for an ordinary epoch."""
        if self._resume is None:
            return (), 0
        return self._resume.continued_by(sharding.world_size, sharding.even_batches, worker, num_workers)

    def _remainder(self, epoch: int, stretches: tuple[Stretch, ...]) -> list[WorkUnit]:
        """What ``stretches`` left of ``epoch`` (kept for the epoch's iterations and ``len``)."""
        key = (epoch, self.config.seed, stretches)
        if self._left is None or self._left[0] != key:
            self._left = (key, epoch_remainder(self.plan, self.config, epoch, stretches))
        return self._left[1]

    def _units(
        self, epoch: int, stretches: tuple[Stretch, ...], sharding: Sharding, worker: int, num_workers: int
    ) -> list[WorkUnit]:
        """The work units of this (rank, worker) in ``epoch``, after ``stretches`` of it."""
        if stretches:
            return share_units(
                self._remainder(epoch, stretches),
                sharding.rank,
                sharding.world_size,
                worker,
                num_workers,
                sharding.even_batches,
            )
        return epoch_units(
            self.plan,
            self.config,
            epoch,
            sharding.rank,
            sharding.world_size,
            worker,
            num_workers,
            sharding.even_batches,
        )

    def _claim(self, iteration: Iteration) -> tuple[EpochRun, Backend]:
        """Start the next epoch for ``iteration`` (its first step)."""
        if self._closed:
            raise RuntimeError("this DDBDataLoader is closed")
        in_worker = get_worker_info() is not None
        if in_worker and self._replans:
            raise ValueError(REPLAN_IN_WORKER)
        if in_worker and self.config.device.type != "cpu":
            raise ValueError(
                f"device={str(self.config.device)!r} in a DataLoader worker process: a worker cannot "
                f"deliver batches on a device; keep device='cpu' and move each batch in the training loop "
                f"(give the DataLoader pin_memory=True), or serve the loader with num_workers=0"
            )
        sharding = self.sharding
        if self._fixed_sharding is None:
            refuse_a_rank_without_a_process_group()
        self._agree(sharding)
        epoch, config = self._epoch, self.config
        stretches, saved = self._next_run(sharding, iteration.worker, iteration.num_workers)
        units = tuple(self._units(epoch, stretches, sharding, iteration.worker, iteration.num_workers))
        batches = batch_count(sum(u.samples for u in units), config.batch_size, config.drop_last)
        skip = min(saved, batches)
        self._recorder = StatsRecorder(epoch, self._mixing.epoch(units, epoch, batches))
        # A worker never pins: torch sends its batches to the main process through shared memory,
        # where the pinning is lost (DataLoader(pin_memory=True) pins there), and workers forked
        # from a process that used CUDA inherit its pinned host allocator and hand out the same
        # pinned memory in every worker, each writing over another's batches.
        pin = config.pin_memory and not in_worker
        stage = DeviceStage(config.device, pin, config.window_on_device, config.collate)
        # an arena is taken by one epoch at a time and shelved when its last batch is gathered
        arena, self._arena = (
            (None, self._arena)
            if stage.gathers_on_device
            else (arena_for(self.plan, config, self._arena), None)
        )
        # An epoch served from the cache to the CPU waits for no fetch and no copy: an assembler
        # thread would only add a hand-over per batch (two thread wake-ups, tens of µs, about
        # what the gather of a batch costs), so the consumer's thread assembles its batches.
        from_memory = self._cache is not None and self._cache.holds(self.plan.partitions)
        prefetch = 0 if from_memory and stage.device.type == "cpu" else config.prefetch_batch
        run = EpochRun(
            self.plan,
            config,
            epoch,
            units,
            batches,
            skip,
            self._recorder,
            stage,
            arena,
            self._shelve,
            self._cache,
            prefetch,
        )
        backend = self._backend_here()
        _log.info(
            "epoch %d: %d groups, %d partitions, %d samples, %d batches%s",
            epoch,
            len(self.plan.groups),
            self.plan.partitions,
            self.plan.samples,
            batches,
            (f" (resuming after batch {skip})" if skip else "")
            + (f" (the rest after {len(stretches)} stretch(es) under other worlds)" if stretches else ""),
        )
        self._epoch, self._plan_served, self._serving = epoch + 1, True, True
        self._resume = None
        self._running = Resume(
            stretches,
            sharding.world_size,
            sharding.even_batches,
            iteration.num_workers,
            iteration.worker,
            0,
            None,
        )
        self._progress = (epoch, skip, False)
        iteration.started(epoch, skip, sharding.world_size, self._running)
        return run, backend

    def _report(self, token: int, skip: int, progress: tuple[int, int, bool], place: Resume) -> None:
        self._progress = progress
        epoch, yielded, ended = progress
        self._serving = not ended
        self._peek = (token, epoch, place.at(skip)) if yielded == skip + 1 and not ended else None

    def _give_back(self, token: int | None) -> None:
        """Return the epoch of an iteration abandoned after its first batch (``None``: any such one)."""
        peek = self._peek
        if peek is None or (token is not None and peek[0] != token):
            return
        self._peek = None
        _, self._epoch, self._resume = peek
        self._progress = None

    def _check_world(self, world: int) -> None:
        if self._fixed_sharding is None and (now := distributed_world_size()) != world:
            raise ValueError(
                f"the world size changed from {world} to {now} during an epoch: the "
                f"epoch was split for {world} ranks; finish the epoch before changing the process group"
            )


class Iteration:
    """One ``iter(loader)``: the :class:`~ddbloader._pipeline.epoch.EpochSource` of its iterator."""

    def __init__(
        self,
        loader: EpochClaims,
        token: int,
        worker: int,
        num_workers: int,
        claimed: Callable[[int], None] | None,
    ) -> None:
        self.loader, self.token, self.worker, self.num_workers = loader, token, worker, num_workers
        self._claimed = claimed
        self._skip = 0
        self._world = 1
        self._place: Resume | None = None

    def pending(self) -> tuple[int, int]:
        return self.loader._pending(self.worker, self.num_workers)

    def claim(self) -> tuple[EpochRun, Backend]:
        return self.loader._claim(self)

    def started(self, epoch: int, skip: int, world: int, place: Resume) -> None:
        self._skip, self._world, self._place = skip, world, place
        if self._claimed is not None:
            self._claimed(epoch)

    def report(self, progress: tuple[int, int, bool]) -> None:
        assert self._place is not None
        self.loader._report(self.token, self._skip, progress, self._place)

    def check(self) -> None:
        self.loader._check_world(self._world)
