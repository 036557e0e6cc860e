"""One epoch's iteration: its batches assembled from work units, served to a single consumer."""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from .._core.config import LoaderConfig
from .._core.display import readable_in_notebooks
from .._core.engine import Backend
from .._epoch.schedule import BatchSchedule
from .._epoch.shard import WorkUnit
from .._epoch.units import fetch_units
from .._io.cache import PartitionCache
from .._io.fetch import Fetcher
from .._io.retry import RetryPolicy
from .._sql.plan import QueryPlan
from .arena import Arena
from .device import DeviceStage, Staged
from .pool import GroupPool
from .prefetch import Prefetcher

__all__ = ["Delivered", "EpochIterator", "EpochRun", "EpochSource"]

_log = logging.getLogger("ddbloader")


class EpochRecorder(Protocol):
    """What an epoch reports its throughput to (``ddbloader.stats.StatsRecorder``); thread-safe."""

    def fetched(self, partitions: int, rows: int, queries: int, seconds: float) -> None: ...

    def delivered(self, samples: int, nbytes: int, waited: float, queue_depth: int) -> None: ...

    def finish(self) -> None: ...

    @property
    def started(self) -> float:
        """When the epoch's clock started (``time.perf_counter()``)."""
        ...


#: What an iteration yields: ``(x, y)``, or ``(x, y, keys)`` with ``key_col`` (a
#: :data:`~ddbloader.keys.Keys` dict); typed loosely so that ``for x, y in loader`` type-checks.
Delivered = tuple[Any, ...]


class EpochBatches:
    """The batches of one epoch's work units, assembled in the calling (assembler) thread.

    The pool executes the epoch's :class:`~ddbloader._epoch.schedule.BatchSchedule`; a resume
    skips its first ``skip`` batches (see :meth:`~ddbloader._pipeline.pool.GroupPool.batches`).
    Its fetch threads stop in ``close()``, never on a failure: the driver reports the failure
    first and closes after, so a slow join (a fetch stuck in the engine) cannot delay the error
    past the consumer's own timeout and replace it with a vaguer one.
    """

    def __init__(self, run: EpochRun, backend: Backend, stop: threading.Event) -> None:
        config = run.config
        # an epoch served from the cache alone fetches nothing: no units to cut
        cached = run.cache is not None and run.cache.holds(run.plan.partitions)
        self._fetcher = Fetcher(
            backend,
            run.plan,
            config.fetch_threads,
            run.recorder.fetched,
            retry=RetryPolicy(config.retries, config.retry_backoff),
            units=()
            if cached
            else fetch_units(
                run.plan,
                run.units,
                config,
                run.epoch,
                config.fetch_bytes,
                lists=bool(getattr(backend, "binds_lists", False)),
            ),
        )
        self._batches = self._assemble(run, stop)

    def _assemble(self, run: EpochRun, stop: threading.Event) -> Iterator[Staged]:
        plan, config = run.plan, run.config
        pool = GroupPool(
            BatchSchedule(run.units, plan.geometry, config, run.epoch, run.batches),
            self._fetcher if run.cache is None else run.cache.around(self._fetcher),
            stop,
            arena=run.arena,
        )
        for pieces in pool.batches(run.skip):
            yield run.stage.assemble(pieces, plan.geometry, plan.layout)
        if run.arena is not None:
            # every batch is gathered: the next epoch may write its segments there
            run.shelve(run.arena)

    def __iter__(self) -> EpochBatches:
        return self

    def __next__(self) -> Staged:
        return next(self._batches)

    def close(self) -> None:
        self._fetcher.close()


@dataclass(frozen=True)
class EpochRun:
    """What one iteration serves: the units of this (rank, worker), its batch count, the resume skip."""

    plan: QueryPlan
    config: LoaderConfig
    epoch: int
    units: tuple[WorkUnit, ...]
    batches: int
    skip: int
    recorder: EpochRecorder
    stage: DeviceStage
    arena: Arena | None
    shelve: Callable[[Arena], None]
    cache: PartitionCache | None
    #: batches assembled ahead in a thread; 0 assembles them in the consumer's thread
    prefetch: int


class EpochSource(Protocol):
    """Where an :class:`EpochIterator` gets its epoch from (the loader): asked at its first step."""

    def pending(self) -> tuple[int, int]:
        """``(epoch, batches)`` the iteration would serve if its first step came now."""
        ...

    def claim(self) -> tuple[EpochRun, Backend]:
        """Start the epoch: what to serve and from where. Called once, by the first step."""
        ...

    def report(self, progress: tuple[int, int, bool]) -> None:
        """``(epoch, batches yielded, ended)`` after every batch and at the end."""
        ...

    def check(self) -> None:
        """Raise if the epoch can no longer be served as claimed (the world size changed)."""
        ...


