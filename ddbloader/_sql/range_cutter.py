"""RangeCutter: the planning queries that find a big subquery's tiles by its order key.

One query per subquery ranks its rows by the leading ORDER BY key ``k`` (``RANK()``, so equal
keys share a rank) and cuts the ranks into *tiles* of about equal rows; each tile is a key range
``[lowest key of the tile, lowest key of the next)`` with its exact row count. Equal keys always
share a tile, so a piece never splits them. NULL keys form their own piece, placed where the
ORDER BY puts NULLs. The pieces are laid out from the tiles by :func:`ddbloader._sql.pieces.layout`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from sqlglot import exp

from .binding import binds_exactly
from .ordering import is_carried, read_direction, same_name
from .pieces import COMB_BAND, COMB_STRIPES, CONTIGUOUS_TILES, KeyRanges, layout, paren
from .query import Query, UserQuery
from .window_pieces import WindowTile, window_layout

__all__ = ["CONTEXT_SHARE", "OrderKey", "RangeCutter"]

_KEY_ALIAS = "_ddb_k"
_TILE_ALIAS = "_ddb_tile"
_LOW_ALIAS = "_ddb_low"
_ROWS_ALIAS = "_ddb_rows"
#: A combed piece of windows has at most ``rows / CONTEXT_SHARE`` rows of context (its stripes'
#: ``span - 1`` rows each), so it holds at most 1.25 pieces' rows: fewer stripes for long windows.
CONTEXT_SHARE = 4
_AHEAD_ALIAS = "_ddb_ahead"
_BEHIND_ALIAS = "_ddb_behind"
_TIES_ALIAS = "_ddb_ties"


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
    Samples of ``span`` rows, ``stride`` apart: one row (``span == 1``) are combed; windows are combed where a
    subquery is a whole series whose order key is distinct (see
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
        self.key: OrderKey | None = None
        self.reason: str | None = None
        #: Per (query, piece shape): the query (kept, so its id stays its own) and the piece's SQL,
        #: which the bounds' values do not change.
        self._sql: dict[tuple[int, tuple[Any, ...]], tuple[Query, str]] = {}
        #: ``KeyRanges.sort`` for combed pieces read whole (see :func:`_client_sort`).
        self.sort: tuple[int, bool] | None = None
        if not isinstance(query, UserQuery):
            self.reason = "this engine's queries cannot be cut by key ranges"
            return
        ordered = query.order_key(keys)
        if ordered is None:
            self.reason = (
                "the query has no ORDER BY"
                if not query.is_ordered()
                else "its ORDER BY has no term besides group_col and repartition_col, or one that "
                "cannot be resolved against the query's result columns"
            )
            return
        term = ordered.this
        text = term.name if isinstance(term, exp.Column) else term.sql(dialect=query.dialect)
        if is_carried(term):
            self.reason = f"the leading ORDER BY term {text!r} is not a result column (select it)"
            return
        try:  # the engine's own direction and NULL placement, whatever its session settings
            direction = run(query.direction_probe(ordered), "asking the engine how the ORDER BY sorts", ())
        except Exception as error:  # the engine's refusal is a reason to fall back, not to fail
            self.reason = f"the engine could not say how it sorts by {text!r} ({_first_line(error)})"
            return
        descending, nulls_first, default_descending = read_direction(direction)
        if default_descending:
            self.reason = "the session sorts descending by default (DuckDB's default_order)"
            return
        self.key = OrderKey(term, descending, nulls_first, text)
        if schema is not None:
            self.sort = _client_sort(query, keys, schema)

    def cut(
        self,
        columns: Sequence[exp.Expr],
        params: tuple[Any, ...],
        rows: int,
        pieces: int,
        *,
        series: bool = False,
    ) -> list[tuple[KeyRanges, int]] | None:
        """The range pieces of the subquery of ``columns = params`` (``rows`` rows), in plan
        order; None when the key's type does not bind back exactly or the engine refused the
        ranking query (then :attr:`reason` says which). ``series``: the subquery is its group's
        only one, so windowed pieces may be combed.

        Raises:
            ValueError: the ranking query found more rows than counting the subquery did (the
                data changed during planning).
        """
        assert isinstance(self._query, UserQuery) and self.key is not None
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
        tile_count = pieces * stripes
        sql = self._query.render(self._tiles_tree(columns, tile_count, edge))
        try:
            table = self._run(sql, "ranking the rows of a big subquery by its order key", params)
        except Exception as error:  # the engine's refusal is a reason to fall back, not to fail
            if edge:  # its window functions, maybe: cut contiguous pieces instead
                return self.cut(columns, params, rows, pieces)
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
        if windows:
            # a window of one row has no context to cut by key, so its ties do not matter
            tied = bool(edge) and any(int(n) for n in table.column(_TIES_ALIAS).to_pylist())
            if not tied and keyed == rows:
                ahead = table.column(_AHEAD_ALIAS).to_pylist() if edge else lows
                behind = table.column(_BEHIND_ALIAS).to_pylist() if edge else lows
                windowed = [WindowTile(*tile) for tile in zip(lows, counts, ahead, behind, strict=True)]
                return window_layout(
                    windowed, pieces, COMB_BAND, self._span, self._stride, descending=self.key.descending
                )
            # keys shared by several rows (whose order between queries is the engine's) or NULL
            # keys (which windows cross into): contiguous pieces, which need neither
            combed = False
        nulls_first = self.key.nulls_first
        if keyed and rows > keyed:
            nulls_first = self._nulls_come_first(columns, params)
        return layout(
            tiles,
            rows - keyed,
            pieces,
            COMB_BAND if combed else 1,
            descending=self.key.descending,
            nulls_first=nulls_first,
        )

    def _unequal_to_themselves(self, columns: Sequence[exp.Expr], params: tuple[Any, ...]) -> bool:
        """Whether some key of the subquery compares unequal to itself (NaN on engines such as
        ClickHouse; DuckDB, PostgreSQL and Spark find NaN equal to NaN and above every number)."""
        assert isinstance(self._query, UserQuery) and self.key is not None
        key = paren(self.key.expression)
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
            exp.Is(this=paren(self.key.expression), expression=exp.Null()).as_(_KEY_ALIAS)
        ).from_(_subquery(first, "_ddb_f"))
        table = self._run(self._query.render(probe), "asking where the engine orders NULL keys", params)
        return bool(table.column(_KEY_ALIAS)[0].as_py())

    def piece_sql(self, columns: Sequence[exp.Expr], ranges: KeyRanges, query: Query | None = None) -> str:
        """The piece's query: the subquery's rows in ``ranges``, in the query's order; its key
        parameters first, then :meth:`KeyRanges.bounds`. ``query`` (default: the one cut) may be
        the same query carrying the row hash (``verify=True``). Without an ORDER BY when
        ``ranges.sort`` says the reader orders the rows. Every call of one cutter passes the
        same ``columns`` (the plan's keys): the SQL is kept per query and piece shape."""
        query = self._query if query is None else query
        assert isinstance(query, UserQuery) and self.key is not None
        shape = (id(query), ranges.shape())
        if shape not in self._sql:  # rendering costs ~10 ms at 32 ranges; combed pieces share a shape
            predicate = ranges.predicate(self.key.expression, len(columns) + 1)
            tree = query.filtered_where(columns, predicate, ordered=ranges.sort is None)
            self._sql[shape] = (query, query.render(tree))
        return self._sql[shape][1]

    def _tiles_tree(self, columns: Sequence[exp.Expr], tiles: int, edge: int = 0) -> exp.Expr:
        """``(tile, lowest key, rows)`` per non-empty tile of the subquery's non-NULL keys, by tile:
        a row's tile is ``(rank - 1) * tiles // rows`` (equal keys share their rank). With an
        ``edge`` (windows' ``span - 1``), also whether a key of it is shared (the most any row's
        ``ROW_NUMBER() - RANK()`` reaches: 0 only where no row ties with an earlier one; a third of
        the cost of counting distinct keys on DuckDB) and the keys ``edge`` rows after and before
        its first row (as :class:`WindowTile` reads them: the keys grow with the rows, so the
        least of a tile's is its first row's; before-keys of a tile that starts within ``edge``
        rows of the first are not used)."""
        assert isinstance(self._query, UserQuery) and self.key is not None
        key = self.key.expression
        filtered = self._query.filtered_where(
            columns, exp.Not(this=exp.Is(this=paren(key), expression=exp.Null())), ordered=False
        )
        keys = exp.select(paren(key).as_(_KEY_ALIAS)).from_(_subquery(filtered, "_ddb_r"))
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
        outputs: list[exp.Expr] = [
            exp.column(_TILE_ALIAS),
            exp.Min(this=column).as_(_LOW_ALIAS),
            exp.Count(this=exp.Star()).as_(_ROWS_ALIAS),
        ]
        if edge:
            order = exp.Order(expressions=[exp.Ordered(this=column.copy())])
            for kind, alias in ((exp.Lead, _AHEAD_ALIAS), (exp.Lag, _BEHIND_ALIAS)):
                shifted = kind(this=column.copy(), offset=exp.Literal.number(edge))
                ranked = ranked.select(exp.Window(this=shifted, order=order.copy()).as_(alias))
                outputs.append(exp.Min(this=exp.column(alias)).as_(alias))
            number = exp.Window(this=exp.Anonymous(this="ROW_NUMBER"), order=order.copy())
            ranked = ranked.select(exp.Sub(this=number, expression=rank.copy()).as_(_TIES_ALIAS))
            outputs.append(exp.Max(this=exp.column(_TIES_ALIAS)).as_(_TIES_ALIAS))
        return (
            exp.select(*outputs)
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
    found = [i for i, name in enumerate(schema.names) if same_name(column.this, name, query.dialect)]
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
