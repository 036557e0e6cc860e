"""The arena's regions: reused only after the batch that drew from them, and segments that do not fit."""

from __future__ import annotations

import numpy as np

from ddbloader._io.block import Block
from ddbloader._pipeline.arena import Arena


def test_arena_reuses_a_region_only_after_the_batch_that_drew_from_it() -> None:
    rows = Block(np.arange(12.0).reshape(6, 2), np.arange(6.0).reshape(6, 1))
    arena = Arena(region_rows=6, regions=2)
    first = arena.place([rows.rows_between(0, 3), rows.rows_between(3, 6)])
    assert first.base is not first.block and first.block.x.tolist() == rows.x.tolist()
    second = arena.place([rows])
    assert arena.place([rows]).base is rows  # no region left: the rows as they are
    arena.retire(first)
    assert arena.place([rows]).base is rows  # retired, but not free before the next draw
    arena.recycle()
    reused = arena.place([rows])
    assert reused.base is first.base and reused.first == first.first
    assert arena.place([rows, rows]).base is not second.base  # more rows than a region
    assert Arena(6, 2, whole_partitions=False).place([rows]).block is rows  # served where it is
