"""Slots: the active units of a pool of many as arrays, so that a batch's draw is a few array operations.

A shuffled pool gives each sample of a batch's draw to a slot (see
:class:`~ddbloader._epoch.shuffle.SourceDraws`), and each slot serves its share from its unit's
current step in slot order. With many units active a batch holds about one chunk per unit, and
drawing those chunks one unit at a time costs more than the samples (a few microseconds of Python
a chunk, ~150 chunks a batch with 200 units). :class:`Slots` keeps what a draw reads of every
active unit in arrays, every current step's samples not served yet in one buffer, so that the
slots whose share their step holds without an event (no load, no end of a step or of the unit)
are served together in one run: a few array operations give the run's samples, steps, counts
and groups. The other slots are served by their unit as before, in slot order, each recording its
events at the place its samples take in the batch, and their chunks are then placed among the
run's, so the batches, their events and the order of every random draw are exactly those of a
draw one unit at a time, for a few array operations a draw however many slots need their unit.

Owned by one :class:`~ddbloader._epoch.schedule.BatchSchedule` iteration; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from .events import NO_SAMPLES, Recorder
from .shuffle import SampleOrders

__all__ = ["RUNS_FROM", "Drawable", "Slots"]

#: A shuffled pool of at least this many slots draws in runs; a smaller one draws one unit at a
#: time, which costs less than a run's array operations for a few chunks a batch.
RUNS_FROM = 8

#: The buffer's least size, in samples.
_LEAST_BUFFER = 1 << 14

_ZERO = np.zeros(1, np.int64)


class _Run(NamedTuple):
    """Chunks served at once: ``taken[c]`` samples of group ``groups[c]`` from step ``steps[c]``
    of slot ``slots[c]`` (ascending), ``samples`` all of them in order; ``ends`` the cumulative
    ``taken``, ``total`` its last."""

    samples: np.ndarray[Any, Any]
    steps: np.ndarray[Any, Any]
    taken: np.ndarray[Any, Any]
    groups: np.ndarray[Any, Any]
    slots: np.ndarray[Any, Any]
    ends: np.ndarray[Any, Any]
    total: int

    def ends_before(self, slots: np.ndarray[Any, Any]) -> list[int]:
        """The run's samples in slots before each of ``slots`` (ascending, none of the run's)."""
        chunks = self.slots.searchsorted(slots)
        return np.concatenate((_ZERO, self.ends))[chunks].tolist()  # type: ignore[no-any-return]

    def interleave(
        self,
        log: Recorder,
        mark: int,
        slots: np.ndarray[Any, Any],
        before: list[int],
        served: list[int],
        chunks: list[int],
    ) -> None:
        """Record the run in ``log`` (whose ``drawn`` is where it began) together with the chunks
        that ``slots`` (ascending, none of the run's) recorded one by one since chunk ``mark``:
        ``chunks[i]`` chunks and ``served[i]`` samples of ``slots[i]``, which go after the run's
        chunks of the slots before it (``before[i]`` of its samples), so all in slot order."""
        drawn = log.samples[mark:]
        ints = [np.array(values[mark:], np.int64) for values in (log.steps, log.counts, log.groups)]
        for values in (log.samples, log.steps, log.counts, log.groups):
            del values[mark:]
        one_by_one = np.concatenate(drawn) if len(drawn) > 1 else drawn[0] if drawn else NO_SAMPLES
        total = self.total + len(one_by_one)
        at = np.arange(len(one_by_one), dtype=np.int64)
        at += np.repeat(np.array(before, np.int64), served)
        samples = _merged(self.samples, one_by_one, at, total)
        at = np.arange(len(ints[0]), dtype=np.int64)
        at += np.repeat(self.slots.searchsorted(slots), chunks)
        width = len(self.taken) + len(at)
        steps, taken, groups = (
            _merged(mine, theirs, at, width)
            for mine, theirs in zip((self.steps, self.taken, self.groups), ints, strict=True)
        )
        log.run(samples, steps, taken, groups, total)


def _merged(
    run: np.ndarray[Any, Any], others: np.ndarray[Any, Any], at: np.ndarray[Any, Any], size: int
) -> np.ndarray[Any, Any]:
    """``size`` int64 values: ``others`` at the places ``at``, ``run``'s in order in the rest."""
    merged = np.empty(size, np.int64)
    rest = np.ones(size, bool)
    rest[at] = False
    merged[at] = others
    merged[rest] = run
    return merged


class Drawable(Protocol):
    """What :class:`Slots` reads and moves of a unit of the schedule."""

    group: int
    #: samples it has not served, up to the samples served in runs since it was last synced
    remaining: int

    def take(self, count: int, orders: SampleOrders) -> None:
        """Serve the next ``count`` samples (``0 < count <= remaining``), with their events."""
        ...

    def serving(self) -> tuple[int, np.ndarray[Any, Any], int]:
        """The current step's number (-1 for none), its samples in order, and how many it served."""
        ...

    def drawn_in_run(self, count: int) -> None:
        """``count`` more samples of the current step were served in a run (no event among them)."""
        ...


U = TypeVar("U", bound=Drawable)


class Slots(Generic[U]):
    """The active units (:attr:`units`, in slot order) of a shuffled pool of up to ``pool`` slots.

    Invariants, for each slot ``s``: the samples its unit's current step has not served are
    ``buffer[cursor[s]:stop[s]]``, in order; ``room[s]`` is how many the slot serves without an
    event, ``min(stop[s] - cursor[s], remaining - 1)`` (0 without a step), so a run neither
    serves past a step's samples nor ends a unit; the unit's own counts lag by ``cursor[s] -
    synced[s]`` samples served in runs, and are brought up to date before the unit draws itself.
    A unit appended to :attr:`units` takes a slot at the next draw.

    Memory: the buffer copies the current steps' samples (8 bytes each, besides the units' own
    orders) and is at most twice what it held at its last compaction plus the step that caused it.
    """

    def __init__(self, pool: int, batch_size: int, log: Recorder) -> None:
        self.units: list[U] = []
        self._log = log
        #: slots with arrays (units admitted)
        self._size = 0
        self._cursor = np.zeros(pool, np.int64)
        self._stop = np.zeros(pool, np.int64)
        self._synced = np.zeros(pool, np.int64)
        self._room = np.zeros(pool, np.int64)
        self._step = np.full(pool, -1, np.int64)
        self._group = np.zeros(pool, np.int64)
        self._buffer = np.empty(_LEAST_BUFFER, np.int64)
        self._end = 0
        self._ramp = np.arange(batch_size, dtype=np.int64)
        self._closed: list[int] = []

    def draw(
        self, counts: np.ndarray[Any, Any], orders: SampleOrders, following: Callable[[], U | None]
    ) -> int:
        """Serve ``counts[s]`` samples from each slot ``s``, in slot order; how many were served.

        A unit that runs out hands its slot, and the rest of its share, to ``following()``; a slot
        it returns None for closes, the rest of its share unserved, and leaves :attr:`units`
        (after this draw, the later slots moving up). ``counts`` is written to.

        The slots whose share fits their room are served first, as one run; then the others, one
        at a time in slot order (see the module's docstring).
        """
        self._admit()
        size = self._size
        room = self._room[:size]
        over = (counts > room).nonzero()[0]
        if not len(over):
            return self._run(counts, size)
        shares = counts[over].tolist()
        counts[over] = 0
        log = self._log
        start, mark = log.drawn, len(log.samples)
        run = self._gathered(counts, size)
        # the run's samples before each slot served one at a time: where that slot's samples begin
        before = [0] * len(over) if run is None else run.ends_before(over)
        given = 0
        served, chunks = [0] * len(over), [0] * len(over)
        for i, (slot, share) in enumerate(zip(over.tolist(), shares, strict=True)):
            log.drawn = start + before[i] + given
            recorded = len(log.samples)
            served[i] = self._serve(slot, share, orders, following)
            chunks[i] = len(log.samples) - recorded
            given += served[i]
        if run is not None:
            log.drawn = start
            run.interleave(log, mark, over, before, served, chunks)
        if self._closed:
            self._close()
        return (0 if run is None else run.total) + given

    def _admit(self) -> None:
        """Slots for the units appended since the last draw: no step yet."""
        for slot in range(self._size, len(self.units)):
            self._cursor[slot] = self._stop[slot] = self._synced[slot] = self._room[slot] = 0
            self._step[slot] = -1
            self._group[slot] = self.units[slot].group
        self._size = len(self.units)

    def _run(self, counts: np.ndarray[Any, Any], size: int) -> int:
        """Serve slots ``[0, size)``, each within its room, as one run of chunks."""
        run = self._gathered(counts, size)
        if run is None:
            return 0
        self._log.run(run.samples, run.steps, run.taken, run.groups, run.total)
        return run.total

    def _gathered(self, counts: np.ndarray[Any, Any], size: int) -> _Run | None:
        """Take ``counts[s]`` samples of each slot ``s`` (within its room) off the buffer, as a run
        of chunks in slot order (None for no sample)."""
        # array methods rather than numpy's functions: a few microseconds less a batch
        slots = counts.nonzero()[0]
        if not len(slots):
            return None
        taken = counts[slots]
        ends = taken.cumsum()
        total = int(ends[-1])
        # chunk c's samples are buffer[cursor : cursor + taken[c]], at ends[c] - taken[c] of the run
        picks = (self._cursor[slots] - ends + taken).repeat(taken)
        picks += self._ramp[:total]
        self._cursor[:size] += counts
        self._room[:size] -= counts
        return _Run(self._buffer[picks], self._step[slots], taken, self._group[slots], slots, ends, total)

    def _serve(self, slot: int, share: int, orders: SampleOrders, following: Callable[[], U | None]) -> int:
        """Serve ``share`` samples of ``slot`` through its units, one at a time (events and hand-offs)."""
        units = self.units
        drawn = int(self._cursor[slot] - self._synced[slot])
        if drawn:
            units[slot].drawn_in_run(drawn)
        given = 0
        while share:
            unit = units[slot]
            give = min(share, unit.remaining)
            unit.take(give, orders)
            share -= give
            given += give
            if unit.remaining == 0:
                passed = following()
                if passed is None:
                    self._closed.append(slot)
                    break
                units[slot] = passed
        self._refresh(slot)
        return given

    def _refresh(self, slot: int) -> None:
        """The arrays of ``slot`` from its unit (just synced): a new step's samples into the buffer."""
        unit = self.units[slot]
        number, order, served = unit.serving()
        if number != self._step[slot]:
            # a new step, or a new unit: the samples left of the old one are not kept
            self._cursor[slot] = self._stop[slot]
            if number >= 0:
                self._stop[slot] = self._place(order)
            self._step[slot] = number
            self._group[slot] = unit.group
        left = len(order) - served
        self._cursor[slot] = self._synced[slot] = self._stop[slot] - left
        self._room[slot] = max(0, min(left, unit.remaining - 1))

    def _place(self, order: np.ndarray[Any, Any]) -> int:
        """Append ``order`` to the buffer; where it stops."""
        if self._end + len(order) > len(self._buffer):
            self._compact(len(order))
        end = self._end + len(order)
        self._buffer[self._end : end] = order
        self._end = end
        return end

    def _compact(self, extra: int) -> None:
        """A new buffer holding the samples not served yet of every slot and room for ``extra``
        more, at least twice what it holds (so appends cost O(1) each, amortised)."""
        size = self._size
        cursor, stop = self._cursor[:size], self._stop[:size]
        lengths = stop - cursor
        live = int(lengths.sum())
        buffer = np.empty(max(2 * (live + extra), _LEAST_BUFFER), np.int64)
        firsts = lengths.cumsum() - lengths  # each slot's samples' new place, in slot order
        shift = firsts - cursor
        # one gather for every slot (a loop over slots cost ~2 ms at 256 slots)
        buffer[:live] = self._buffer[np.arange(live, dtype=np.int64) - shift.repeat(lengths)]
        cursor += shift
        stop += shift
        self._synced[:size] += shift
        self._buffer, self._end = buffer, live

    def _close(self) -> None:
        """Drop the closed slots (their units ran out with none waiting); the later ones move up."""
        closed = set(self._closed)
        self._closed.clear()
        kept = [slot for slot in range(self._size) if slot not in closed]
        self.units[:] = [self.units[slot] for slot in kept]
        at = np.array(kept, np.int64)
        for array in (self._cursor, self._stop, self._synced, self._room, self._step, self._group):
            array[: len(kept)] = array[at]
        self._size = len(kept)
