"""Building the plan: :func:`build_plan` turns the user's query and configuration into an
immutable :class:`~ddbloader._sql.plan.QueryPlan`.

Built once per loader, before iteration: it parses the query, resolves the columns, discovers
scheme values the user left as ``None``, and counts the rows of every subquery, so ``len()`` is
exact before the first fetch. Refuses (naming the argument) keys the engine cannot resolve or
bind back exactly, and columns that are NULL in every row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlglot import exp

from .._core.config import LoaderConfig
from .._core.display import progress_bar
from .._core.engine import Backend, Cursor
from .._core.errors import add_note, warn_caller
from .._core.window import WindowGeometry
from .aliases import ROWS_ALIAS
from .binding import POSTGRES_TYPE, binds_exactly, text_identifies
from .cells import (
    Lost,
    Tallied,
    TickingCursor,
    parse_query,
    pin_pivots,
    plan_cells,
    probe_partition,
    run_planning,
)
from .columns import nullable_candidates, resolve_layout, resolve_layout_on_rows
from .fingerprint import Fingerprint, row_hash
from .key_values import PlanKey
from .partition import PartitionSpec
from .plan import GroupPlan, QueryPlan, pieces, series_rows
from .query import Query, UserQuery
from .ranges import range_pieces
from .read import Cut, group_reads, streaming_reads
from .splits import BEFORE_ALIAS, first_sample, plan_split

__all__ = ["build_plan"]


def _refuse_all_null(cursor: Cursor, query: Query, nulls: dict[str, int]) -> None:
    """A column of x or y that is NULL in every row would feed only NaN: refuse it by name."""
    total = int(
        run_planning(cursor, query.count(query.filtered([])), "counting rows").column(ROWS_ALIAS)[0].as_py()
    )
    empty = sorted(name for name, count in nulls.items() if total and count == total)
    if empty:
        raise ValueError(
            f"column(s) {empty} are NULL in every one of the query's {total} rows, so they would feed "
            f"only NaN; leave them out (exclude_col) or fix the query"
        )


def _name_the_key(error: Exception, keys: Sequence[PlanKey], columns: Sequence[str]) -> None:
    """Raise a ValueError naming the argument when the engine could not resolve a key's column.

    The engine's message (a binder error) names the column but not ``group_col`` /
    ``repartition_col``; it stays attached as the cause. ddbloader's own errors (a plain
    ValueError or TypeError; engines raise their own classes) already name their argument and
    pass unchanged: a misspelt ``target_col`` must not be blamed on ``group_col``.
    """
    if type(error) in (ValueError, TypeError):
        return
    message = str(error)
    for key in keys:
        if not isinstance(key.expression, exp.Expr):
            continue  # DolphinDB text: its engine's message stands
        for column in key.expression.find_all(exp.Column):
            if f'"{column.name}"' in message or f"'{column.name}'" in message:
                named = ValueError(
                    f"{key.parameter}={key.text!r}: the engine cannot resolve column {column.name!r} "
                    f"({message.splitlines()[0]}); the query's result columns: {list(columns)}"
                )
                for note in getattr(error, "__notes__", ()):
                    add_note(named, note)  # which planning query failed
                raise named from error


def build_plan(backend: Backend, sql: str, config: LoaderConfig, progress: bool = False) -> QueryPlan:
    """Plan the epoch: parse, resolve columns, discover schemes, count every subquery.

    Warns once per key whose NULL values leave rows out (naming the key and the row count), and
    once for the groups too short for one sample (naming them). With ``progress`` a bar counts
    the planning queries (its total known once the subqueries to count are), shown only when
    planning lasts longer than :data:`~ddbloader._core.display.PROGRESS_DELAY_SECONDS`.

    Raises:
        ValueError / TypeError: the query or a column argument is unusable (message names it).
        Exception: an engine error, with a note naming the query that failed.
    """
    query = parse_query(backend, sql)
    hashing = _row_hash(backend, query) if config.verify else None
    keys = [
        PlanKey(query.column(column, parameter), scheme, parameter, column)
        for column, scheme, parameter in (
            (config.group_col, config.group_scheme, "group_col"),
            (config.repartition_col, config.repartition_scheme, "repartition_col"),
        )
        if column is not None
    ]
    geometry = WindowGeometry.from_config(config)
    lost: Lost = {}
    bar = progress_bar("ddbloader: planning", "query", progress)
    cursor = TickingCursor(backend.cursor(), bar)
    result_columns: list[str] = []
    try:
        if keys:
            query = pin_pivots(cursor, query)
        probe = run_planning(cursor, query.schema(), "reading the result schema")
        schema = probe.schema
        result_columns = list(schema.names)
        query = query.with_output(schema.names)
        key_columns = _key_columns(keys, schema.names)
        if keys and isinstance(query, UserQuery):
            keys = _exact_keys(cursor, query, keys)
        split = None
        if config.split_col is not None:
            split = plan_split(
                cursor, query, keys, config, geometry, bool(getattr(backend, "binds_lists", False))
            )
            query = split.query
        names = {*(config.input_col or schema.names), *config.target_col}
        # Only integer and boolean columns change dtype with nulls, so only they are scanned at
        # planning (a full pass over the query); an all-NULL one of them is refused by name.
        # key_col columns too: their representation is decided once, for every batch.
        candidates = nullable_candidates(schema, names | set(config.key_col))
        with_nulls: set[str] = set()
        if candidates:
            counts = run_planning(cursor, query.null_counts(candidates), "counting nulls").to_pylist()[0]
            with_nulls = {name for name in candidates if counts[name]}
            fed = {name: count for name, count in counts.items() if name in names}
            if with_nulls & set(fed):
                _refuse_all_null(cursor, query, fed)
        planned = resolve_layout(probe, config, with_nulls, key_columns)
        partition_sql = query.filtered([k.expression for k in keys])
        lists = bool(getattr(backend, "binds_lists", False))
        counted, counted_sql = query, partition_sql
        if hashing is not None:  # the fetch queries and the counts carry the row hash
            assert isinstance(query, UserQuery)
            counted = query.with_row_hash(hashing)
            counted_sql = counted.filtered([k.expression for k in keys])
        befores: list[list[Tallied]] = []
        tallied = counted
        if split is not None and split.before is not None and isinstance(counted, UserQuery):
            tallied = counted.with_tallies([split.before])
        cells = plan_cells(cursor, tallied, keys, counted_sql, lost, lists, befores)
        if planned is None:  # the transform needs rows to show its output
            rows, where = probe_partition(cursor, partition_sql, cells)
            planned = resolve_layout_on_rows(probe, rows, where, config, with_nulls, key_columns)
        layout = planned
        ranged, piece_key = range_pieces(
            cursor, query, counted, keys, cells, layout.row_bytes, config, geometry, schema
        )
    except Exception as error:
        _name_the_key(error, keys, result_columns)
        raise
    finally:
        bar.close()
        cursor.close()
    for name, rows in lost.items():
        warn_caller(
            f"{rows} rows have NULL {name} and match no subquery, so they are not loaded; "
            f"filter them out or COALESCE the column in the query"
        )
    group_params = any(k.parameter == "group_col" for k in keys)
    groups: list[GroupPlan] = []
    for index, (group_value, row) in enumerate(cells):
        cut = [
            (repartition_value, cell_params, fingerprint, (sql, params, ranges), piece)
            for cell, (repartition_value, cell_params, cell_rows, content) in enumerate(row)
            if cell_rows > 0
            for sql, ranges, params, rows, fingerprint in ranged.get(
                (index, cell),
                [
                    (
                        partition_sql,
                        None,
                        cell_params,
                        cell_rows,
                        None if content is None else Fingerprint(counted_sql, content),
                    )
                ],
            )
            # a combed piece of windows is read whole: its stripes' contexts may take it past
            # the budget by a few windows' rows, and its rows are runs a streamed part could split
            for piece in _cut(rows, layout.row_bytes, 0 if ranges and ranges.windows else config.fetch_bytes)
        ]
        partitions = tuple(
            PartitionSpec(
                group=index,
                position=position,
                group_value=group_value,
                repartition_value=repartition_value,
                sql=partition_sql,
                params=cell_params,
                rows=rows,
                fingerprint=fingerprint,
            )
            for position, (repartition_value, cell_params, fingerprint, _, (*_, rows)) in enumerate(cut)
        )
        # how a subquery larger than fetch_bytes leaves the engine: its reads' (see group_reads)
        cuts = [
            None if count == 1 and ranges is None else Cut(piece, count, sql, params, ranges)
            for *_, (sql, params, ranges), (piece, count, _, _) in cut
        ]
        reads = group_reads(partitions, cuts)
        total = series_rows(partitions, reads.row_maps)
        first = _first_sample(befores[index] if befores else [], geometry)
        groups.append(
            GroupPlan(
                index,
                group_value if group_params else None,
                partitions,
                max(0, geometry.sample_count(total) - first),
                first,
                **reads._asdict(),
            )
        )
    if not any(g.samples for g in groups):
        longest = max((g.rows for g in groups), default=0)
        why = _why_no_sample(geometry, longest, group_params)
        if config.split_col is not None:
            why = f"no sample's y rows all lie in split_range={config.split_range!r} of {config.split_col!r}"
        raise ValueError(
            f"the loader can make no sample: {why}; check the query, the schemes and window_size"
        )
    # under a split a group's rows are those near the range: a group with none there is no surprise
    short = [g.value if group_params else "<all rows>" for g in groups if 0 < g.rows < geometry.span]
    short = short if config.split_col is None else []
    if short:
        warn_caller(
            f"samples need {geometry.span} consecutive rows, more than group(s) {short[:10]} "
            f"{'(and more) ' if len(short) > 10 else ''}have; they yield no samples"
        )
    plan = QueryPlan(
        backend.engine,
        tuple(groups),
        layout,
        geometry,
        counted,  # its fetch units carry the row hash when the partitions do
        tuple((k.parameter, k.expression) for k in keys),
        piece_key,
    )
    if geometry.windowed and not query.is_ordered():
        warn_caller(
            f"window_size is set, but the query {_short(query.text)!r} has no ORDER BY: its windows "
            f"would be rows in whatever order the engine returns them, not a time series; add an "
            f"ORDER BY that orders each group's rows totally (e.g. by timestamp)"
        )
    streamed = streaming_reads(groups)
    if streamed and not query.is_ordered():
        named = streamed[0].cells[0].describe(streamed[0])
        warn_caller(
            f"{len(streamed)} subquer{'y is' if len(streamed) == 1 else 'ies are'} read in pieces (more "
            f"than fetch_bytes each; the first: {named}), but the query has no ORDER BY: "
            f"a piece read again (resume, retry, another rank) may get rows in another order, losing or "
            f"repeating rows; add an ORDER BY that orders the rows totally"
        )
    return plan


def _first_sample(befores: Sequence[Tallied], geometry: WindowGeometry) -> int:
    """A group's first sample under a split (see :mod:`ddbloader._sql.splits`): after the rows
    its subqueries count below ``split_range``'s ``lo`` (0 without a split, or no such rows)."""
    before = sum(int(t.get(BEFORE_ALIAS) or 0) for t in befores)
    return first_sample(before, geometry) if before else 0


