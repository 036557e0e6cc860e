"""BatchSchedule: an epoch's batches as a pure, data-free function of (plan, seed, epoch, shard).

Which samples each batch holds, and when each partition is claimed from the fetchers, loaded,
dropped and released, depend only on the planned row counts, the window geometry, the loader's
configuration, the epoch and the (rank, worker)'s work units: never on data or thread timing.
:class:`BatchSchedule` computes them from those alone, so the epoch's order has one definition
that tests can check without an engine (exactly-once, shard disjointness, equal batch counts, the
memory bound) and that a resume can skip into.

The order it defines (the pool's, see :class:`~ddbloader._pipeline.pool.GroupPool`):

* Units enter a pool of ``group_pool_size`` slots in the given order. Without shuffle the pool
  serves them one after another; with shuffle sample ``k`` of a batch's draw goes to slot
  ``floor(u_k * active)`` (:class:`~ddbloader._epoch.shuffle.SourceDraws`), each slot serves its
  share in slot order, a unit that runs out hands its slot (and the rest of its share) to the next
  waiting unit, and once none waits the shares of closed slots are drawn again among the rest.
* A unit loads the partitions its samples touch in :func:`~ddbloader._epoch.units.partition_visits`
  order, keeping the first and last ``span - 1`` rows of each; a loaded partition's *step* holds
  the unit's samples that it completes (those whose rows are now all at hand), permuted by the
  next draw of :class:`~ddbloader._epoch.shuffle.SampleOrders` when it is loaded. A step is loaded
  when its unit is next asked for a sample after the one before it ran out.
* Fetches are queued within a budget of ``group_pool_size x prepartition_num`` partitions held
  (queued, in flight or being served), at most ``prepartition_num`` per unit: the active units'
  next partitions first, then the first ones of the next waiting unit.

Not thread-safe: one consumer iterates it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import WorkUnit
from .owed import keep_owed
from .shuffle import SampleOrders, SourceDraws
from .units import PartitionKey, partition_visits

__all__ = ["BatchSchedule", "Event", "EventKind", "ScheduledBatch"]


class EventKind(IntEnum):
    """What an :class:`Event` asks of the executor."""

    #: claim the partition from the fetchers (queue its fetch): it counts as held from now on
    FETCH = 1
    #: the partition's step becomes its unit's current one: its rows, with ``left`` kept rows of
    #: loaded neighbours before them and ``right`` after, hold the step's samples
    LOAD = 2
    #: the partition is no longer held (its step is done, or its unit ended before loading it)
    DROP = 3
    #: the unit ended: no partition of its group that it needed is asked for again (one event per
    #: partition; none for a group of one partition, whose one claim took its rows)
    RELEASE = 4


class Event(NamedTuple):
    """One partition event, ``at`` samples into its batch (before the sample of that number)."""

    kind: EventKind
    key: PartitionKey
    at: int
    left: int = 0
    right: int = 0


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One batch: sample ``j`` is sample ``samples[j]`` of group ``groups[j]`` (int64 arrays of the
    batch's length), and ``events`` are the partition events of its draw, in order (see
    :class:`Event`; those after its last sample are the top-up for the next batch)."""

    index: int
    groups: np.ndarray[Any, Any]
    samples: np.ndarray[Any, Any]
    events: tuple[Event, ...]


class _Recorder:
    """A batch being drawn: its samples by chunk, its events, and the partitions held."""

    def __init__(self) -> None:
        self.held = 0
        self.high_water = 0
        self.drawn = 0
        self.groups: list[np.ndarray[Any, Any]] = []
        self.samples: list[np.ndarray[Any, Any]] = []
        self.events: list[Event] = []

    def event(self, kind: EventKind, key: PartitionKey, left: int = 0, right: int = 0) -> None:
        if kind == EventKind.FETCH:
            self.held += 1
            self.high_water = max(self.high_water, self.held)
        elif kind == EventKind.DROP:
            self.held -= 1
        self.events.append(Event(kind, key, self.drawn, left, right))

    def draw(self, group: int, samples: np.ndarray[Any, Any]) -> None:
        self.groups.append(np.full(len(samples), group, np.int64))
        self.samples.append(samples)
        self.drawn += len(samples)

    def batch(self, index: int) -> ScheduledBatch:
        empty = np.empty(0, np.int64)
        batch = ScheduledBatch(
            index,
            np.concatenate(self.groups) if self.groups else empty,
            np.concatenate(self.samples) if self.samples else empty,
            tuple(self.events),
        )
        self.groups, self.samples, self.events, self.drawn = [], [], [], 0
        return batch


