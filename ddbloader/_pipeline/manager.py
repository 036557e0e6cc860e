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

import functools
import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._epoch.shard import EvenBatches, WorkUnit, split_units
from .._epoch.shuffle import Purpose, SampleOrders, SourceDraws, visit_order
from .._epoch.units import partition_visits
from .._io.cache import CachedFetcher
from .._io.fetch import Fetcher
from .._io.threads import Pending
from .._sql.plan import QueryPlan
from .._sql.source import Block

__all__ = [
    "Arena",
    "GroupPool",
    "GroupStream",
    "PartitionGauge",
    "PartitionStream",
    "Piece",
    "Segment",
    "arena_for",
    "epoch_units",
]

#: The most bytes (address space; pages are touched as segments are written) an arena reserves.
ARENA_MAX_BYTES = 1 << 30

#: From this many active groups on, a partition without kept rows (no window, or the first one
#: of a unit) is copied into the arena too: a batch draws about one piece per group, and one take
#: for the batch costs less than a take per piece plus visiting each group. Below it, such a
#: partition is served where it is, without the copy.
WHOLE_PARTITIONS_POOL = 8


class Segment:
    """Contiguous rows of one group: x ``[rows, Fx]`` and y ``[rows, Fy]``, row-major. Read-only.

    ``block`` holds them as numpy arrays, ``x_rows`` / ``y_rows`` as tensors sharing that memory.
    The rows are rows ``[first, first + rows)`` of ``base`` (an :class:`Arena`'s arrays, or the
    block the given one is a view of, or the block itself), so that pieces of several segments
    of one base gather in one take.

    Sample windows are cut from these rows at gather time (see :func:`~ddbloader._pipeline.batch.gather`);
    ``window_on_device`` ships them to the device once and cuts the windows there.
    """

    def __init__(self, block: Block, base: Block | None = None, first: int = 0) -> None:
        self.block = block
        if base is None:
            base, first = (block, 0) if block.origin is None else (block.origin, block.offset)
        self.base = base
        self.first = first

    # Made on first use (the device path): a tensor wrapper costs ~8 µs, a segment per small group.
    @functools.cached_property
    def x_rows(self) -> torch.Tensor:
        return torch.from_numpy(self.block.x)

    @functools.cached_property
    def y_rows(self) -> torch.Tensor:
        return torch.from_numpy(self.block.y)


