"""Fetch units: several partitions fetched by one query, and the claims waiting for them.

The :class:`Coalescer` holds an epoch's fetch units as claims reach them: a partition of a unit is
served from its unit once; asked for again, or after a release, it is fetched alone by its own
subquery. The reader (:class:`~ddbloader._io.reader.ReadJob`) runs a unit's read and delivers its
partitions here, through the unit's :meth:`Coalescer.waiters`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .._epoch.visits import PartitionKey
from .._sql.partition import PartitionSpec, Read
from .block import Block
from .threads import Pending, ThreadFailure
from .unit_split import UnitPartitions

__all__ = ["Coalescer"]


@dataclass
class _UnitState:
    """Where one fetch unit stands: asked for or not, its waiting and its delivered partitions."""

    requested: bool = False
    waiters: dict[PartitionKey, Pending[Block]] = field(default_factory=dict)
    #: the delivered partitions, and where each delivered and unclaimed one is among them
    delivered: UnitPartitions | None = None
    ready: dict[PartitionKey, int] = field(default_factory=dict)
    claimed: set[PartitionKey] = field(default_factory=set)
    failure: ThreadFailure | None = None
    cancelled: bool = False

    def drop_if_claimed(self) -> None:
        """Let the unit's rows go once no delivered partition waits to be claimed."""
        if not self.ready:
            self.delivered = None


class Coalescer:
    """An epoch's fetch units, and the partitions they delivered before the manager asked. Thread-safe.

    A partition of a unit is served from its unit once (its first ``claim``); asked for again, or
    after ``release``, it is fetched alone. A unit starts when one of its partitions is first
    claimed, and the next unit with it, so the next unit's rows travel while this one's are
    served. Memory: the partitions delivered and not yet claimed: the rest of every started unit
    that holds a partition claimed so far, and the unit after the last of them (at the default
    shape, where a unit holds one group, or the rest of one after its first partitions: the
    three active groups' units and the next, 4 units).

    Units are taken from ``units`` as claims reach them (a key in none takes them all): ``claim``
    and ``release`` are called from one thread (the assembler), which alone advances ``units``
    and appends to ``self.units``; other threads read the units that exist.
    """

    def __init__(self, units: Iterable[Read]) -> None:
        self._cutting = iter(units)
        self.units: list[Read] = []
        self._unit_of: dict[PartitionKey, int] = {}
        self._states: list[_UnitState] = []
        self._lock = threading.Lock()
        self._splitting = True

    def _cut_next(self) -> bool:
        """Take the next unit; False when there is none."""
        unit = next(self._cutting, None)
        if unit is None:
            return False
        index = len(self.units)
        with self._lock:
            self.units.append(unit)
            self._states.append(_UnitState())
            self._unit_of.update(dict.fromkeys(unit.wanted, index))
        return True

    def _unit_index(self, key: PartitionKey) -> int | None:
        """The index of ``key``'s unit, with the unit after it taken too; None if in none."""
        while (index := self._unit_of.get(key)) is None:
            if not self._cut_next():
                return None
        if index + 1 == len(self.units):
            self._cut_next()
        return index

    def claim(self, spec: PartitionSpec) -> tuple[Pending[Block] | None, Sequence[int]]:
        """``spec``'s result through its unit and the units to start now; ``(None, ())`` when
        ``spec`` is to be fetched alone."""
        key = spec.key
        index = self._unit_index(key)
        if index is None:
            return None, ()
        with self._lock:
            state = self._states[index]
            if key in state.claimed or not (state.requested or self._splitting):
                return None, ()
            state.claimed.add(key)
            ready = state.ready.pop(key, None)
            if ready is not None:
                assert state.delivered is not None
                pending: Pending[Block] = Pending.of(state.delivered.block(ready))
                state.drop_if_claimed()
            else:
                pending = Pending(f"fetching {spec.describe()}, in a fetch unit")
                if state.failure is not None:
                    pending.fail(state.failure)
                elif state.cancelled:
                    pending.cancel()
                else:
                    state.waiters[key] = pending
            states = self._states
            # most claims: both units started already
            if not self._splitting or (
                state.requested and (index + 1 == len(states) or states[index + 1].requested)
            ):
                return pending, ()
            start = [i for i in (index, index + 1) if i < len(states) and not states[i].requested]
            for i in start:
                states[i].requested = True
        return pending, start

    def waiters(self, index: int) -> _UnitWaiters:
        """The claims waiting for unit ``index``, as the reader delivers to them."""
        return _UnitWaiters(self, index)

    def deliver(self, index: int, partitions: UnitPartitions) -> None:
        # built whole, not cell by cell: a unit has thousands of cells, and this holds the GIL
        where = dict(zip([spec.key for spec in partitions.specs], itertools.count()))
        with self._lock:
            state = self._states[index]
            state.delivered = partitions
            for key, waiter in state.waiters.items():
                waiter.set(partitions.block(where[key]))
            state.waiters.clear()
            for key in state.claimed:  # the waiters' keys too
                where.pop(key, None)
            state.ready = where
            state.drop_if_claimed()

    def fail(self, index: int, failure: ThreadFailure) -> None:
        with self._lock:
            state = self._states[index]
            state.failure = failure
            for waiter in state.waiters.values():
                waiter.fail(failure)
            state.waiters.clear()

    def cancel(self, index: int) -> None:
        with self._lock:
            state = self._states[index]
            state.cancelled = True
            for waiter in state.waiters.values():
                waiter.cancel()
            state.waiters.clear()
            state.ready.clear()
            state.delivered = None

    def release(self, keys: Sequence[PartitionKey]) -> None:
        """No more claims of ``keys`` through their units: drop what arrived for them (and what
        will: a key released before its unit is taken, as after a fast-forward, takes it now)."""
        indexes = [self._unit_index(key) for key in keys]
        with self._lock:
            for key, index in zip(keys, indexes, strict=True):
                if index is not None:
                    state = self._states[index]
                    state.claimed.add(key)
                    if state.ready.pop(key, None) is not None:
                        state.drop_if_claimed()

    def stop_splitting(self) -> None:
        """A unit's result did not split exactly: fetch the partitions of units not started alone."""
        with self._lock:
            self._splitting = False


@dataclass(frozen=True)
class _UnitWaiters:
    """The claims waiting for one unit (a :class:`~ddbloader._io.reader.Waiters`)."""

    coalescer: Coalescer
    index: int

    def deliver(self, partitions: UnitPartitions) -> None:
        self.coalescer.deliver(self.index, partitions)

    def fail(self, failure: ThreadFailure) -> None:
        self.coalescer.fail(self.index, failure)

    def cancel(self) -> None:
        self.coalescer.cancel(self.index)

    def split_failed(self) -> None:
        self.coalescer.stop_splitting()