class EpochIterator:
    """One pass over the plan. Single consumer; ``close()`` (or GC) stops its threads.

    The epoch is claimed by the first step, not by ``iter()``: an iterator that never steps (a
    progress-bar wrapper, a framework's probe) starts no threads and uses up no epoch. Holds its
    ``source`` (which holds the loader), so ``for batch in DDBDataLoader(...)`` does not free (and
    close) the loader, and reports its position to it after every batch (for ``state_dict``).

    Invariant: once the epoch has ended, every step raises StopIteration; once the iteration was
    stopped before that (superseded by a new one, closed, or failed), every step raises
    RuntimeError saying why, so a training loop never ends early as if the epoch were done.
    """

    def __init__(self, source: EpochSource) -> None:
        self._source = source
        self._run: EpochRun | None = None
        self.yielded = 0
        self._started = time.perf_counter()
        self._owner = threading.current_thread()
        self._stepping = threading.Lock()
        self._finished = False
        self._stopped_because: str | None = None
        self._prefetcher: Prefetcher[Staged] | None = None
        self._close: Callable[[], Any] = _nothing

    @property
    def epoch(self) -> int:
        """The epoch this iteration serves (before its first step: the one it would claim now)."""
        return self._run.epoch if self._run is not None else self._source.pending()[0]

    def start(self) -> None:
        """Claim the epoch now, before the first step (for a resumed epoch with nothing left)."""
        if self._prefetcher is None:
            self._begin()

    def _begin(self) -> Prefetcher[Staged]:
        run, backend = self._source.claim()
        self._run, self.yielded, self._started = run, run.skip, time.perf_counter()
        prefetcher: Prefetcher[Staged] = Prefetcher(
            functools.partial(EpochBatches, run, backend),
            depth=run.prefetch,
            name="ddbloader-assemble",
            timeout=2 * run.config.timeout,
        )
        self._prefetcher = prefetcher
        self._close = weakref.finalize(self, prefetcher.close)
        return prefetcher

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        if self._run is None:
            return self._source.pending()[1]
        return self._run.batches - self.yielded

    @property
    def host_to_device_bytes(self) -> int:
        """Bytes enqueued for copy to the device so far this epoch (0 when delivering on the CPU)."""
        return 0 if self._run is None else self._run.stage.bytes_to_device

    def owner_elsewhere(self) -> threading.Thread | None:
        """The other, still running thread that started this unfinished iteration, if any."""
        if self._finished or self._stopped_because is not None:
            return None
        owner = self._owner
        return owner if owner is not threading.current_thread() and owner.is_alive() else None

    def __next__(self) -> Delivered:
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError(
                "two threads are stepping the same DDBDataLoader iterator at once; "
                "a loader serves one consumer thread: give each thread its own loader"
            )
        try:
            return self._step()
        finally:
            self._stepping.release()

    def _step(self) -> Delivered:
        if self._stopped_because is not None:
            raise RuntimeError(self._stopped_because)
        if self._finished:
            raise StopIteration
        waiting = time.perf_counter()
        if self._prefetcher is None:
            prefetcher = self._begin()
        else:
            self._source.check()
            prefetcher = self._prefetcher
        run = self._run
        assert run is not None  # set by _begin
        # the first step claimed the epoch before its clock started: its wait counts from the clock
        waiting = max(waiting, run.recorder.started)
        ready = prefetcher.ready()
        try:
            batch = run.stage.deliver(next(prefetcher))
        except StopIteration:
            if self._stopped_because is not None:  # stopped from another thread during this step
                raise RuntimeError(self._stopped_because) from None
            if not self._finished:
                self._finished = True
                elapsed = time.perf_counter() - self._started
                _log.info("epoch %d done: %d batches in %.2f s", run.epoch, self.yielded, elapsed)
                self._source.report((run.epoch, self.yielded, True))
                run.recorder.finish()
                self._close()
            raise
        except BaseException as error:
            if self._stopped_because is not None:
                raise RuntimeError(self._stopped_because) from error
            self.stop(
                f"this DDBDataLoader iteration failed earlier ({type(error).__name__}); "
                f"start a new one with iter(loader)"
            )
            readable_in_notebooks(error)
            raise
        self.yielded += 1
        self._source.report((run.epoch, self.yielded, False))
        x, y = batch[0], batch[1]
        run.recorder.delivered(x.shape[0], x.nbytes + y.nbytes, time.perf_counter() - waiting, ready)
        return batch

    def stop(self, reason: str) -> None:
        """Stop the threads; unless the epoch had ended, every later step raises RuntimeError(reason).

        Safe to call from any thread, during a step too: that step raises the RuntimeError.
        """
        if not self._finished and self._stopped_because is None:
            self._stopped_because = reason
        self._close()

    def close(self) -> None:
        """Stop this iteration and its threads; a later step raises RuntimeError."""
        self.stop("this DDBDataLoader iteration was closed (iterator.close())")


def _nothing() -> None:
    """Closing an iteration that never started: no threads to stop."""
