"""Planning queries and cells: the queries that discover scheme values and count the rows of
every subquery (a *cell*: one group × one repartition).

Every planning query runs through :func:`run_planning`, which notes on a failure what ddbloader
was doing and with which parameters. Cells come back per group, in scheme order, with their exact
row counts (and, with ``verify=True``, planned hash sums); rows whose key is NULL are counted as
lost, never silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import SqlglotError

from .._core.engine import Backend, Cursor
from .._core.errors import add_note
from .aliases import GROUP_ALIAS, INDEX_SUFFIX, PIVOT_ALIAS, REPARTITION_ALIAS, ROWS_ALIAS
from .fingerprint import HASH_SUM_ALIAS, planned_sum
from .key_values import PlanKey, check_discovered, check_scheme, python_rows
from .query import Query, UserQuery
from .rewrites import Tally

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "Cell",
    "Lost",
    "Tallied",
    "TickingCursor",
    "parse_query",
    "pin_pivots",
    "plan_cells",
    "probe_partition",
    "run_planning",
]


def run_planning(cursor: Cursor, sql: str, purpose: str, params: Sequence[Any] = ()) -> pa.Table:
    """Run one planning query; a failure carries a note of ``purpose``, the SQL and its parameters."""
    try:
        return cursor.fetch(sql, params)
    except Exception as error:
        add_note(error, f"ddbloader was {purpose}: {sql!r} with parameters {list(params)!r}")
        raise


class TickingCursor:
    """A planning cursor that advances a progress bar once per query, failed ones included."""

    def __init__(self, cursor: Cursor, bar: tqdm) -> None:
        self._cursor = cursor
        self._bar = bar

    def expect(self, queries: int) -> None:
        """``queries`` more queries will run: the bar's total becomes known."""
        # No refresh: the bar appears with its next update, and only once the delay has passed.
        self._bar.total = self._bar.n + queries

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        try:
            return self._cursor.fetch(sql, params)
        finally:
            self._bar.update()

    def interrupt(self) -> None:
        self._cursor.interrupt()

    def close(self) -> None:
        self._cursor.close()


#: A subquery: its repartition value, parameters, rows and (verify=True) planned hash sum.
Cell = tuple[Any, tuple[Any, ...], int, int | None]


#: A subquery's tallies (see :class:`~ddbloader._sql.rewrites.Tally`), by alias.
Tallied = dict[str, Any]


#: Rows whose key is NULL, per key: they match no subquery and are not loaded.
Lost = dict[str, int]


def probe_partition(
    cursor: Cursor, partition_sql: str, cells: list[tuple[Any, list[Cell]]]
) -> tuple[pa.Table | None, str]:
    """The smallest partition, to probe a transform on that cannot run on zero rows, and its name."""
    sized = [(rows, params) for _, row in cells for _, params, rows, _ in row if rows > 0]
    if not sized:
        return None, "the query's empty result (the query has no rows)"
    _, params = min(sized, key=lambda cell: cell[0])
    table = run_planning(cursor, partition_sql, "fetching a partition to probe the transform on", params)
    return table, f"the first rows of subquery {partition_sql!r} with parameters {list(params)!r}"


def parse_query(backend: Backend, sql: str) -> Query:
    """The user's query, parsed by the backend when it brings its own parser (DolphinDB).

    When the query does not parse and the backend's own parser can say why (``syntax_error``:
    DuckDB parses without running anything), the engine's message is the one raised.
    """
    parse = getattr(backend, "query", None)
    if callable(parse):
        parsed: Query = parse(sql)
        return parsed
    try:
        return UserQuery(sql, backend.dialect)
    except ValueError as error:
        check = getattr(backend, "syntax_error", None)
        engine_says = check(sql) if isinstance(error.__cause__, SqlglotError) and callable(check) else None
        if engine_says is None:
            raise
        raise ValueError(f"sql does not parse as {backend.dialect} SQL: {engine_says}") from error


def pin_pivots(cursor: Cursor, query: Query) -> Query:
    """Fix the columns of a PIVOT that takes them from the data, so every subquery has them all."""
    fields = query.dynamic_pivot_fields()
    if not fields:
        return query
    values = [
        run_planning(cursor, f, "listing the values of a PIVOT").column(PIVOT_ALIAS).to_pylist()
        for f in fields
    ]
    return query.pinned(values)


def _discover(cursor: Cursor, query: Query, key: PlanKey, lost: Lost) -> list[Any]:
    table = run_planning(
        cursor,
        query.distinct_values([key.expression], with_counts=False),
        f"discovering {key.parameter} values",
    )
    values = table.column(GROUP_ALIAS).to_pylist()
    if None in values:
        nulls = run_planning(
            cursor, query.null_rows([key.expression]), f"counting rows with NULL {key.parameter}"
        )
        lost[key.name] = int(nulls.column(ROWS_ALIAS)[0].as_py())
    return [v for v in values if v is not None]


