"""The steps of one work unit, from row counts alone: what the schedule's pool holds of it.

:class:`UnitSteps` serves a unit (fetches within the unit's share of the budget, a step per
loaded partition, kept edge rows, releases at its end), driven by
:class:`~ddbloader._epoch.schedule.BatchSchedule` (one by one) or by
:class:`~ddbloader._epoch.slots.Slots` (in runs). Not thread-safe: the schedule's iteration owns
them.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import WorkUnit
from .events import NO_SAMPLES, EventKind, Recorder
from .owed import keep_owed
from .shuffle import SampleOrders
from .visits import partition_visits

_FETCH, _LOAD, _DROP = EventKind.FETCH, EventKind.LOAD, EventKind.DROP

__all__ = ["UnitSteps"]


class UnitSteps:
    """One work unit's steps, from row counts alone (what the pool holds of it)."""

    __slots__ = (
        "_bounds",
        "_geometry",
        "_kept",
        "_log",
        "_needed",
        "_order",
        "_pending",
        "_prepartitions",
        "_served",
        "_single",
        "_step",
        "_step_number",
        "_to_submit",
        "_unit",
        "group",
        "index",
        "queued",
        "remaining",
    )

    def __init__(
        self,
        index: int,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        epoch: int,
        log: Recorder,
    ) -> None:
        group = unit.group
        self.index = index
        self.group = group.index
        self.remaining = unit.samples
        self._unit = unit
        self._geometry = geometry
        self._prepartitions = config.prepartition_num
        self._log = log
        #: a group of one partition: one fetch, one step, nothing to release (its claim took it)
        self._single = len(group.partitions) == 1
        self._needed = partition_visits(unit, config, geometry, epoch)
        self._bounds: list[int] = []
        self._to_submit: deque[int] = deque(self._needed)
        #: whether every partition it needs is queued (topping it up does nothing)
        self.queued = not self._to_submit
        self._pending: deque[int] = deque()
        self._kept: dict[int, int] = {}
        self._step: int | None = None
        self._step_number = -1
        self._order: np.ndarray[Any, Any] = NO_SAMPLES
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
            self._log.fetch(self.index, (self.group, position))
            self.queued = not self._to_submit

    def take(self, count: int, orders: SampleOrders) -> None:
        """Draw the next ``count`` samples (``0 < count <= remaining``), loading steps as needed."""
        while count > 0:
            if self._step is None or self._served == len(self._order):
                self._advance(orders)
            given = min(count, len(self._order) - self._served)
            self._log.draw(
                self.group, self._step_number, self._order[self._served : self._served + given], given
            )
            self._served += given
            self.remaining -= given
            count -= given
        if self.remaining == 0:
            self._finish()

    def serving(self) -> tuple[int, np.ndarray[Any, Any], int]:
        """See :class:`~ddbloader._epoch.slots.Drawable`."""
        if self._step is None:
            return -1, NO_SAMPLES, 0
        return self._step_number, self._order, self._served

    def drawn_in_run(self, count: int) -> None:
        self._served += count
        self.remaining -= count

    def _advance(self, orders: SampleOrders) -> None:
        while True:
            if self._step is not None:
                self._log.drop(self.index, (self.group, self._step), self._step_number)
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
        unit = self._unit
        row_map = unit.group.row_maps[position]
        samples = None
        if self._single:
            left = right = 0
            first, stop = unit.first, unit.stop
        elif row_map is not None:  # a combed piece of windows: its samples need no neighbour
            samples = row_map.samples(unit.first, unit.stop)
            left = right = 0
            first, stop = unit.first, unit.first
            if len(samples):
                first, stop = int(samples[0]), int(samples[-1]) + 1
        else:
            if not self._bounds:
                self._bounds = list(itertools.accumulate((p.rows for p in unit.group.partitions), initial=0))
            rows_first, rows_stop = self._bounds[position], self._bounds[position + 1]
            edge = self._geometry.span - 1
            left = self._kept_rows(position, -1, edge)
            right = self._kept_rows(position, +1, edge)
            self._kept[position] = min(edge, rows_stop - rows_first)
            completed = self._geometry.samples_completed_by(
                rows_first, rows_stop, rows_first - left, rows_stop + right, unit.group.sample_stop
            )
            first, stop = max(completed.start, unit.first), min(completed.stop, unit.stop)
            stop = max(first, stop)
        self._step_number = self._log.load(self.index, (self.group, position), left, right, first, stop)
        self._step = position
        order = orders.order(first, stop) if samples is None else samples[orders.order(0, len(samples))]
        self._order = keep_owed(unit, order)
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
        key = self.group
        if self._step is not None:
            self._log.drop(self.index, (key, self._step), self._step_number)
            self._step = None
        for position in self._pending:
            self._log.drop(self.index, (key, position))
        self._pending.clear()
        self._to_submit.clear()
        self.queued = True
        if not self._single:
            for position in self._needed:
                self._log.release(self.index, (key, position))
