"""The ranking query: a big subquery's rows ranked by its whole ORDER BY tuple, cut into tiles.

Rows the engine orders as equal share a ``RANK()``; a row's tile is ``(rank - 1) * tiles // rows``,
so the tile boundaries are the engine's, whatever it does with ties, NULLs, NaN or -0.0. The
result has one row per non-empty tile, in tile order, with columns named by the aliases below
(one per ORDER BY term where suffixed by the term's index). Pure: builds a sqlglot tree, runs
nothing; :class:`~ddbloader._sql.range_cutter.RangeCutter` runs it and reads the tiles.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from .comparisons import over_pieces_scope, subquery
from .parsing import NULLS_STATED
from .query import UserQuery
from .tuple_order import Term, paren

__all__ = ["AHEAD_ALIAS", "LOW_ALIAS", "NULLS_ALIAS", "ROWS_ALIAS", "TIES_ALIAS", "tiles_tree"]

_KEY_ALIAS = "_ddb_k"
_TILE_ALIAS = "_ddb_tile"
_RANK_ALIAS = "_ddb_rank"
_FIRST_ALIAS = "_ddb_first"
#: per term: the tile's first row's value
LOW_ALIAS = "_ddb_low"
#: the tile's rows
ROWS_ALIAS = "_ddb_rows"
#: per term: how many NULLs the subquery holds there (the same in every tile)
NULLS_ALIAS = "_ddb_nulls"
#: per term, with an edge: the value ``edge`` rows after the tile's first row
AHEAD_ALIAS = "_ddb_ahead"
#: with an edge: whether a tuple of the tile is shared by several rows (> 0)
TIES_ALIAS = "_ddb_ties"


def tiles_tree(
    query: UserQuery, terms: Sequence[Term], columns: Sequence[exp.Expr], tiles: int, rows: int, edge: int = 0
) -> exp.Expr:
    """The ranking query's tree over the subquery ``columns = params`` of ``query`` (``rows``
    rows, ranked by the ORDER BY ``terms``): per non-empty tile, by tile, its first row's tuple
    (``_ddb_low0``, ...), its rows, and per term how many NULLs the subquery holds there. A
    row's tile is ``(rank - 1) * tiles // rows`` (rows the ORDER BY ties share their rank); a
    tile's first rows are those of its least rank, which all tie. With an ``edge`` (windows'
    ``span - 1``), also whether a tuple of it is shared (the most any row's ``ROW_NUMBER() -
    RANK()`` reaches: 0 only where no row ties with an earlier one) and the tuple ``edge``
    rows after its first row (``_ddb_ahead0``, ...: meaningless past the last row, whatever
    the engine returns there).

    One ranking of the rows (``_ddb_r``), grouped by tile (``_ddb_t``: each tile's least
    rank, rows and NULLs), joined back on that rank for the tuples: grouping costs a fifth
    of the window functions partitioned by tile it replaces (DuckDB, 2M rows)."""
    names = [f"{_KEY_ALIAS}{i}" for i in range(len(terms))]
    keys = over_pieces_scope(
        query,
        columns,
        [paren(term.expression).as_(name) for term, name in zip(terms, names, strict=True)],
    )

    def order() -> exp.Order:
        return exp.Order(
            expressions=[
                # NULL placement stated even where it is the dialect's default: the session's
                # may differ (DuckDB's default_null_order), and the pieces assume the engine's
                exp.Ordered(
                    this=exp.column(name),
                    desc=term.descending,
                    nulls_first=term.nulls_first,
                    **{NULLS_STATED: True},
                )
                for term, name in zip(terms, names, strict=True)
            ]
        )

    rank = exp.Window(this=exp.Anonymous(this="RANK"), order=order())
    ranked = exp.select(*map(exp.column, names), rank.copy().as_(_RANK_ALIAS))
    # FLOOR of a division, not an integer division: every engine spells that alike, and the
    # tile only has to grow with the rank
    tile = exp.Floor(
        this=exp.Div(
            this=exp.Paren(
                this=exp.Mul(
                    this=exp.Paren(
                        this=exp.Sub(this=exp.column(_RANK_ALIAS), expression=exp.Literal.number(1))
                    ),
                    expression=exp.Literal.number(tiles),
                )
            ),
            expression=exp.Literal.number(max(rows, 1)),
        )
    )
    grouped = exp.select(
        tile.copy().as_(_TILE_ALIAS),
        exp.Min(this=exp.column(_RANK_ALIAS)).as_(_FIRST_ALIAS),
        exp.Count(this=exp.Star()).as_(ROWS_ALIAS),
    )
    outputs: list[exp.Expr] = [exp.column(_TILE_ALIAS, table="_ddb_t")]
    outputs += [
        exp.Min(this=exp.column(n, table="_ddb_r")).as_(f"{LOW_ALIAS}{i}") for i, n in enumerate(names)
    ]
    outputs.append(exp.Min(this=exp.column(ROWS_ALIAS, table="_ddb_t")).as_(ROWS_ALIAS))
    for index, name in enumerate(names):
        nulls = exp.Sub(this=exp.Count(this=exp.Star()), expression=exp.Count(this=exp.column(name)))
        grouped = grouped.select(nulls.as_(f"{NULLS_ALIAS}{index}"))
        outputs.append(
            exp.Max(this=exp.column(f"{NULLS_ALIAS}{index}", table="_ddb_t")).as_(f"{NULLS_ALIAS}{index}")
        )
    if edge:
        for index, name in enumerate(names):
            shifted = exp.Lead(this=exp.column(name), offset=exp.Literal.number(edge))
            ranked = ranked.select(exp.Window(this=shifted, order=order()).as_(f"{AHEAD_ALIAS}{index}"))
            outputs.append(
                exp.Min(this=exp.column(f"{AHEAD_ALIAS}{index}", table="_ddb_r")).as_(f"{AHEAD_ALIAS}{index}")
            )
        number = exp.Window(this=exp.Anonymous(this="ROW_NUMBER"), order=order())
        ranked = ranked.select(exp.Sub(this=number, expression=rank.copy()).as_(TIES_ALIAS))
        grouped = grouped.select(exp.Max(this=exp.column(TIES_ALIAS)).as_(TIES_ALIAS))
        outputs.append(exp.Max(this=exp.column(TIES_ALIAS, table="_ddb_t")).as_(TIES_ALIAS))
    ranked = ranked.from_(subquery(keys, "_ddb_s"))
    grouped = grouped.from_("_ddb_r").group_by(tile)
    first = exp.EQ(
        this=exp.column(_RANK_ALIAS, table="_ddb_r"), expression=exp.column(_FIRST_ALIAS, table="_ddb_t")
    )
    return (
        exp.select(*outputs)
        .from_("_ddb_t")
        .join("_ddb_r", on=first)
        .group_by(exp.column(_TILE_ALIAS, table="_ddb_t"))
        .order_by(exp.column(_TILE_ALIAS, table="_ddb_t"))
        .with_("_ddb_r", as_=ranked)
        .with_("_ddb_t", as_=grouped)
    )