def plan_cells(
    cursor: TickingCursor,
    query: Query,
    keys: list[PlanKey],
    partition_sql: str,
    lost: Lost,
    lists: bool,
    tallied: list[list[Tallied]] | None = None,
) -> list[tuple[Any, list[Cell]]]:
    """Per group: its value and its (repartition value, parameters, rows) in scheme order.

    ``lists``: the backend binds a list as one parameter (explicit schemes are bound that way).
    ``tallied``: filled, for a query with tallies (a :class:`UserQuery`'s ``with_tallies``), with
    each cell's tallies, per group in the cells' order.
    """
    if isinstance(query, UserQuery) and query.tallies:
        cursor.expect(1)
        sql, params = query.key_counts([k.expression for k in keys], [k.scheme for k in keys], lists=lists)
        if not keys:
            table = run_planning(cursor, sql, "counting rows", params)
            row = table.to_pylist()[0]
            if tallied is not None:
                tallied.append([{t.alias: row[t.alias] for t in query.tallies}])
            return [(None, [(None, (), int(row[ROWS_ALIAS]), _content(table))])]
        return _counted_cells(cursor, query, keys, lost, lists, tallied)
    if not keys:
        table = run_planning(cursor, query.count(partition_sql), "counting rows")
        content = _content(table)
        return [(None, [(None, (), int(table.column(ROWS_ALIAS)[0].as_py()), content)])]
    if isinstance(query, UserQuery):
        cursor.expect(1)
        return _counted_cells(cursor, query, keys, lost, lists)
    discovered = all(k.scheme is None for k in keys)
    if discovered and query.counts_are_groupable():
        return _grouped_counts(cursor, query, keys, lost)
    schemes = [list(k.scheme) if k.scheme is not None else _discover(cursor, query, k, lost) for k in keys]
    count_sql = query.count(partition_sql)
    cursor.expect(math.prod(len(s) for s in schemes))

    def count(params: tuple[Any, ...]) -> int:
        table = run_planning(cursor, count_sql, "counting the rows of a subquery", params)
        return int(table.column(ROWS_ALIAS)[0].as_py())

    if len(keys) == 1:
        if keys[0].parameter == "group_col":
            return [(v, [(None, (v,), count((v,)), None)]) for v in schemes[0]]
        return [(None, [(v, (v,), count((v,)), None) for v in schemes[0]])]
    return [(g, [(r, (g, r), count((g, r)), None) for r in schemes[1]]) for g in schemes[0]]


def _content(table: pa.Table) -> int | None:
    """A whole-query count's planned hash sum (verify=True), or None when it has none."""
    if HASH_SUM_ALIAS not in table.column_names:
        return None
    return planned_sum(table.column(HASH_SUM_ALIAS)[0].as_py())


def _grouped_counts(
    cursor: Cursor, query: Query, keys: list[PlanKey], lost: Lost
) -> list[tuple[Any, list[Cell]]]:
    """Every cell's row count from one GROUP BY over the query's FROM/WHERE."""
    table = run_planning(
        cursor,
        query.distinct_values([k.expression for k in keys], with_counts=True),
        "counting rows per partition key",
    )
    aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(keys)]
    columns = [table.column(a).to_pylist() for a in aliases]
    counts = table.column(ROWS_ALIAS).to_pylist()
    rows = list(zip(*columns, counts, strict=True))
    for position, key in enumerate(keys):
        nulls = sum(r[-1] for r in rows if r[position] is None)
        if nulls:
            lost[key.name] = nulls
    complete = [r for r in rows if None not in r[:-1]]
    if len(keys) == 1:
        if keys[0].parameter == "group_col":
            return [(v, [(None, (v,), n, None)]) for v, n in complete]
        return [(None, [(v, (v,), n, None) for v, n in complete])]
    cells: dict[Any, list[Cell]] = {}
    for g, r, n in complete:
        cells.setdefault(g, []).append((r, (g, r), n, None))
    return list(cells.items())


