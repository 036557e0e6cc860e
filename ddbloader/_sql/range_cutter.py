"""RangeCutter: the planning queries that find a big subquery's tiles by its whole ORDER BY.

One query per subquery (:mod:`ddbloader._sql.tile_query`) ranks its rows by the query's own
ORDER BY tuple (``RANK()`` over every term, with its direction and NULL placement, so rows the
engine orders as equal share a rank) and cuts the ranks into *tiles* of about equal rows; each
tile runs from its first row's tuple to the next tile's, with its exact row count, so the
boundaries are the engine's, whatever it does with ties, NULLs, NaN or -0.0. Where a term is a
float, a second query counts the rows of every tile by the comparisons the pieces' queries will
make; where those disagree with the ORDER BY the subquery is not cut (the caller warns and reads
it front to back). The pieces are laid out from the tiles by :func:`ddbloader._sql.pieces.layout`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from sqlglot import exp

from .binding import binds_exactly
from .comparisons import Run, disagreement
from .ordering import read_direction, same_name
from .pieces import (
    COMB_BAND,
    COMB_STRIPES,
    CONTIGUOUS_TILES,
    KeyRanges,
    combed_count,
    layout,
)
from .query import Query, UserQuery
from .tile_query import AHEAD_ALIAS, LOW_ALIAS, NULLS_ALIAS, ROWS_ALIAS, TIES_ALIAS, tiles_tree
from .tuple_order import Point
from .window_pieces import WindowTile, window_layout

__all__ = ["CONTEXT_SHARE", "OrderKey", "RangeCutter"]

#: A combed piece of windows has at most ``rows / CONTEXT_SHARE`` rows of context (its stripes'
#: ``span - 1`` rows each), so it holds at most 1.25 pieces' rows: fewer stripes for long windows.
CONTEXT_SHARE = 4


@dataclass(frozen=True)
class OrderKey:
    """One term of the ORDER BY that pieces are cut on, over the query's result."""

    expression: exp.Expr
    descending: bool
    nulls_first: bool
    text: str


