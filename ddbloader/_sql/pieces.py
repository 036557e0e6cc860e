"""Range pieces: a partition too big for ``fetch_bytes``, cut at planning by its order key.

With ``shuffle=True`` a subquery whose planned bytes exceed ``fetch_bytes`` would otherwise be
read by one query in consecutive pieces (:mod:`ddbloader._io.streams`), front to back: one big
table's epoch would walk it in row order. Instead planning cuts it into *range pieces*, each the
rows whose leading ORDER BY key ``k`` falls in some ranges ``a <= k < b``, each read by a query
of its own, so the plan holds them as partitions of their group and the epoch visits them in a
random order like repartitions (windows continue across consecutive pieces through the kept
edge rows, as across repartitions).

How the ranges are found: a query ranks the subquery's rows by ``k`` and cuts the ranks into
*tiles*, each a key range with its exact row count (:mod:`ddbloader._sql.range_cutter`); the
pieces are made of tiles.

Two layouts (:func:`layout`):

* *contiguous* (windows, ``span > 1``, where they cannot be combed): each piece is one range of
  consecutive tiles, the pieces in the query's order (descending keys for ``DESC``), so the rows
  of the pieces in plan order are the subquery's rows in its order, and windows straddle pieces
  as they straddle partitions.
* *combed* (one row per sample): within a *band* of at most :data:`COMB_BAND` pieces' rows, tile
  ``j`` goes to piece ``j mod pieces``, so each piece holds :data:`COMB_STRIPES` thin ranges
  spread over the band: one piece's batches mix the whole band, where a contiguous piece would
  hold a few thousand neighbouring rows. The cost: each piece's query reads its band (the rows
  of up to :data:`COMB_BAND` pieces) to find its stripes. Windows are combed too where that is
  exact, each stripe widened by the rows its windows run into (:mod:`ddbloader._sql.window_pieces`).

Invariants (checked by the tests without an engine): the tiles' ranges are disjoint and cover
every key, each tile is in exactly one piece, a piece's row count is the sum of its tiles',
so the pieces cover the subquery's rows exactly once. Each piece's count is checked again
when it is read (the stream refuses a piece whose rows differ from the plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from .window_rows import WindowRows

__all__ = [
    "COMB_BAND",
    "COMB_STRIPES",
    "CONTIGUOUS_TILES",
    "KeyRanges",
    "band_members",
    "layout",
    "paren",
]

#: Thin ranges per combed piece: a batch drawn from one piece holds rows from this many places
#: of its band (32 stripes put every 100,000-row block of a 2M-row table in each batch).
COMB_STRIPES = 32
#: Pieces combed together at most: a piece's query reads the rows of its band (this many pieces'
#: worth) to find its own, so an epoch reads each row of a combed subquery up to this many times.
COMB_BAND = 64
#: Tiles per contiguous piece: finer tiles keep the pieces near equal when keys repeat.
CONTIGUOUS_TILES = 8


#: ``(low, high)``: ``low <= k < high``; None is unbounded on that side.
Range = tuple[Any, Any]


@dataclass(frozen=True)
class KeyRanges:
    """The rows of one range piece: order key in one of ``ranges``, or NULL (``nulls``).

    Invariants: ``ranges`` ascending and disjoint; empty exactly when ``nulls``.
    """

    ranges: tuple[Range, ...] = ()
    nulls: bool = False
    #: A combed piece's band (its subquery's pieces combed together share one); None if contiguous.
    band: int | None = None
    #: ``(result column, descending)`` when the piece's query has no ORDER BY and its reader puts
    #: the rows in the query's order by that column (see :meth:`in_order`); None: the engine sorts.
    sort: tuple[int, bool] | None = None
    #: A combed piece of a windowed series: where its rows lie in the series and which start
    #: windows (see :mod:`ddbloader._sql.window_pieces`); None for every other piece.
    windows: WindowRows | None = None

    def in_order(self, table: pa.Table) -> pa.Table:
        """``table`` (this piece's rows, as its query returned them) in the query's order: as it
        is without :attr:`sort`; else stably sorted by the :attr:`sort` column, which is then the
        query's whole order over the piece (its only ORDER BY term, of an integer, date or
        timestamp type whose order Arrow's equals, and never NULL in a ranged piece), so equal
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

    def bounds(self) -> tuple[Any, ...]:
        """The bound values, in the order :meth:`predicate` numbers their parameters: the
        enclosing range's, then (with several ranges) every range's ends in ascending order."""
        low, high = self._enclosing()
        enclosing = tuple(value for value in (low, high) if value is not None)
        return enclosing + (self._points() if len(self.ranges) > 1 else ())

    def predicate(self, key: exp.Expr, first: int) -> exp.Expr:
        """This piece's condition on ``key``, parameters numbered from ``first``.

        One range: ``key >= a AND key < b``. Several: the enclosing range (which engines can
        prune on, and which no NULL passes) AND a binary search over the ranges' ends written as
        nested CASEs, ``log2`` of them per row where a disjunction of the ranges costs two per
        range (32 ranges: a third of the CPU on DuckDB)."""
        if self.nulls:
            return exp.Is(this=paren(key), expression=exp.Null())
        low, high = self._enclosing()
        number = first
        sides: list[exp.Expr] = []
        if low is not None:
            sides.append(exp.GTE(this=paren(key), expression=_parameter(number)))
            number += 1
        if high is not None:
            sides.append(exp.LT(this=paren(key), expression=_parameter(number)))
            number += 1
        if not sides:
            sides.append(exp.Not(this=exp.Is(this=paren(key), expression=exp.Null())))
        if len(self.ranges) > 1:
            # region r: r of the points are <= key; the piece holds the odd regions (the even
            # ones when the first range is unbounded below, whose low is no point)
            points = len(self._points())
            odd = 1 if self.ranges[0][0] is not None else 0
            sides.append(_search(key, number, 0, points, odd))
        return exp.and_(*sides) if len(sides) > 1 else sides[0]

    def shape(self) -> tuple[Any, ...]:
        """What :meth:`predicate`'s SQL depends on besides the key and the bounds' values, and
        whether the piece's query is ordered by the engine: equal shapes, equal SQL."""
        low, high = self._enclosing()
        return (self.nulls, low is None, high is None, len(self.ranges), self.sort is None)

    def describe(self) -> str:
        """The ranges for messages: ``[a, b) ∪ [c, d)`` or ``NULL``."""
        if self.nulls:
            return "NULL"
        shown = [
            f"[{'-inf' if lo is None else repr(lo)}, {'+inf' if hi is None else repr(hi)})"
            for lo, hi in self.ranges
        ]
        more = f" ∪ ... ({len(shown)} ranges)" if len(shown) > 3 else ""
        return " ∪ ".join(shown[:3]) + more

    def _enclosing(self) -> Range:
        return (self.ranges[0][0], self.ranges[-1][1]) if self.ranges else (None, None)

    def _points(self) -> tuple[Any, ...]:
        """The ranges' ends, ascending, without the unbounded ones (strictly increasing: ranges
        are disjoint and never adjacent, adjacent tiles being merged)."""
        return tuple(value for low, high in self.ranges for value in (low, high) if value is not None)


def _search(key: exp.Expr, first: int, start: int, stop: int, odd: int) -> exp.Expr:
    """Whether ``key``'s region (how many of the points, parameters ``first`` on, are <= it),
    known to lie in ``[start, stop]``, is a held one: a balanced tree of CASEs."""
    if start == stop:
        return exp.true() if start % 2 == odd else exp.false()
    middle = (start + stop + 1) // 2  # region >= middle exactly when key >= point middle - 1
    return exp.Case(
        ifs=[
            exp.If(
                this=exp.LT(this=paren(key), expression=_parameter(first + middle - 1)),
                true=_search(key, first, start, middle - 1, odd),
            )
        ],
        default=_search(key, first, middle, stop, odd),
    )


def layout(
    tiles: Sequence[tuple[Any, int]],
    null_rows: int,
    pieces: int,
    band: int,
    *,
    descending: bool,
    nulls_first: bool,
) -> list[tuple[KeyRanges, int]]:
    """The range pieces of a subquery, in plan order, each with its row count. Pure.

    Args:
        tiles: ``(lowest key, rows)`` of each non-empty tile, ascending by key (distinct keys);
            tile ``i`` is the keys ``[low_i, low_{i+1})``, the first unbounded below and the last
            above.
        null_rows: rows whose key is NULL (one piece of their own when any).
        pieces: how many pieces to cut the keyed rows into (at most one per tile).
        band: 1 for contiguous pieces; more to comb up to that many pieces together.
        descending: the ORDER BY sorts the key descending (contiguous pieces come in that order).
        nulls_first: the ORDER BY puts NULL keys first (their piece comes first).
    """
    cut = band_members(tiles, pieces, band) if tiles else []
    lows = [low for low, _ in tiles]
    result = [
        (KeyRanges(_merged(members, lows), band=owner), sum(tiles[i][1] for i in members))
        for members, owner in cut
    ]
    if descending:
        result.reverse()
    if null_rows:
        nulls = (KeyRanges(nulls=True), null_rows)
        result = [nulls, *result] if nulls_first else [*result, nulls]
    return result


def band_members(
    tiles: Sequence[tuple[Any, int]], pieces: int, band: int
) -> list[tuple[list[int], int | None]]:
    """Which tiles (ascending indices) each piece holds, and its band (None: contiguous), in plan
    order for an ascending key: :func:`layout`'s cut of non-empty ``tiles``. Pure."""
    total = sum(rows for _, rows in tiles)
    count = max(min(pieces, len(tiles)), 1)
    cut: list[tuple[list[int], int | None]] = []
    if band <= 1 or count == 1:
        chunk = _chunks(tiles, total, count)
        for index, piece in enumerate(chunk):
            if not cut or piece != chunk[index - 1]:
                cut.append(([], None))
            cut[-1][0].append(index)
        return cut
    bands = -(-count // band)
    owner = _chunks(tiles, total, bands)
    for b in range(bands):
        members = [i for i, o in enumerate(owner) if o == b]
        share = count // bands + (1 if b < count % bands else 0)
        per_band = max(min(share, len(members)), 1)
        combs: list[list[int]] = [[] for _ in range(per_band)]
        for j, index in enumerate(members):
            combs[j % per_band].append(index)
        cut.extend((c, b) for c in combs if c)
    return cut


def _chunks(tiles: Sequence[tuple[Any, int]], total: int, count: int) -> list[int]:
    """Per tile, which of ``count`` consecutive chunks of near-equal rows holds it (by the rows
    before its middle, so a tile larger than a chunk takes the chunk it mostly falls in)."""
    owner = []
    before = 0
    for _, rows in tiles:
        middle = before + rows / 2
        owner.append(min(int(middle * count / max(total, 1)), count - 1))
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


def _parameter(number: int) -> exp.Parameter:
    return exp.Parameter(this=exp.Literal.number(number))


def paren(expression: exp.Expr) -> exp.Expr:
    """A copy of ``expression``, in parentheses unless it is a column, a literal or already so."""
    if isinstance(expression, (exp.Column, exp.Literal, exp.Paren)):
        return expression.copy()
    return exp.Paren(this=expression.copy())
