"""The query plan: groups × repartitions → subqueries with exact row counts.

Built once per loader, before iteration: it parses the query, resolves the columns, discovers
scheme values the user left as ``None``, and counts the rows of every subquery, so ``len()`` is
exact before the first fetch. Immutable afterwards and safe to share between threads.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .backends import Backend, Cursor
from .config import LoaderConfig
from .errors import add_note
from .query import GROUP_ALIAS, REPARTITION_ALIAS, ROWS_ALIAS, UserQuery, parse_column_expression
from .source import ColumnLayout, nullable_candidates, resolve_columns
from .window import WindowGeometry

__all__ = ["GroupPlan", "PartitionSpec", "QueryPlan", "build_plan"]


@dataclass(frozen=True)
class PartitionSpec:
    """One subquery: the rows of one group in one repartition, in the query's order."""

    group: int
    position: int
    group_value: Any
    repartition_value: Any
    sql: str
    params: tuple[Any, ...]
    rows: int

    def describe(self) -> str:
        """Name the subquery for messages: its values, its SQL and its parameters."""
        return (
            f"partition {self.position} of group {self.group} "
            f"(subquery {self.sql!r} with parameters {list(self.params)!r})"
        )


@dataclass(frozen=True)
class GroupPlan:
    """One time series: its non-empty partitions in repartition order."""

    index: int
    value: Any
    partitions: tuple[PartitionSpec, ...]
    samples: int

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)


@dataclass(frozen=True)
class QueryPlan:
    """Everything an epoch needs, independent of seed and epoch."""

    engine: str
    groups: tuple[GroupPlan, ...]
    layout: ColumnLayout
    geometry: WindowGeometry

    @property
    def samples(self) -> int:
        return sum(g.samples for g in self.groups)

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self.groups)

    @property
    def partitions(self) -> int:
        return sum(len(g.partitions) for g in self.groups)


def _run(cursor: Cursor, sql: str, params: Sequence[Any], purpose: str) -> pa.Table:
    try:
        return cursor.fetch(sql, params)
    except Exception as error:
        add_note(error, f"ddbloader was {purpose}: {sql!r} with parameters {list(params)!r}")
        raise


def _drop_nulls(values: list[Any], parameter: str, rows: int | None) -> list[Any]:
    if None not in values:
        return values
    lost = f"{rows} rows" if rows is not None else "rows"
    warnings.warn(
        f"{lost} have NULL {parameter} and match no subquery, so they are not loaded; "
        f"filter them out or COALESCE the column in the query",
        stacklevel=4,
    )
    return [v for v in values if v is not None]


def _discover(cursor: Cursor, query: UserQuery, column: Any, parameter: str) -> list[Any]:
    table = _run(
        cursor,
        query.distinct_values([column], with_counts=False),
        [],
        f"discovering {parameter} values",
    )
    return _drop_nulls(table.column(GROUP_ALIAS).to_pylist(), parameter, None)


def build_plan(backend: Backend, sql: str, config: LoaderConfig) -> QueryPlan:
    """Plan the epoch: parse, resolve columns, discover schemes, count every subquery.

    Raises:
        ValueError / TypeError: the query or a column argument is unusable (message names it).
        Exception: an engine error, with a note naming the query that failed.
    """
    query = UserQuery(sql, backend.dialect)
    keys = [
        (parse_column_expression(column, parameter, backend.dialect), scheme, parameter)
        for column, scheme, parameter in (
            (config.group_col, config.group_scheme, "group_col"),
            (config.repartition_col, config.repartition_scheme, "repartition_col"),
        )
        if column is not None
    ]
    geometry = WindowGeometry.from_config(config)
    cursor = backend.cursor()
    try:
        schema = _run(cursor, query.schema(), [], "reading the result schema").schema
        names = {*(config.input_col or schema.names), *config.target_col}
        candidates = nullable_candidates(schema, names)
        with_nulls: set[str] = set()
        if candidates:
            counts = _run(cursor, query.null_counts(candidates), [], "counting nulls").to_pylist()[0]
            with_nulls = {name for name, nulls in counts.items() if nulls}
        layout = resolve_columns(schema, config, with_nulls)
        partition_sql = query.filtered([k[0] for k in keys])
        cells = _cells(cursor, query, keys, partition_sql)
    finally:
        cursor.close()
    group_params = len(keys) == 2 or (len(keys) == 1 and keys[0][2] == "group_col")
    groups: list[GroupPlan] = []
    for index, (group_value, row) in enumerate(cells):
        partitions = tuple(
            PartitionSpec(
                group=index,
                position=position,
                group_value=group_value,
                repartition_value=repartition_value,
                sql=partition_sql,
                params=params,
                rows=rows,
            )
            for position, (repartition_value, params, rows) in enumerate(r for r in row if r[2] > 0)
        )
        total = sum(p.rows for p in partitions)
        groups.append(
            GroupPlan(
                index,
                group_value if group_params else None,
                partitions,
                geometry.sample_count(total),
            )
        )
    short = [g.value if group_params else "<all rows>" for g in groups if 0 < g.rows < geometry.span]
    if short:
        warnings.warn(
            f"samples need {geometry.span} consecutive rows, more than group(s) {short[:10]} "
            f"{'(and more) ' if len(short) > 10 else ''}have; they yield no samples",
            stacklevel=3,
        )
    return QueryPlan(backend.engine, tuple(groups), layout, geometry)


