"""The vocabulary of a :class:`~ddbloader._epoch.schedule.BatchSchedule`: partition events,
scheduled batches, and the recorder that collects them while a batch is drawn.

Pure data: no engine, no I/O. Not thread-safe: one consumer iterates a schedule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from .visits import PartitionKey

__all__ = ["NO_SAMPLES", "ChunkInts", "Event", "EventKind", "Recorder", "ScheduledBatch"]


#: no samples (the order of a unit with no step loaded yet)
NO_SAMPLES: np.ndarray[Any, Any] = np.empty(0, np.int64)


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


_FETCH, _LOAD, _DROP, _RELEASE = EventKind.FETCH, EventKind.LOAD, EventKind.DROP, EventKind.RELEASE


class Event(NamedTuple):
    """One partition event of unit ``unit`` (its index in the schedule's units), ``at`` samples
    into its batch (before the sample of that number).

    A LOAD loads step number ``step`` (the epoch's steps are numbered in load order from 0),
    which holds the unit's samples ``[first, stop)``, whose start rows lie in its partition with
    ``left`` and ``right`` kept rows. A DROP drops step ``step``, or a partition queued and not
    loaded (``step`` -1)."""

    kind: EventKind
    key: PartitionKey
    at: int
    left: int = 0
    right: int = 0
    unit: int = 0
    first: int = 0
    stop: int = 0
    step: int = -1


#: A batch's per-chunk ints (steps, counts, groups): a tuple when its chunks were drawn one by one,
#: an int64 array when some were drawn in a run (see :class:`ScheduledBatch`).
ChunkInts = tuple[int, ...] | np.ndarray[Any, Any]


# Not frozen: a frozen dataclass's __init__ costs a microsecond more, a batch each; read-only by contract.
@dataclass(slots=True, eq=False)
class ScheduledBatch:
    """One batch: its samples in chunks, each from one step, and the partition events of its
    draw, in order (see :class:`Event`; those after its last sample are the top-up for the next
    batch).

    Chunk ``c`` is ``counts[c]`` samples of group ``chunk_groups[c]``, drawn from step number
    ``steps[c]``; so an executor turns a chunk into rows with one ``chunk * stride + shift``. Their
    sample numbers (int64) are held in one of two forms: drawn one by one (a pool of few units),
    ``chunks[c]`` is chunk ``c`` and the per-chunk ints are tuples; with some chunks drawn in a run
    (a pool of many units, see :class:`~ddbloader._epoch.slots.Slots`), ``chunks`` is the one array of
    the whole batch and the per-chunk ints are int64 arrays. :meth:`drawn` gives the chunks in
    either form; :attr:`samples` and :attr:`groups` are the whole batch's."""

    index: int
    chunks: tuple[np.ndarray[Any, Any], ...]
    events: tuple[Event, ...]
    steps: ChunkInts
    counts: ChunkInts
    chunk_groups: ChunkInts

    @property
    def samples(self) -> np.ndarray[Any, Any]:
        """Sample ``j`` of the batch is sample ``samples[j]`` of group ``groups[j]``."""
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else NO_SAMPLES

    @property
    def groups(self) -> np.ndarray[Any, Any]:
        groups: np.ndarray[Any, Any] = np.repeat(np.array(self.chunk_groups, np.int64), self.counts)
        return groups

    def drawn(self) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
        """Each chunk's step number and samples, in order."""
        steps = self.steps
        if isinstance(steps, tuple):
            yield from zip(steps, self.chunks, strict=True)
            return
        samples, at = self.samples, 0
        for step, count in zip(steps.tolist(), np.asarray(self.counts).tolist(), strict=True):
            yield step, samples[at : at + count]
            at += count


#: makes a tuple subclass from a tuple, without the NamedTuple's Python-level ``__new__`` (a few
#: events per small group)
_new = tuple.__new__


#: A run of chunks drawn at once (see :meth:`Recorder.run`): how many chunks drawn one by one come
#: before it, then its samples, steps, counts and groups (int64 arrays).
_Run = tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]


class Recorder:
    """A batch being drawn: its samples by chunk, its events, and the partitions held."""

    def __init__(self) -> None:
        self.held = 0
        self.high_water = 0
        self.drawn = 0
        self.loads = 0
        #: the batch's chunks so far (see :class:`ScheduledBatch`; appended to by :meth:`draw`)
        self.groups: list[int] = []
        self.samples: list[np.ndarray[Any, Any]] = []
        self.steps: list[int] = []
        self.counts: list[int] = []
        self.events: list[Event] = []
        #: the batch's runs of chunks drawn at once, among those of :attr:`samples`
        self.runs: list[_Run] = []

    def fetch(self, unit: int, key: PartitionKey) -> None:
        self.held += 1
        self.high_water = max(self.high_water, self.held)
        self.events.append(_new(Event, (_FETCH, key, self.drawn, 0, 0, unit, 0, 0, -1)))

    def drop(self, unit: int, key: PartitionKey, step: int = -1) -> None:
        self.held -= 1
        self.events.append(_new(Event, (_DROP, key, self.drawn, 0, 0, unit, 0, 0, step)))

    def load(self, unit: int, key: PartitionKey, left: int, right: int, first: int, stop: int) -> int:
        """Record a LOAD; the step's number."""
        step = self.loads
        self.events.append(_new(Event, (_LOAD, key, self.drawn, left, right, unit, first, stop, step)))
        self.loads = step + 1
        return step

    def release(self, unit: int, key: PartitionKey) -> None:
        self.events.append(_new(Event, (_RELEASE, key, self.drawn, 0, 0, unit, 0, 0, -1)))

    def draw(self, group: int, step: int, samples: np.ndarray[Any, Any], count: int) -> None:
        self.groups.append(group)
        self.steps.append(step)
        self.counts.append(count)
        self.samples.append(samples)
        self.drawn += count

    def run(
        self,
        samples: np.ndarray[Any, Any],
        steps: np.ndarray[Any, Any],
        counts: np.ndarray[Any, Any],
        groups: np.ndarray[Any, Any],
        total: int,
    ) -> None:
        """Chunks drawn at once: ``counts[c]`` samples of group ``groups[c]`` from step ``steps[c]``,
        ``samples`` all of them in order (``total`` samples)."""
        self.runs.append((len(self.samples), samples, steps, counts, groups))
        self.drawn += total

    def batch(self, index: int) -> ScheduledBatch:
        chunks: tuple[np.ndarray[Any, Any], ...]
        steps: ChunkInts
        counts: ChunkInts
        groups: ChunkInts
        if self.runs:
            chunks, steps, counts, groups = self._merged()
            self.runs.clear()
        else:
            chunks, steps = tuple(self.samples), tuple(self.steps)
            counts, groups = tuple(self.counts), tuple(self.groups)
        batch = ScheduledBatch(index, chunks, tuple(self.events), steps, counts, groups)
        self.groups.clear()
        self.samples.clear()
        self.steps.clear()
        self.counts.clear()
        self.events.clear()
        self.drawn = 0
        return batch

    def _merged(
        self,
    ) -> tuple[tuple[np.ndarray[Any, Any]], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The batch's chunks, runs among them: all samples in one array, the per-chunk ints as arrays."""
        runs = self.runs
        if len(runs) == 1 and not self.samples:  # the usual batch of a pool of many units
            _, samples, steps, counts, groups = runs[0]
            return (samples,), steps, counts, groups
        parts: tuple[list[np.ndarray[Any, Any]], ...] = ([], [], [], [])
        done = 0
        for mark, *run in runs:
            self._one_by_one(parts, done, mark)
            done = mark
            for part, array in zip(parts, run, strict=True):
                part.append(array)
        self._one_by_one(parts, done, len(self.samples))
        samples, steps, counts, groups = (np.concatenate(part) for part in parts)
        return (samples,), steps, counts, groups

    def _one_by_one(self, parts: tuple[list[np.ndarray[Any, Any]], ...], first: int, stop: int) -> None:
        """Append chunks ``[first, stop)`` of those drawn one by one to ``parts`` (as :meth:`_merged`'s)."""
        if first < stop:
            parts[0].extend(self.samples[first:stop])
            for part, ints in zip(parts[1:], (self.steps, self.counts, self.groups), strict=True):
                part.append(np.array(ints[first:stop], np.int64))
