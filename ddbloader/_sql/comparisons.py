"""The planning check of range pieces: the engine's comparisons place rows as its ORDER BY ranks them.

A piece's rows are those its predicate (lexicographic comparisons with its ends, see
:func:`~ddbloader._sql.tuple_order.compare`) holds, while its planned count comes from the engine's
ranking by the ORDER BY. Where an engine compares otherwise than it orders (NaN is neither before
nor after 7.0; -0.0 equals 0.0 but may sort apart), a piece would read other rows than planned:
:func:`disagreement` counts, per boundary, the rows the comparisons place before and at or after
it, and names the first that differs from the ranking, so the partition is streamed instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from sqlglot import exp

from .query import UserQuery
from .tuple_order import Point, Term, compare, search

__all__ = ["Run", "disagreement", "over_pieces_scope", "subquery"]

#: Runs a planning query: (sql, purpose, parameters) -> its result.
Run = Callable[[str, str, Sequence[Any]], pa.Table]

_REGION_ALIAS = "_ddb_region"
_ROWS_ALIAS = "_ddb_rows"


def subquery(tree: exp.Expr, alias: str) -> exp.Subquery:
    """``(tree) AS alias``."""
    return exp.Subquery(this=tree, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def over_pieces_scope(
    query: UserQuery, columns: Sequence[exp.Expr], outputs: Sequence[exp.Expr]
) -> exp.Select:
    """``outputs`` over the rows of the subquery of ``columns`` (its keys' parameters first), in
    the scope a piece's predicate reads: the query's result columns, and the ORDER BY terms it
    carries as hidden ones (which the pieces' queries do not return)."""
    filtered = query.filtered_where(columns, exp.true(), ordered=False)
    assert isinstance(filtered, exp.Select)
    return filtered.select(*outputs, append=False, copy=False)


def disagreement(
    query: UserQuery,
    run: Run,
    terms: Sequence[Term],
    text: str,
    columns: Sequence[exp.Expr],
    params: tuple[Any, ...],
    nullable: tuple[bool, ...],
    marks: Sequence[tuple[int, Point]],
    rows: int,
) -> str | None:
    """None when the comparisons of the ORDER BY ``terms`` (``text`` in messages) place the
    subquery's ``rows`` rows (the query filtered by ``columns`` = the first ``params``) as the
    ranking did, else why not. ``marks`` are ``(row, tuple of that row)`` at the ends pieces are
    cut at: the rows between consecutive marks by the comparisons "before", and the rows at or
    after each mark, must be the ranking's."""
    marks = sorted(dict(marks).items())
    points = [point for _, point in marks]
    first = len(columns) + 1
    bounds = tuple(value for point in points for value in point if value is not None)
    purpose = f"checking the pieces' comparisons of {text}"
    region = search(terms, nullable, points, first, exp.Literal.number)
    regions = over_pieces_scope(query, columns, [region.as_(_REGION_ALIAS)])
    counted = (
        exp.select(exp.column(_REGION_ALIAS), exp.Count(this=exp.Star()).as_(_ROWS_ALIAS))
        .from_(subquery(regions, "_ddb_c"))
        .group_by(exp.column(_REGION_ALIAS))
    )
    table = run(query.render(counted), purpose, (*params, *bounds))
    found = {int(r): int(n) for r, n in zip(*table.to_pydict().values(), strict=True)}
    ends = [0, *(row for row, _ in marks), rows]
    expected = {r: ends[r + 1] - ends[r] for r in range(len(ends) - 1) if ends[r + 1] > ends[r]}
    if found != expected:
        wrong = next(r for r in sorted(set(found) | set(expected)) if found.get(r) != expected.get(r))
        return _reason(text, expected.get(wrong, 0), found.get(wrong, 0))
    sums, number = [], first
    for index, point in enumerate(points):
        at = compare(terms, nullable, point, number, after=True)
        one = exp.Case(ifs=[exp.If(this=at, true=exp.Literal.number(1))], default=exp.Literal.number(0))
        sums.append(exp.Sum(this=one).as_(f"{_ROWS_ALIAS}{index}"))
        number += sum(value is not None for value in point)
    table = run(query.render(over_pieces_scope(query, columns, sums)), purpose, (*params, *bounds))
    for index, (row, _) in enumerate(marks):
        after = int(table.column(index)[0].as_py() or 0)
        if after != rows - row:
            return _reason(text, rows - row, after)
    return None


def _reason(text: str, ranked: int, found: int) -> str:
    return (
        f"the engine's comparisons of {text!r} do not agree with its own ORDER BY (it ranked {ranked} "
        f"rows where its comparisons find {found}; NaN or -0.0 and 0.0 in a float key do this on some "
        f"engines), so pieces cut by those comparisons would not hold the rows planned"
    )