_Cell = tuple[Any, tuple[Any, ...], int]


def _cells(
    cursor: Cursor, query: UserQuery, keys: list[tuple[Any, Any, str]], partition_sql: str
) -> list[tuple[Any, list[_Cell]]]:
    """Per group: its value and its (repartition value, parameters, rows) in scheme order."""
    if not keys:
        rows = _run(cursor, query.count(partition_sql), [], "counting rows").column(ROWS_ALIAS)[0].as_py()
        return [(None, [(None, (), rows)])]
    if len(keys) == 2 and keys[0][1] is None and keys[1][1] is None and query.counts_are_groupable():
        return _grouped_counts(cursor, query, keys)
    if len(keys) == 1 and keys[0][1] is None and query.counts_are_groupable():
        table = _run(
            cursor,
            query.distinct_values([keys[0][0]], with_counts=True),
            [],
            "counting rows per value",
        )
        counted = list(
            zip(
                table.column(GROUP_ALIAS).to_pylist(),
                table.column(ROWS_ALIAS).to_pylist(),
                strict=True,
            )
        )
        null_rows = sum(n for v, n in counted if v is None)
        if null_rows:
            _drop_nulls([None], keys[0][2], null_rows)
        cells = [(v, (v,), n) for v, n in counted if v is not None]
        if keys[0][2] == "group_col":
            return [(v, [(None, params, n)]) for v, params, n in cells]
        return [(None, cells)]
    schemes = [
        list(scheme) if scheme is not None else _discover(cursor, query, column, parameter)
        for column, scheme, parameter in keys
    ]
    count_sql = query.count(partition_sql)

    def count(params: tuple[Any, ...]) -> int:
        table = _run(cursor, count_sql, params, "counting the rows of a subquery")
        return int(table.column(ROWS_ALIAS)[0].as_py())

    if len(keys) == 1:
        if keys[0][2] == "group_col":
            return [(v, [(None, (v,), count((v,)))]) for v in schemes[0]]
        return [(None, [(v, (v,), count((v,))) for v in schemes[0]])]
    return [(g, [(r, (g, r), count((g, r))) for r in schemes[1]]) for g in schemes[0]]


def _grouped_counts(
    cursor: Cursor, query: UserQuery, keys: list[tuple[Any, Any, str]]
) -> list[tuple[Any, list[_Cell]]]:
    table = _run(
        cursor,
        query.distinct_values([k[0] for k in keys], with_counts=True),
        [],
        "counting rows per group and repartition",
    )
    groups = table.column(GROUP_ALIAS).to_pylist()
    repartitions = table.column(REPARTITION_ALIAS).to_pylist()
    counts = table.column(ROWS_ALIAS).to_pylist()
    null_rows = sum(n for g, r, n in zip(groups, repartitions, counts, strict=True) if g is None or r is None)
    if null_rows:
        _drop_nulls([None], "group_col or repartition_col", null_rows)
    cells: dict[Any, list[_Cell]] = {}
    for g, r, n in zip(groups, repartitions, counts, strict=True):
        if g is not None and r is not None:
            cells.setdefault(g, []).append((r, (g, r), n))
    return list(cells.items())
