"""Range pieces: a partition too big for ``fetch_bytes``, cut at planning by its order key.

With ``shuffle=True`` a subquery whose planned bytes exceed ``fetch_bytes`` would otherwise be
read by one query in consecutive pieces (:mod:`ddbloader._io.streams`), front to back: one big
table's epoch would walk it in row order. Instead planning cuts it into *range pieces*, each the
rows whose leading ORDER BY key ``k`` falls in some ranges ``a <= k < b``, each read by a query
of its own, so the plan holds them as partitions of their group and the epoch visits them in a
random order like repartitions (windows continue across consecutive pieces through the kept
edge rows, as across repartitions).

How the ranges are found: one query per subquery ranks its rows by ``k`` (``RANK()``, so equal
keys share a rank) and cuts the ranks into *tiles* of about equal rows; each tile is a key range
``[lowest key of the tile, lowest key of the next)`` with its exact row count. Equal keys always
share a tile, so a piece never splits them. NULL keys form their own piece, placed where the
ORDER BY puts NULLs.

Two layouts (:func:`layout`):

* *contiguous* (windows, ``span > 1``): each piece is one range of consecutive tiles, the pieces in
  the query's order (descending keys for ``DESC``), so the rows of the pieces in plan order are
  the subquery's rows in its order, and windows straddle pieces as they straddle partitions.
* *combed* (one row per sample): within a *band* of at most :data:`COMB_BAND` pieces' rows, tile
  ``j`` goes to piece ``j mod pieces``, so each piece holds :data:`COMB_STRIPES` thin ranges
  spread over the band: one piece's batches mix the whole band, where a contiguous piece would
  hold a few thousand neighbouring rows. The cost: each piece's query reads its band (the rows
  of up to :data:`COMB_BAND` pieces) to find its stripes.

Invariants (checked by the tests without an engine): the tiles' ranges are disjoint and cover
every key, each tile is in exactly one piece, a piece's row count is the sum of its tiles',
so the pieces cover the subquery's rows exactly once. Each piece's count is checked again
when it is read (the stream refuses a piece whose rows differ from the plan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from .binding import binds_exactly
from .ordering import same_name
from .query import Query, UserQuery

__all__ = [
    "COMB_BAND",
    "COMB_STRIPES",
    "CONTIGUOUS_TILES",
    "KeyRanges",
    "OrderKey",
    "RangeCutter",
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

_KEY_ALIAS = "_ddb_k"
_TILE_ALIAS = "_ddb_tile"
_LOW_ALIAS = "_ddb_low"
_ROWS_ALIAS = "_ddb_rows"

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
            return exp.Is(this=_paren(key), expression=exp.Null())
        low, high = self._enclosing()
        number = first
        sides: list[exp.Expr] = []
        if low is not None:
            sides.append(exp.GTE(this=_paren(key), expression=_parameter(number)))
            number += 1
        if high is not None:
            sides.append(exp.LT(this=_paren(key), expression=_parameter(number)))
            number += 1
        if not sides:
            sides.append(exp.Not(this=exp.Is(this=_paren(key), expression=exp.Null())))
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
                this=exp.LT(this=_paren(key), expression=_parameter(first + middle - 1)),
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
    total = sum(rows for _, rows in tiles)
    count = max(min(pieces, len(tiles)), 1)
    cut: list[tuple[list[int], int | None]] = []
    if tiles and (band <= 1 or count == 1):
        chunk = _chunks(tiles, total, count)
        for index, piece in enumerate(chunk):
            if not cut or piece != chunk[index - 1]:
                cut.append(([], None))
            cut[-1][0].append(index)
    elif tiles:
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


def _paren(expression: exp.Expr) -> exp.Expr:
    if isinstance(expression, (exp.Column, exp.Literal, exp.Paren)):
        return expression.copy()
    return exp.Paren(this=expression.copy())


@dataclass(frozen=True)
class OrderKey:
    """The key range pieces are cut on: the query's leading ORDER BY term over its result."""

    expression: exp.Expr
    descending: bool
    nulls_first: bool
    text: str


#: Runs a planning query: (sql, purpose, parameters) -> its result.
Run = Callable[[str, str, Sequence[Any]], pa.Table]


