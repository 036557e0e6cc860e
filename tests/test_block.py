"""Block: views remember the block they were cut from; compact copies stand alone."""

from __future__ import annotations

import numpy as np

from ddbloader._io.block import Block


def test_a_view_of_a_view_names_the_rows_of_the_block_it_was_cut_from() -> None:
    block = Block(np.arange(20.0).reshape(10, 2), np.arange(10.0).reshape(10, 1))
    inner = block.view(2, 9).view(3, 5)
    assert inner.origin is block and inner.offset == 5
    assert np.array_equal(inner.x, block.x[5:7]) and np.array_equal(inner.y, block.y[5:7])
    assert block.rows_between(2, 4).origin is None  # a compact copy stands alone
