"""GroupStream: one work unit of a group of several partitions, in emission order.

A :class:`GroupStream` loads its group's partitions in (possibly shuffled) order, at most
``prepartition_num`` at a time, keeps the first and last ``span - 1`` rows of every loaded
partition, and emits each sample at the step that loads the last partition it touches: the
samples of a step are a contiguous index range cut from one contiguous row segment. Which
samples a step emits depends only on the partition order, so the sequence is a pure function of
``(plan, seed, epoch)``, and every sample comes out exactly once.

Owned by the assembler thread; not thread-safe.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Sequence

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._epoch.owed import keep_owed
from .._epoch.shard import WorkUnit
from .._epoch.shuffle import SampleOrders
from .._epoch.units import partition_visits
from .._io.source import PartitionSource
from .._io.threads import Pending
from .._sql.source import Block
from .arena import Arena, Piece, Segment
from .unit_stream import PartitionGauge, Step, UnitStream

__all__ = ["GroupStream"]


class GroupStream(UnitStream):
    """Serves one work unit (a group's contiguous sample range) in emission order.

    Only the partitions that the unit's samples touch are fetched.
    """

    def __init__(
        self,
        unit: WorkUnit,
        config: LoaderConfig,
        geometry: WindowGeometry,
        epoch: int,
        fetcher: PartitionSource,
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

    def _advance(self) -> Step:
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

    def _edge_sides(self, step: Step) -> tuple[bool, bool]:
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

    def _fetched_segment(self, step: Step) -> Segment:
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

    def _load(self, position: int, block: Block) -> Step:
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
        order = keep_owed(self._unit, self._orders.order(samples.start, samples.stop))
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
        return Step(segment, starts, position, first - lo, hi - stop)

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
