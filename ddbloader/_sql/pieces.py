"""Range pieces: a partition too big for ``fetch_bytes``, cut at planning by its order key.

With ``shuffle=True`` a subquery whose planned bytes exceed ``fetch_bytes`` would otherwise be
read by one query in consecutive pieces (:mod:`ddbloader._io.streams`), front to back: one big
table's epoch would walk it in row order. Instead planning cuts it into *range pieces*, each the
rows whose ORDER BY tuple falls in some ranges ``a <= (k1, k2, ...) < b`` (lexicographic, each
term by its own direction and NULL placement), each read by a query of its own, so the plan
holds them as partitions of their group and the epoch visits them in a random order like
repartitions (windows continue across consecutive pieces through the kept edge rows, as across
repartitions).

How the ranges are found: a query ranks the subquery's rows by the query's own ORDER BY (the
engine's order, ties, NULLs, NaN and all) and cuts the ranks into *tiles*, each starting at its
first row's tuple, with its exact row count (:mod:`ddbloader._sql.range_cutter`); the pieces are
made of tiles.

Two layouts (:func:`layout`):

* *contiguous* (windows, ``span > 1``, where they cannot be combed): each piece is one range of
  consecutive tiles, the pieces in the query's order, so the rows
  of the pieces in plan order are the subquery's rows in its order, and windows straddle pieces
  as they straddle partitions.
* *combed* (one row per sample): within a *band* of at most :data:`COMB_BAND` pieces' rows,
  each pass of ``pieces`` consecutive tiles gives one tile to every piece, the deal rotated
  from pass to pass, so each piece holds :data:`COMB_STRIPES` thin ranges evenly spread over
  the band with its mean position at the band's middle: one piece's batches mix the whole band,
  where a contiguous piece would hold a few thousand neighbouring rows, and no piece leans to
  one end (so the order the pieces are visited makes no trend in the batches' mean position).
  The cost: each piece's query reads its band (the rows of up to :data:`COMB_BAND` pieces) to
  find its stripes. Windows are combed too where that is
  exact, each stripe widened by the rows its windows run into (:mod:`ddbloader._sql.window_pieces`).

Invariants (checked by the tests without an engine): the tiles' ranges are disjoint and cover
every tuple, each tile is in exactly one piece, a piece's row count is the sum of its tiles',
so the pieces cover the subquery's rows exactly once. Where the engine's comparisons agree with
its ORDER BY; so the cutter counts every piece's predicate at planning, and an engine that
disagrees (NaN, -0.0 and 0.0 on some) is not cut. Each piece's count is checked again when it is
read (the stream refuses a piece whose rows differ from the plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from .tuple_order import Point, Term, bound_count, compare, search
from .window_rows import WindowRows

__all__ = [
    "COMB_BAND",
    "COMB_STRIPES",
    "CONTIGUOUS_TILES",
    "KeyRanges",
    "band_members",
    "combed_count",
    "layout",
]

#: Thin ranges per combed piece: a batch drawn from one piece holds rows from this many places
#: of its band (32 stripes put every 100,000-row block of a 2M-row table in each batch).
COMB_STRIPES = 32
#: Pieces combed together at most: a piece's query reads the rows of its band (this many pieces'
#: worth) to find its own, so an epoch reads each row of a combed subquery up to this many times.
COMB_BAND = 64
#: Tiles per contiguous piece: finer tiles keep the pieces near equal when keys repeat.
CONTIGUOUS_TILES = 8

#: ``(low, high)``: the rows at or after ``low`` and before ``high`` in the query's order; None
#: is unbounded on that side.
Range = tuple[Point | None, Point | None]


@dataclass(frozen=True)
class KeyRanges:
    """The rows of one range piece: those whose ORDER BY tuple lies in one of ``spans``.

    Ranges compare rows lexicographically by the whole tuple of ORDER BY terms, each term by its
    direction and NULL placement, as the query orders them (see :func:`predicate`).

    Invariants: ``spans`` disjoint, in the query's order, and never adjacent.
    """

    spans: tuple[Range, ...]
    #: Per term, whether the subquery held a NULL there when it was cut: the predicate tests for
    #: NULL only where one may be (a row added later shows at the fetch, by its count).
    nullable: tuple[bool, ...]
    #: A combed piece's band (its subquery's pieces combed together share one); None if contiguous.
    band: int | None = None
    #: ``(result column, descending)`` when the piece's query has no ORDER BY and its reader puts
    #: the rows in the query's order by that column (see :meth:`in_order`); None: the engine sorts.
    sort: tuple[int, bool] | None = None
    #: A combed piece of a windowed series: where its rows lie in the series and which start
    #: windows (see :mod:`ddbloader._sql.window_pieces`); None for every other piece.
    windows: WindowRows | None = None
    #: Where the piece's rows lie in its subquery, in the query's order: ``(first row, rows)`` per
    #: range, as the planning query ranked them (what ``stats()`` places each sample by).
    runs: tuple[tuple[int, int], ...] = ()

    def in_order(self, table: pa.Table) -> pa.Table:
        """``table`` (this piece's rows, as its query returned them) in the query's order: as it
        is without :attr:`sort`; else stably sorted by the :attr:`sort` column, which is then the
        query's whole order over the piece (its only ORDER BY term, of an integer, date or
        timestamp type whose order Arrow's equals, and never NULL in the subquery), so equal
        keys stay in the engine's order as an ORDER BY leaves them in the engine's. Costs one
        pass over the key when the rows came sorted (DuckDB's scan of a table stored in key
        order), a sort and a gather otherwise."""
        if self.sort is None or table.num_rows < 2:
            return table
        column, descending = self.sort
        keys = table.column(column).combine_chunks()
        values = np.asarray(keys.to_numpy(zero_copy_only=False))
        later, earlier = values[1:], values[:-1]
        if bool(np.all(later <= earlier) if descending else np.all(later >= earlier)):
            return table
        order = pc.array_sort_indices(keys, order="descending" if descending else "ascending")
        return table.take(order)

    def points(self) -> tuple[Point, ...]:
        """The ranges' ends in the query's order, without the unbounded ones (strictly in order:
        ranges are disjoint and never adjacent, adjacent tiles being merged)."""
        return tuple(point for low, high in self.spans for point in (low, high) if point is not None)

    def bounds(self) -> tuple[Any, ...]:
        """The bound values, in the order :meth:`predicate` numbers their parameters: the
        enclosing range's ends, then (with several ranges) every range's ends, each point's
        non-NULL values in term order."""
        low, high = self._enclosing()
        points = [point for point in (low, high) if point is not None]
        if len(self.spans) > 1:
            points.extend(self.points())
        return tuple(value for point in points for value in point if value is not None)

    def predicate(self, terms: Sequence[Term], first: int) -> exp.Expr:
        """This piece's condition on the ORDER BY ``terms``, parameters numbered from ``first``.

        One range: ``tuple >= a AND tuple < b`` in the query's order (for one ascending term
        never NULL: ``k >= $a AND k < $b``). Several: the enclosing range (which engines can prune
        on) AND a binary search over the ranges' ends written as nested CASEs, ``log2`` of them
        per row where a disjunction of the ranges costs two per range (32 ranges: a third of the
        CPU on DuckDB)."""
        low, high = self._enclosing()
        number = first
        sides: list[exp.Expr] = []
        for point, after in ((low, True), (high, False)):
            if point is not None:
                sides.append(compare(terms, self.nullable, point, number, after=after))
                number += bound_count(point)
        if len(self.spans) > 1:
            # region r: r of the points are at or before the row; the piece holds the odd
            # regions (the even ones when the first range is unbounded below, whose low is no point)
            odd = 1 if self.spans[0][0] is not None else 0
            sides.append(self._search(terms, number, 0, len(self.points()), odd))
        if not sides:
            return exp.true()
        return exp.and_(*sides) if len(sides) > 1 else sides[0]

    def _search(self, terms: Sequence[Term], first: int, start: int, stop: int, odd: int) -> exp.Expr:
        """Whether the row's region (how many of the points, parameters ``first`` on, are at or
        before it), known to lie in ``[start, stop]``, is a held one."""
        held = exp.true(), exp.false()
        return search(terms, self.nullable, self.points(), first, lambda r: held[(r - odd) % 2], start, stop)

    def shape(self) -> tuple[Any, ...]:
        """What :meth:`predicate`'s SQL depends on besides the terms and the bounds' values, and
        whether the piece's query is ordered by the engine: equal shapes, equal SQL."""
        nulls = tuple(
            None if point is None else tuple(value is None for value in point)
            for span in self.spans
            for point in span
        )
        return (nulls, self.nullable, self.sort is None)

    def describe(self) -> str:
        """The ranges for messages: ``[a, b) ∪ [c, d)``."""
        shown = [f"[{_show(low, '-inf')}, {_show(high, '+inf')})" for low, high in self.spans]
        more = f" ∪ ... ({len(shown)} ranges)" if len(shown) > 3 else ""
        return " ∪ ".join(shown[:3]) + more

    def _enclosing(self) -> Range:
        return (self.spans[0][0], self.spans[-1][1]) if self.spans else (None, None)