def _why_no_sample(geometry: WindowGeometry, longest: int, grouped: bool) -> str:
    if longest == 0:
        return "the query (with its schemes) returns no rows"
    where = "the longest group has" if grouped else "the query returns"
    return (
        f"a sample needs {geometry.span} consecutive rows (x window {geometry.x_window}, y window "
        f"{geometry.y_window}, offset {geometry.offset}), but {where} only {longest}"
    )


def _exact_keys(cursor: Cursor, query: UserQuery, keys: list[PlanKey]) -> list[PlanKey]:
    """The keys, each compared as the engine's text of it where its values would not bind back
    exactly (see :mod:`ddbloader._sql.binding`).

    Raises:
        ValueError: an explicit scheme for such a key (its values cannot be bound as given),
            naming the key and its type.
    """
    for key in keys:
        query.check_key(key.expression, key.name)
    fields = run_planning(
        cursor, query.key_schema([k.expression for k in keys]), "reading the keys' types"
    ).schema
    exact = []
    for key, field in zip(keys, fields, strict=True):
        if binds_exactly(field):
            exact.append(key)
            continue
        kind = (field.metadata or {}).get(POSTGRES_TYPE, b"").decode() or str(field.type)
        if not text_identifies(field):
            raise ValueError(
                f"{key.name} is of type {kind}, whose values can neither be bound back to the engine "
                f"exactly nor be told apart by their text; split by a key of another type"
            )
        if key.scheme is not None:
            raise ValueError(
                f"{key.name} is of type {kind}, whose values cannot be bound back to the engine "
                f"exactly, so {key.parameter.replace('_col', '_scheme')} cannot be compared with it; "
                f"leave the scheme None (the values are then discovered and compared as the "
                f"engine's text of them), or cast the key to text in the query and list texts"
            )
        exact.append(dataclasses.replace(key, expression=query.as_text(key.expression)))
    return exact


