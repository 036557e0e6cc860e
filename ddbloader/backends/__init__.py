"""Engine backends. :func:`connect` turns whatever the user passed as ``source`` into one.

| source                                   | backend           | connections                    |
|------------------------------------------|-------------------|--------------------------------|
| ``None``, a DuckDB connection or path    | DuckDBBackend     | cursors of one database        |
| ``"postgresql://..."``                   | ADBCBackend       | one per cursor (thread)        |
| an ADBC DB-API connection                | ADBCBackend       | a sibling per cursor           |
| ``"dolphindb://..."`` / a factory        | DolphinDBBackend  | one session per cursor         |
| a ``dolphindb.Session``                  | DolphinDBBackend  | the one session, serialised    |
| ``"sc://..."``, a ``SparkSession``        | SparkBackend      | one session, shared by threads |
| ``"chdb://<path>"``                      | ClickHouseBackend | one per cursor (thread)        |
| ``"grpc://..."`` (Flight SQL)            | FlightSQLBackend  | one per cursor (thread)        |
| a ``datafusion.SessionContext``          | DataFusionBackend | the one context, shared        |
| a plain DB-API 2.0 connection            | DBAPIBackend      | the one connection, serialised |
| a factory (callable) returning any above | by what it returns | one per cursor                |

Drivers are imported only when a source needs them, so ddbloader works without any of them.
"""

from __future__ import annotations

import threading
from typing import Any

from duckdb import ConnectionException as DuckDBConnectionClosed
from duckdb import DuckDBPyConnection

from .._core.engine import Backend, Cursor, redact_uri
from .adbc import POSTGRES_SCHEMES, ADBCBackend, is_adbc_connection
from .clickhouse import CHDB_SCHEME, ClickHouseBackend
from .datafusion import DataFusionBackend, is_datafusion_context
from .dbapi import DBAPIBackend
from .dolphindb import URI_SCHEME, DolphinDBBackend, is_dolphindb_session
from .duckdb import DuckDBBackend
from .flightsql import URI_SCHEMES as FLIGHT_SQL_SCHEMES
from .flightsql import FlightSQLBackend, is_flightsql_connection
from .spark import URI_SCHEME as SPARK_SCHEME
from .spark import SparkBackend, is_spark_session

__all__ = [
    "ADBCBackend",
    "Backend",
    "ClickHouseBackend",
    "Cursor",
    "DBAPIBackend",
    "DataFusionBackend",
    "DolphinDBBackend",
    "DuckDBBackend",
    "FlightSQLBackend",
    "SparkBackend",
    "connect",
    "is_backend",
    "redact_uri",
]


def _is_dbapi_connection(source: Any) -> bool:
    return all(callable(getattr(source, name, None)) for name in ("cursor", "commit", "close"))


def is_backend(source: Any) -> bool:
    """True for an object that already implements :class:`Backend` (used as it is)."""
    return all(hasattr(source, attribute) for attribute in ("cursor", "dialect", "engine", "close"))


