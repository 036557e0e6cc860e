"""Time splits: ``split_col`` + ``split_range=(lo, hi)`` serve exactly the samples whose y rows
all have ``lo <= split_col < hi``; x may look back before ``lo``.

How: the query is narrowed to the rows a split can use (:meth:`UserQuery.narrowed`), so every
fetch, count and piece reads only them and the engine pushes the predicate down: rows at or after
``hi``, and with a look-back bound ``floor`` the rows below it (``split_col >= floor``). The counts
that plan the subqueries also count, per subquery, the rows below ``lo``; a group whose series
has ``before`` of them serves its samples from its ``first_sample``-th on
(:func:`first_sample`), the first whose y starts at or after ``lo``
(:attr:`~ddbloader._sql.plan.GroupPlan.first_sample`).

Why that is exact: a filter on ``split_col`` removes a prefix and a suffix of a series, never
rows from its middle (which would make other rows neighbours), only when ``split_col`` never
decreases along the series. :func:`check_series` asks the engine, once at planning, before any
filter: per subquery, the rows where ``split_col`` is lower than on the row before (``LAG`` in the
query's order), its NULLs, its least and greatest value; across the repartitions of a group the
greatest of one must not exceed the least of the next. Without windows a sample is one row, and
a row filter is exact whatever the order: only NULLs are refused there.

``floor`` (the look-back bound, one for all groups): with stride 1 the least value among each
group's ``offset`` rows before ``lo`` (its first needed row), over the groups with rows in the
range, found by one planning query; the rows below it are at the start of every series, so
dropping them keeps sample ``i`` of the narrowed series the unsplit series' sample
``i + dropped``. With a stride above 1 the dropped
rows would have to be a multiple of it in every group, so nothing is dropped below ``lo``'s
look-back; repartitions wholly before it are never fetched (their samples are not served).
"""

from __future__ import annotations

import datetime as dt
import decimal
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .binding import binds_exactly
from .cells import Tallied, TickingCursor, plan_cells, run_planning
from .key_values import PlanKey
from .query import Query, UserQuery
from .rewrites import Tally, operand, subquery

__all__ = ["SplitPlan", "first_sample", "plan_split"]

BEFORE_ALIAS = "_ddb_split_before"
_NULLS_ALIAS = "_ddb_split_nulls"
_DESCENTS_ALIAS = "_ddb_split_descents"
_LEAST_ALIAS = "_ddb_split_least"
_GREATEST_ALIAS = "_ddb_split_greatest"
_FLOOR_ALIAS = "_ddb_split_floor"


@dataclass(frozen=True)
class SplitPlan:
    """A split's narrowed query and what its planning counts add.

    ``query``: the user's query keeping only the rows the split can use; ``before``: the tally
    :func:`plan_cells` adds to count each subquery's rows below ``lo`` (None: ``lo`` is None or
    the floor, so no kept row lies below it).
    """

    query: UserQuery
    before: Tally | None


def literal(value: Any, dialect: str) -> exp.Expr:
    """``value`` (a ``split_range`` end) as a literal the engine compares with ``split_col``:
    a number, a string, or a date or timestamp cast from its ISO text (a zoned one as
    ``TIMESTAMPTZ``), built by the dialect's generator."""
    if isinstance(value, bool):
        raise TypeError(f"split_range ends must not be bools, got {value!r}")
    if isinstance(value, (int, decimal.Decimal)):
        return exp.Literal.number(str(value))
    if isinstance(value, float):
        return exp.Literal.number(repr(value))
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):
        kind = "timestamptz" if value.tzinfo is not None else "timestamp"
        return exp.cast(
            exp.Literal.string(value.isoformat(sep=" ")), exp.DataType.build(kind, dialect=dialect)
        )
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), exp.DataType.build("date", dialect=dialect))
    raise TypeError(f"split_range ends must be numbers, strings, dates or datetimes, got {value!r}")


