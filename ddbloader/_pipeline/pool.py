"""GroupPool: the executor of an epoch's :class:`~ddbloader._epoch.schedule.BatchSchedule`.

The schedule says which samples each batch holds and when each partition is claimed, loaded,
dropped and released; the pool does it: it claims partitions from its
:class:`~ddbloader._io.source.PartitionSource`, places each loaded step's rows (its partition with
the kept edge rows of its neighbours, see :class:`~ddbloader._pipeline.edges.KeptEdges`) in the
arena, and turns each batch's samples into rows of those steps
(:class:`~ddbloader._pipeline.placed.PlacedSteps`). It defines no order of its own. Owned by
the assembler thread; not thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._epoch.owed import keep_owed
from .._epoch.schedule import BatchSchedule, Event, EventKind, ScheduledBatch
from .._epoch.visits import PartitionKey
from .._io.block import Block
from .._io.source import PartitionSource
from .._io.threads import Pending
from .._sql.window_rows import WindowRows
from .arena import Arena, Piece, Segment
from .edges import KeptEdges
from .placed import PlacedSteps

__all__ = ["GroupPool", "PartitionGauge"]

_FETCH, _LOAD, _DROP, _RELEASE = EventKind.FETCH, EventKind.LOAD, EventKind.DROP, EventKind.RELEASE

#: A partition of one unit of the schedule: (unit index, position in its group).
_Key = tuple[int, int]


def _number(unit: int, position: int) -> int:
    """A partition of one unit as one int (no tuple to allocate: a few per small group)."""
    return unit << 32 | position


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


class _Replayed(NamedTuple):
    """A step loaded while a resume replays the batches it skips, and the samples drawn from it."""

    load: Event
    drawn: list[np.ndarray[Any, Any]]


class GroupPool:
    """Executes ``schedule``: partitions from ``fetcher``, segments in ``arena`` (else arrays of
    their own), a batch's samples as :class:`~ddbloader._pipeline.arena.Piece`\\ s.

    Invariants: the partitions held (claimed and not dropped) are the schedule's, so at most
    ``group_pool_size x prepartition_num`` (:attr:`gauge`); every partition a unit needed is
    released to the fetcher when the unit ends (claimed or not: a fetch unit brings them all).
    """

    def __init__(
        self,
        schedule: BatchSchedule,
        fetcher: PartitionSource,
        stop: threading.Event,
        *,
        arena: Arena | None = None,
    ) -> None:
        self.gauge = PartitionGauge()
        self.arena = arena
        self._schedule = schedule
        self._units = schedule.units
        self._fetcher = fetcher
        self._stop = stop
        self._timeout = schedule.config.timeout
        geometry = schedule.geometry
        self._stride = geometry.stride
        self._span = geometry.span
        self._edges = KeptEdges(schedule.units, geometry.span, self._claim)
        #: claimed partitions not loaded yet, by :func:`_number` (None while replaying: not claimed)
        self._pending: dict[int, Pending[Block] | None] = {}
        self._placed = PlacedSteps(arena, geometry.stride, schedule.in_runs)
        self._replayed: dict[int, _Replayed] = {}

    def batches(self, skip: int = 0) -> Iterator[list[Piece]]:
        """The pieces of the schedule's batches from batch ``skip`` on.

        The first ``skip`` batches (a resume) are replayed as bookkeeping: which partitions are
        held and which step each unit serves, nothing claimed. At batch ``skip`` the pool claims
        what the rest of the epoch needs (see :meth:`_resume`) and serves from there. Once the
        last batch is gathered (the next step of this iterator), every arena region is retired.
        """
        for batch in self._schedule:
            if batch.index < skip:
                self._replay(batch)
                continue
            if batch.index == skip and skip:
                self._resume()
            yield self.take(batch)
        self._placed.retire_all()

    def take(self, batch: ScheduledBatch) -> list[Piece]:
        """Honour ``batch``'s events, and its samples as pieces of the loaded steps' segments."""
        arena = self.arena
        if arena is not None:
            arena.recycle()
        if batch.events:
            self._events(batch.events)
        placed = self._placed
        pieces = placed.pieces(batch)
        placed.forget_dropped()
        return pieces

    def _events(self, events: Sequence[Event]) -> None:
        """Honour ``events``, in order."""
        releases: list[_Key] = []
        gauge = self.gauge
        # the gauge's counts and the partition numbers inline: a few events per group
        for event in events:
            kind = event.kind
            if releases and kind is not _RELEASE:
                self._release(releases)
            if kind is _FETCH:
                gauge.held += 1
                gauge.high_water = max(gauge.high_water, gauge.held)
                spec = self._units[event.unit].group.partitions[event.key[1]]
                self._pending[event.unit << 32 | spec.position] = self._fetcher.submit(spec)
            elif kind is _LOAD:
                pending = self._pending.pop(event.unit << 32 | event.key[1])
                assert pending is not None
                self._load(event, pending.wait(self._stop, self._timeout))
            elif kind is _DROP:
                self._drop(event.unit << 32 | event.key[1], event.step)
            else:
                releases.append((event.unit, event.key[1]))
        if releases:
            self._release(releases)

    def _drop(self, partition: int, step: int) -> None:
        """A DROP: the partition (numbered as in ``_pending``) is no longer held; its step's
        segment, if it was loaded (``step`` ≥ 0), is retired at the end of the batch."""
        self.gauge.held -= 1
        if step < 0:  # its unit ended before loading it
            del self._pending[partition]
            return
        self._placed.drop(step)

    def _claim(self, key: _Key) -> Pending[Block]:
        return self._fetcher.submit(self._units[key[0]].group.partitions[key[1]])

    def _release(self, releases: list[_Key]) -> None:
        """Consecutive RELEASE events (one unit's end): one release to the fetcher."""
        unit = self._units[releases[0][0]].group
        self._fetcher.release([unit.partitions[position].key for _, position in releases])
        self._edges.forget(releases)
        releases.clear()

    def _load(self, event: Event, block: Block) -> None:
        """Place a step: its block with its neighbours' kept rows."""
        key = event.unit, event.key[1]
        self._edges.keep(key, block)
        self._place(event, self._edges.around(key, block, event.left, event.right, self._wait))

    def _wait(self, pending: Pending[Block]) -> Block:
        return pending.wait(self._stop, self._timeout)

    def _place(self, event: Event, blocks: Sequence[Block]) -> None:
        row_map = self._units[event.unit].group.row_maps[event.key[1]]
        if row_map is not None:  # its rows are runs of its series: no one shift
            self._placed.place(event.step, self._runs_segment(event, blocks[0], row_map), windows=row_map)
        else:
            shift = event.left - self._edges.first_row(event.unit, event.key[1])
            self._placed.place(event.step, self._placed_segment(event, blocks, shift), shift)

    def _runs_segment(self, event: Event, block: Block, row_map: WindowRows) -> Segment:
        """A combed piece of windows as one segment (its rows are all its windows read)."""
        segment = self.arena.place((block,)) if self.arena is not None else Segment(block)
        starts = row_map.block_rows(row_map.samples(event.first, event.stop) * self._stride)
        if len(starts) and (int(starts.min()) < 0 or int(starts.max()) + self._span > block.rows):
            raise RuntimeError(
                f"internal error: group {event.key[0]} step {event.step} has samples outside its "
                f"{block.rows} rows"
            )
        return segment

    def _placed_segment(self, event: Event, blocks: Sequence[Block], shift: int) -> Segment:
        """``event``'s step as one segment: ``blocks`` are its partition with ``event.left`` kept
        rows before it and ``event.right`` after; sample ``s`` starts at its row ``s * stride + shift``."""
        arena = self.arena
        segment = arena.place(blocks) if arena is not None else Segment(Block.concatenate(blocks))
        self._check_rows(segment, event.key, event.step, event.first, event.stop, shift)
        return segment

    def _check_rows(
        self, segment: Segment, key: PartitionKey, step: int, first: int, stop: int, shift: int
    ) -> None:
        """Refuse a step whose samples ``[first, stop)`` would start or end outside ``segment``."""
        stride = self._stride
        if first < stop and (
            first * stride + shift < 0 or (stop - 1) * stride + shift + self._span > segment.block.rows
        ):
            # the gather copies without bounds checks (see batch.gather): never let a bad row through
            raise RuntimeError(
                f"internal error: group {key[0]} step {step} has samples outside its "
                f"{segment.block.rows} rows"
            )

    # ---------------------------------------------------------------------------- resume

    def _replay(self, batch: ScheduledBatch) -> None:
        """A skipped batch's events as bookkeeping only: nothing claimed, loaded or placed.

        A partition of a one-partition group whose unit ended is released at once (no RELEASE
        event stands for it: its claim would have taken its rows, but it was never claimed)."""
        releases: list[_Key] = []
        for event in batch.events:
            kind = event.kind
            if releases and kind is not _RELEASE:
                self._release(releases)
            key = (event.unit, event.key[1])
            if kind is _FETCH:
                self.gauge.acquire()
                self._pending[_number(*key)] = None
            elif kind is _LOAD:
                del self._pending[_number(*key)]
                self._edges.passed(key)
                self._replayed[event.step] = _Replayed(event, [])
            elif kind is _DROP:
                self.gauge.release()
                if event.step < 0:
                    del self._pending[_number(*key)]
                else:
                    del self._replayed[event.step]
                if len(self._units[event.unit].group.partitions) == 1:
                    self._fetcher.release([event.key])
            else:
                releases.append(key)
        if releases:
            self._release(releases)
        for step, chunk in batch.drawn():
            replayed = self._replayed.get(step)
            if replayed is not None:
                replayed.drawn.append(chunk)

    def _resume(self) -> None:
        """Claim what the rest of the epoch needs after a replay: first each step being served
        with samples left, with the neighbours whose kept rows those samples reach; then the
        partitions queued and not loaded yet. A neighbour loaded during the replay whose kept rows
        a later step joins is claimed when that step loads (see :class:`KeptEdges`)."""
        rebuilt: list[tuple[Event, bool, bool, Pending[Block]]] = []
        stride, span = self._stride, self._span
        for event, drawn in self._replayed.values():
            unit = self._units[event.unit]
            row_map = unit.group.row_maps[event.key[1]]
            samples = (
                np.arange(event.first, event.stop)
                if row_map is None
                else row_map.samples(event.first, event.stop)
            )
            whole = keep_owed(unit, samples)
            rest = np.setdiff1d(whole, np.concatenate(drawn) if drawn else ())
            if not len(rest):
                continue
            key = (event.unit, event.key[1])
            shift = event.left - self._edges.first_row(*key)
            rows = self._edges.rows(*key)
            reach_left = event.left > 0 and int(rest.min()) * stride + shift < event.left
            reach_right = event.right > 0 and int(rest.max()) * stride + shift + span > event.left + rows
            rebuilt.append((event, reach_left, reach_right, self._claim(key)))
            self._edges.claim_early(key, event.left if reach_left else 0, event.right if reach_right else 0)
        self._replayed.clear()
        for number, pending in self._pending.items():
            if pending is None:
                self._pending[number] = self._claim((number >> 32, number & 0xFFFFFFFF))
        for event, reach_left, reach_right, pending in rebuilt:
            key = (event.unit, event.key[1])
            block = self._wait(pending)
            self._edges.keep(key, block)
            reach = (reach_left, reach_right)
            self._place(event, self._edges.around(key, block, event.left, event.right, self._wait, reach))