def _show(point: Point | None, unbounded: str) -> str:
    if point is None:
        return unbounded
    return repr(point[0]) if len(point) == 1 else repr(point)


def layout(
    tiles: Sequence[tuple[Point, int]], nullable: tuple[bool, ...], pieces: int, band: int
) -> list[tuple[KeyRanges, int]]:
    """The range pieces of a subquery, in plan order, each with its row count. Pure.

    Args:
        tiles: ``(first row's tuple, rows)`` of each non-empty tile, in the query's order (the
            tuples distinct); tile ``i`` is the rows from ``low_i`` to before ``low_{i+1}``, the
            first unbounded before and the last after.
        nullable: per ORDER BY term, whether the subquery holds a NULL there.
        pieces: how many pieces to cut the rows into (at most one per tile).
        band: 1 for contiguous pieces; more to comb up to that many pieces together.
    """
    cut = band_members(tiles, pieces, band) if tiles else []
    lows = [low for low, _ in tiles]
    firsts = np.cumsum([0] + [rows for _, rows in tiles]).tolist()
    result = []
    for members, owner in cut:
        runs: list[list[int]] = []
        for index in members:
            if runs and runs[-1][0] + runs[-1][1] == firsts[index]:
                runs[-1][1] += tiles[index][1]
            else:
                runs.append([firsts[index], tiles[index][1]])
        placed = tuple((first, rows) for first, rows in runs)
        ranges = KeyRanges(_merged(members, lows), nullable, band=owner, runs=placed)
        result.append((ranges, sum(tiles[i][1] for i in members)))
    return result


