"""Combed pieces of a windowed series: stripes that carry the rows their windows run into.

A long series cut into contiguous range pieces is served a piece at a time, so a batch holds
windows of one stretch of it. Combed like rows without windows (see :mod:`ddbloader._sql.pieces`),
each piece holds :data:`~ddbloader._sql.pieces.COMB_STRIPES` stripes spread over its band; a
window starting near a stripe's end runs into rows of the next stripe, which belongs to another
piece. So each stripe carries, as *context*, the ``span - 1`` rows that follow it in the query's
order: its windows start only in the stripe's own rows and end at the latest in its context, so
each window of the series belongs to exactly one piece and is read whole by that piece's query,
and a piece needs nothing from its neighbours (any visit order serves every window once).

Where the rows sit: a piece's query reads the key ranges of its stripes widened by their contexts
(merged where they touch); its rows in the query's order are *runs* of consecutive rows of the
series, and :class:`WindowRows` says where each run starts in the series and which rows start
windows. Exact only when the ORDER BY tuple orders the series totally (no two rows share it): the
context is cut by tuple, and a tuple shared by rows on both sides of a context's end would make
the rows a window reads depend on the engine's order of ties. The cutter checks that before combing.
Samples of one row taken every ``stride > 1`` rows are combed this way too, with no context (so
ties do not matter): rows combed as rows are numbered piece after piece, which is the series'
numbering only when every row is a sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .pieces import KeyRanges, band_members
from .tuple_order import Point
from .window_rows import WindowRows

__all__ = ["WindowTile", "window_layout"]


@dataclass(frozen=True)
class WindowTile:
    """One tile of a series ranked by its ORDER BY tuple (every row's distinct), in the query's order.

    ``low``: its first row's tuple; ``rows``: how many rows; ``ahead``: the tuple ``span - 1``
    rows after its first row (unused where that is past the last row, whatever the engine
    returned there: ClickHouse's LEAD gives a default value, not NULL).
    """

    low: Point
    rows: int
    ahead: Point


def window_layout(
    tiles: Sequence[WindowTile], nullable: tuple[bool, ...], pieces: int, band: int, span: int, stride: int
) -> list[tuple[KeyRanges, int]]:
    """The combed pieces of a series whose ORDER BY tuples are distinct, in plan order, each with
    the rows its query returns (stripes and contexts). Pure.

    Args:
        tiles: the series' tiles, in the query's order, every row's tuple distinct when
            ``span > 1`` (with ``span == 1`` a tile's ``ahead`` is its ``low``).
        nullable: per ORDER BY term, whether the series holds a NULL there.
        pieces: how many pieces to cut the rows into (at most one per tile).
        band: how many pieces to comb together at most.
        span: rows a window needs; each stripe carries the ``span - 1`` rows after it in the
            query's order.
        stride: rows between the starts of consecutive windows.
    """
    total = sum(tile.rows for tile in tiles)
    firsts = np.cumsum([0] + [tile.rows for tile in tiles]).tolist()
    edge = span - 1
    result = []
    for members, owner in band_members([(t.low, t.rows) for t in tiles], pieces, band):
        # row intervals [a, b) with their tuples: the stripes widened by their contexts, merged
        widened: list[list[Any]] = []
        for index in members:
            low, high = firsts[index], firsts[index + 1]
            low_key = None if index == 0 else tiles[index].low
            high_key = None if index + 1 == len(tiles) else tiles[index + 1].low
            if high < total:
                high = min(high + edge, total)
                high_key = None if high == total else tiles[index + 1].ahead
            if widened and low <= widened[-1][1]:
                widened[-1][1:4:2] = [high, high_key]
            else:
                widened.append([low, high, low_key, high_key])
        runs = tuple((low, high - low) for low, high, _, _ in widened)
        starts = tuple((firsts[i], firsts[i + 1]) for i in members)
        windows = WindowRows(runs, starts, stride)
        ranges = tuple((low_key, high_key) for _, _, low_key, high_key in widened)
        result.append(
            (KeyRanges(ranges, nullable, band=owner, windows=windows), sum(rows for _, rows in runs))
        )
    return result