def connect(source: Any) -> Backend:
    """Wrap ``source`` in a :class:`Backend` (see the module table).

    An object that already implements :class:`Backend` is used as it is (the loader will close
    it). A factory is called once here to learn which engine it opens; that connection then
    serves the first cursor.

    Raises:
        TypeError: ``source`` is not something ddbloader can read from.
        FileNotFoundError: a DuckDB database path that does not exist.
        ImportError: the driver a URI needs is not installed.
    """
    if is_backend(source):
        return source  # type: ignore[no-any-return]
    if isinstance(source, str) and source.startswith(POSTGRES_SCHEMES):
        return ADBCBackend(source)
    if isinstance(source, str) and source.startswith(URI_SCHEME):
        return DolphinDBBackend(source)
    if (isinstance(source, str) and source.startswith(SPARK_SCHEME)) or is_spark_session(source):
        return SparkBackend(source)
    if isinstance(source, str) and source.startswith(CHDB_SCHEME):
        return ClickHouseBackend(source)
    if isinstance(source, str) and source.startswith(FLIGHT_SQL_SCHEMES):
        return FlightSQLBackend(source)
    if is_datafusion_context(source):
        return DataFusionBackend(source)
    if DuckDBBackend.accepts(source):
        return DuckDBBackend(source)
    if is_adbc_connection(source):
        return FlightSQLBackend(source) if is_flightsql_connection(source) else ADBCBackend(source)
    if is_dolphindb_session(source):
        return DolphinDBBackend(source)
    if _is_dbapi_connection(source):
        return DBAPIBackend(source)
    if callable(source):
        return _from_factory(source)
    kind = f"{type(source).__module__}.{type(source).__qualname__}"
    data = _DATA_CONSTRUCTORS.get((type(source).__module__.split(".", maxsplit=1)[0], type(source).__name__))
    if data is not None:
        raise TypeError(
            f"source is a {kind}, data rather than a connection: load it with "
            f"DDBDataLoader.{data}(data, target_col, sql='SELECT * FROM data', ...): it becomes the "
            f"in-memory DuckDB table data"
        )
    raise TypeError(
        f"source must be a DuckDB connection or path, a postgresql://, dolphindb://, sc://, chdb:// or "
        f"grpc:// URI, a SparkSession, a DataFusion SessionContext, an ADBC, DolphinDB or DB-API "
        f"connection, or a factory returning one; got {kind}"
    )


#: (top-level module, class name) of in-memory data → the constructor that loads it
_DATA_CONSTRUCTORS = {
    ("pandas", "DataFrame"): "from_pandas",
    ("pyarrow", "Table"): "from_arrow",
    ("pyarrow", "RecordBatch"): "from_arrow",
    ("polars", "DataFrame"): "from_arrow",
}


def _from_factory(factory: Any) -> Backend:
    first = factory()
    if is_backend(first):
        return first  # type: ignore[no-any-return]
    handed_out = False

    def replay() -> Any:
        nonlocal handed_out
        if not handed_out:
            handed_out = True
            return first
        return factory()

    if isinstance(first, DuckDBPyConnection):
        # DuckDB cursors share one database: the first connection is the only one needed.
        return _Owning(DuckDBBackend(first), first, factory)
    if is_adbc_connection(first):
        return FlightSQLBackend(replay) if is_flightsql_connection(first) else ADBCBackend(replay)
    if is_dolphindb_session(first):
        return DolphinDBBackend(replay)
    if _is_dbapi_connection(first):
        return DBAPIBackend(replay)
    close = getattr(first, "close", None)
    if callable(close):
        close()
    raise TypeError(
        f"the source factory returned {type(first).__module__}.{type(first).__qualname__}, "
        f"which is not a connection ddbloader can read from"
    )


class _Owning:
    """A DuckDB backend over a connection a factory made: closing the backend closes it.

    When that connection has been closed under it, the next ``cursor()`` opens a new one through
    the factory, and a closed-connection error counts as transient, so the fetch is retried on
    the new connection. Thread-safe.
    """

    def __init__(self, inner: DuckDBBackend, connection: Any, factory: Any) -> None:
        self._inner = inner
        self._connection = connection
        self._factory = factory
        self._lock = threading.Lock()
        self.dialect = inner.dialect
        self.engine = inner.engine
        self.binds_lists = inner.binds_lists
        self.row_hash_dialect = inner.row_hash_dialect

    def cursor(self) -> Cursor:
        with self._lock:
            try:
                return self._inner.cursor()
            except DuckDBConnectionClosed:
                self._connection = self._factory()
                self._inner = DuckDBBackend(self._connection)
                return self._inner.cursor()

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        return isinstance(error, DuckDBConnectionClosed)

    def close(self) -> None:
        with self._lock:
            self._inner.close()
            self._connection.close()