class RangeCutter:
    """Cuts the subqueries of one plan into range pieces, or says why it cannot.

    Built once per plan; :attr:`reason` is None when range pieces are possible, else a sentence
    naming why (the caller warns and reads the big subqueries in consecutive pieces instead).
    Samples of ``span`` rows, ``stride`` apart: one row (``span == 1``) are combed; windows are
    combed where a subquery is a whole series whose ORDER BY tuple is distinct (see
    :mod:`ddbloader._sql.window_pieces`), else cut into contiguous pieces.
    """

    def __init__(
        self,
        query: Query,
        keys: Sequence[exp.Expr],
        run: Run,
        *,
        span: int,
        stride: int = 1,
        schema: pa.Schema | None = None,
    ) -> None:
        self._query = query
        self._run = run
        self._span = span
        self._stride = stride
        #: whether samples are windows (several rows each)
        self.windowed = span > 1
        #: the ORDER BY terms besides the partition keys, in order
        self.terms: tuple[OrderKey, ...] = ()
        self.reason: str | None = None
        #: Per (query, piece shape): the query (kept, so its id stays its own) and the piece's SQL,
        #: which the bounds' values do not change.
        self._sql: dict[tuple[int, tuple[Any, ...]], tuple[Query, str]] = {}
        self._floats = False  # an ORDER BY term of the subquery last cut is a float (see _agrees)
        #: ``KeyRanges.sort`` for combed pieces read whole (see :func:`_client_sort`).
        self.sort: tuple[int, bool] | None = None
        if not isinstance(query, UserQuery):
            self.reason = "this engine's queries cannot be cut by key ranges"
            return
        ordered = query.order_terms(keys)
        if not ordered:
            self.reason = (
                "the query has no ORDER BY"
                if not query.is_ordered()
                else "its ORDER BY has no term besides group_col and repartition_col, or one that "
                "cannot be resolved against the query's result columns"
            )
            return
        resolved = query.resolved_order()
        # a term the query does not select is carried as a hidden result column: cut by that
        # column, named in messages as the user wrote it
        written = {h.alias: h.this for h in resolved.hidden} if resolved is not None else {}
        terms = []
        for ordered_term in ordered:
            term = ordered_term.this
            shown = written.get(term.name, term) if isinstance(term, exp.Column) else term
            text = shown.name if isinstance(shown, exp.Column) else shown.sql(dialect=query.dialect)
            try:  # the engine's own direction and NULL placement, whatever its session settings
                probe = query.direction_probe(ordered_term)
                direction = run(probe, "asking the engine how the ORDER BY sorts", ())
            except Exception as error:  # the engine's refusal is a reason to fall back, not to fail
                self.reason = f"the engine could not say how it sorts by {text!r} ({_first_line(error)})"
                return
            descending, nulls_first, default_descending = read_direction(direction)
            if default_descending:
                self.reason = "the session sorts descending by default (DuckDB's default_order)"
                return
            terms.append(OrderKey(term, descending, nulls_first, text))
        self.terms = tuple(terms)
        if schema is not None:
            self.sort = _client_sort(query, keys, schema)

    @property
    def text(self) -> str:
        """The ORDER BY terms pieces are cut on, for messages."""
        return ", ".join(term.text for term in self.terms)

    def cut(
        self,
        columns: Sequence[exp.Expr],
        params: tuple[Any, ...],
        rows: int,
        pieces: int,
        limit: int,
        *,
        series: bool = False,
    ) -> list[tuple[KeyRanges, int]] | None:
        """The range pieces of the subquery of ``columns = params`` (``rows`` rows), in plan
        order; None when a term's type does not bind back exactly, the engine refused the ranking
        query, or its comparisons disagree with its ORDER BY (then :attr:`reason` says which).
        ``limit``: the rows one piece may hold (what ``fetch_bytes`` holds); combed pieces of
        rows, read whole, hold at most that many.
        ``series``: the subquery is its group's only one, so windowed pieces may be combed.

        Raises:
            ValueError: the ranking query found another number of rows than counting the
                subquery did (the data changed during planning).
        """
        assert isinstance(self._query, UserQuery) and self.terms
        # Rows combed across pieces are numbered piece after piece, which is the series' sample
        # numbering only where every row is a sample; otherwise a sample is placed by its series
        # row (``i * stride``), which only a series' combed pieces of windows map back.
        rows_are_samples = self._span == 1 and self._stride == 1
        windows = series and not rows_are_samples
        combed = rows_are_samples or windows
        edge = self._span - 1 if windows else 0
        stripes = COMB_STRIPES if combed else CONTIGUOUS_TILES
        if edge:  # each stripe's context adds edge rows: at most 1/CONTEXT_SHARE of a piece's
            stripes = max(min(stripes, rows // pieces // (CONTEXT_SHARE * edge)), 1)
        if rows_are_samples:  # read whole, so within the budget
            pieces = combed_count(rows, pieces, stripes, limit)
        sql = self._query.render(tiles_tree(self._query, self.terms, columns, pieces * stripes, rows, edge))
        try:
            table = self._run(sql, f"ranking the rows of a big subquery by {self.text}", params)
        except Exception as error:  # the engine's refusal is a reason to fall back, not to fail
            if edge:  # its window functions, maybe: cut contiguous pieces instead
                return self.cut(columns, params, rows, pieces, limit)
            self.reason = f"the engine could not rank the rows by {self.text!r} ({_first_line(error)})"
            return None
        lows = self._points(table, LOW_ALIAS)
        if lows is None:
            return None
        self._floats = any(
            pa.types.is_floating(table.schema.field(f"{LOW_ALIAS}{i}").type) for i in range(len(self.terms))
        )
        counts = [int(n) for n in table.column(ROWS_ALIAS).to_pylist()]
        if sum(counts) != rows:
            raise ValueError(
                f"ranking a subquery by {self.text!r} found {sum(counts)} rows, but counting it found "
                f"{rows}: the data changed while the loader was being built; build it again"
            )
        nullable = tuple(
            any(int(n) for n in table.column(f"{NULLS_ALIAS}{i}").to_pylist()) for i in range(len(self.terms))
        )
        tiles = list(zip(lows, counts, strict=True))
        if windows:
            # a window of one row has no context to cut by key, so its ties do not matter
            tied = bool(edge) and any(int(n) for n in table.column(TIES_ALIAS).to_pylist())
            aheads = self._points(table, AHEAD_ALIAS) if edge else lows
            if aheads is None:
                return None
            if not tied:
                windowed = [WindowTile(*tile) for tile in zip(lows, counts, aheads, strict=True)]
                marks = _marks(windowed, edge)
                pieces_of = window_layout(windowed, nullable, pieces, COMB_BAND, self._span, self._stride)
                return pieces_of if self._agrees(columns, params, nullable, marks, rows) else None
            # tuples shared by several rows, whose order between queries is the engine's:
            # contiguous pieces, which cut no context by tuple
            combed = False
        firsts = itertools.accumulate(counts[:-1], initial=0)
        marks = [(first, low) for first, (low, _) in zip(firsts, tiles, strict=True) if first]
        if not self._agrees(columns, params, nullable, marks, rows):
            return None
        return layout(tiles, nullable, pieces, COMB_BAND if combed else 1)

    def _points(self, table: pa.Table, alias: str) -> list[Point] | None:
        """Per tile, the tuple of the terms' columns ``alias0, alias1, ...``; None when a term's
        type does not bind back to the engine exactly or a value has no Python value."""
        columns = []
        for index, term in enumerate(self.terms):
            field = table.schema.field(f"{alias}{index}")
            if not binds_exactly(field):
                self.reason = (
                    f"the order key {term.text!r} is of type {field.type}, whose values do not bind "
                    f"back to the engine exactly"
                )
                return None
            try:
                columns.append(table.column(field.name).to_pylist())
            except (OverflowError, ValueError) as error:  # e.g. 'infinity' dates: no Python value
                self.reason = f"a value of the order key {term.text!r} has no Python value ({error})"
                return None
        return [tuple(values) for values in zip(*columns, strict=True)]

    def _agrees(
        self,
        columns: Sequence[exp.Expr],
        params: tuple[Any, ...],
        nullable: tuple[bool, ...],
        marks: Sequence[tuple[int, Point]],
        rows: int,
    ) -> bool:
        """Whether the engine's comparisons place the subquery's rows as its ORDER BY ranked them
        (see :func:`~ddbloader._sql.comparisons.disagreement`); False, with :attr:`reason` set,
        where they do not. Asked only where a term is a float (what engines compare otherwise
        than they order: a scan of the subquery, a third of the planning on DuckDB), else True."""
        assert isinstance(self._query, UserQuery)
        if not marks or not self._floats:
            return True
        self.reason = disagreement(
            self._query, self._run, self.terms, self.text, columns, params, nullable, marks, rows
        )
        return self.reason is None

    def piece_sql(self, columns: Sequence[exp.Expr], ranges: KeyRanges, query: Query | None = None) -> str:
        """The piece's query: the subquery's rows in ``ranges``, in the query's order; its key
        parameters first, then :meth:`KeyRanges.bounds`. ``query`` (default: the one cut) may be
        the same query carrying the row hash (``verify=True``). Without an ORDER BY when
        ``ranges.sort`` says the reader orders the rows. Every call of one cutter passes the
        same ``columns`` (the plan's keys): the SQL is kept per query and piece shape."""
        query = self._query if query is None else query
        assert isinstance(query, UserQuery) and self.terms
        shape = (id(query), ranges.shape())
        if shape not in self._sql:  # rendering costs ~10 ms at 32 ranges; combed pieces share a shape
            predicate = ranges.predicate(self.terms, len(columns) + 1)
            tree = query.filtered_where(columns, predicate, ordered=ranges.sort is None)
            self._sql[shape] = (query, query.render(tree))
        return self._sql[shape][1]


def _marks(tiles: Sequence[WindowTile], edge: int) -> list[tuple[int, Point]]:
    """``(row, tuple)`` of every end a combed windowed piece is cut at: each tile's first row but
    the first, and the row ``edge`` after it (its context's end) where that is not past the end."""
    total = sum(tile.rows for tile in tiles)
    marks: list[tuple[int, Point]] = []
    first = 0
    for index, tile in enumerate(tiles):
        if index:
            marks.append((first, tile.low))
        if edge and first + edge < total:
            marks.append((first + edge, tile.ahead))
        first += tile.rows
    return marks


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
    found = [i for i, name in enumerate(schema.names) if same_name(column.this, name, query.dialect)]
    if len(found) != 1:
        return None
    kind = schema.field(found[0]).type
    if not (pa.types.is_integer(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind)):
        return None
    return found[0], bool(terms[0].args.get("desc"))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