def combed_count(rows: int, pieces: int, stripes: int, limit: int) -> int:
    """How many combed pieces to cut ``rows`` rows into, at least ``pieces``, so that each holds
    at most ``limit`` rows (what the budget holds) however :func:`layout` deals the tiles: a piece
    takes ``stripes`` tiles, and the ranking query's ``count * stripes`` tiles hold
    ``ceil(rows / tiles)`` rows at most where the ORDER BY ties no rows. Pure."""
    per_tile = limit // stripes
    return max(pieces, -(-rows // (stripes * per_tile))) if per_tile else pieces


def band_members(
    tiles: Sequence[tuple[Any, int]], pieces: int, band: int
) -> list[tuple[list[int], int | None]]:
    """Which tiles (ascending indices) each piece holds, and its band (None: contiguous), in plan
    order: :func:`layout`'s cut of non-empty ``tiles``. Pure."""
    total = sum(rows for _, rows in tiles)
    count = max(min(pieces, len(tiles)), 1)
    cut: list[tuple[list[int], int | None]] = []
    if band <= 1 or count == 1:
        chunk = _chunks(tiles, total, [1] * count)
        for index, piece in enumerate(chunk):
            if not cut or piece != chunk[index - 1]:
                cut.append(([], None))
            cut[-1][0].append(index)
        return cut
    bands = -(-count // band)
    shares = [count // bands + (1 if b < count % bands else 0) for b in range(bands)]
    owner = _chunks(tiles, total, shares)
    for b, share in enumerate(shares):
        members = [i for i, o in enumerate(owner) if o == b]
        per_band = max(min(share, len(members)), 1)
        passes = -(-len(members) // per_band)
        combs: list[list[int]] = [[] for _ in range(per_band)]
        for j, index in enumerate(members):
            # Pass k over the band deals its tiles to the pieces rotated by k * pieces / passes,
            # so each piece's tiles sit at evenly spread places of the passes: its mean position
            # is the band's middle within pieces / passes / 2 tiles, and its next tile lies at
            # most a pass and pieces / passes tiles on. (Dealt alike every pass, piece j sat j
            # tiles into each: the pieces leaned to one end of the band by up to half a pass,
            # and the batches' mean position drifted with the order the pieces were visited.)
            period, slot = divmod(j, per_band)
            combs[(slot - period * per_band // passes) % per_band].append(index)
        cut.extend((c, b) for c in combs if c)
    return cut


def _chunks(tiles: Sequence[tuple[Any, int]], total: int, shares: Sequence[int]) -> list[int]:
    """Per tile, which consecutive chunk holds it, chunk ``c`` taking ``shares[c]`` parts of
    the rows (by the rows before its middle, so a tile larger than a chunk takes the chunk it
    mostly falls in). Over equal tiles, ``shares[c]`` pieces' worth of tiles each."""
    ends = np.cumsum(shares)
    owner = []
    before = 0
    for _, rows in tiles:
        middle = before + rows / 2
        at = middle * int(ends[-1]) / max(total, 1)  # in shares
        owner.append(min(int(np.searchsorted(ends, at, side="right")), len(shares) - 1))
        before += rows
    return owner


def _merged(members: Sequence[int], lows: Sequence[Any]) -> tuple[Range, ...]:
    """The key ranges of tiles ``members`` (ascending), consecutive tiles merged into one range."""
    ranges: list[list[Any]] = []
    previous = -2
    for index in members:
        high = lows[index + 1] if index + 1 < len(lows) else None
        if index == previous + 1:
            ranges[-1][1] = high
        else:
            ranges.append([None if index == 0 else lows[index], high])
        previous = index
    return tuple((low, high) for low, high in ranges)
