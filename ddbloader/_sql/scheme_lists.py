"""The SQL of the counting query's key lists: a scheme's values bound as rows, and the counted
keys joined to them (see :meth:`ddbloader._sql.query.UserQuery.key_counts`).

Scheme values are only ever parameters (never SQL text); each row carries the value's position
in its scheme (``_ddb_index``) so the counts come back matched to the scheme as given. Pure:
builds sqlglot trees, runs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlglot import exp

from .aliases import INDEX_SUFFIX, ROWS_ALIAS
from .fingerprint import HASH_SUM_ALIAS

__all__ = ["matched_keys", "scheme_list"]


def scheme_list(positions: list[int], listed: list[Any], values: list[Any], lists: bool) -> exp.Expr:
    """Rows (position, value) of one scheme's values of one type; their parameters go to ``values``.

    With ``lists`` (DuckDB, PostgreSQL) two list parameters are bound and unnested side by side:
    one statement of constant size, where thousands of markers cost more to build, parse and
    bind than the count costs to run. Other engines get a VALUES list with a parameter per value.
    """
    if lists:
        values.extend([positions, listed])
        first, second = (exp.Parameter(this=exp.Literal.number(len(values) - n)) for n in (1, 0))
        return exp.select(exp.Unnest(expressions=[first]), exp.Unnest(expressions=[second]))
    rows = []
    for position, value in zip(positions, listed, strict=True):
        values.append(value)
        parameter = exp.Parameter(this=exp.Literal.number(len(values)))
        rows.append(exp.Tuple(expressions=[exp.Literal.number(position), parameter]))
    if len(rows) == 1:
        # sqlglot writes a one-row VALUES for ClickHouse as its values() table function, which
        # reads each item as a row of one column: one row is a plain SELECT on every engine.
        return exp.select(*rows[0].expressions)
    return exp.Values(expressions=rows)


def matched_keys(
    aliases: Sequence[str], tables: Sequence[str | None], hashed: bool, extra: Sequence[str]
) -> exp.Select:
    """The counted keys joined to one VALUES list per explicit key (None: a discovered key);
    ``hashed``: with their hash sums; with the ``extra`` columns (tallies)."""
    indexes = [
        exp.column("_ddb_index", table=t).as_(a + INDEX_SUFFIX)
        for a, t in zip(aliases, tables, strict=True)
        if t
    ]
    keys = [exp.column(a, table="_ddb_keys") for a in aliases]
    sums = [exp.column(HASH_SUM_ALIAS, table="_ddb_keys")] if hashed else []
    tallied = [exp.column(e, table="_ddb_keys") for e in extra]
    select = exp.select(*indexes, *keys, exp.column(ROWS_ALIAS, table="_ddb_keys"), *sums, *tallied).from_(
        "_ddb_keys"
    )
    for alias, table in zip(aliases, tables, strict=True):
        if table is not None:
            on = exp.EQ(
                this=exp.column(alias, table="_ddb_keys"), expression=exp.column("_ddb_value", table=table)
            )
            select = select.join(table, on=on, copy=False)
    return select
