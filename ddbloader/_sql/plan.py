"""The query plan: groups × repartitions → subqueries with exact row counts.

Built once per loader, before iteration: it parses the query, resolves the columns, discovers
scheme values the user left as ``None``, and counts the rows of every subquery, so ``len()`` is
exact before the first fetch. Immutable afterwards and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from .._core.config import LoaderConfig
from .._core.display import progress_bar
from .._core.engine import Backend, Cursor
from .._core.errors import add_note, warn_caller
from .._core.window import WindowGeometry
from .binding import POSTGRES_TYPE, binds_exactly, text_identifies
from .fingerprint import HASH_SUM_ALIAS, Fingerprint, planned_sum, row_hash
from .literals import dolphindb_literal_hint
from .pieces import KeyRanges, RangeCutter
from .query import (
    GROUP_ALIAS,
    INDEX_SUFFIX,
    PIVOT_ALIAS,
    REPARTITION_ALIAS,
    ROWS_ALIAS,
    Query,
    UserQuery,
)
from .source import ColumnLayout, nullable_candidates, resolve_layout, resolve_layout_on_rows

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "MIN_PIECE_ROWS",
    "GroupPlan",
    "PartitionSpec",
    "QueryPlan",
    "WorkUnit",
    "build_plan",
    "plan_differences",
    "plan_fingerprint",
]

#: The fewest rows ``fetch_bytes`` counts as when a subquery is cut into pieces (see
#: :func:`pieces`): however small it is, a subquery is never cut into more than
#: ``rows / MIN_PIECE_ROWS + 1`` pieces.
MIN_PIECE_ROWS = 64

#: Unit queries :meth:`QueryPlan.unit_sql` keeps rendered (a few shapes an epoch, the same every
#: epoch when groups are of equal size).
UNIT_SQL_SHAPES = 256


@dataclass(frozen=True)
class PartitionSpec:
    """One subquery: the rows of one group in one repartition, in the query's order.

    A subquery whose planned bytes exceed ``fetch_bytes`` is streamed: it becomes ``pieces``
    consecutive partitions of its group, piece ``piece`` holding its result's rows
    ``[first_row, first_row + rows)``; all pieces share ``sql`` and ``params``, and are read by
    one query (see :mod:`ddbloader._io.streams`). Invariants: ``0 <= piece < pieces``; the pieces of
    one subquery sit at positions ``position - piece`` to ``position - piece + pieces - 1``.

    With shuffle, such a subquery is cut instead into range pieces (see
    :mod:`ddbloader._sql.pieces`): each a partition of its own, ``sql`` the subquery's rows in
    ``ranges`` of its order key, ``params`` the key values then the ranges' bounds; one larger
    than ``fetch_bytes`` (equal keys) is itself read in pieces as above.

    ``fingerprint`` (``verify=True``): what the subquery's (or the range piece's) rows hash to
    (see :mod:`ddbloader._sql.fingerprint`); its SQL is the one fetches run, ``sql`` the plain one.
    """

    group: int
    position: int
    group_value: Any
    repartition_value: Any
    sql: str
    params: tuple[Any, ...]
    rows: int
    piece: int = 0
    pieces: int = 1
    first_row: int = 0
    #: A range piece's key ranges (see :mod:`ddbloader._sql.pieces`): ``sql`` reads only them.
    ranges: KeyRanges | None = None
    fingerprint: Fingerprint | None = None

    # made once per plan: at thousands of groups, a tuple per partition and epoch cost ~5 ms an epoch
    @functools.cached_property
    def key(self) -> tuple[int, int]:
        """``(group, position)``: this partition's identity within its plan."""
        return self.group, self.position

    @property
    def streamed(self) -> bool:
        """Whether this partition is read by a streaming query of its own, never by a fetch unit:
        a piece of a subquery read in pieces, or a range piece (a subquery of one piece)."""
        return self.pieces > 1 or self.ranges is not None

    @property
    def head(self) -> int:
        """The position of the first piece of this partition's subquery (its own if not streamed)."""
        return self.position - self.piece

    @property
    def key_params(self) -> tuple[Any, ...]:
        """The key values among :attr:`params` (a range piece's bounds follow them)."""
        if self.ranges is None:
            return self.params
        return self.params[: len(self.params) - len(self.ranges.bounds())]

    def describe(self) -> str:
        """Name the subquery for messages: its values, its SQL and its parameters."""
        rows = (
            f"rows {self.first_row}-{self.first_row + self.rows - 1} (piece {self.piece + 1} of "
            f"{self.pieces}) of "
            if self.streamed
            else ""
        )
        ranges = f"order key in {self.ranges.describe()}: " if self.ranges is not None else ""
        return (
            f"partition {self.position} of group {self.group} "
            f"({rows}{ranges}subquery {self.sql!r} with parameters {list(self.params)!r})"
        )