class RangeCutter:
    """Cuts the subqueries of one plan into range pieces, or says why it cannot.

    Built once per plan; :attr:`reason` is None when range pieces are possible, else a sentence
    naming why (the caller warns and reads the big subqueries in consecutive pieces instead).
    """

    def __init__(
        self,
        query: Query,
        keys: Sequence[exp.Expr],
        run: Run,
        *,
        combed: bool,
        schema: pa.Schema | None = None,
    ) -> None:
        self._query = query
        self._run = run
        self._combed = combed
        self.key: OrderKey | None = None
        self.reason: str | None = None
        #: Per (query, piece shape): the query (kept, so its id stays its own) and the piece's SQL,
        #: which the bounds' values do not change.
        self._sql: dict[tuple[int, tuple[Any, ...]], tuple[Query, str]] = {}
        #: ``KeyRanges.sort`` for combed pieces read whole (see :meth:`client_sort`).
        self.sort: tuple[int, bool] | None = None
        if not isinstance(query, UserQuery):
            self.reason = "this engine's queries cannot be cut by key ranges"
            return
        ordered = query.order_key(keys)
        if ordered is None:
            self.reason = (
                "the query has no ORDER BY"
                if not query.is_ordered()
                else "its ORDER BY has no term besides group_col and repartition_col, or its leading "
                "one is not one of the query's result columns"
            )
            return
        term = ordered.this
        self.key = OrderKey(
            term,
            bool(ordered.args.get("desc")),
            bool(ordered.args.get("nulls_first")),
            term.sql(dialect=query.dialect),
        )
        if combed and schema is not None:
            self.sort = _client_sort(query, keys, schema)

    def cut(
        self, columns: Sequence[exp.Expr], params: tuple[Any, ...], rows: int, pieces: int
    ) -> list[tuple[KeyRanges, int]] | None:
        """The range pieces of the subquery of ``columns = params`` (``rows`` rows), in plan
        order; None when the key's type does not bind back exactly or the engine refused the
        ranking query (then :attr:`reason` says which).

        Raises:
            ValueError: the ranking query found more rows than counting the subquery did (the
                data changed during planning).
        """
        assert isinstance(self._query, UserQuery) and self.key is not None
        stripes = COMB_STRIPES if self._combed else CONTIGUOUS_TILES
        sql = self._query.render(self._tiles_tree(columns, pieces * stripes))
        try:
            table = self._run(sql, "ranking the rows of a big subquery by its order key", params)
        except Exception as error:  # the engine's refusal is a reason to fall back, not to fail
            self.reason = f"the engine could not rank the rows by {self.key.text!r} ({_first_line(error)})"
            return None
        if not binds_exactly(table.schema.field(_LOW_ALIAS)):
            self.reason = (
                f"the order key {self.key.text!r} is of type {table.schema.field(_LOW_ALIAS).type}, "
                f"whose values do not bind back to the engine exactly"
            )
            return None
        try:
            lows = table.column(_LOW_ALIAS).to_pylist()
        except (OverflowError, ValueError) as error:  # e.g. 'infinity' dates: no Python value
            self.reason = f"a value of the order key {self.key.text!r} has no Python value ({error})"
            return None
        counts = [int(n) for n in table.column(_ROWS_ALIAS).to_pylist()]
        tiles = list(zip(lows, counts, strict=True))
        keyed = sum(counts)
        if keyed > rows:
            raise ValueError(
                f"ranking a subquery by {self.key.text!r} found {keyed} rows, but counting it found "
                f"{rows}: the data changed while the loader was being built; build it again"
            )
        if pa.types.is_floating(table.schema.field(_LOW_ALIAS).type) and self._unequal_to_themselves(
            columns, params
        ):
            self.reason = (
                f"the order key {self.key.text!r} holds NaN, which this engine finds unequal to itself, "
                f"so no key range would hold those rows"
            )
            return None
        nulls_first = self.key.nulls_first
        if keyed and rows > keyed:
            nulls_first = self._nulls_come_first(columns, params)
        return layout(
            tiles,
            rows - keyed,
            pieces,
            COMB_BAND if self._combed else 1,
            descending=self.key.descending,
            nulls_first=nulls_first,
        )

    def _unequal_to_themselves(self, columns: Sequence[exp.Expr], params: tuple[Any, ...]) -> bool:
        """Whether some key of the subquery compares unequal to itself (NaN on engines such as
        ClickHouse; DuckDB, PostgreSQL and Spark find NaN equal to NaN and above every number)."""
        assert isinstance(self._query, UserQuery) and self.key is not None
        key = _paren(self.key.expression)
        odd = self._query.filtered_where(columns, exp.NEQ(this=key, expression=key.copy()), ordered=False)
        probe = exp.select(exp.Count(this=exp.Star()).as_(_ROWS_ALIAS)).from_(_subquery(odd, "_ddb_n"))
        table = self._run(self._query.render(probe), "looking for NaN order keys", params)
        return bool(table.column(_ROWS_ALIAS)[0].as_py())

    def _nulls_come_first(self, columns: Sequence[exp.Expr], params: tuple[Any, ...]) -> bool:
        """Whether the engine puts the subquery's NULL keys before the others in the query's own
        order: asked of the engine, whose session may order NULLs otherwise than its dialect's
        default (DuckDB's ``default_null_order``), when the ORDER BY does not say."""
        assert isinstance(self._query, UserQuery) and self.key is not None
        first = self._query.filtered_where(columns, exp.true(), ordered=True)
        assert isinstance(first, exp.Select)
        first = first.limit(1)
        probe = exp.select(
            exp.Is(this=_paren(self.key.expression), expression=exp.Null()).as_(_KEY_ALIAS)
        ).from_(_subquery(first, "_ddb_f"))
        table = self._run(self._query.render(probe), "asking where the engine orders NULL keys", params)
        return bool(table.column(_KEY_ALIAS)[0].as_py())

    def piece_sql(self, columns: Sequence[exp.Expr], ranges: KeyRanges, query: Query | None = None) -> str:
        """The piece's query: the subquery's rows in ``ranges``, in the query's order; its key
        parameters first, then :meth:`KeyRanges.bounds`. ``query`` (default: the one cut) may be
        the same query carrying the row hash (``verify=True``)."""
        query = self._query if query is None else query
        assert isinstance(query, UserQuery) and self.key is not None
        shape = (id(query), ranges.shape())
        if shape not in self._sql:  # rendering costs ~10 ms at 32 ranges; combed pieces share a shape
            predicate = ranges.predicate(self.key.expression, len(columns) + 1)
            tree = query.filtered_where(columns, predicate, ordered=ranges.sort is None)
            self._sql[shape] = (query, query.render(tree))
        return self._sql[shape][1]

    def _tiles_tree(self, columns: Sequence[exp.Expr], tiles: int) -> exp.Expr:
        """``(tile, lowest key, rows)`` per non-empty tile of the subquery's non-NULL keys, by tile:
        a row's tile is ``(rank - 1) * tiles // rows`` (equal keys share their rank)."""
        assert isinstance(self._query, UserQuery) and self.key is not None
        key = self.key.expression
        filtered = self._query.filtered_where(
            columns, exp.Not(this=exp.Is(this=_paren(key), expression=exp.Null())), ordered=False
        )
        keys = exp.select(_paren(key).as_(_KEY_ALIAS)).from_(_subquery(filtered, "_ddb_r"))
        column = exp.column(_KEY_ALIAS)
        rank = exp.Window(
            this=exp.Anonymous(this="RANK"), order=exp.Order(expressions=[exp.Ordered(this=column)])
        )
        everything = exp.Window(this=exp.Count(this=exp.Star()))
        # FLOOR of a division, not an integer division: every engine spells that alike, and the
        # tile only has to grow with the rank
        tile = exp.Floor(
            this=exp.Div(
                this=exp.Paren(
                    this=exp.Mul(
                        this=exp.Paren(this=exp.Sub(this=rank, expression=exp.Literal.number(1))),
                        expression=exp.Literal.number(tiles),
                    )
                ),
                expression=everything,
            )
        )
        ranked = exp.select(column, tile.as_(_TILE_ALIAS)).from_(_subquery(keys, "_ddb_s"))
        return (
            exp.select(
                exp.column(_TILE_ALIAS),
                exp.Min(this=column).as_(_LOW_ALIAS),
                exp.Count(this=exp.Star()).as_(_ROWS_ALIAS),
            )
            .from_(_subquery(ranked, "_ddb_t"))
            .group_by(exp.column(_TILE_ALIAS))
            .order_by(exp.column(_TILE_ALIAS))
        )


def _client_sort(query: UserQuery, keys: Sequence[exp.Expr], schema: pa.Schema) -> tuple[int, bool] | None:
    """``(result column, descending)`` when the reader can put a piece's rows in the query's
    order itself, cheaper than the engine's sort of every column: the ORDER BY's only term
    besides ``keys`` is one result column (found by name as the engine resolves it, exactly
    once) of an integer, date or timestamp type, whose order Arrow's equals; else None."""
    terms = query.order_terms(keys)
    if terms is None or len(terms) != 1 or not isinstance(terms[0].this, exp.Column):
        return None
    column = terms[0].this
    if column.table:
        return None
    found = [i for i, name in enumerate(schema.names) if same_name(column.this, name)]
    if len(found) != 1:
        return None
    kind = schema.field(found[0]).type
    if not (pa.types.is_integer(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind)):
        return None
    return found[0], bool(terms[0].args.get("desc"))


def _subquery(tree: exp.Expr, alias: str) -> exp.Subquery:
    return exp.Subquery(this=tree, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
