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
windows. Exact only when the order key alone orders the series (no two rows share a key): the
context is cut by key, and a key shared by rows on both sides of a context's end would make the
rows a window reads depend on the engine's order of ties. The cutter checks that before combing.
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
from .window_rows import WindowRows

__all__ = ["WindowTile", "window_layout"]


@dataclass(frozen=True)
class WindowTile:
    """One tile of a series ranked by its (distinct) order key ``k``, ascending.

    ``low``: its lowest key; ``rows``: how many rows; ``ahead``: the key ``span - 1`` rows after its
    first row (None past the last row); ``behind``: the key ``span - 1`` rows before its first row
    (None before the first row, or where the engine did not say).
    """

    low: Any
    rows: int
    ahead: Any
    behind: Any


def window_layout(
    tiles: Sequence[WindowTile], pieces: int, band: int, span: int, stride: int, *, descending: bool
) -> list[tuple[KeyRanges, int]]:
    """The combed pieces of a series whose order key is distinct, in plan order, each with the
    rows its query returns (stripes and contexts). Pure.

    Args:
        tiles: the series' tiles, ascending by key, no key NULL, and every row's key distinct
            when ``span > 1`` (with ``span == 1`` a tile's ``ahead`` and ``behind`` are its ``low``).
        pieces: how many pieces to cut the rows into (at most one per tile).
        band: how many pieces to comb together at most.
        span: rows a window needs; each stripe carries the ``span - 1`` rows after it in the
            query's order (lower keys when ``descending``).
        stride: rows between the starts of consecutive windows.
        descending: the query orders the key descending.
    """
    total = sum(tile.rows for tile in tiles)
    firsts = np.cumsum([0] + [tile.rows for tile in tiles]).tolist()
    edge = span - 1
    result = []
    for members, owner in band_members([(t.low, t.rows) for t in tiles], pieces, band):
        # rank intervals [a, b) with their keys: the stripes widened by their contexts, merged
        widened: list[list[Any]] = []
        for index in members:
            low, high = firsts[index], firsts[index + 1]
            low_key = None if index == 0 else tiles[index].low
            high_key = None if index + 1 == len(tiles) else tiles[index + 1].low
            if descending and low > 0:
                low, low_key = max(low - edge, 0), (None if low <= edge else tiles[index].behind)
            elif not descending and high < total:
                high, high_key = min(high + edge, total), tiles[index + 1].ahead
            if widened and low <= widened[-1][1]:
                widened[-1][1:4:2] = [high, high_key]
            else:
                widened.append([low, high, low_key, high_key])
        runs = [(low, high - low) for low, high, _, _ in widened]
        starts = [(firsts[i], firsts[i + 1]) for i in members]
        if descending:  # the query's rows run from the highest key: row r is rank total - 1 - r
            runs = [(total - low - rows, rows) for low, rows in reversed(runs)]
            starts = [(total - high, total - low) for low, high in reversed(starts)]
        windows = WindowRows(tuple(runs), tuple(starts), stride)
        ranges = tuple((low_key, high_key) for _, _, low_key, high_key in widened)
        result.append((KeyRanges(ranges, band=owner, windows=windows), sum(rows for _, rows in runs)))
    if descending:
        result.reverse()
    return result