def first_sample(before: int, geometry: WindowGeometry) -> int:
    """The first sample of a series whose first ``before`` rows lie below ``lo``: the first whose
    y starts at or after row ``before`` (sample ``i``'s y starts at row ``i * stride + offset``)."""
    return max(0, -(-(before - geometry.offset) // geometry.stride))


def plan_split(
    cursor: TickingCursor,
    query: Query,
    keys: list[PlanKey],
    config: LoaderConfig,
    geometry: WindowGeometry,
    lists: bool,
) -> SplitPlan:
    """Check that the split is exact on this query and narrow the query to the rows it can use.

    Raises:
        ValueError: the query is not one ddbloader parses (DolphinDB's), ``split_col`` is not a
            result column, is NULL in some row, or (with windows) decreases along a series,
            naming the column and the group; the engine cannot compare it with ``split_range``.
    """
    assert config.split_col is not None and config.split_range is not None
    if not isinstance(query, UserQuery):
        raise ValueError(
            f"split_col needs a query ddbloader parses as SQL; {type(query).__name__} queries filter "
            f"their own rows: bound split_col in the query's WHERE"
        )
    column = query.column(config.split_col, "split_col")
    query.check_key(column, f"split_col {config.split_col!r}")
    lo, hi = (None if v is None else literal(v, query.dialect) for v in config.split_range)
    check_series(cursor, query, keys, column, config, geometry, lists)
    kept: list[exp.Expr] = [] if hi is None else [exp.LT(this=operand(column), expression=hi)]
    floor = None if lo is None else _floor(cursor, query, keys, column, lo, hi, geometry)
    if floor is not None:
        kept.append(exp.GTE(this=operand(column), expression=floor))
    narrowed = query.narrowed(exp.and_(*kept)) if kept else query
    before = None
    if lo is not None and floor is not lo:
        below = exp.LT(this=operand(column), expression=lo)
        before = Tally(BEFORE_ALIAS, _indicator(below), exp.Sum)
    return SplitPlan(narrowed, before)


def check_series(
    cursor: TickingCursor,
    query: UserQuery,
    keys: list[PlanKey],
    column: exp.Expr,
    config: LoaderConfig,
    geometry: WindowGeometry,
    lists: bool,
) -> None:
    """Refuse a ``split_col`` that is NULL in some row, or, with windows, decreases along a series
    (within a subquery in the query's order, or from one repartition to the next), naming the
    column and the group. One planning query over the whole query (see the module docstring)."""
    if geometry.windowed and not query.is_ordered():
        raise ValueError(
            f"split_col {config.split_col!r} with window_size needs the query's ORDER BY: a split keeps "
            f"each series' rows between two values of split_col, which must never decrease in the "
            f"series' order; add an ORDER BY that orders each series' rows (e.g. by timestamp)"
        )
    null = exp.Is(this=operand(column), expression=exp.Null())
    tallies = [Tally(_NULLS_ALIAS, _indicator(null), exp.Sum)]
    if geometry.windowed:
        tallies += [
            Tally(_DESCENTS_ALIAS, column, exp.Sum, descents=True),
            Tally(_LEAST_ALIAS, column, exp.Min),
            Tally(_GREATEST_ALIAS, column, exp.Max),
        ]
    tallied: list[list[Tallied]] = []
    with warnings.catch_warnings():  # about the schemes: the counts that plan the split warn once
        warnings.simplefilter("ignore")
        cells = plan_cells(cursor, query.with_tallies(tallies), keys, "", {}, lists, tallied)
    name = f"split_col {config.split_col!r}"
    for (group, row), figures in zip(cells, tallied, strict=True):
        where = "" if group is None else f" in group {group!r}"
        nulls = sum(int(f.get(_NULLS_ALIAS) or 0) for f in figures)
        if nulls:
            raise ValueError(
                f"{name} is NULL in {nulls} row(s){where}: such a row lies in no split_range, so the splits "
                f"of the query would not hold all its samples; filter them out (WHERE {config.split_col} IS "
                f"NOT NULL) or COALESCE the column in the query"
            )
        if not geometry.windowed:
            continue
        previous: tuple[Any, Any] | None = None
        for (repartition, _, rows, _), f in zip(row, figures, strict=True):
            if not rows:
                continue
            at = where + ("" if repartition is None else f", repartition {repartition!r}")
            if int(f.get(_DESCENTS_ALIAS) or 0):
                _refuse_descent(name, at, f"in {f[_DESCENTS_ALIAS]} row(s) of the query's order")
            if previous is not None and _exceeds(previous[1], f[_LEAST_ALIAS]):
                _refuse_descent(
                    name,
                    at,
                    f"from {previous[1]!r} (repartition {previous[0]!r}) to {f[_LEAST_ALIAS]!r}",
                )
            previous = (repartition, f[_GREATEST_ALIAS])


def _exceeds(greatest: Any, least: Any) -> bool:
    try:
        return bool(greatest > least)
    except TypeError:  # values Python cannot compare: the engine's order cannot be checked here
        return True


def _refuse_descent(name: str, where: str, how: str) -> None:
    raise ValueError(
        f"{name} decreases along the series{where} ({how}), so a range of it is not a run of the "
        f"series: filtering it would make rows neighbours that are not; split by a column that never "
        f"decreases in each series' order (such as its timestamp), or order the query by it"
    )


def _indicator(condition: exp.Expr) -> exp.Expr:
    """``CASE WHEN condition THEN 1 ELSE 0 END``."""
    return exp.Case(ifs=[exp.If(this=condition, true=exp.Literal.number(1))], default=exp.Literal.number(0))


def _floor(
    cursor: TickingCursor,
    query: UserQuery,
    keys: Sequence[PlanKey],
    column: exp.Expr,
    lo: exp.Expr,
    hi: exp.Expr | None,
    geometry: WindowGeometry,
) -> exp.Expr | None:
    """The look-back bound (see the module docstring): ``lo`` itself when a sample's y starts on
    its first row (no row before ``lo`` is needed), else with stride 1 the least ``split_col``
    among the ``offset`` greatest values below ``lo`` of each group that has rows in the range (a
    series that ended before ``lo`` serves nothing here, and must not pull the bound back), as a
    literal; None (read from each series' start) with a stride above 1, when no row lies below
    ``lo``, or when the value would not come back to the engine exactly."""
    if geometry.offset == 0:
        return lo
    if geometry.stride != 1:
        return None
    value = operand(column)
    group = [operand(k.expression) for k in keys if k.parameter == "group_col"]
    below = exp.LT(this=value.copy(), expression=lo)
    # rows at or after lo (and below hi) rank first, descending: the rows below lo after them
    inside = exp.Window(
        this=exp.Sum(this=_indicator(exp.Not(this=exp.Paren(this=below.copy())))), partition_by=group
    )
    rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=[g.copy() for g in group],
        order=exp.Order(expressions=[exp.Ordered(this=value.copy(), desc=True)]),
    )
    ranked = exp.select(
        value.copy().as_("_ddb_value"), rank.as_("_ddb_rank"), inside.as_("_ddb_inside")
    ).from_(subquery(query.source(), "_ddb_q"))
    if hi is not None:
        ranked = ranked.where(exp.LT(this=value.copy(), expression=hi))
    rank_column, inside_column = exp.column("_ddb_rank"), exp.column("_ddb_inside")
    needed = exp.and_(
        exp.LT(this=exp.column("_ddb_value"), expression=lo.copy()),
        exp.GT(this=inside_column.copy(), expression=exp.Literal.number(0)),
        exp.LTE(
            this=rank_column,
            expression=exp.Add(this=inside_column, expression=exp.Literal.number(geometry.offset)),
        ),
    )
    least = (
        exp.select(exp.Min(this=exp.column("_ddb_value")).as_(_FLOOR_ALIAS))
        .from_(subquery(ranked, "_ddb_ranked"))
        .where(needed)
    )
    table = run_planning(cursor, query.render(least), "finding the rows split_col's look-back needs")
    field, found = table.schema.field(_FLOOR_ALIAS), table.column(_FLOOR_ALIAS)
    if found.null_count or not binds_exactly(field):  # a value that would not come back exactly
        return None
    try:
        return literal(found[0].as_py(), query.dialect)
    except TypeError:  # a value the loader does not write as a literal: read from the series' start
        return None
