"""The arena: the rows of a pool's active segments in one pair of arrays, and the pieces drawn from them.

A :class:`Segment` is contiguous rows of one group; a :class:`Piece` some samples of one segment;
the :class:`Arena` holds the segments of the active steps so that a batch drawn from many of
them is one take per tensor. Owned by one assembler thread at a time; not thread-safe.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .._core.config import LoaderConfig
from .._io.block import Block
from .._sql.plan import QueryPlan

__all__ = ["ARENA_MAX_BYTES", "WHOLE_PARTITIONS_POOL", "Arena", "Piece", "Segment", "arena_for"]

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
    draw. A segment that does not fit or finds no free region gets arrays of its own, as without
    an arena. Owned by one assembler thread at a time.
    """

    def __init__(self, region_rows: int, regions: int, *, whole_partitions: bool = True) -> None:
        self.region_rows = region_rows
        self.regions = regions
        self.whole_partitions = whole_partitions
        self._base: Block | None = None
        #: every region as one segment, for pieces that draw from several regions at once
        self.whole: Segment | None = None
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
        if not self._free or rows > self.region_rows:
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