class Arena:
    """The rows of the active segments in one pair of arrays, reused from batch to batch and
    epoch to epoch: a batch drawn from many segments is then one take per tensor, and a new
    segment is written into memory that is already mapped.

    Up to ``regions`` regions of ``region_rows`` rows each, allocated on the first segment (whose
    dtypes and widths they take) and no more than :data:`ARENA_MAX_BYTES` in all. A segment takes
    the lowest free region (so the touched pages stay few); :meth:`retire` hands it back once the
    batch being drawn, whose pieces may still point into it, has been gathered: regions retired
    during one draw are reused from the next :meth:`recycle` on, which the pool calls before each
    draw. A segment that is not fetched, does not fit or finds no free region gets arrays of its
    own, as without an arena. Owned by one assembler thread at a time.
    """

    def __init__(self, region_rows: int, regions: int, *, whole_partitions: bool = True) -> None:
        self.region_rows = region_rows
        self.regions = regions
        self.whole_partitions = whole_partitions
        self._base: Block | None = None
        #: every region as one segment, for pieces that draw from several regions at once
        self.whole: Segment | None = None
        #: per region, the sample order of the step whose segment it holds, as rows of the base
        #: (written once per step, see :class:`_Serving`)
        self.orders: np.ndarray[Any, Any] | None = None
        self._free = list(range(regions))
        self._retired: list[int] = []

    def fits(self, region_rows: int, regions: int, whole_partitions: bool = True) -> bool:
        """Whether this arena, all of it free, can serve a pool that wants these regions."""
        return (
            self.whole_partitions == whole_partitions
            and self.region_rows >= region_rows
            and self.regions >= regions
            and len(self._free) + len(self._retired) == self.regions
        )

    def place(self, blocks: Sequence[Block]) -> Segment:
        """A segment of ``blocks``' rows, concatenated (into a free region when one fits); one
        block stays where it is unless ``whole_partitions``."""
        if len(blocks) == 1 and not self.whole_partitions:
            return Segment(blocks[0])
        rows = sum(b.rows for b in blocks)
        if not self._free or rows > self.region_rows or not all(b.fetched for b in blocks):
            return Segment(Block.concatenate(blocks))
        base = self._base or self._allocate(blocks[0])
        if not all(base.same_layout(b) for b in blocks) or not self._free:
            return Segment(Block.concatenate(blocks))
        first = heapq.heappop(self._free) * self.region_rows
        at = first
        for block in blocks:
            base.write(at, block)
            at += block.rows
        return Segment(base.view(first, at), base, first)

    def _allocate(self, like: Block) -> Block:
        """The arrays, shaped after ``like`` (address space only: pages are mapped when written)."""
        key_bytes = sum(v.itemsize for v in (like.keys or {}).values()) + np.dtype(np.int64).itemsize
        row_bytes = like.x.shape[1] * like.x.itemsize + like.y.shape[1] * like.y.itemsize + key_bytes
        regions = min(self.regions, ARENA_MAX_BYTES // max(self.region_rows * row_bytes, 1))
        self.regions = regions
        self._free = [r for r in self._free if r < regions]
        self._base = like.empty_like(regions * self.region_rows)
        self.orders = np.empty(regions * self.region_rows, np.int64)
        self.whole = Segment(self._base)
        return self._base

    def retire(self, segment: Segment) -> None:
        """``segment`` is no longer drawn from: its region is free after the current batch."""
        if self._base is not None and segment.base is self._base:
            self._retired.append(segment.first // self.region_rows)

    def recycle(self) -> None:
        """The previous batch has been gathered: regions retired before now are free."""
        for region in self._retired:
            heapq.heappush(self._free, region)
        self._retired.clear()


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


@dataclass(slots=True)
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
    #: whether ``starts``, as rows of the segment's base, are in its arena's orders (see :class:`_Serving`)
    ordered: bool = False


class _UnitStream:
    """What a stream of one work unit holds, and how the pool's :class:`_Serving` hands out the
    samples of the step it serves. ``remaining`` counts the unit's samples not yet handed out."""

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
        fetcher: Fetcher | CachedFetcher,
        gauge: PartitionGauge,
        stop: threading.Event,
        orders: SampleOrders,
        arena: Arena | None,
    ) -> None:
        self.group = unit.group
        self.remaining = unit.stop - unit.first
        self._unit = unit
        self._config = config
        self._geometry = geometry
        self._fetcher = fetcher
        self._gauge = gauge
        self._stop = stop
        self._orders = orders
        self._arena = arena
        self._step: _Step | None = None

    def serving(self) -> _Step | None:
        """The step being served, if it still has samples to give."""
        step = self._step
        return step if step is not None and step.served < len(step.starts) else None

    def served_elsewhere(self, count: int) -> None:
        """``count`` more samples of the step being served were handed out by the pool's
        :class:`_Serving` (they were not more than the step had left)."""
        assert self._step is not None
        self._step.served += count
        self.remaining -= count
        if self.remaining == 0:
            self._finish()

    def _finish(self) -> None:
        raise NotImplementedError


class GroupStream(_UnitStream):
    """Serves one work unit (a group's contiguous sample range) in emission order.

    Only the partitions that the unit's samples touch are fetched.
    """

    def __init__(
        self,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        epoch: int,
        fetcher: Fetcher | CachedFetcher,
        gauge: PartitionGauge,
        stop: threading.Event,
        orders: SampleOrders,
        fetching: bool = True,
        arena: Arena | None = None,
    ) -> None:
        super().__init__(unit, config, geometry, fetcher, gauge, stop, orders, arena)
        group = unit.group
        self._bounds = list(itertools.accumulate((p.rows for p in group.partitions), initial=0))
        self._needed = partition_visits(unit, config, geometry, epoch)
        self._to_submit: deque[int] = deque(self._needed)
        self._pending: deque[tuple[int, Pending[Block] | None]] = deque()
        self._edges: dict[int, tuple[Block, Block]] = {}
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
        if not self._to_submit:
            return
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

    def take(self, count: int, pieces: list[Piece]) -> None:
        """Append the next ``count`` samples (``count <= remaining``) to ``pieces``, loading
        partitions as needed."""
        while count > 0:
            step = self._step
            if step is None or step.served == len(step.starts):
                step = self._advance()
            if self._fetching and not step.segment.block.fetched:
                step.segment, step.ordered = self._fetched_segment(step), False
            served = step.served
            chosen = step.starts[served : served + count]
            given = len(chosen)
            step.served = served + given
            count -= given
            self.remaining -= given
            pieces.append(Piece(step.segment, chosen))
        if self.remaining == 0:
            self._finish()

    def _finish(self) -> None:
        """Release everything: the served step, and to the fetcher every partition the unit
        needed (a fetch unit may hold some unclaimed: served from the cache, or passed during a
        fast-forward; a streamed piece's stream ends)."""
        if self._step is not None:
            self._drop_step()
        for _ in self._pending:
            self._gauge.release()
        self._pending.clear()
        self._to_submit.clear()
        self._edges.clear()
        self._early.clear()
        index = self.group.index
        self._fetcher.release([(index, position) for position in self._needed])

    def _advance(self) -> _Step:
        while True:
            if self._step is not None:
                self._drop_step()
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

    def _drop_step(self) -> None:
        assert self._step is not None
        if self._arena is not None:
            self._arena.retire(self._step.segment)
        self._step = None
        self._gauge.release()

    def _segment(self, blocks: Sequence[Block]) -> Segment:
        """``blocks``' rows as one segment, in the arena when there is one."""
        if self._arena is not None:
            return self._arena.place(blocks)
        return Segment(Block.concatenate(blocks))

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
        left = self._gather_edges(step.position, -1, step.left) if reach_left else [block.zeros(step.left)]
        right = (
            self._gather_edges(step.position, +1, step.right) if reach_right else [block.zeros(step.right)]
        )
        return self._segment([*left, block, *right])

    def _load(self, position: int, block: Block) -> _Step:
        first, stop = self._bounds[position], self._bounds[position + 1]
        left: list[Block] = []
        right: list[Block] = []
        if len(self._bounds) > 2:  # a group of one partition has no neighbours' rows to join
            edge = self._geometry.span - 1
            left = self._gather_edges(position, -1, edge)
            right = self._gather_edges(position, +1, edge)
            self._keep_edges(position, block)
        lo = first - sum(b.rows for b in left)
        hi = stop + sum(b.rows for b in right)
        completed = self._geometry.samples_completed_by(first, stop, lo, hi, self.group.samples)
        samples = range(max(completed.start, self._unit.first), min(completed.stop, self._unit.stop))
        order = self._orders.order(samples.start, samples.stop)
        self._steps_taken += 1
        segment = self._segment([*left, block, *right])
        stride = self._geometry.stride
        starts = order * stride - lo
        # the order is a permutation of ``samples``: its first and last starts bound them all
        if samples and (
            samples.start * stride < lo
            or (samples.stop - 1) * stride - lo + self._geometry.span > segment.block.rows
        ):
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
            part = kept.view(kept.rows - take, kept.rows) if direction < 0 else kept.view(0, take)
            pieces.append(part)
            rows -= take
            neighbour += direction
        return pieces[::-1] if direction < 0 else pieces


class PartitionStream(_UnitStream):
    """Serves a work unit of a group of one partition (most small groups): one fetch, one step.

    What :class:`GroupStream` does for such a unit (same fetches, gauge counts, sample orders and
    pieces, in the same order), without the bookkeeping of many partitions and of neighbours'
    kept rows, which cost about as much per small group as serving its samples. Made only while
    the pool fetches: a fast-forward's streams are :class:`GroupStream`\\ s, which can fetch a
    half-served step again when it ends.
    """

    __slots__ = ("_pending", "_submitted")

    def __init__(
        self,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        fetcher: Fetcher | CachedFetcher,
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

    def _load(self) -> _Step:
        if not self._submitted:
            self._submit()
        assert self._pending is not None
        block = self._pending.wait(self._stop, self._config.timeout)
        self._pending = None
        segment = Segment(block) if self._arena is None else self._arena.place((block,))
        unit = self._unit
        order = self._orders.order(unit.first, unit.stop)
        stride = self._geometry.stride
        if (unit.stop - 1) * stride + self._geometry.span > block.rows:
            # the gather copies without bounds checks (see batch.gather): never let a bad row through
            raise RuntimeError(
                f"internal error: group {self.group.index} has samples outside its {block.rows} rows"
            )
        step = self._step = _Step(segment, order * stride if stride != 1 else order, 0, 0, 0)
        return step

    def _finish(self) -> None:
        """Release the step. The partition needs no release to the fetcher: its one submission
        took its rows from the fetcher (see :meth:`~ddbloader._io.fetch.Fetcher.release`)."""
        if self._step is not None:
            if self._arena is not None:
                self._arena.retire(self._step.segment)
            self._step = None
            self._gauge.release()


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

    def __init__(self, steps: Sequence[_Step], orders: np.ndarray[Any, Any]) -> None:
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
        fetcher: Fetcher | CachedFetcher,
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


def arena_for(plan: QueryPlan, config: LoaderConfig, given: Arena | None) -> Arena:
    """``given`` if it can hold the segments of a pool of the plan's units, else a new arena: a
    region per active unit and as many again for the units that move on to their next segment
    during one batch's draw, plus one; a region holds the plan's largest partition with kept
    rows on both sides (the same every epoch, whichever groups a shard serves)."""
    region_rows = plan.largest_partition_rows + 2 * (plan.geometry.span - 1)
    regions = 2 * config.group_pool_size + 1
    whole = config.group_pool_size >= WHOLE_PARTITIONS_POOL
    if given is not None and given.fits(region_rows, regions, whole):
        return given
    return Arena(region_rows, regions, whole_partitions=whole)


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
    groups = plan.groups
    return split_units(
        [groups[i] for i in order.tolist()], rank, world_size, worker, num_workers, even_batches
    )