def pieces(rows: int, row_bytes: int, budget: int) -> list[tuple[int, int]]:
    """The pieces of a subquery of ``rows`` rows of ``row_bytes`` bytes as ``(first_row, rows)``.

    One piece when the rows fit in ``budget`` bytes (or ``budget <= 0``: nothing is streamed);
    else as few near-equal consecutive pieces as keep each within the budget, where a budget of
    fewer than :data:`MIN_PIECE_ROWS` rows counts as that many.
    """
    if budget <= 0 or rows * row_bytes <= budget:
        return [(0, rows)]
    per_piece = max(budget // max(row_bytes, 1), MIN_PIECE_ROWS)
    count = -(-rows // per_piece)
    sizes = [rows // count + (1 if i < rows % count else 0) for i in range(count)]
    firsts = list(itertools.accumulate(sizes[:-1], initial=0))
    return list(zip(firsts, sizes, strict=True))


@dataclass(frozen=True)
class GroupPlan:
    """One time series: its non-empty partitions in repartition order."""

    index: int
    value: Any
    partitions: tuple[PartitionSpec, ...]
    samples: int

    @functools.cached_property  # read per group and epoch, thousands of times with small groups
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    # The same object every epoch (for one rank and worker; shards cut their own): at thousands of
    # small groups, a new unit per group and epoch outlived enough collections to make the garbage
    # collector sweep the whole heap every few epochs.
    @functools.cached_property
    def whole(self) -> WorkUnit:
        """The unit of all this group's samples."""
        return WorkUnit(self, 0, self.samples)


@dataclass(frozen=True)
class WorkUnit:
    """Samples ``[first, stop)`` of one group (indices as in the whole group), or only the ``owed``
    ones among them.

    ``owed`` (an elastic resume's remainder, see :mod:`ddbloader._epoch.elastic`) is None for every
    sample of ``[first, stop)``, else their sorted, distinct int64 indices with ``owed[0] == first``
    and ``owed[-1] == stop - 1``. It is left out of comparisons and hashing (an array compares
    elementwise), so a unit's identity stays ``(group, first, stop)``.
    """

    group: GroupPlan
    first: int
    stop: int
    owed: np.ndarray[Any, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def samples(self) -> int:
        return self.stop - self.first if self.owed is None else len(self.owed)


@dataclass(frozen=True)
class QueryPlan:
    """Everything an epoch needs, independent of seed and epoch.

    ``query`` and ``keys`` (each key's parameter name and parsed expression, group key first)
    derive the queries of fetch units (see :mod:`ddbloader._epoch.units`); no keys, no units.
    """

    engine: str
    groups: tuple[GroupPlan, ...]
    layout: ColumnLayout
    geometry: WindowGeometry
    query: Query | None = None
    keys: tuple[tuple[str, Any], ...] = ()

    # read every epoch: at thousands of groups a sum over them costs a millisecond each time
    @functools.cached_property
    def samples(self) -> int:
        return sum(g.samples for g in self.groups)

    @functools.cached_property
    def rows(self) -> int:
        return sum(g.rows for g in self.groups)

    @functools.cached_property
    def partitions(self) -> int:
        return sum(len(g.partitions) for g in self.groups)

    @functools.cached_property
    def largest_partition_rows(self) -> int:
        """The most rows one partition holds (an arena's regions are sized from it)."""
        return max((p.rows for g in self.groups for p in g.partitions), default=0)

    def unit_sql(self, counts: Sequence[int | None], *, lists: bool) -> str | None:
        """``query.filtered_many`` of the plan's keys, rendered once per shape of unit.

        Rendering an ``IN`` list of a thousand parameters costs ~5 ms, and every epoch cuts
        units of the same shapes, so the text is kept: at most :data:`UNIT_SQL_SHAPES` shapes
        (then forgotten all at once; with groups of varied sizes the counts vary too). With
        ``lists`` the SQL says only which keys are bound, not how many values each has.
        Thread-safe: two threads rendering one shape at once both get the same text.
        """
        assert self.query is not None
        shape = tuple(count is not None if lists else count for count in counts)
        sqls = self._unit_sqls
        if (lists, shape) not in sqls:
            if len(sqls) >= UNIT_SQL_SHAPES:
                sqls.clear()
            sqls[lists, shape] = self.query.filtered_many(
                [expression for _, expression in self.keys], counts, lists=lists
            )
        return sqls[lists, shape]

    @functools.cached_property
    def _unit_sqls(self) -> dict[tuple[bool, tuple[int | bool | None, ...]], str | None]:
        return {}


#: What a plan fingerprint identifies, one digest each, in the fingerprint's order.
FINGERPRINT_PARTS = (
    ("query", "the query text"),
    ("schemes", "the group and repartition values, in order"),
    ("counts", "the planned row counts per partition"),
    ("layout", "the columns of x, y and key_col, and their dtypes"),
    ("window", "the window arguments (window_size, window_stride, offset)"),
)


def plan_fingerprint(plan: QueryPlan) -> str:
    """A short text naming ``plan``: one 8-hex-digit digest per :data:`FINGERPRINT_PARTS` entry,
    joined by dots. Equal for equal plans in any process (built from reprs, not ``hash()``)."""
    layout = plan.layout
    parts = {
        "query": plan.query.text if plan.query is not None else "",
        "schemes": repr([(g.value, [p.repartition_value for p in g.partitions]) for g in plan.groups]),
        "counts": repr(
            [
                [(p.rows, p.pieces) + ((p.ranges,) if p.ranges else ()) for p in g.partitions]
                for g in plan.groups
            ]
        ),
        "layout": repr(
            (layout.x_names, layout.y_names, str(layout.x_dtype), str(layout.y_dtype), layout.key_names)
        ),
        "window": repr(dataclasses.astuple(plan.geometry)),
    }
    return ".".join(hashlib.sha256(parts[name].encode()).hexdigest()[:8] for name, _ in FINGERPRINT_PARTS)


def plan_differences(saved: str, current: str) -> list[str]:
    """What differs between two :func:`plan_fingerprint` texts, described (empty: the same plan)."""
    if saved == current:
        return []
    pairs = list(zip(saved.split("."), current.split("."), strict=False))
    if len(pairs) != len(FINGERPRINT_PARTS):
        return ["the plan's fingerprint format"]
    return [label for (_, label), (a, b) in zip(FINGERPRINT_PARTS, pairs, strict=True) if a != b]


def _refuse_all_null(cursor: Cursor, query: Query, nulls: dict[str, int]) -> None:
    """A column of x or y that is NULL in every row would feed only NaN: refuse it by name."""
    total = int(_run(cursor, query.count(query.filtered([])), "counting rows").column(ROWS_ALIAS)[0].as_py())
    empty = sorted(name for name, count in nulls.items() if total and count == total)
    if empty:
        raise ValueError(
            f"column(s) {empty} are NULL in every one of the query's {total} rows, so they would feed "
            f"only NaN; leave them out (exclude_col) or fix the query"
        )


def _run(cursor: Cursor, sql: str, purpose: str, params: Sequence[Any] = ()) -> pa.Table:
    try:
        return cursor.fetch(sql, params)
    except Exception as error:
        add_note(error, f"ddbloader was {purpose}: {sql!r} with parameters {list(params)!r}")
        raise


@dataclass(frozen=True)
class _Key:
    """A partition key: ``group_col`` or ``repartition_col``, parsed, and its scheme."""

    expression: Any  # what query.column() returns: a sqlglot expression, or DolphinDB text
    scheme: tuple[Any, ...] | None
    parameter: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.parameter} {self.text!r}"


def _name_the_key(error: Exception, keys: Sequence[_Key], columns: Sequence[str]) -> None:
    """Raise a ValueError naming the argument when the engine could not resolve a key's column.

    The engine's message (a binder error) names the column but not ``group_col`` /
    ``repartition_col``; it stays attached as the cause.
    """
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


class _TickingCursor:
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
_Cell = tuple[Any, tuple[Any, ...], int, int | None]
#: Rows whose key is NULL, per key: they match no subquery and are not loaded.
_Lost = dict[str, int]


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
    query = _parse(backend, sql)
    hashing = _row_hash(backend, query) if config.verify else None
    keys = [
        _Key(query.column(column, parameter), scheme, parameter, column)
        for column, scheme, parameter in (
            (config.group_col, config.group_scheme, "group_col"),
            (config.repartition_col, config.repartition_scheme, "repartition_col"),
        )
        if column is not None
    ]
    geometry = WindowGeometry.from_config(config)
    lost: _Lost = {}
    bar = progress_bar("ddbloader: planning", "query", progress)
    cursor = _TickingCursor(backend.cursor(), bar)
    result_columns: list[str] = []
    try:
        if keys:
            query = _pin_pivots(cursor, query)
        probe = _run(cursor, query.schema(), "reading the result schema")
        schema = probe.schema
        result_columns = list(schema.names)
        query = query.with_output(schema.names)
        key_columns = _key_columns(keys, schema.names)
        if keys and isinstance(query, UserQuery):
            keys = _exact_keys(cursor, query, keys)
        names = {*(config.input_col or schema.names), *config.target_col}
        # Only integer and boolean columns change dtype with nulls, so only they are scanned at
        # planning (a full pass over the query); an all-NULL one of them is refused by name.
        # key_col columns too: their representation is decided once, for every batch.
        candidates = nullable_candidates(schema, names | set(config.key_col))
        with_nulls: set[str] = set()
        if candidates:
            counts = _run(cursor, query.null_counts(candidates), "counting nulls").to_pylist()[0]
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
        cells = _cells(cursor, counted, keys, counted_sql, lost, lists)
        if planned is None:  # the transform needs rows to show its output
            rows, where = _probe_partition(cursor, partition_sql, cells)
            planned = resolve_layout_on_rows(probe, rows, where, config, with_nulls, key_columns)
        layout = planned
        ranged = _range_pieces(cursor, query, counted, keys, cells, layout.row_bytes, config, geometry)
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
            (repartition_value, sql, ranges, params, piece, fingerprint)
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
            for piece in _cut(rows, layout.row_bytes, config.fetch_bytes)
        ]
        partitions = tuple(
            PartitionSpec(
                group=index,
                position=position,
                group_value=group_value,
                repartition_value=repartition_value,
                sql=sql,
                params=params,
                rows=rows,
                piece=piece,
                pieces=count,
                first_row=first_row,
                ranges=ranges,
                fingerprint=fingerprint,
            )
            for position, (
                repartition_value,
                sql,
                ranges,
                params,
                (piece, count, first_row, rows),
                fingerprint,
            ) in enumerate(cut)
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
    )
    if geometry.windowed and not query.is_ordered():
        warn_caller(
            f"window_size is set, but the query {_short(query.text)!r} has no ORDER BY: its windows "
            f"would be rows in whatever order the engine returns them, not a time series; add an "
            f"ORDER BY that orders each group's rows totally (e.g. by timestamp)"
        )
    streamed = [p for g in groups for p in g.partitions if p.streamed and p.piece == 0]
    if streamed and not query.is_ordered():
        warn_caller(
            f"{len(streamed)} subquer{'y is' if len(streamed) == 1 else 'ies are'} read in pieces (more "
            f"than fetch_bytes each; the first: {streamed[0].describe()}), but the query has no ORDER BY: "
            f"a piece read again (resume, retry, another rank) may get rows in another order, losing or "
            f"repeating rows; add an ORDER BY that orders the rows totally"
        )
    if plan.samples == 0:
        warn_caller(
            f"the plan has 0 samples ({plan.rows} rows in {plan.partitions} partitions"
            f"{f', {geometry.span} rows per sample' if geometry.span > 1 else ''}): "
            f"the loader yields nothing; check the query, the schemes and window_size"
        )
    return plan


#: Per (group index, cell index) cut into range pieces: each piece's SQL, ranges, parameters,
#: rows and, with ``verify=True``, fingerprint.
_Piece = tuple[str, KeyRanges | None, tuple[Any, ...], int, Fingerprint | None]
_Ranged = dict[tuple[int, int], list[_Piece]]


def _range_pieces(
    cursor: Cursor,
    query: Query,
    counted: Query,
    keys: list[_Key],
    cells: list[tuple[Any, list[_Cell]]],
    row_bytes: int,
    config: LoaderConfig,
    geometry: WindowGeometry,
) -> _Ranged:
    """With shuffle, the subqueries larger than ``fetch_bytes`` cut into range pieces (see
    :mod:`ddbloader._sql.pieces`): combed without windows, contiguous with them. Where they
    cannot be cut, warns once naming why and what would fix it; those are read in consecutive
    pieces (front to back). With ``verify=True`` (``counted`` carries the row hash) each piece's
    rows are counted and hashed by one more query, so each piece is checked at its fetch."""
    big = [
        (index, position, params, rows, count)
        for index, (_, row) in enumerate(cells)
        for position, (_, params, rows, _) in enumerate(row)
        if config.shuffle and (count := len(pieces(rows, row_bytes, config.fetch_bytes))) > 1
    ]
    if not big:
        return {}

    def run(sql: str, purpose: str, params: Sequence[Any]) -> pa.Table:
        return _run(cursor, sql, purpose, params)

    columns = [query.column(k.text, k.parameter) for k in keys]  # as written, not as compared
    cutter = RangeCutter(query, columns, run, combed=geometry.span == 1)
    expressions = [k.expression for k in keys]
    ranged: _Ranged = {}
    for index, position, params, rows, count in big:
        layout = cutter.cut(expressions, params, rows, count) if cutter.reason is None else None
        if layout is None:
            break
        ranged[index, position] = [
            _range_piece(cutter, counted, expressions, ranges, (*params, *ranges.bounds()), size, run)
            for ranges, size in layout
        ]
    if cutter.reason is not None:
        warn_caller(
            f"shuffle=True, but {len(big)} subquer{'y is' if len(big) == 1 else 'ies are'} larger than "
            f"fetch_bytes={config.fetch_bytes} and cannot be cut into pieces by ranges of the order key: "
            f"{cutter.reason}; they are read front to back in consecutive pieces, so their samples come "
            f"close to row order. To shuffle them across the epoch, order the query by a result column "
            f"(ORDER BY a column it selects, of an integer, float, text, date or timestamp type), split "
            f"it with a repartition_col, or set fetch_bytes=0 (each subquery read whole)"
        )
        return {}
    return ranged


def _range_piece(
    cutter: RangeCutter,
    counted: Query,
    expressions: Sequence[exp.Expr],
    ranges: KeyRanges,
    params: tuple[Any, ...],
    rows: int,
    run: Callable[[str, str, Sequence[Any]], pa.Table],
) -> _Piece:
    """One range piece of ``rows`` rows; fingerprinted when ``counted`` carries the row hash.

    Raises:
        ValueError: the piece's hashing count finds another number of rows than its cut did
            (the data changed during planning).
    """
    sql = cutter.piece_sql(expressions, ranges)
    if not (isinstance(counted, UserQuery) and counted.hashes_rows):
        return sql, ranges, params, rows, None
    hashed = cutter.piece_sql(expressions, ranges, counted)
    counts = run(counted.count(hashed), "fingerprinting a range piece", params).to_pylist()[0]
    if counts[ROWS_ALIAS] != rows:
        raise ValueError(
            f"a range piece of the subquery with parameters {list(params)!r} holds {counts[ROWS_ALIAS]} "
            f"rows, where cutting it counted {rows}: the data changed while the loader was planning; "
            f"build the loader again"
        )
    return sql, ranges, params, rows, Fingerprint(hashed, planned_sum(counts[HASH_SUM_ALIAS]))


def _exact_keys(cursor: Cursor, query: UserQuery, keys: list[_Key]) -> list[_Key]:
    """The keys, each compared as the engine's text of it where its values would not bind back
    exactly (see :mod:`ddbloader._sql.binding`).

    Raises:
        ValueError: an explicit scheme for such a key (its values cannot be bound as given),
            naming the key and its type.
    """
    for key in keys:
        query.check_key(key.expression, key.name)
    fields = _run(cursor, query.key_schema([k.expression for k in keys]), "reading the keys' types").schema
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


def _key_columns(keys: Sequence[_Key], names: Sequence[str]) -> list[str]:
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
    """A subquery's :func:`pieces` as ``(piece, pieces, first_row, rows)``."""
    cut = pieces(rows, row_bytes, budget)
    return [(piece, len(cut), first, size) for piece, (first, size) in enumerate(cut)]


def _probe_partition(
    cursor: Cursor, partition_sql: str, cells: list[tuple[Any, list[_Cell]]]
) -> tuple[pa.Table | None, str]:
    """The smallest partition, to probe a transform on that cannot run on zero rows, and its name."""
    sized = [(rows, params) for _, row in cells for _, params, rows, _ in row if rows > 0]
    if not sized:
        return None, "the query's empty result (the query has no rows)"
    _, params = min(sized, key=lambda cell: cell[0])
    table = _run(cursor, partition_sql, "fetching a partition to probe the transform on", params)
    return table, f"the first rows of subquery {partition_sql!r} with parameters {list(params)!r}"


def _parse(backend: Backend, sql: str) -> Query:
    """The user's query, parsed by the backend when it brings its own parser (DolphinDB)."""
    parse = getattr(backend, "query", None)
    if callable(parse):
        parsed: Query = parse(sql)
        return parsed
    return UserQuery(sql, backend.dialect)


def _pin_pivots(cursor: Cursor, query: Query) -> Query:
    """Fix the columns of a PIVOT that takes them from the data, so every subquery has them all."""
    fields = query.dynamic_pivot_fields()
    if not fields:
        return query
    values = [
        _run(cursor, f, "listing the values of a PIVOT").column(PIVOT_ALIAS).to_pylist() for f in fields
    ]
    return query.pinned(values)


def _discover(cursor: Cursor, query: Query, key: _Key, lost: _Lost) -> list[Any]:
    table = _run(
        cursor,
        query.distinct_values([key.expression], with_counts=False),
        f"discovering {key.parameter} values",
    )
    values = table.column(GROUP_ALIAS).to_pylist()
    if None in values:
        nulls = _run(cursor, query.null_rows([key.expression]), f"counting rows with NULL {key.parameter}")
        lost[key.name] = int(nulls.column(ROWS_ALIAS)[0].as_py())
    return [v for v in values if v is not None]


def _cells(
    cursor: _TickingCursor, query: Query, keys: list[_Key], partition_sql: str, lost: _Lost, lists: bool
) -> list[tuple[Any, list[_Cell]]]:
    """Per group: its value and its (repartition value, parameters, rows) in scheme order.

    ``lists``: the backend binds a list as one parameter (explicit schemes are bound that way).
    """
    if not keys:
        table = _run(cursor, query.count(partition_sql), "counting rows")
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
        table = _run(cursor, count_sql, "counting the rows of a subquery", params)
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
    cursor: Cursor, query: Query, keys: list[_Key], lost: _Lost
) -> list[tuple[Any, list[_Cell]]]:
    """Every cell's row count from one GROUP BY over the query's FROM/WHERE."""
    table = _run(
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
    cells: dict[Any, list[_Cell]] = {}
    for g, r, n in complete:
        cells.setdefault(g, []).append((r, (g, r), n, None))
    return list(cells.items())


def _counted_cells(
    cursor: Cursor, query: UserQuery, keys: list[_Key], lost: _Lost, lists: bool
) -> list[tuple[Any, list[_Cell]]]:
    """Every cell's row count from one query, with the scheme values compared by the engine
    (bound as lists when the backend ``lists`` them).

    Raises:
        ValueError: two values of an explicit scheme equal the same rows in SQL (``1`` and
            ``'1'``, ``'a'`` and ``'A'`` under NOCASE): their rows would load twice.
    """
    sql, params = query.key_counts([k.expression for k in keys], [k.scheme for k in keys], lists=lists)
    try:
        table = _run(cursor, sql, "counting the rows of every subquery", params)
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
    found = _python_rows(table, keys, aliases)
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
        else:
            _check_scheme(key, [r[alias + INDEX_SUFFIX] for r in found], [r[alias] for r in found])
            values.append(list(enumerate(key.scheme)))
    rows: dict[tuple[Any, ...], int] = {}
    # verify=True: per cell, the sum of its rows' hashes (mod 2**64, as rows add up)
    contents: dict[tuple[Any, ...], int | None] = {}
    for r in found:
        cell = tuple(
            repr(r[a]) if k.scheme is None else r[a + INDEX_SUFFIX]
            for k, a in zip(keys, aliases, strict=True)
        )
        rows[cell] = rows.get(cell, 0) + int(r[ROWS_ALIAS])
        if HASH_SUM_ALIAS in r:
            contents[cell] = planned_sum((contents.get(cell) or 0) + planned_sum(r[HASH_SUM_ALIAS]))
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


def _python_rows(table: pa.Table, keys: list[_Key], aliases: Sequence[str]) -> list[dict[str, Any]]:
    """``table``'s rows as dicts.

    Raises:
        ValueError: a key's values include one Python cannot represent (an infinite date, a year
            past 9999), naming the key and its type.
    """
    for key, alias in zip(keys, aliases, strict=True):
        column = table.column(alias)
        try:
            column.to_pylist()
        except (OverflowError, ValueError, pa.ArrowException) as error:
            raise ValueError(
                f"{key.name} ({column.type}) holds values Python cannot represent ({error}), so they "
                f"cannot be bound back to the engine; cast the key to text in the query, or filter "
                f"those rows out"
            ) from error
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _check_scheme(key: _Key, positions: list[int], matched: list[Any]) -> None:
    """Refuse scheme values that equal the same key value in SQL; warn about values matching none."""
    assert key.scheme is not None
    scheme_name = key.parameter.replace("_col", "_scheme")
    by_key: dict[str, set[int]] = {}
    for position, value in zip(positions, matched, strict=True):
        by_key.setdefault(repr(value), set()).add(position)
    for value, found in by_key.items():
        if len(found) > 1:
            equal = [key.scheme[p] for p in sorted(found)]
            raise ValueError(
                f"{scheme_name} values {equal!r} are equal in SQL: each matches the rows where "
                f"{key.parameter} {key.text!r} = {value}, so those rows would load more than once; "
                f"keep one of them"
            )
    seen = set(positions)
    unmatched = [key.scheme[p] for p in range(len(key.scheme)) if p not in seen]
    if unmatched:
        hints = [h for h in (dolphindb_literal_hint(v) for v in unmatched) if h]
        warn_caller(
            f"{scheme_name} value(s) {unmatched[:10]!r}{' (and more)' if len(unmatched) > 10 else ''} "
            f"match no rows of {key.parameter} {key.text!r}, so they load nothing"
            + (f"; {'; '.join(hints[:3])}" if hints else "")
        )
