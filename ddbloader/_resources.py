"""What a loader holds in its process: its backend and the plan made on it, its partition cache, its
arena, its running iteration.

A plan is made on what the backend reads (on PostgreSQL its snapshot; under DDP rank 0's, where
the ranks can talk), at construction, again where a rank finds at its first agreement that it
read another snapshot than rank 0 and, with ``replan="epoch"``, before each new epoch (see
:mod:`ddbloader._claims`).

A backend belongs to the process that opened it: a DataLoader worker process (a pickled copy of
the loader) opens its own from the source, which must therefore be one a process can open again
(a path, a URI or a factory, never a connection object); the copy holds no iteration, arena or
cached partitions of the original. :class:`LoaderResources` is a base of
:class:`~ddbloader.DDBDataLoader`, which sets the attributes declared there.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import weakref
from typing import TYPE_CHECKING, Any

from ._core.config import LoaderConfig
from ._core.errors import warn_caller
from ._epoch.schedule import pool_size
from ._epoch.shard import Sharding, from_rank0
from ._io.cache import PartitionCache
from ._pipeline.arena import Arena
from ._pipeline.epoch import EpochIterator
from ._sql.plan import QueryPlan
from ._sql.planner import build_plan
from .backends import Backend, connect

if TYPE_CHECKING:
    from ._modes import Handover

__all__ = ["REPLAN_IN_WORKER", "LoaderResources", "reopenable", "replans"]


class LoaderResources:
    """The process-bound holdings of :class:`~ddbloader.DDBDataLoader` (see the module docstring).

    It holds no state of its own: the loader sets the attributes declared here.
    """

    plan: QueryPlan
    config: LoaderConfig
    _source: Any
    _backend: Backend | None
    _backend_pid: int
    #: the snapshot the parent's backend reads, in a worker process started by pickling
    _pinned: str | None = None
    _cache: PartitionCache | None
    _arena: Arena | None
    _iterator: weakref.ref[EpochIterator] | None
    _handover: Handover
    #: ``group_pool_size`` as given (0: sized from each plan)
    _pool_given: int

    if TYPE_CHECKING:  # the loader's own, used here

        @property
        def sharding(self) -> Sharding: ...

    def _backend_here(self) -> Backend:
        """This process's backend: reopened from the source in a worker process."""
        if self._backend is None or self._backend_pid != os.getpid():
            if not reopenable(self._source):
                raise RuntimeError(
                    "this loader's connection belongs to another process; for DataLoader workers "
                    "give source as a database path, a URI or a factory that opens a connection"
                )
            # a worker reads the snapshot its parent pinned (see ddbloader.backends.postgres)
            pinned = getattr(self._backend, "snapshot", None) if self._backend is not None else self._pinned
            backend = connect(self._source)
            follow = getattr(backend, "follow", None)
            if pinned is not None and follow is not None:
                follow(pinned, hold=False)
            self._backend = backend
            self._backend_pid = os.getpid()
        return self._backend

    def _follow_rank0(self, sharding: Sharding) -> bool:
        """Read rank 0's PostgreSQL snapshot where this backend pins one and the ranks can talk
        (torch.distributed initialised with ``sharding``'s world size: a collective), so every
        rank plans and reads the same rows by construction. A rank whose own snapshot sees other
        rows than rank 0's (its ``xmin:xmax:xip`` differs) imports rank 0's into a holder of its
        own, so it outlives rank 0's loader; True when it did (a plan made before is stale)."""
        backend = self._backend
        follow = getattr(backend, "follow", None)
        visibility = getattr(backend, "visibility", None)
        if visibility is None or follow is None:
            return False
        snapshot, shared = from_rank0((getattr(backend, "snapshot", None), visibility), sharding)
        if shared == visibility:
            return False
        follow(snapshot)
        return True

    def _plan_now(self, backend: Backend, sql: str, progress: bool = False) -> None:
        """Plan ``sql`` on what ``backend`` reads now; the group pool is sized from this plan
        unless ``group_pool_size`` was given."""
        config = dataclasses.replace(self.config, group_pool_size=self._pool_given)
        self.plan = build_plan(backend, sql, config, progress=progress)
        self.config = dataclasses.replace(config, group_pool_size=pool_size(self.plan, config))
        self._handover.check(self.plan)

    def _partition_cache(self) -> PartitionCache | None:
        """A cache for the partitions when ``cache_bytes`` allows all of them, else None."""
        budget = self.config.cache_bytes
        if budget is None:
            return None
        planned = self.plan.rows * self.plan.layout.row_bytes
        if planned > budget:
            warn_caller(
                f"cache_bytes={budget:,} is less than the {planned:,} bytes of the planned partitions "
                f"({self.plan.rows:,} rows of {self.plan.layout.row_bytes} bytes): every epoch fetches them "
                f"again; raise cache_bytes to keep them in memory"
            )
            return None
        return PartitionCache()

    def _shelve(self, arena: Arena) -> None:
        self._arena = arena

    def __getstate__(self) -> dict[str, Any]:
        if not reopenable(self._source):
            raise TypeError(
                "a DDBDataLoader over a connection object cannot be sent to another process; "
                "give source as a database path, a URI or a factory that opens a connection"
            )
        state = self.__dict__.copy()
        state.update(_pinned=getattr(self._backend, "snapshot", None))
        state.update(_backend=None, _iterator=None, _recorder=None, _progress=None, _arena=None, _peek=None)
        state.update(_left=None)
        # a worker started by pickling (spawn) has no process group: it keeps this process's place
        state.update(_fixed_sharding=self.sharding, _tokens=itertools.count())
        # a worker process keeps the partitions it fetches itself
        state.update(_cache=None if self._cache is None else PartitionCache())
        return state

    def _stop_iterator(self, reason: str) -> None:
        previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.stop(reason)
        self._iterator = None


def reopenable(source: Any) -> bool:
    """True for sources a worker process can open again on its own."""
    if isinstance(source, (str, os.PathLike)):
        return str(source) != ":memory:"
    return callable(source) and not hasattr(source, "cursor")


REPLAN_IN_WORKER = (
    "replan='epoch' in a DataLoader worker process: each worker is a copy of the loader and "
    "cannot follow the snapshot and plan its parent takes at each epoch; serve the loader with "
    "num_workers=0 (it fetches in threads of its own), or use replan='never'"
)


def replans(replan: str, config: LoaderConfig) -> bool:
    """Whether ``replan`` asks for a new plan per epoch (``"epoch"``) or not (``"never"``).

    Raises:
        ValueError: another value, or ``"epoch"`` with ``cache_bytes`` (which serves later
            epochs from the first epoch's partitions).
    """
    if replan not in ("never", "epoch"):
        raise ValueError(f"replan must be 'never' or 'epoch', got {replan!r}")
    if replan == "epoch" and config.cache_bytes is not None:
        raise ValueError(
            f"replan='epoch' with cache_bytes={config.cache_bytes}: the cache serves later epochs "
            f"from the first epoch's rows, a new plan reads what is committed then; give one of them"
        )
    return replan == "epoch"
