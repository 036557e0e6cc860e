"""Which key values survive the trip engine → Python → bound parameter exactly.

A partition key's values are discovered from the engine and bound back as parameters. That is
exact only for the types whose Python value holds every bit of the engine's value and binds
back to the same type: integers, booleans, floats, text, dates and timestamps of at most
microsecond precision. Every other key (nanosecond timestamps, TIME/TIMETZ, intervals, BIT and
BLOB, decimals, UUIDs, enums, lists, structs, maps; PostgreSQL ``char(n)``, ``numeric``,
``money``, ``inet``, ``jsonb``, enums ...) is compared as the engine's own text of it: the
planning query discovers ``CAST(key AS TEXT)`` and each subquery compares ``CAST(key AS TEXT)``
with that text. Whatever the engine's text rendering, each row then lands in exactly one
partition (the one of its own text), so the partitions of a discovered scheme cover the query's
rows exactly once; they are finer than SQL equality only where equal values print differently
(PostgreSQL ``numeric`` 1.0 and 1.00, DuckDB ``INTERVAL 1 DAY`` and ``INTERVAL 24 HOUR``). A type
whose text can be the same for values that differ (a UNION of ``1`` and ``'1'``) is refused.

Pure functions of Arrow fields; thread-safe.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["POSTGRES_TYPE", "binds_exactly", "text_identifies"]

#: Field metadata the PostgreSQL ADBC driver sets to the column's type name.
POSTGRES_TYPE = b"POSTGRESQL:type"

#: PostgreSQL types whose Arrow value binds back as the same value (``char(n)`` comes back
#: blank-padded, ``money`` as cents, ``numeric`` as text: not these).
_POSTGRES_EXACT = frozenset(
    {b"int2", b"int4", b"int8", b"bool", b"text", b"varchar", b"float4", b"float8", b"date"}
    | {b"timestamp", b"timestamptz", b"name"}
)


def binds_exactly(field: pa.Field) -> bool:
    """Whether a key value of ``field``'s type, as a Python value, binds back as the same value.

    ``field`` is the key expression's field in the engine's Arrow result (with the driver's
    metadata, if any).
    """
    metadata = field.metadata or {}
    engine_type = metadata.get(POSTGRES_TYPE)
    if engine_type is not None and engine_type not in _POSTGRES_EXACT:
        return False
    kind = field.type
    if pa.types.is_timestamp(kind):
        return bool(kind.unit != "ns")
    return bool(
        pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_date(kind)
        or pa.types.is_null(kind)
    )


def text_identifies(field: pa.Field) -> bool:
    """Whether values that differ in SQL always differ in the engine's text of them.

    False for a union (``1`` and ``'1'`` print alike), anywhere in a nested type.
    """
    return not _holds_union(field.type)


def _holds_union(kind: pa.DataType) -> bool:
    if pa.types.is_union(kind):
        return True
    return any(_holds_union(kind.field(i).type) for i in range(kind.num_fields))
