"""GroupPool: the ``group_pool_size`` active work units of an epoch, and each batch's draw.

The pool opens the epoch's units in order, spends the partition budget (``group_pool_size ×
prepartition_num``) on their fetches, and draws each batch's samples from the active units
(uniformly per sample with shuffle, one unit after another without). Owned by the assembler
thread; not thread-safe.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._epoch.shard import WorkUnit
from .._epoch.shuffle import SampleOrders, SourceDraws
from .._io.source import PartitionSource
from .arena import Arena, Piece
from .group_stream import GroupStream
from .unit_stream import PartitionGauge, PartitionStream, Step

__all__ = ["GroupPool", "Stream"]

#: A stream of one work unit, as the pool draws from it.
Stream = GroupStream | PartitionStream


class _Serving:
    """The active streams' steps being served, as arrays over one arena: a batch whose draws each
    step can give in full becomes one piece of arena rows, without visiting the streams.

    What it hands out is written back to the streams by :meth:`settle` (before any stream is
    visited again), so they serve the same samples in the same order as if visited one by one.

    Each step's sample order lies in the arena's ``orders`` at its region (position
    ``segment.first``, written once per step), so a batch's draw from any number of steps is a
    few array operations, not a slice per step.
    """

    def __init__(self, steps: Sequence[Step], orders: np.ndarray[Any, Any]) -> None:
        self._orders = orders
        self._next = np.array([step.segment.first + step.served for step in steps], dtype=np.int64)
        self._left = np.array([len(step.starts) - step.served for step in steps], dtype=np.int64)
        self._given = np.zeros(len(steps), dtype=np.int64)

    @staticmethod
    def of(streams: Sequence[Stream], arena: Arena) -> _Serving | None:
        """The streams' steps, if every one is in ``arena`` (else None: visit the streams)."""
        whole, orders = arena.whole, arena.orders
        if whole is None or orders is None:
            return None
        steps = []
        for stream in streams:
            step = stream.serving()
            if step is None or step.segment.base is not whole.base:
                return None
            steps.append(step)
        for step in steps:
            if not step.ordered:
                first = step.segment.first
                orders[first : first + len(step.starts)] = step.starts + first
                step.ordered = True
        return _Serving(steps, orders)

    def serve(self, counts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """The arena rows of the next ``counts[k]`` samples of each step ``k``, in stream order;
        None (and nothing served) when a step has fewer left."""
        if (counts > self._left).any():
            return None
        drawn = np.flatnonzero(counts)
        taken = counts[drawn]
        firsts = self._next[drawn]
        rows: np.ndarray[Any, Any]
        if len(drawn) == 1:
            first = int(firsts[0])
            rows = self._orders[first : first + int(taken[0])].copy()
        else:
            ends = np.cumsum(taken)
            # the batch's j-th sample is its step's next sample number j - (where that step's run begins)
            rows = self._orders[np.repeat(firsts - (ends - taken), taken) + np.arange(int(ends[-1]))]
        self._next += counts
        self._left -= counts
        self._given += counts
        return rows

    @property
    def exhausted(self) -> bool:
        """Whether some step has nothing left (its stream must move on, or finish, by itself)."""
        return bool((self._left == 0).any())

    def settle(self, streams: Sequence[Stream]) -> None:
        """Tell each stream what was handed out on its behalf."""
        for k in np.flatnonzero(self._given).tolist():
            streams[k].served_elsewhere(int(self._given[k]))
        self._given[:] = 0


class GroupPool:
    """The ``group_pool_size`` active work units of an epoch, and the draw of each batch's samples.

    Units enter in the given order (the epoch's group order, see :func:`epoch_units`). Without
    shuffle they are served one after another (the pool only prefetches the next ones); with
    shuffle each sample of a batch comes from a uniformly drawn active unit.

    With ``fetching=False`` the pool fast-forwards: it draws the same samples from row counts
    alone, fetching nothing, and its pieces have no data (they are for skipping, not gathering).
    :meth:`start_fetching` ends the fast-forward; the partitions the rest of the epoch needs are
    then fetched, including, once each, the neighbours of a partition loaded during the
    fast-forward whose edge rows a window still needs.
    """

    def __init__(
        self,
        units: Sequence[WorkUnit],
        geometry: WindowGeometry,
        config: LoaderConfig,
        epoch: int,
        fetcher: PartitionSource,
        stop: threading.Event,
        *,
        fetching: bool = True,
        arena: Arena | None = None,
    ) -> None:
        self.gauge = PartitionGauge()
        self.arena = arena
        self._config = config
        self._budget = config.group_pool_size * config.prepartition_num
        self._waiting = deque(u for u in units if u.samples > 0)
        self._active: list[Stream] = []
        self._ahead: Stream | None = None
        self._draws = SourceDraws(config.seed, epoch, pool=config.group_pool_size)
        orders = SampleOrders(config.shuffle, config.seed, epoch)
        self._fetching = fetching
        self._serving: _Serving | None = None
        self._topped_up_at = -1
        self._make: Callable[[WorkUnit], Stream] = lambda unit: (
            PartitionStream(unit, config, geometry, fetcher, self.gauge, stop, orders, self.arena)
            if self._fetching and len(unit.group.partitions) == 1
            else GroupStream(
                unit, config, geometry, epoch, fetcher, self.gauge, stop, orders, self._fetching, self.arena
            )
        )

    def start_fetching(self) -> None:
        """End the fast-forward (see the class docstring)."""
        self._fetching = True
        every = [*self._active, *([self._ahead] if self._ahead else [])]
        streams = [stream for stream in every if isinstance(stream, GroupStream)]
        # made during the fast-forward, so none is a PartitionStream
        assert len(streams) == len(every)
        for stream in streams:
            stream.submit_rebuild()
        for stream in streams:
            stream.start_fetching()

    def take(self, count: int) -> list[Piece]:
        """The next ``count`` samples of the epoch; ``count`` must not exceed what is left.

        With shuffle, each of the ``count`` samples goes to the slot ``floor(u * active)`` of a
        pool draw (:class:`~ddbloader._epoch.shuffle.SourceDraws`), and each slot serves its share from
        its unit; a unit that runs out hands its slot, and the rest of its share, to the next
        waiting unit. Only once no unit waits does a slot close, and the shares it could not
        serve are drawn again among the slots left. With every active step in the arena, a batch
        whose shares the steps can give in full is one piece (see :class:`_Serving`); otherwise
        each unit gives its own. Without shuffle the units are served one after another.
        """
        if self.arena is not None:
            self.arena.recycle()
        pieces: list[Piece] = []
        while count > 0:
            if len(self._active) < self._config.group_pool_size:
                self._open()
            if not self._active:
                raise RuntimeError(f"the epoch ran out of samples with {count} still owed")
            if not self._config.shuffle:
                stream = self._active[0]
                give = min(count, stream.remaining)
                stream.take(give, pieces)
                count -= give
                if stream.remaining == 0:
                    del self._active[0]
                continue
            wanted = self._draws.counts(len(self._active), count)
            rows = self._serve(wanted)
            if rows is not None:
                assert self.arena is not None and self.arena.whole is not None
                pieces.append(Piece(self.arena.whole, rows))
                count -= len(rows)
                continue
            self._settle()
            count -= self._serve_shares(wanted.tolist(), pieces)
        if self.gauge.held < self._budget and self.gauge.held != self._topped_up_at:
            self._top_up()
        return pieces

    def _serve_shares(self, wanted: list[int], pieces: list[Piece]) -> int:
        """Serve ``wanted[k]`` samples from slot ``k``, in slot order, passing the slot of a unit
        that runs out to the next unit; the samples served (fewer only once no unit waits)."""
        served = 0
        for slot, share in enumerate(wanted):
            left = share
            while left:
                stream = self._active[slot]
                give = min(left, stream.remaining)
                stream.take(give, pieces)
                served += give
                left -= give
                if stream.remaining == 0 and not self._pass_on(slot):
                    break
        self._close_finished()
        return served

    def _pass_on(self, slot: int) -> bool:
        """Hand the slot of a finished unit to the next unit; False when none waits (the
        finished unit stays there until :meth:`_close_finished`, so slots keep their places)."""
        following = self._following()
        if following is not None:
            self._active[slot] = following
        return following is not None

    def _close_finished(self) -> None:
        """Close the slots whose units finished with no unit waiting to take them."""
        if any(stream.remaining == 0 for stream in self._active):
            self._active = [stream for stream in self._active if stream.remaining > 0]

    def _following(self) -> Stream | None:
        """The next unit's stream (the one opened ahead first), or None when no unit waits."""
        if self._ahead is not None:
            following, self._ahead = self._ahead, None
            return following
        return self._make(self._waiting.popleft()) if self._waiting else None

    def _serve(self, wanted: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """``wanted``'s samples as arena rows from the active steps, or None (see :meth:`take`)."""
        if self.arena is None:
            return None
        if self._serving is None:
            self._serving = _Serving.of(self._active, self.arena)
            if self._serving is None:
                return None
        rows = self._serving.serve(wanted)
        if rows is not None and self._serving.exhausted:
            # a stream moves on or finishes when next visited; a finished one passes its slot on now
            self._settle()
            for slot, stream in enumerate(self._active):
                if stream.remaining == 0:
                    self._pass_on(slot)
            self._close_finished()
        return rows

    def _settle(self) -> None:
        if self._serving is not None:
            self._serving.settle(self._active)
            self._serving = None

    def _open(self) -> None:
        """Fill the pool from the waiting units (the one opened ahead first), then queue fetches."""
        self._settle()
        while len(self._active) < self._config.group_pool_size and (following := self._following()):
            self._active.append(following)
        self._top_up()

    def _top_up(self) -> None:
        """Spend the partition budget (``group_pool_size × prepartition_num``): the active units'
        next partitions first, then the first partitions of the next waiting unit, so that its
        first batch does not wait for a fetch when it enters the pool. The budget frees up as
        active units run out of partitions to queue, near their ends."""
        for stream in self._active:
            stream.top_up(self._budget - self.gauge.held)
        room = self._budget - self.gauge.held
        if room > 0 and self._ahead is None and self._waiting:
            self._ahead = self._make(self._waiting.popleft())
        if room > 0 and self._ahead is not None:
            self._ahead.top_up(room)
        # until a partition is released, topping up again would find nothing to queue
        self._topped_up_at = self.gauge.held