def _key_columns(keys: Sequence[PlanKey], names: Sequence[str]) -> list[str]:
    """The result columns that ``group_col`` / ``repartition_col`` name as plain columns: they
    stay out of a derived x (a key expression such as ``CAST(ts AS DATE)`` leaves ``ts`` in)."""
    found = []
    for key in keys:
        expression = key.expression
        if isinstance(expression, exp.Column) and not expression.table:
            identifier = expression.this
            quoted = bool(identifier.args.get("quoted"))
            found += [
                n
                for n in names
                if (n == identifier.name if quoted else n.casefold() == identifier.name.casefold())
            ]
        elif isinstance(expression, str) and expression in names:  # an engine's own column text
            found.append(expression)
    return found


def _row_hash(backend: Backend, query: Query) -> exp.Expr:
    """The engine's row hash for ``verify=True``.

    Raises:
        ValueError: the engine has no row hash ddbloader uses (or brings its own query parser,
            as DolphinDB does), naming the engine.
    """
    return row_hash(backend, backend.dialect if isinstance(query, UserQuery) else "")


def _short(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters for a message."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _cut(rows: int, row_bytes: int, budget: int) -> list[tuple[int, int, int, int]]:
    """A subquery's :func:`~ddbloader._sql.plan.pieces` as ``(piece, pieces, first_row, rows)``."""
    cut = pieces(rows, row_bytes, budget)
    return [(piece, len(cut), first, size) for piece, (first, size) in enumerate(cut)]