class _Unit:
    """One work unit's steps, from row counts alone (what a stream of the pool holds)."""

    def __init__(
        self, unit: WorkUnit, config: LoaderConfig, geometry: WindowGeometry, epoch: int, log: _Recorder
    ) -> None:
        group = unit.group
        self.group = group.index
        self.remaining = unit.samples
        self._unit = unit
        self._geometry = geometry
        self._prepartitions = config.prepartition_num
        self._log = log
        #: a group of one partition: one fetch, one step, nothing to release (its claim took it)
        self._single = len(group.partitions) == 1
        self._needed = partition_visits(unit, config, geometry, epoch)
        self._bounds = list(itertools.accumulate((p.rows for p in group.partitions), initial=0))
        self._to_submit: deque[int] = deque(self._needed)
        self._pending: deque[int] = deque()
        self._kept: dict[int, int] = {}
        self._step: int | None = None
        self._order: np.ndarray[Any, Any] = np.empty(0, np.int64)
        self._served = 0

    @property
    def held(self) -> int:
        return len(self._pending) + (self._step is not None)

    def top_up(self, room: int) -> None:
        """Queue up to ``room`` more fetches, never holding more than ``prepartition_num``."""
        if self._single:
            if room > 0 and self._to_submit:
                self._submit_next()
            return
        for _ in range(room):
            if self.held >= self._prepartitions or not self._to_submit:
                return
            self._submit_next()

    def _submit_next(self) -> None:
        if self._to_submit:
            position = self._to_submit.popleft()
            self._pending.append(position)
            self._log.event(EventKind.FETCH, (self.group, position))

    def take(self, count: int, orders: SampleOrders) -> None:
        """Draw the next ``count`` samples (``0 < count <= remaining``), loading steps as needed."""
        while count > 0:
            if self._step is None or self._served == len(self._order):
                self._advance(orders)
            given = min(count, len(self._order) - self._served)
            self._log.draw(self.group, self._order[self._served : self._served + given])
            self._served += given
            self.remaining -= given
            count -= given
        if self.remaining == 0:
            self._finish()

    def _advance(self, orders: SampleOrders) -> None:
        while True:
            if self._step is not None:
                self._log.event(EventKind.DROP, (self.group, self._step))
                self._step = None
                if not self._single:
                    self._submit_next()
            if not self._pending:
                self._submit_next()
            if not self._pending:
                raise RuntimeError(f"group {self.group} ran out of partitions with {self.remaining} owed")
            self._load(self._pending.popleft(), orders)
            if len(self._order):
                return

    def _load(self, position: int, orders: SampleOrders) -> None:
        first, stop = self._bounds[position], self._bounds[position + 1]
        unit = self._unit
        if self._single:
            left = right = 0
            samples = range(unit.first, unit.stop)
        else:
            edge = self._geometry.span - 1
            left = self._kept_rows(position, -1, edge)
            right = self._kept_rows(position, +1, edge)
            self._kept[position] = min(edge, stop - first)
            completed = self._geometry.samples_completed_by(
                first, stop, first - left, stop + right, unit.group.samples
            )
            samples = range(max(completed.start, unit.first), min(completed.stop, unit.stop))
        self._log.event(EventKind.LOAD, (self.group, position), left, right)
        self._step = position
        self._order = keep_owed(unit, orders.order(samples.start, samples.stop))
        self._served = 0

    def _kept_rows(self, position: int, direction: int, rows: int) -> int:
        """How many kept rows of the loaded neighbours on one side a step joins (up to ``rows``)."""
        joined = 0
        neighbour = position + direction
        while rows > joined and neighbour in self._kept:
            joined += min(rows - joined, self._kept[neighbour])
            neighbour += direction
        return joined

    def _finish(self) -> None:
        if self._step is not None:
            self._log.event(EventKind.DROP, (self.group, self._step))
            self._step = None
        for position in self._pending:
            self._log.event(EventKind.DROP, (self.group, position))
        self._pending.clear()
        self._to_submit.clear()
        if not self._single:
            for position in self._needed:
                self._log.event(EventKind.RELEASE, (self.group, position))


