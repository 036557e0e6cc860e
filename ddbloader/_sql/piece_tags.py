"""Tagged pieces: several combed range pieces of one subquery read by one query, each row tagged
with its piece.

A combed piece's query scans the order key of its whole band to find its stripes, and reads the
storage blocks its stripes touch (see :mod:`ddbloader._sql.pieces`). One query for ``m`` pieces
instead scans the band's keys once for all of them: its WHERE is the enclosing range of the
pieces' ranges AND a balanced CASE tree over the ranges' ends that returns the index of the
row's piece (NULL between ranges), the same tree selected as column :data:`TAG_ALIAS`, by which
the client splits the result (:mod:`ddbloader._io.unit_split`). The tree costs ``log2`` of
the ends per row: one test more than one piece's for two pieces.

On DuckDB most of a combed piece's CPU goes to the blocks read, not to the key tests: its
stripes of ~2,000 rows each touch a vector or two of every column. Two pieces far apart read
twice the blocks (0.94 of their two queries, measured); two *neighbours* (comb ``j`` and
``j + 1``, whose stripes touch) read about one piece's (0.67). So a fetch unit reads neighbours,
visited one after the other (see :mod:`ddbloader._epoch.visits`). Combed pieces of windows are
each read alone (two to a query saved under 1.2x of an epoch, see ``benchmarks/LOG.md``).

Only pieces the reader orders (:attr:`~ddbloader._sql.pieces.KeyRanges.sort`: the ORDER BY is
one ascending integer, date or timestamp column, never NULL in the subquery) are tagged: their ranges
are merged by comparing the bounds in Python, whose order is then the engine's, and the query
needs no ORDER BY (each piece's rows are put in order after the split, as when read alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlglot import exp

from .pieces import KeyRanges
from .rewrites import WrappedQuery
from .tuple_order import Point, Term, compare, paren, search

__all__ = ["TAG_ALIAS", "TagRegions", "tag_regions", "tagged_sql"]

#: The column a tagged query selects last: the index of the row's piece among the query's pieces.
TAG_ALIAS = "_ddb_piece"

#: ``(points, tags)``: the ranges' ends ascending, and per region (``len(points) + 1`` of them,
#: region ``r`` holding the keys with ``r`` points ``<=`` them) the index of the piece holding it,
#: or None.
TagRegions = tuple[tuple[Any, ...], tuple[int | None, ...]]


def tag_regions(pieces: Sequence[KeyRanges]) -> TagRegions:
    """The regions of ``pieces``' ranges (see :data:`TagRegions`). Pure.

    Requires the pieces' ranges disjoint (tiles of one subquery) and bounds that Python orders as
    the engine does (the pieces are ordered by the reader). Ranges of two pieces that touch share
    their point; no region is tagged twice, and the points increase strictly.
    """
    spans = sorted(
        ((_value(low), _value(high), tag) for tag, piece in enumerate(pieces) for low, high in piece.spans),
        key=lambda span: (span[0] is not None, _Directed(span[0], _descending(pieces))),
    )
    points: list[Any] = []
    tags: list[int | None] = [None]
    for low, high, tag in spans:
        if low is None:
            tags[0] = tag
        elif points and points[-1] == low and tags[-1] is None:
            tags[-1] = tag
        else:
            points.append(low)
            tags.append(tag)
        if high is not None:
            points.append(high)
            tags.append(None)
    return tuple(points), tuple(tags)


class _Directed:
    """A bound value ordered as the query orders its key (reversed for DESC)."""

    def __init__(self, value: Any, descending: bool) -> None:
        self.value = value
        self.descending = descending

    def __lt__(self, other: Any) -> bool:
        value = other.value if isinstance(other, _Directed) else other
        if self.value is None or value is None:  # unbounded: sorted apart, by the key's first part
            return False
        return bool(self.value > value) if self.descending else bool(self.value < value)

    def __le__(self, other: Any) -> bool:
        value = other.value if isinstance(other, _Directed) else other
        return bool(self.value >= value) if self.descending else bool(self.value <= value)


def _descending(pieces: Sequence[KeyRanges]) -> bool:
    sort = pieces[0].sort
    return sort is not None and sort[1]


def _value(point: Point | None) -> Any:
    """The one value of a tagged piece's bound (its ORDER BY is one term, never NULL)."""
    if point is None:
        return None
    (value,) = point
    return value


def _point(value: Any) -> Point | None:
    return None if value is None else (value,)


def tagged_sql(
    query: WrappedQuery, columns: Sequence[exp.Expr], term: Term, tags: Sequence[int | None]
) -> str:
    """The query of the pieces whose regions are ``tags`` (see :func:`tag_regions`), each row
    tagged with its piece's index as :data:`TAG_ALIAS`, the last column (after the row hash of a
    query that carries one); its parameters the ``columns``' values, then the points. ``term``:
    the one ORDER BY term the pieces are cut on, never NULL. Without an ORDER BY: the reader
    orders each piece's rows.

    The SQL depends on ``tags`` and the number of ``columns`` only, not on the bounds' values.
    """
    first = len(columns) + 1
    sides: list[exp.Expr] = []
    start, stop = 0, len(tags) - 1
    # the enclosing range's ends are the first and the last point (each parameter is used: an
    # engine may refuse one that is not)
    if tags[0] is None:  # bounded below: the region before the first point holds no piece
        sides.append(compare([term], (False,), _BOUND, first, after=True))
        start = 1
    if tags[-1] is None:
        sides.append(compare([term], (False,), _BOUND, first + len(tags) - 2, after=False))
        stop -= 1
    if not sides:
        sides.append(exp.Not(this=exp.Is(this=paren(term.expression), expression=exp.Null())))
    points = [_BOUND] * (len(tags) - 1)
    tree = search([term], (False,), points, first, _leaf(tags), start, stop)
    sides.append(exp.Not(this=exp.Is(this=exp.Paren(this=tree.copy()), expression=exp.Null())))
    select = query.filtered_where(columns, exp.and_(*sides), ordered=False)
    assert isinstance(select, exp.Select)
    # a signed type the client can mark a missing tag in (ClickHouse types the CASE UInt8)
    tag = exp.cast(tree, exp.DataType.build("bigint"))
    return query.render(select.select(tag.as_(TAG_ALIAS), copy=False))


#: A point of one non-NULL value: its comparisons bind the value as a parameter.
_BOUND: Point = (0,)


def _leaf(tags: Sequence[int | None]) -> Callable[[int], exp.Expr]:
    def leaf(region: int) -> exp.Expr:
        tag = tags[region]
        return exp.Null() if tag is None else exp.Literal.number(tag)

    return leaf
