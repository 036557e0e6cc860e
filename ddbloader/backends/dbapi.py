"""Any DB-API 2.0 driver: the slow but universal fallback (sqlite3, psycopg, pymysql, ...).

Rows come back as Python tuples and are turned into Arrow column by column, so this is the
backend to use only when an engine has no Arrow-native path (DuckDB, ADBC).

Connections: a factory (a callable returning a new connection) gives every cursor, so every
fetch thread, its own connection, and fetches run in parallel; those connections are the
loader's, so every query on them runs right after the session was switched to read-only where
the engine has a switch (SQLite ``query_only``, PostgreSQL read-only transactions). A connection
passed in as it is is shared and left as it is: every query takes one lock, so fetches run one
at a time; drivers that bind a connection to the thread that made it (sqlite3 by default) fail
in the fetch threads with a note saying to pass a factory.

Parameters: the loader's SQL carries numbered placeholders in the backend's sqlglot dialect;
:func:`bind_parameters` rewrites them into the driver's ``paramstyle`` (qmark, numeric, named,
format, pyformat), so values are always bound by the driver, never spliced into the text.

Types: Arrow types are inferred from the values, so a column that is NULL in every row of a
result has Arrow type ``null``. A schema probe (a top-level ``LIMIT 0``) has no values at all;
for it, the first :data:`SCHEMA_SAMPLE_ROWS` rows of the same query are read to type the columns.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp

from .._core.engine import read_only_statement
from .._core.errors import add_note

__all__ = ["PARAMSTYLES", "DBAPIBackend", "bind_parameters"]

PARAMSTYLES = ("qmark", "numeric", "named", "format", "pyformat")

#: Rows read to type the columns of an empty schema probe.
SCHEMA_SAMPLE_ROWS = 1000

#: DB-API modules of PostgreSQL servers.
_POSTGRES_DRIVERS = frozenset({"psycopg", "psycopg2", "pg8000"})

#: DB-API module (top-level package) → sqlglot dialect.
_DIALECTS = {
    "sqlite3": "sqlite",
    "psycopg": "postgres",
    "psycopg2": "postgres",
    "pg8000": "postgres",
    "pymysql": "mysql",
    "MySQLdb": "mysql",
    "mysql": "mysql",
    "snowflake": "snowflake",
    "trino": "trino",
    "oracledb": "oracle",
    "pyodbc": "tsql",
    "pymssql": "tsql",
    "clickhouse_connect": "clickhouse",
    "databricks": "databricks",
}

#: Drivers of embedded engines: no network, so no error of theirs is worth a retry.
_EMBEDDED = frozenset({"sqlite3"})

_THREAD_BOUND_HINT = (
    "this connection may only be used by the thread that created it; pass a factory instead "
    "(for example lambda: sqlite3.connect(path)) so that every fetch thread opens its own"
)


@functools.lru_cache(maxsize=256)
def _translate(sql: str, dialect: str, paramstyle: str) -> tuple[str, tuple[int, ...]]:
    """``sql`` in ``paramstyle`` and, per marker in text order, the 1-based parameter it binds."""
    tree = sqlglot.parse_one(sql, read=dialect)
    prefix = "ddbparam"
    while prefix in sql:
        prefix += "x"
    marker = re.compile(rf"\b{prefix}_(\d+)\b")

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.Parameter, exp.Placeholder)) and node.name.isdigit():
            return exp.column(f"{prefix}_{node.name}")
        return node

    rendered = tree.transform(replace).sql(dialect=dialect)
    order = tuple(int(m.group(1)) for m in marker.finditer(rendered))
    if paramstyle in {"format", "pyformat"}:
        rendered = rendered.replace("%", "%%")
    return marker.sub(lambda m: _placeholder(paramstyle, int(m.group(1))), rendered), order


def _placeholder(paramstyle: str, number: int) -> str:
    if paramstyle == "qmark":
        return "?"
    if paramstyle == "numeric":
        return f":{number}"
    if paramstyle == "named":
        return f":p{number}"
    if paramstyle == "format":
        return "%s"
    return f"%(p{number})s"


def bind_parameters(
    sql: str, params: Sequence[Any], dialect: str, paramstyle: str
) -> tuple[str, Sequence[Any] | dict[str, Any]]:
    """Rewrite the numbered placeholders of ``sql`` (``$1`` / ``@1`` …) for a driver's ``paramstyle``.

    Returns the SQL and the parameters in the shape that paramstyle takes: a sequence in marker
    order (qmark, format), a sequence in number order (numeric) or a mapping ``p1, p2, …``
    (named, pyformat). SQL without parameters is returned unchanged.

    Raises:
        ValueError: an unknown paramstyle, or a placeholder numbered beyond ``params``.
    """
    if paramstyle not in PARAMSTYLES:
        raise ValueError(f"paramstyle must be one of {PARAMSTYLES}, got {paramstyle!r}")
    if not params:
        return sql, ()
    text, order = _translate(sql, dialect, paramstyle)
    if any(n > len(params) for n in order):
        raise ValueError(f"the query uses parameter ${max(order)} but only {len(params)} were given")
    if paramstyle in {"named", "pyformat"}:
        return text, {f"p{n}": params[n - 1] for n in set(order)}
    if paramstyle == "numeric":
        return text, list(params)
    return text, [params[n - 1] for n in order]


@functools.lru_cache(maxsize=64)
def _schema_sample(sql: str, dialect: str) -> str | None:
    """For a top-level ``... LIMIT 0`` query, the same query limited to a sample of rows."""
    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except sqlglot.errors.ParseError:
        return None
    limit = tree.args.get("limit")
    if not isinstance(tree, exp.Select) or limit is None or limit.expression.sql() != "0":
        return None
    return tree.limit(SCHEMA_SAMPLE_ROWS).sql(dialect=dialect)


def rows_to_arrow(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    """Build an Arrow table from DB-API rows, inferring each column's type from its values.

    Raises:
        TypeError: a column mixes values Arrow cannot hold in one type (names the column).
    """
    columns: list[Sequence[Any]] = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in names]
    arrays = []
    for name, values in zip(names, columns, strict=True):
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise TypeError(
                f"column {name!r} holds values of mixed types ({error}); cast it in the query"
            ) from error
    return pa.Table.from_arrays(arrays, names=list(names))


def _module_of(connection: Any) -> Any:
    return sys.modules.get(type(connection).__module__.split(".")[0])


class _DBAPICursor:
    def __init__(self, backend: DBAPIBackend, connection: Any, shared: bool) -> None:
        self._backend = backend
        self._connection: Any = connection
        self._shared = shared
        self._running = False

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        backend = self._backend
        text, bound = bind_parameters(sql, params, backend.dialect, backend.paramstyle)
        probe = None if params else _schema_sample(sql, backend.dialect)

        table = self._execute(text, bound)
        if probe is not None and table.num_rows == 0 and any(pa.types.is_null(t) for t in table.schema.types):
            return self._execute(probe, ()).schema.empty_table()
        return table

    def batches(self, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
        """``sql``'s rows ``rows`` at a time (``fetchmany``), read as the iterator advances; on a
        shared connection, whose lock a paused reader would hold, all at once."""
        if self._shared:
            yield self.fetch(sql, params)
            return
        text, bound = bind_parameters(sql, params, self._backend.dialect, self._backend.paramstyle)
        with self._executed(text, bound) as cursor:
            names = [d[0] for d in cursor.description or ()]
            while chunk := cursor.fetchmany(rows):
                yield rows_to_arrow(names, chunk)

    def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> pa.Table:
        with self._executed(sql, params) as cursor:
            names = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchall()
        return rows_to_arrow(names, rows)

    @contextlib.contextmanager
    def _executed(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> Iterator[Any]:
        """A driver cursor that ran ``sql``, under the shared connection's lock; afterwards the
        cursor is closed and the implicit transaction ended."""
        lock = self._backend.lock if self._shared else contextlib.nullcontext()
        with lock:
            if self._connection is None:
                self._connection = self._backend.open()
            self._running = True
            try:
                cursor = self._connection.cursor()
                try:
                    if not self._shared and self._backend.read_only_sql is not None:
                        cursor.execute(self._backend.read_only_sql)
                        self._connection.commit()  # a driver that opened a transaction for it keeps it
                    if params:
                        cursor.execute(sql, params)
                    else:
                        cursor.execute(sql)
                    yield cursor
                finally:
                    cursor.close()
            except Exception as error:
                if "same thread" in str(error):
                    add_note(error, _THREAD_BOUND_HINT)
                raise
            finally:
                self._running = False
                self._end_transaction()

    def _end_transaction(self) -> None:
        # Drivers that open a transaction implicitly would otherwise keep one open between
        # reads (or stay aborted after an error). A shared connection is the caller's: its
        # transaction is left alone.
        if not self._shared and self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.rollback()

    def interrupt(self) -> None:
        connection = self._connection
        if connection is None or not self._running:
            return
        # sqlite3 has interrupt(), psycopg cancel(); both may be called from another thread.
        for name in ("interrupt", "cancel"):
            method = getattr(connection, name, None)
            if callable(method):
                with contextlib.suppress(Exception):
                    method()
                return

    def close(self) -> None:
        if self._shared:
            return
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()


class DBAPIBackend:
    """A DB-API 2.0 connection or connection factory. Thread-safe.

    Args:
        source: a DB-API connection (shared, queries serialised) or a callable returning a new
            connection (one per cursor, so fetches run in parallel).
        dialect: sqlglot dialect of the engine; default: guessed from the driver module.
        paramstyle: the driver's placeholder style; default: the driver module's ``paramstyle``.

    Raises:
        TypeError: the dialect or paramstyle cannot be told from the driver; pass them.
    """

    def __init__(
        self,
        source: Any,
        *,
        dialect: str | None = None,
        paramstyle: str | None = None,
    ) -> None:
        self._factory: Callable[[], Any] | None
        if callable(source) and not hasattr(source, "cursor"):
            self._factory = source
            self._shared_connection = None
            sample = source()
            self._spare: Any = sample
        else:
            self._factory = None
            self._shared_connection = source
            self._spare = None
            sample = source
        module = _module_of(sample)
        name = module.__name__ if module is not None else type(sample).__module__
        self.dialect = dialect or _DIALECTS.get(name, "")
        self.paramstyle = paramstyle or str(getattr(module, "paramstyle", ""))
        #: verify=True: PostgreSQL's row hash through its drivers (see ddbloader._sql.fingerprint)
        self.row_hash_dialect = (
            "postgres" if name in _POSTGRES_DRIVERS and self.dialect == "postgres" else None
        )
        if not self.dialect or self.paramstyle not in PARAMSTYLES:
            self.close()
            raise TypeError(
                f"cannot tell the SQL dialect and paramstyle of {name} connections: "
                f"use DBAPIBackend(source, dialect=..., paramstyle=...)"
            )
        self.engine = f"{name} (DB-API{', shared connection' if self._factory is None else ''})"
        self.read_only_sql = read_only_statement(self.dialect)
        self.lock = threading.Lock()
        self._error_module = module
        self._driver = name

    def open(self) -> Any:
        """A new connection from the factory (the one made to detect the driver comes first)."""
        if self._factory is None:
            raise RuntimeError("a shared DB-API connection cannot be reopened")
        with self.lock:
            spare, self._spare = self._spare, None
        return spare if spare is not None else self._factory()

    def is_transient(self, error: BaseException) -> bool:
        """Network-level failures: an OS-level error, or a server driver's OperationalError.

        A shared connection cannot be reopened, so nothing is transient on it. An embedded
        engine (sqlite3) has no network, and raises OperationalError for missing tables and
        syntax errors too, so nothing it raises is retried.
        """
        if self._factory is None:
            return False
        if isinstance(error, OSError):
            return True
        if self._driver in _EMBEDDED:
            return False
        operational = getattr(self._error_module, "OperationalError", None)
        return isinstance(operational, type) and isinstance(error, operational)

    def cursor(self) -> _DBAPICursor:
        if self._factory is None:
            return _DBAPICursor(self, self._shared_connection, shared=True)
        return _DBAPICursor(self, self.open(), shared=False)

    def close(self) -> None:
        """Close the spare connection; a shared connection belongs to the caller and stays open."""
        spare, self._spare = self._spare, None
        if spare is not None:
            with contextlib.suppress(Exception):
                spare.close()