class BatchSchedule:
    """The batches of one (rank, worker)'s epoch: ``units`` in its group order (see
    :func:`~ddbloader._epoch.shard.epoch_units`), ``batches`` batches of ``batch_size`` samples
    (the last one shorter unless ``drop_last`` cut it).

    Iterating yields one :class:`ScheduledBatch` per batch; :attr:`high_water` is the most
    partitions held at once so far in the latest iteration (at most ``group_pool_size x
    prepartition_num``). A resume after ``k`` batches serves the items from ``k`` on.
    """

    def __init__(
        self,
        units: Sequence[WorkUnit],
        geometry: WindowGeometry,
        config: LoaderConfig,
        epoch: int,
        batches: int,
    ) -> None:
        self._units = units
        self._geometry = geometry
        self._config = config
        self._epoch = epoch
        self.batches = batches
        self._log = _Recorder()

    @property
    def high_water(self) -> int:
        return self._log.high_water

    def __iter__(self) -> Iterator[ScheduledBatch]:
        """The epoch's batches from the first (each iteration starts the epoch afresh)."""
        config = self._config
        log = self._log = _Recorder()
        pool, shuffle = config.group_pool_size, config.shuffle
        budget = pool * config.prepartition_num
        waiting = deque(u for u in self._units if u.samples > 0)
        active: list[_Unit] = []
        ahead: list[_Unit] = []
        draws = SourceDraws(config.seed, self._epoch, pool=pool)
        orders = SampleOrders(shuffle, config.seed, self._epoch)
        topped_up_at = -1

        def following() -> _Unit | None:
            if ahead:
                return ahead.pop()
            return _Unit(waiting.popleft(), config, self._geometry, self._epoch, log) if waiting else None

        def top_up() -> None:
            nonlocal topped_up_at
            for unit in active:
                unit.top_up(budget - log.held)
            room = budget - log.held
            if room > 0 and not ahead and waiting:
                ahead.append(_Unit(waiting.popleft(), config, self._geometry, self._epoch, log))
            if room > 0 and ahead:
                ahead[0].top_up(room)
            topped_up_at = log.held

        left = sum(u.samples for u in self._units)
        for index in range(self.batches):
            count = min(config.batch_size, left)
            left -= count
            while count > 0:
                if len(active) < pool:
                    while len(active) < pool and (unit := following()) is not None:
                        active.append(unit)
                    top_up()
                if not active:
                    raise RuntimeError(f"the epoch ran out of samples with {count} still owed")
                if not shuffle:
                    give = min(count, active[0].remaining)
                    active[0].take(give, orders)
                    count -= give
                    if active[0].remaining == 0:
                        del active[0]
                    continue
                for slot, share in enumerate(draws.counts(len(active), count).tolist()):
                    owed = share
                    while owed:
                        unit = active[slot]
                        give = min(owed, unit.remaining)
                        unit.take(give, orders)
                        count -= give
                        owed -= give
                        if unit.remaining == 0:
                            passed = following()
                            if passed is None:
                                break
                            active[slot] = passed
                active = [unit for unit in active if unit.remaining > 0]
            if log.held < budget and log.held != topped_up_at:
                top_up()
            yield log.batch(index)
