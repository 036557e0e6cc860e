"""DataManager: one group's samples in emission order, and the pool of active groups.

A :class:`GroupStream` loads its group's partitions in (possibly shuffled) order, at most
``prepartition_num`` at a time, keeps the first and last ``span - 1`` rows of every loaded
partition, and emits each sample at the step that loads the last partition it touches: the
samples of a step are a contiguous index range cut from one contiguous row segment. Which
samples a step emits depends only on the partition order, so the sequence is a pure function of
``(plan, seed, epoch)``, and every sample comes out exactly once.

Both classes are owned by the assembler thread and are not thread-safe.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from .config import LoaderConfig
from .fetch import Fetcher
from .plan import QueryPlan
from .prefetch import Pending
from .shard import EvenBatches, WorkUnit, split_units
from .shuffle import Purpose, SourceDraws, sample_order, visit_order
from .source import Block
from .units import partition_visits
from .window import WindowGeometry

__all__ = ["GroupPool", "GroupStream", "PartitionGauge", "Piece", "Segment", "epoch_units"]


class Segment:
    """Contiguous rows of one group: x ``[rows, Fx]`` and y ``[rows, Fy]``, row-major. Read-only.

    ``block`` holds them as numpy arrays, ``x_rows`` / ``y_rows`` as tensors sharing that memory.

    Sample windows are cut from these rows at gather time (see :func:`~ddbloader.batch.gather`);
    ``window_on_device`` ships them to the device once and cuts the windows there.
    """

    def __init__(self, block: Block) -> None:
        self.block = block
        self.x_rows = torch.from_numpy(block.x)
        self.y_rows = torch.from_numpy(block.y)


class Piece(NamedTuple):
    """Some samples of one segment: ``starts`` are their first x rows within the segment."""

    segment: Segment
    starts: np.ndarray[Any, Any]


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


@dataclass
class _Step:
    """One loaded partition's samples: ``starts`` are their first x rows within ``segment``,
    in emission order; ``served`` of them have been handed out. ``segment`` is partition
    ``position`` with ``left`` kept rows of its loaded neighbours before it and ``right`` after."""

    segment: Segment
    starts: np.ndarray[Any, Any]
    position: int
    left: int
    right: int
    served: int = 0


class GroupStream:
    """Serves one work unit (a group's contiguous sample range) in emission order.

    Only the partitions that the unit's samples touch are fetched.
    """

    def __init__(
        self,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        epoch: int,
        fetcher: Fetcher,
        gauge: PartitionGauge,
        stop: threading.Event,
        fetching: bool = True,
    ) -> None:
        group = unit.group
        self.group = group
        self.remaining = unit.samples
        self._unit = unit
        self._config = config
        self._geometry = geometry
        self._epoch = epoch
        self._fetcher = fetcher
        self._gauge = gauge
        self._stop = stop
        self._bounds = np.concatenate([[0], np.cumsum([p.rows for p in group.partitions])]).tolist()
        self._to_submit: deque[int] = deque(partition_visits(unit, config, geometry, epoch))
        self._needed = tuple(self._to_submit)
        self._pending: deque[tuple[int, Pending[Block] | None]] = deque()
        self._edges: dict[int, tuple[Block, Block]] = {}
        self._step: _Step | None = None
        self._steps_taken = 0
        self._fetching = fetching
        self._early: dict[int, Pending[Block]] = {}

    def submit_rebuild(self) -> None:
        """After a fast-forward, queue first what the step being served needs: its partition and
        the neighbours whose kept rows its remaining samples reach (fetched and awaited together
        when the step is next served, see :meth:`take`)."""
        step = self._step
        if step is None or step.segment.block.fetched or step.served == len(step.starts):
            return
        left, right = self._edge_sides(step)
        needed = [step.position]
        if left:
            needed += self._neighbours(step.position, -1, step.left)
        if right:
            needed += self._neighbours(step.position, +1, step.right)
        for position in needed:
            if position == step.position or not self._edges[position][0].fetched:
                self._early[position] = self._fetcher.submit(self.group.partitions[position])

    def start_fetching(self) -> None:
        """End a fast-forward: fetch what is queued (after :meth:`submit_rebuild`'s fetches), and
        the edge rows of neighbours loaded during the fast-forward when a window needs them."""
        self._fetching = True
        self._pending = deque(
            (position, self._fetcher.submit(self.group.partitions[position]) if pending is None else pending)
            for position, pending in self._pending
        )

    @property
    def held(self) -> int:
        """Partitions this stream holds: queued or in flight, plus the one being served."""
        return len(self._pending) + (self._step is not None)

    def top_up(self, room: int) -> None:
        """Queue up to ``room`` more fetches, never holding more than ``prepartition_num``
        partitions. A new stream queues nothing until asked."""
        for _ in range(room):
            if self.held >= self._config.prepartition_num or not self._to_submit:
                return
            self._submit_next()

    def _submit_next(self) -> None:
        if self._to_submit:
            position = self._to_submit.popleft()
            self._gauge.acquire()
            spec = self.group.partitions[position]
            self._pending.append((position, self._fetcher.submit(spec) if self._fetching else None))

    def take(self, count: int) -> list[Piece]:
        """The next ``count`` samples (``count <= remaining``), loading partitions as needed."""
        pieces: list[Piece] = []
        while count > 0:
            step = self._step
            if step is None or step.served == len(step.starts):
                step = self._advance()
            if self._fetching and not step.segment.block.fetched:
                step.segment = self._fetched_segment(step)
            chosen = step.starts[step.served : step.served + count]
            step.served += len(chosen)
            count -= len(chosen)
            self.remaining -= len(chosen)
            pieces.append(Piece(step.segment, chosen))
        if self.remaining == 0:
            self._finish()
        return pieces

    def _finish(self) -> None:
        """Release everything: the served step and partitions no remaining sample needs."""
        if self._step is not None:
            self._step = None
            self._gauge.release()
        for _ in self._pending:
            self._gauge.release()
        self._pending.clear()
        self._to_submit.clear()
        self._edges.clear()
        self._early.clear()
        self._fetcher.release((self.group.index, position) for position in self._needed)

    def _advance(self) -> _Step:
        while True:
            if self._step is not None:
                self._step = None
                self._gauge.release()
                self._submit_next()
            if not self._pending:
                self._submit_next()
            if not self._pending:
                raise RuntimeError(
                    f"group {self.group.index} ran out of partitions with {self.remaining} samples owed"
                )
            position, pending = self._pending.popleft()
            if pending is None:
                block = Block.unfetched(self._bounds[position + 1] - self._bounds[position])
            else:
                block = pending.wait(self._stop, self._config.timeout)
            step = self._load(position, block)
            self._step = step
            if len(step.starts):
                return step

    def _fetch_now(self, position: int) -> Block:
        """Partition ``position``'s rows, awaited now (after a fast-forward); fetched now unless
        :meth:`submit_rebuild` queued it already."""
        pending = self._early.pop(position, None) or self._fetcher.submit(self.group.partitions[position])
        return pending.wait(self._stop, self._config.timeout)

    def _edge_sides(self, step: _Step) -> tuple[bool, bool]:
        """Whether the step's remaining samples reach into its left / right edge rows."""
        rest = step.starts[step.served :]
        own_rows = self._bounds[step.position + 1] - self._bounds[step.position]
        reach_left = step.left > 0 and int(rest.min()) < step.left
        reach_right = step.right > 0 and int(rest.max()) + self._geometry.span > step.left + own_rows
        return reach_left, reach_right

    def _neighbours(self, position: int, direction: int, rows: int) -> list[int]:
        """The loaded neighbours whose kept rows an edge walk of ``rows`` rows visits."""
        visited = []
        neighbour = position + direction
        while rows > 0 and neighbour in self._edges:
            head, tail = self._edges[neighbour]
            rows -= min(rows, (tail if direction < 0 else head).rows)
            visited.append(neighbour)
            neighbour += direction
        return visited

    def _keep_edges(self, position: int, block: Block) -> None:
        keep = min(self._geometry.span - 1, block.rows)
        self._edges[position] = (
            block.rows_between(0, keep),
            block.rows_between(block.rows - keep, block.rows),
        )

    def _fetched_segment(self, step: _Step) -> Segment:
        """The data of a step loaded during a fast-forward: its partition and the same edge rows.

        Edge rows that no remaining sample of the step reaches are zeros, not fetched (they only
        keep the segment's row numbering)."""
        block = self._fetch_now(step.position)
        self._keep_edges(step.position, block)
        reach_left, reach_right = self._edge_sides(step)
        left = self._gather_edges(step.position, -1, step.left) if reach_left else [_zeros(block, step.left)]
        right = (
            self._gather_edges(step.position, +1, step.right) if reach_right else [_zeros(block, step.right)]
        )
        return Segment(Block.concatenate([*left, block, *right]))

    def _load(self, position: int, block: Block) -> _Step:
        edge = self._geometry.span - 1
        first, stop = self._bounds[position], self._bounds[position + 1]
        left = self._gather_edges(position, -1, edge)
        right = self._gather_edges(position, +1, edge)
        lo = first - sum(b.rows for b in left)
        hi = stop + sum(b.rows for b in right)
        self._keep_edges(position, block)
        completed = self._geometry.samples_completed_by(first, stop, lo, hi, self.group.samples)
        samples = range(max(completed.start, self._unit.first), min(completed.stop, self._unit.stop))
        order = sample_order(
            samples.start,
            samples.stop,
            self._config.shuffle,
            self._config.seed,
            self._epoch,
            self.group.index,
            self._steps_taken,
        )
        self._steps_taken += 1
        segment = Segment(Block.concatenate([*left, block, *right]))
        starts = order * self._geometry.stride - lo
        if len(starts) and (starts.min() < 0 or starts.max() + self._geometry.span > segment.block.rows):
            # the gather copies without bounds checks (see batch.gather): never let a bad row through
            raise RuntimeError(
                f"internal error: group {self.group.index} step {self._steps_taken - 1} has samples "
                f"outside its {segment.block.rows} rows"
            )
        return _Step(segment, starts, position, first - lo, hi - stop)

    def _gather_edges(self, position: int, direction: int, rows: int) -> list[Block]:
        """Up to ``rows`` kept rows of the loaded neighbours on one side, in row order."""
        pieces: list[Block] = []
        neighbour = position + direction
        while rows > 0 and neighbour in self._edges:
            head, tail = self._edges[neighbour]
            if self._fetching and not head.fetched:
                self._keep_edges(neighbour, self._fetch_now(neighbour))
                head, tail = self._edges[neighbour]
            kept = tail if direction < 0 else head
            take = min(rows, kept.rows)
            part = (
                Block(kept.x[kept.rows - take :], kept.y[kept.rows - take :], kept.fetched)
                if direction < 0
                else Block(kept.x[:take], kept.y[:take], kept.fetched)
            )
            pieces.append(part)
            rows -= take
            neighbour += direction
        return pieces[::-1] if direction < 0 else pieces


def _zeros(like: Block, rows: int) -> Block:
    return Block(
        np.zeros((rows, like.x.shape[1]), like.x.dtype), np.zeros((rows, like.y.shape[1]), like.y.dtype)
    )


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
        fetcher: Fetcher,
        stop: threading.Event,
        *,
        fetching: bool = True,
    ) -> None:
        self.gauge = PartitionGauge()
        self._config = config
        self._budget = config.group_pool_size * config.prepartition_num
        self._waiting = deque(u for u in units if u.samples > 0)
        self._active: list[GroupStream] = []
        self._ahead: GroupStream | None = None
        self._draws = SourceDraws(config.seed, epoch)
        self._fetching = fetching
        self._make: Callable[[WorkUnit], GroupStream] = lambda unit: GroupStream(
            unit, config, geometry, epoch, fetcher, self.gauge, stop, self._fetching
        )

    def start_fetching(self) -> None:
        """End the fast-forward (see the class docstring)."""
        self._fetching = True
        streams = [*self._active, *([self._ahead] if self._ahead else [])]
        for stream in streams:
            stream.submit_rebuild()
        for stream in streams:
            stream.start_fetching()

    def take(self, count: int) -> list[Piece]:
        """The next ``count`` samples of the epoch; ``count`` must not exceed what is left."""
        pieces: list[Piece] = []
        while count > 0:
            if len(self._active) < self._config.group_pool_size:
                self._open()
            if not self._active:
                raise RuntimeError(f"the epoch ran out of samples with {count} still owed")
            if self._config.shuffle:
                wanted = self._draws.counts(len(self._active), count)
            else:
                wanted = [count] + [0] * (len(self._active) - 1)
            for stream, want in zip(self._active, wanted, strict=True):
                give = min(want, stream.remaining)
                if give:
                    pieces.extend(stream.take(give))
                    count -= give
            self._active = [s for s in self._active if s.remaining > 0]
        if self.gauge.held < self._budget:
            self._top_up()
        return pieces

    def _open(self) -> None:
        """Fill the pool from the waiting units (the one opened ahead first), then queue fetches."""
        while len(self._active) < self._config.group_pool_size and (self._ahead or self._waiting):
            if self._ahead is not None:
                self._active.append(self._ahead)
                self._ahead = None
            else:
                self._active.append(self._make(self._waiting.popleft()))
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


def epoch_units(
    plan: QueryPlan,
    config: LoaderConfig,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    even_batches: EvenBatches = "pad",
) -> list[WorkUnit]:
    """The work units one (rank, worker) serves in ``epoch``, in the epoch's group order."""
    order = visit_order(len(plan.groups), config.shuffle, config.seed, epoch, Purpose.GROUP_ORDER)
    return split_units(
        [plan.groups[int(i)] for i in order], rank, world_size, worker, num_workers, even_batches
    )
