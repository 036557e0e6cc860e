"""PlacedSteps: where the loaded steps of an epoch lie, and a batch's samples as rows of them.

The pool (:class:`~ddbloader._pipeline.pool.GroupPool`) places each loaded step's rows in a
segment; this is the map from a step's samples to those rows: sample ``s`` of step ``k`` starts
at row ``s * stride + shifts.get(k, 0)`` of ``segments[k]``, or, for a combed piece of windows
(whose rows are runs of its series, see :class:`~ddbloader._sql.window_rows.WindowRows`), at its
row ``runs[k].block_rows(s * stride)``. A batch becomes one piece when all of its steps lie in
the arena's one buffer (one take for the batch), else one piece per chunk. Owned by the
assembler thread with its pool; not thread-safe.
"""

from __future__ import annotations

import numpy as np

from .._epoch.schedule import ScheduledBatch
from .._sql.window_rows import WindowRows
from .arena import Arena, Piece, Segment

__all__ = ["PlacedSteps"]

#: makes a :class:`Piece` without its Python-level ``__new__``
_new = tuple.__new__


class PlacedSteps:
    """The loaded steps' segments (in ``arena`` when there is one) by step number.

    ``segments``, ``shifts`` and ``runs`` are read and written by the pool inline on its hot
    paths (as is ``fresh``); a step dropped during a batch keeps its entries until
    :meth:`forget_dropped`, after the batch's pieces are made. With ``indexed`` (a schedule that
    draws in runs) it also keeps, for each step loaded until the last batch, the row of
    ``arena.whole`` where its sample 0 starts (see :meth:`_index`), and which loaded steps lie
    elsewhere.
    """

    def __init__(self, arena: Arena | None, stride: int, indexed: bool) -> None:
        self.arena = arena
        self._stride = stride
        self.segments: dict[int, Segment] = {}
        self.shifts: dict[int, int] = {}
        self.runs: dict[int, WindowRows] = {}
        self._dropped: list[int] = []
        self.indexed = indexed
        self._firsts = np.zeros(64 if indexed else 0, np.int64)
        #: steps loaded since the last batch of a schedule that draws in runs
        self.fresh: list[int] = []
        self._apart: set[int] = set()

    def place(self, step: int, segment: Segment, shift: int = 0, windows: WindowRows | None = None) -> None:
        """Step ``step``'s samples start in ``segment`` (see the module docstring)."""
        self.segments[step] = segment
        if windows is not None:
            self.runs[step] = windows
        elif shift:
            self.shifts[step] = shift
        if self.indexed:
            self.fresh.append(step)

    def drop(self, step: int) -> None:
        """Step ``step`` is no longer held: its segment, if it was placed, is retired now and
        forgotten after the batch (whose pieces may still read it)."""
        segment = self.segments.get(step)
        if segment is not None:
            if self.arena is not None:
                self.arena.retire(segment)
            self._dropped.append(step)

    def forget_dropped(self) -> None:
        for step in self._dropped:
            del self.segments[step]
            self.shifts.pop(step, None)
            self.runs.pop(step, None)
            self._apart.discard(step)
        self._dropped.clear()

    def retire_all(self) -> None:
        """The epoch is over: every segment still placed (``drop_last`` cut the epoch short) hands
        its region back, so the next epoch can take the arena over."""
        if self.arena is not None:
            for segment in self.segments.values():
                self.arena.retire(segment)
        self.segments.clear()

    def pieces(self, batch: ScheduledBatch) -> list[Piece]:
        """``batch``'s samples as pieces of the placed steps' segments."""
        return self._pieces(batch) if isinstance(batch.steps, tuple) else self._run_pieces(batch)

    def _pieces(self, batch: ScheduledBatch) -> list[Piece]:
        """One piece when every step's segment is in the arena (one take for the batch), else one
        per chunk (a segment each)."""
        stride, chunks, steps, shifts = self._stride, batch.chunks, batch.steps, self.shifts
        if self.runs:
            return self._mapped_pieces(batch)
        whole = None if self.arena is None else self.arena.whole
        if whole is not None and len(steps) > 1:
            placed = [self.segments[step] for step in steps]
            if all(segment.base is whole.base for segment in placed):
                firsts = [
                    segment.first + shifts.get(step, 0) for segment, step in zip(placed, steps, strict=True)
                ]
                offsets = np.repeat(np.array(firsts, np.int64), batch.counts)
                return [Piece(whole, np.concatenate(chunks) * stride + offsets)]
        segments = self.segments
        if stride == 1 and not shifts:  # the chunks are the starts (a few pieces a batch)
            return [_new(Piece, (segments[step], chunk)) for chunk, step in zip(chunks, steps, strict=True)]
        pieces = []
        for chunk, step in zip(chunks, steps, strict=True):
            shift = shifts.get(step, 0)
            pieces.append(
                _new(Piece, (segments[step], chunk * stride + shift if stride != 1 or shift else chunk))
            )
        return pieces

    def _mapped_pieces(self, batch: ScheduledBatch) -> list[Piece]:
        """One piece per chunk, some of steps whose rows are mapped (a combed piece of windows)."""
        stride, segments, shifts, runs = self._stride, self.segments, self.shifts, self.runs
        pieces = []
        for step, chunk in batch.drawn():
            windows = runs.get(step)
            starts = chunk * stride
            rows = starts + shifts.get(step, 0) if windows is None else windows.block_rows(starts)
            pieces.append(_new(Piece, (segments[step], rows)))
        return pieces

    def _run_pieces(self, batch: ScheduledBatch) -> list[Piece]:
        """The pieces of a batch drawn in runs: one when its steps' segments are all in the arena
        (row numbers from the step index in a few array operations), else one per chunk."""
        self._index()
        whole = None if self.arena is None else self.arena.whole
        steps = np.asarray(batch.steps)
        if whole is not None and (not self._apart or self._apart.isdisjoint(steps.tolist())):
            starts = self._firsts[steps].repeat(batch.counts)
            starts += batch.samples * self._stride if self._stride != 1 else batch.samples
            return [Piece(whole, starts)]
        return self._mapped_pieces(batch)

    def _index(self) -> None:
        """Where the steps loaded since the last batch start in ``arena.whole`` (see ``firsts``)."""
        whole = None if self.arena is None else self.arena.whole
        for step in self.fresh:
            segment = self.segments.get(step)
            if segment is None:  # loaded and dropped by the batches of a pool of few units
                continue
            if whole is None or segment.base is not whole.base or step in self.runs:
                self._apart.add(step)
                continue
            if step >= len(self._firsts):
                self._firsts = np.concatenate(
                    [self._firsts, np.zeros(max(step + 1, len(self._firsts)), np.int64)]
                )
            self._firsts[step] = segment.first + self.shifts.get(step, 0)
        self.fresh.clear()