def _counted_cells(
    cursor: Cursor,
    query: UserQuery,
    keys: list[PlanKey],
    lost: Lost,
    lists: bool,
    tallied: list[list[Tallied]] | None = None,
) -> list[tuple[Any, list[Cell]]]:
    """Every cell's row count from one query, with the scheme values compared by the engine
    (bound as lists when the backend ``lists`` them).

    Raises:
        ValueError: two values of an explicit scheme equal the same rows in SQL (``1`` and
            ``'1'``, ``'a'`` and ``'A'`` under NOCASE): their rows would load twice.
    """
    sql, params = query.key_counts([k.expression for k in keys], [k.scheme for k in keys], lists=lists)
    try:
        table = run_planning(cursor, sql, "counting the rows of every subquery", params)
    except Exception as error:
        explicit = [f"{k.parameter.replace('_col', '_scheme')} {list(k.scheme)!r}" for k in keys if k.scheme]
        if explicit:
            add_note(
                error,
                f"the engine compares {' and '.join(explicit)} with the key's values as a subquery's "
                f"`key = value` would; give values of the key's type",
            )
        raise
    aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(keys)]
    found = python_rows(table, keys, aliases)
    discovered = [(k, a) for k, a in zip(keys, aliases, strict=True) if k.scheme is None]
    for key, alias in discovered:
        nulls = sum(r[ROWS_ALIAS] for r in found if r[alias] is None)
        if nulls:
            lost[key.name] = nulls
    found = [r for r in found if all(r[a] is not None for _, a in discovered)]
    # Per key, its values in plan order as (token, value): the token identifies the value in
    # cells (its position for a scheme value, which may be unhashable or equal in Python to
    # another; its text for a value the engine returned).
    values: list[list[tuple[Any, Any]]] = []
    for key, alias in zip(keys, aliases, strict=True):
        if key.scheme is None:
            values.append(list(dict.fromkeys((repr(r[alias]), r[alias]) for r in found)))
            check_discovered(key, [v for _, v in values[-1]])
        else:
            check_scheme(key, [r[alias + INDEX_SUFFIX] for r in found], [r[alias] for r in found])
            values.append(list(enumerate(key.scheme)))
    rows: dict[tuple[Any, ...], int] = {}
    # verify=True: per cell, the sum of its rows' hashes (mod 2**64, as rows add up)
    contents: dict[tuple[Any, ...], int | None] = {}
    tallies: dict[tuple[Any, ...], Tallied] = {}
    for r in found:
        cell = tuple(
            repr(r[a]) if k.scheme is None else r[a + INDEX_SUFFIX]
            for k, a in zip(keys, aliases, strict=True)
        )
        rows[cell] = rows.get(cell, 0) + int(r[ROWS_ALIAS])
        if HASH_SUM_ALIAS in r:
            contents[cell] = planned_sum((contents.get(cell) or 0) + planned_sum(r[HASH_SUM_ALIAS]))
        if query.tallies:
            tallies[cell] = _merged(query.tallies, tallies.get(cell), r)
    if tallied is not None:
        tallied.extend(_tallies_of_cells(keys, values, found, tallies))
    if len(keys) == 1:
        if keys[0].parameter == "group_col":
            return [(v, [(None, (v,), rows.get((t,), 0), contents.get((t,)))]) for t, v in values[0]]
        return [(None, [(v, (v,), rows.get((t,), 0), contents.get((t,))) for t, v in values[0]])]
    # Within a group, repartitions in scheme order: the scheme's, or the engine's sort order of
    # the values it found (the rows come sorted by group, then repartition value).
    order = {t: n for n, (t, _) in enumerate(values[1])} if keys[1].scheme is not None else {}
    repartition_values = dict(values[1])
    by_group: dict[Any, dict[Any, Any]] = {}
    for r in found:
        tg = repr(r[GROUP_ALIAS]) if keys[0].scheme is None else r[GROUP_ALIAS + INDEX_SUFFIX]
        tr = repr(r[REPARTITION_ALIAS]) if keys[1].scheme is None else r[REPARTITION_ALIAS + INDEX_SUFFIX]
        by_group.setdefault(tg, {})[tr] = repartition_values[tr]
    cells = []
    for tg, g in values[0]:
        present = sorted(by_group.get(tg, {}).items(), key=lambda item: order.get(item[0], 0))
        cells.append((g, [(r, (g, r), rows[tg, tr], contents.get((tg, tr))) for tr, r in present]))
    return cells


def _merged(tallies: Sequence[Tally], held: Tallied | None, row: dict[str, Any]) -> Tallied:
    """A cell's tallies with those of one more row of the counts (the cell's rows the engine
    grouped under another value that equals the same scheme value) folded in."""
    if held is None:
        return {t.alias: row[t.alias] for t in tallies}
    merged: Tallied = {}
    for t in tallies:
        a, b = held[t.alias], row[t.alias]
        if a is None or b is None:
            merged[t.alias] = b if a is None else a
        elif t.aggregate is exp.Sum:
            merged[t.alias] = a + b
        else:
            merged[t.alias] = min(a, b) if t.aggregate is exp.Min else max(a, b)
    return merged


def _tallies_of_cells(
    keys: list[PlanKey],
    values: list[list[tuple[Any, Any]]],
    found: list[dict[str, Any]],
    tallies: dict[tuple[Any, ...], Tallied],
) -> list[list[Tallied]]:
    """Per group, its cells' tallies in the order :func:`_counted_cells` returns its cells."""
    if len(keys) == 1:
        if keys[0].parameter == "group_col":
            return [[tallies.get((t,), {})] for t, _ in values[0]]
        return [[tallies.get((t,), {}) for t, _ in values[0]]]
    order = {t: n for n, (t, _) in enumerate(values[1])} if keys[1].scheme is not None else {}
    present: dict[Any, list[Any]] = {}
    for r in found:
        tg = repr(r[GROUP_ALIAS]) if keys[0].scheme is None else r[GROUP_ALIAS + INDEX_SUFFIX]
        tr = repr(r[REPARTITION_ALIAS]) if keys[1].scheme is None else r[REPARTITION_ALIAS + INDEX_SUFFIX]
        if tr not in present.setdefault(tg, []):
            present[tg].append(tr)
    return [
        [tallies[tg, tr] for tr in sorted(present.get(tg, []), key=lambda t: order.get(t, 0))]
        for tg, _ in values[0]
    ]
