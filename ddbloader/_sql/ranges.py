"""Range pieces: with shuffle, the subqueries larger than ``fetch_bytes`` cut into pieces by
ranges of the order key (see :mod:`ddbloader._sql.pieces`).

Either every big subquery is cut, or (when one cannot be) none is and the caller is warned once,
naming why and what would fix it. With ``verify=True`` each piece is counted and hashed once more,
and a count other than the cut's refuses the plan (the data changed while planning).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from sqlglot import exp

from .._core.config import LoaderConfig
from .._core.engine import Cursor
from .._core.errors import warn_caller
from .._core.window import WindowGeometry
from .aliases import ROWS_ALIAS
from .cells import Cell, run_planning
from .fingerprint import HASH_SUM_ALIAS, Fingerprint, planned_sum
from .key_values import PlanKey
from .pieces import KeyRanges
from .plan import piece_rows, pieces
from .query import Query, UserQuery
from .range_cutter import OrderKey, RangeCutter

__all__ = ["Piece", "Ranged", "range_pieces"]


#: Per (group index, cell index) cut into range pieces: each piece's SQL, ranges, parameters,
#: rows and, with ``verify=True``, fingerprint.
Piece = tuple[str, KeyRanges | None, tuple[Any, ...], int, Fingerprint | None]


Ranged = dict[tuple[int, int], list[Piece]]


def range_pieces(
    cursor: Cursor,
    query: Query,
    counted: Query,
    keys: list[PlanKey],
    cells: list[tuple[Any, list[Cell]]],
    row_bytes: int,
    config: LoaderConfig,
    geometry: WindowGeometry,
    schema: pa.Schema | None = None,
) -> tuple[Ranged, OrderKey | None]:
    """With shuffle, the subqueries larger than ``fetch_bytes`` cut into range pieces (see
    :mod:`ddbloader._sql.pieces`): combed without windows, and with them where a subquery is its
    group's only one and its order key is distinct (:mod:`ddbloader._sql.window_pieces`), else
    contiguous. Where they
    cannot be cut, warns once naming why and what would fix it; those are read in consecutive
    pieces (front to back). With ``verify=True`` (``counted`` carries the row hash) each piece's
    rows are counted and hashed by one more query, so each piece is checked at its fetch. With
    the query's ``schema``, a combed piece read whole whose order the reader can restore (see
    :attr:`KeyRanges.sort`) is queried without an ORDER BY. Returns the pieces and the leading
    ORDER BY term they are cut on, which tagged pieces compare (None when none are cut)."""
    big = [
        (index, position, params, rows, count, sum(cell[2] > 0 for cell in row) == 1)
        for index, (_, row) in enumerate(cells)
        for position, (_, params, rows, _) in enumerate(row)
        if config.shuffle and (count := len(pieces(rows, row_bytes, config.fetch_bytes))) > 1
    ]
    if not big:
        return {}, None

    def run(sql: str, purpose: str, params: Sequence[Any]) -> pa.Table:
        return run_planning(cursor, sql, purpose, params)

    columns = [query.column(k.text, k.parameter) for k in keys]  # as written, not as compared
    cutter = RangeCutter(query, columns, run, span=geometry.span, stride=geometry.stride, schema=schema)
    expressions = [k.expression for k in keys]
    ranged: Ranged = {}
    for index, position, params, rows, count, series in big:
        if cutter.reason is not None:
            break
        limit = piece_rows(row_bytes, config.fetch_bytes)
        layout = cutter.cut(expressions, params, rows, count, limit, series=series)
        if layout is None:
            break
        ranged[index, position] = [
            _range_piece(cutter, counted, expressions, ranges, (*params, *ranges.bounds()), size, run)
            for ranges, size in (
                (_sorted_by_reader(cutter, ranges, size, row_bytes, config.fetch_bytes), size)
                for ranges, size in layout
            )
        ]
    if cutter.reason is not None:
        warn_caller(
            f"shuffle=True, but {len(big)} subquer{'y is' if len(big) == 1 else 'ies are'} larger than "
            f"fetch_bytes={config.fetch_bytes} and cannot be cut into pieces by ranges of the ORDER BY: "
            f"{cutter.reason}; they are read front to back in consecutive pieces, so their samples come "
            f"close to row order. To shuffle them across the epoch, order the query by a result column "
            f"(ORDER BY a column it selects, of an integer, float, text, date or timestamp type), split "
            f"it with a repartition_col, or set fetch_bytes=0 (each subquery read whole)"
        )
        return {}, None
    return ranged, cutter.terms[0]


def _sorted_by_reader(
    cutter: RangeCutter, ranges: KeyRanges, rows: int, row_bytes: int, budget: int
) -> KeyRanges:
    """``ranges``, ordered by its reader (:attr:`KeyRanges.sort`) where the cutter found the
    order key fit, the piece is combed (a contiguous piece of windows keeps the engine's order, as
    its neighbours do: equal keys straddle no piece but the order of ties is the engine's) and
    read whole (one piece of the budget, or a windowed one, which is never cut: a piece read in
    parts needs the engine's order to cut them), the key never NULL in the subquery
    (whose pieces :mod:`ddbloader._sql.piece_tags` may then tag by comparing bounds in Python)."""
    if cutter.sort is None or any(ranges.nullable):
        return ranges
    if ranges.windows is None and (cutter.windowed or len(pieces(rows, row_bytes, budget)) != 1):
        return ranges
    return dataclasses.replace(ranges, sort=cutter.sort)


def _range_piece(
    cutter: RangeCutter,
    counted: Query,
    expressions: Sequence[exp.Expr],
    ranges: KeyRanges,
    params: tuple[Any, ...],
    rows: int,
    run: Callable[[str, str, Sequence[Any]], pa.Table],
) -> Piece:
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
