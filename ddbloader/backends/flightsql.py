"""Arrow Flight SQL servers (Sail, Dremio, GizmoSQL, InfluxDB 3, ...) through adbc-driver-flightsql.

A ``grpc://host:port`` (or ``grpc+tls://``) URI gives every cursor its own Flight SQL
connection; an ADBC Flight SQL connection the user made is cloned per cursor (as every ADBC
connection is: :class:`~ddbloader.backends.adbc.ADBCBackend`, whose cursor this one extends).
The protocol does not say which SQL the server speaks: pass ``dialect=`` (sqlglot's name:
``"spark"`` for Sail, ``"dremio"``, ``"duckdb"`` for GizmoSQL) unless the server's
``vendor_name`` tells it.

Parameters: whether the server binds prepared-statement parameters is asked once, when the
backend is built (``SELECT ?`` with one value). Where it does not (Sail 0.7 answers "must set
IngestTargetTable before bulk ingestion"), each value becomes a typed literal built by sqlglot's
generator for the dialect (:func:`inline_parameters`): the derived query is parsed, every
parameter node is replaced by a literal node, and the tree is rendered, so a value is escaped
as the dialect escapes string literals and can never end the literal or add SQL. A value of a
type with no literal here is refused, naming the type.

Flight SQL has no read-only session: the loader sends only the single query it was given and
its own derived queries. Whoever writes ``sql`` may read what the connection may read.
``interrupt()`` cancels the running call (``adbc_cancel``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import sqlglot
from sqlglot import exp

from .._core.engine import describe_uri, redact_uri
from .adbc import ADBCBackend, _ADBCCursor

__all__ = ["URI_SCHEMES", "FlightSQLBackend", "inline_parameters", "is_flightsql_connection", "sql_literal"]

URI_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")

_INSTALL_HINT = "Flight SQL needs adbc-driver-flightsql: pip install 'ddbloader[flightsql]'"


def _flightsql_connect(uri: str) -> Callable[[], Any]:
    try:
        from adbc_driver_flightsql import dbapi
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return functools.partial(dbapi.connect, uri, autocommit=True)


def is_flightsql_connection(connection: Any) -> bool:
    """True for an ADBC connection made by the Flight SQL driver (call only on ADBC connections)."""
    return "flight sql" in str(connection.adbc_get_info().get("driver_name", "")).lower()


def _typed(text: str, kind: str) -> exp.Expr:
    return exp.cast(exp.Literal.string(text), exp.DataType.build(kind))


def _decimal_literal(value: decimal.Decimal) -> exp.Expr:
    if not value.is_finite():
        raise ValueError(f"{value!r} is not a finite decimal, so it equals no row")
    digits, exponent = value.as_tuple()[1:]
    assert isinstance(exponent, int)  # finite
    scale = max(-exponent, 0)
    precision = max(len(digits) + max(exponent, 0), scale, 1)
    return _typed(str(value), f"DECIMAL({precision}, {scale})")


def _float_literal(value: float) -> exp.Expr:
    if math.isnan(value):
        return _typed("NaN", "DOUBLE")
    if math.isinf(value):
        return _typed("Infinity" if value > 0 else "-Infinity", "DOUBLE")
    return _typed(repr(value), "DOUBLE")


def sql_literal(value: Any) -> exp.Expr:
    """A typed sqlglot literal for one parameter value (render it with the engine's dialect).

    None → NULL; bool → TRUE/FALSE; int → digits; float → ``CAST('<repr>' AS DOUBLE)`` (NaN and
    infinities spelled for the cast); Decimal → ``CAST('<digits>' AS DECIMAL(p, s))`` of its own
    precision; str → a string literal (or a concatenation of literals, see
    :func:`_string_literal`); date → ``CAST('2024-01-02' AS DATE)``; datetime →
    ``CAST('2024-01-02 03:04:05.123456' AS TIMESTAMP)`` (an aware one keeps its offset); numpy
    scalars and Arrow scalars as the Python value they hold (Arrow timestamps with their
    nanoseconds).

    Raises:
        TypeError: a value of a type this builder has no literal for (bytes, time, containers).
        ValueError: a decimal NaN or infinity.
    """
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        return _float_literal(value)
    if isinstance(value, decimal.Decimal):
        return _decimal_literal(value)
    if isinstance(value, str):
        return _string_literal(value)
    if isinstance(value, dt.datetime):
        return _typed(value.isoformat(sep=" "), "TIMESTAMP")
    if isinstance(value, dt.date):
        return _typed(value.isoformat(), "DATE")
    return _other_literal(value)


def _string_literal(value: str) -> exp.Expr:
    """A string literal, each NUL character in a literal of its own and the pieces concatenated:
    Spark's dialect escapes NUL as ``\\0``, which reads the digits after it as an octal escape
    (``'\\00'`` is one character on Sail, ``'\\012'`` a newline on Spark)."""
    if "\x00" not in value:
        return exp.Literal.string(value)
    pieces = [exp.Literal.string(piece) for piece in re.split("(\x00)", value) if piece]
    return pieces[0] if len(pieces) == 1 else exp.Concat(expressions=pieces)


def _other_literal(value: Any) -> exp.Expr:
    """numpy and Arrow scalars (imported only when such a value comes)."""
    kind = type(value).__module__.split(".")[0]
    if kind == "numpy":
        import numpy as np

        if isinstance(value, np.datetime64):
            day = np.datetime_data(value.dtype)[0] == "D"
            return _typed(str(value).replace("T", " "), "DATE" if day else "TIMESTAMP")
        if isinstance(value, np.generic):
            return sql_literal(value.item())
    if kind == "pyarrow":
        import pyarrow as pa
        import pyarrow.compute as pc

        if isinstance(value, pa.TimestampScalar) and value.is_valid and value.type.tz is None:
            return _typed(pc.strftime(value, "%Y-%m-%d %H:%M:%S").as_py(), "TIMESTAMP")
        if isinstance(value, pa.Scalar):
            return sql_literal(value.as_py())
    raise TypeError(
        f"cannot write a {type(value).__module__}.{type(value).__qualname__} value as a SQL literal: "
        f"use a number, string, date, datetime or Decimal scheme value"
    )


@functools.lru_cache(maxsize=256)
def _parsed(sql: str, dialect: str) -> exp.Expr:
    return sqlglot.parse_one(sql, read=dialect)


def inline_parameters(sql: str, params: Sequence[Any], dialect: str) -> str:
    """``sql`` with each numbered parameter (``$1``, ``@1``, ``${1}`` as rendered for ``dialect``)
    replaced by :func:`sql_literal` of its value, rendered by the dialect's generator.

    Raises:
        ValueError: a parameter numbered beyond ``params``.
        TypeError: a value :func:`sql_literal` refuses.
    """
    if not params:
        return sql
    literals = [sql_literal(value) for value in params]

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.Parameter, exp.Placeholder)) and node.name.isdigit():
            number = int(node.name)
            if not 1 <= number <= len(literals):
                raise ValueError(f"the query uses parameter ${number} but only {len(literals)} were given")
            return literals[number - 1].copy()
        return node

    return _parsed(sql, dialect).transform(replace).sql(dialect=dialect)


class _FlightSQLCursor(_ADBCCursor):
    """An ADBC cursor that writes the parameters as literals where the server binds none."""

    def __init__(self, backend: FlightSQLBackend) -> None:
        super().__init__(backend)
        self._binds = backend.binds_parameters

    def _execute(self, sql: str, params: Sequence[Any]) -> None:
        if self._binds or not params:
            super()._execute(sql, params)
        else:
            super()._execute(inline_parameters(sql, params, self._backend.dialect), [])


def _binds_parameters(connection: Any) -> bool:
    """Whether the server returns a bound parameter (``SELECT ?`` with 1): asked once."""
    import adbc_driver_manager

    cursor = connection.cursor()
    try:
        cursor.execute("SELECT ? AS p", [1])
        return bool(cursor.fetch_arrow_table().column(0).to_pylist() == [1])
    except adbc_driver_manager.Error:
        return False
    finally:
        with contextlib.suppress(Exception):
            cursor.close()


class FlightSQLBackend(ADBCBackend):
    """A Flight SQL server through one ADBC connection per cursor. Thread-safe.

    Args:
        source: a ``grpc://`` / ``grpc+tls://`` URI, an ADBC Flight SQL connection, or a
            callable returning one.
        dialect: sqlglot dialect of the server's SQL; default: from its ``vendor_name``.

    Raises:
        ImportError: adbc-driver-flightsql is not installed.
        ValueError: a URI of another scheme.
        TypeError: the dialect cannot be told from the server; pass ``dialect=``.
    """

    def __init__(self, source: Any, *, dialect: str | None = None) -> None:
        if isinstance(source, str):
            if not source.startswith(URI_SCHEMES):
                raise ValueError(f"FlightSQLBackend takes grpc:// URIs, got {redact_uri(source)!r}")
            super().__init__(_flightsql_connect(source), dialect=dialect)
            self.engine = f"flight sql {describe_uri(source).split(' ', 1)[1]}"
        else:
            super().__init__(source, dialect=dialect)
        probe = self._open()
        try:
            #: False where the server takes no parameters: values are sent as typed literals.
            self.binds_parameters = _binds_parameters(probe)
        finally:
            with contextlib.suppress(Exception):
                probe.close()
        # a list has no literal here: a fetch unit binds one value per key where values are literals
        self.binds_lists = self.binds_lists and self.binds_parameters

    def cursor(self) -> _FlightSQLCursor:
        return _FlightSQLCursor(self)
