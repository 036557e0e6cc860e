"""What the pool draws from: one work unit's stream of steps, and the gauge of partitions held.

A :class:`Step` is one loaded partition's samples in emission order; a :class:`UnitStream`
serves one work unit step by step. :class:`PartitionStream` serves a unit of a group of one
partition (most small groups) in one step; :class:`~ddbloader._pipeline.group_stream.GroupStream`
any other. Owned by the assembler thread; not thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._epoch.owed import keep_owed
from .._epoch.shard import WorkUnit
from .._epoch.shuffle import SampleOrders
from .._io.source import PartitionSource
from .._io.threads import Pending
from .._sql.source import Block
from .arena import Arena, Piece, Segment

__all__ = ["PartitionGauge", "PartitionStream", "Step", "UnitStream"]


class PartitionGauge:
    """Counts partitions held (queued, in flight or being served) and their high-water mark."""

    def __init__(self) -> None:
        self.held = 0
        self.high_water = 0

    def acquire(self) -> None:
        self.held += 1
        self.high_water = max(self.high_water, self.held)

    def release(self) -> None:
        self.held -= 1


@dataclass(slots=True)
class Step:
    """One loaded partition's samples: ``starts`` are their first x rows within ``segment``,
    in emission order; ``served`` of them have been handed out. ``segment`` is partition
    ``position`` with ``left`` kept rows of its loaded neighbours before it and ``right`` after."""

    segment: Segment
    starts: np.ndarray[Any, Any]
    position: int
    left: int
    right: int
    served: int = 0
    #: whether ``starts``, as rows of the segment's base, are in its arena's orders
    #: (see :class:`~ddbloader._pipeline.pool._Serving`)
    ordered: bool = False


class UnitStream:
    """What a stream of one work unit holds, and how the pool's
    :class:`~ddbloader._pipeline.pool._Serving` hands out the samples of the step it serves.
    ``remaining`` counts the unit's samples not yet handed out."""

    __slots__ = (
        "_arena",
        "_config",
        "_fetcher",
        "_gauge",
        "_geometry",
        "_orders",
        "_step",
        "_stop",
        "_unit",
        "group",
        "remaining",
    )

    def __init__(
        self,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        fetcher: PartitionSource,
        gauge: PartitionGauge,
        stop: threading.Event,
        orders: SampleOrders,
        arena: Arena | None,
    ) -> None:
        self.group = unit.group
        self.remaining = unit.samples
        self._unit = unit
        self._config = config
        self._geometry = geometry
        self._fetcher = fetcher
        self._gauge = gauge
        self._stop = stop
        self._orders = orders
        self._arena = arena
        self._step: Step | None = None

    def serving(self) -> Step | None:
        """The step being served, if it still has samples to give."""
        step = self._step
        return step if step is not None and step.served < len(step.starts) else None

    def served_elsewhere(self, count: int) -> None:
        """``count`` more samples of the step being served were handed out by the pool's
        :class:`~ddbloader._pipeline.pool._Serving` (they were not more than the step had left)."""
        assert self._step is not None
        self._step.served += count
        self.remaining -= count
        if self.remaining == 0:
            self._finish()

    def _finish(self) -> None:
        raise NotImplementedError


class PartitionStream(UnitStream):
    """Serves a work unit of a group of one partition (most small groups): one fetch, one step.

    What :class:`~ddbloader._pipeline.group_stream.GroupStream` does for such a unit (same
    fetches, gauge counts, sample orders and pieces, in the same order), without the bookkeeping of
    many partitions and of neighbours' kept rows, which cost about as much per small group as
    serving its samples. Made only while the pool fetches: a fast-forward's streams are
    ``GroupStream``\\ s, which can fetch a half-served step again when it ends.
    """

    __slots__ = ("_pending", "_submitted")

    def __init__(
        self,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        fetcher: PartitionSource,
        gauge: PartitionGauge,
        stop: threading.Event,
        orders: SampleOrders,
        arena: Arena | None = None,
    ) -> None:
        super().__init__(unit, config, geometry, fetcher, gauge, stop, orders, arena)
        self._pending: Pending[Block] | None = None
        self._submitted = False

    def top_up(self, room: int) -> None:
        """Submit the fetch if ``room`` allows and it is not submitted yet."""
        if room > 0 and not self._submitted:
            self._submit()

    def _submit(self) -> None:
        self._submitted = True
        self._gauge.acquire()
        self._pending = self._fetcher.submit(self.group.partitions[0])

    def take(self, count: int, pieces: list[Piece]) -> None:
        """Append the next ``count`` samples (``0 < count <= remaining``) to ``pieces``."""
        step = self._step if self._step is not None else self._load()
        served = step.served
        step.served = served + count
        self.remaining -= count
        pieces.append(Piece(step.segment, step.starts[served : served + count]))
        if self.remaining == 0:
            self._finish()

    def _load(self) -> Step:
        if not self._submitted:
            self._submit()
        assert self._pending is not None
        block = self._pending.wait(self._stop, self._config.timeout)
        self._pending = None
        segment = Segment(block) if self._arena is None else self._arena.place((block,))
        unit = self._unit
        order = keep_owed(unit, self._orders.order(unit.first, unit.stop))
        stride = self._geometry.stride
        if (unit.stop - 1) * stride + self._geometry.span > block.rows:
            # the gather copies without bounds checks (see batch.gather): never let a bad row through
            raise RuntimeError(
                f"internal error: group {self.group.index} has samples outside its {block.rows} rows"
            )
        step = self._step = Step(segment, order * stride if stride != 1 else order, 0, 0, 0)
        return step

    def _finish(self) -> None:
        """Release the step. The partition needs no release to the fetcher: its one submission
        took its rows from the fetcher (see :meth:`~ddbloader._io.fetch.Fetcher.release`)."""
        if self._step is not None:
            if self._arena is not None:
                self._arena.retire(self._step.segment)
            self._step = None
            self._gauge.release()
