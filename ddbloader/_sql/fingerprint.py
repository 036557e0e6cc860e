"""Content fingerprints (``verify=True``): each partition's rows checked against planning's.

The planned row count cannot see wrong rows in the right number (a key compared differently at
fetch than at planning, a partition swapped, a value changed in place). With ``verify=True``
planning records, per partition, the sum modulo 2**64 of an engine-computed hash of each of its
rows; every fetch adds the same hash as its last column (:data:`HASH_ALIAS`), which the reader
sums (uint64 wrap-around), drops before anything else sees the rows, and compares.

Invariants:

* The hash is the engine's, of every result column of the query, computed on the query's
  result (``FROM (Q) AS _ddb_q``) at planning and at fetch alike, so equal rows hash equally
  whatever the session; the client only adds.
* The sum is order-independent (a partition's rows may come in any order) and, unlike XOR,
  sees duplicated rows: two copies of a row add twice.
* It cannot see rows reordered within a partition, a change made before planning, or a change
  that keeps every partition's count and hash sum (a collision: about 2**-64 per partition).

Engines: DuckDB (``hash(*COLUMNS(*))``) and PostgreSQL (``hashtextextended`` of the row's text,
which every type has). Every other engine is refused by name at construction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import sqlglot
from sqlglot import exp

__all__ = [
    "HASH_ALIAS",
    "HASH_SUM_ALIAS",
    "Fingerprint",
    "HashSum",
    "content_mismatch",
    "planned_sum",
    "row_hash",
    "strip_hash",
    "verified_engines",
]

#: The per-row hash column a fetch query adds as its last column (before a unit's key columns).
HASH_ALIAS = "_ddb_hash"
#: The column of a planning count holding a partition's hash sum, as text (exact on every driver).
HASH_SUM_ALIAS = "_ddb_hash_sum"

_MODULUS = 2**64

#: Per sqlglot dialect, the engine's hash of one row of ``_ddb_q`` (the wrapped query's result).
#: DuckDB's ``hash(*COLUMNS(*))`` was the cheapest of its row hashes (benchmarks/README.md).
#: PostgreSQL hashes the row's text: ``hash_record_extended`` fails on types without a hash
#: opclass (json, point, xml), while every type has a text output.
_ROW_HASHES = {
    "duckdb": "hash(*COLUMNS(*))",
    "postgres": "hashtextextended(CAST(_ddb_q AS TEXT), 0)",
}

_ENGINE_NAMES = {"duckdb": "DuckDB", "postgres": "PostgreSQL"}


def verified_engines() -> list[str]:
    """The engines ``verify=True`` works on, for messages and docs."""
    return [_ENGINE_NAMES[d] for d in _ROW_HASHES]


def row_hash(backend: Any, dialect: str) -> exp.Expr:
    """The engine's hash of one row of the wrapped query ``_ddb_q``, as a sqlglot expression.

    A backend says which engine's row hash it runs by its ``row_hash_dialect`` attribute (the
    engine itself, not only its SQL dialect: DataFusion speaks PostgreSQL's SQL without its
    functions); it must be the dialect the queries are rendered in (``dialect``).

    Raises:
        ValueError: the engine has no row hash ddbloader uses; the message names it.
    """
    engine = getattr(backend, "engine", type(backend).__name__)
    family = getattr(backend, "row_hash_dialect", None)
    text = _ROW_HASHES.get(family) if family == dialect else None
    if text is None or family is None:
        raise ValueError(
            f"verify=True needs an engine-computed hash of each row, which ddbloader uses on "
            f"{' and '.join(verified_engines())} only, not on {engine}; build the loader without "
            f"verify (the planned row counts are still checked)"
        )
    return sqlglot.parse_one(text, read=family)


def planned_sum(value: Any) -> int:
    """A planning query's hash sum (its text, or a number) reduced modulo 2**64."""
    return int(str(value)) % _MODULUS


@dataclass(frozen=True)
class Fingerprint:
    """What a partition's rows must sum to: ``sql`` is its subquery with the row hash as its last
    column (the same parameters as the plain one); ``content`` the planned hash sum mod 2**64.

    For a streamed subquery every piece holds the whole subquery's fingerprint, checked once the
    last piece has been read."""

    sql: str
    content: int


def strip_hash(table: pa.Table, at: int = -1) -> tuple[pa.Table, int]:
    """``table`` without its hash column (the last, or column ``at``), and that column's sum mod
    2**64 (numpy's uint64 sum wraps around, as the engine's sum is reduced)."""
    index = at % table.num_columns
    column = table.column(index)
    if column.null_count:  # a row the sum would skip: its content would go unchecked
        raise ValueError(
            f"the engine's row hash ({HASH_ALIAS}) is NULL for {column.null_count} rows, so their "
            f"content cannot be checked; verify=True cannot be used with this engine"
        )
    values = np.asarray(column.combine_chunks().to_numpy(zero_copy_only=False))
    if values.dtype != np.uint64:  # PostgreSQL's int8: the same 64 bits, read unsigned
        values = values.astype(np.int64, copy=False).view(np.uint64)
    total = int(values.sum(dtype=np.uint64))
    return table.remove_column(index), total


class HashSum:
    """The running hash sum of a streamed subquery's tables, stripped as they are read."""

    def __init__(self) -> None:
        self.total = 0

    def stripping(self, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """``tables`` without their hash column, each one's sum added to :attr:`total` as it is
        read; closing the result closes ``tables`` (a reader holds the engine's result)."""
        try:
            for table in tables:
                stripped, total = strip_hash(table)
                self.total = (self.total + total) % _MODULUS
                yield stripped
        finally:
            close = getattr(tables, "close", None)
            if callable(close):
                close()


def content_mismatch(where: str, keys: Sequence[Any], rows: int, planned: int, fetched: int) -> ValueError:
    """The error for a partition whose rows are as many as planned but hash otherwise.

    ``where`` names the partition (its subquery), ``keys`` its key values (none: the whole query)."""
    values = f"key values {list(keys)!r}" if keys else "the whole query"
    return ValueError(
        f"{where}, {values}, returned the {rows} rows planning counted, but their content differs: "
        f"the sum of the engine's row hashes is {fetched}, where planning's was {planned} "
        f"(verify=True). The data changed "
        f"after the loader was built, or the query does not return the same rows each time it runs "
        f"(random(), now(), floating-point aggregates computed in another order); build the loader "
        f"again, or make the query deterministic"
    )
