"""Embedded DuckDB: the default engine.

A path is opened read-only so that several processes (ranks, workers) can share one file. A
connection the user passes in is used only through its own cursors; note that DuckDB cursors do
not see the parent connection's TEMP tables or ``register()``-ed objects.

A cursor shares its connection's global settings but not its session settings (``TimeZone``,
``search_path``, the current schema, ...), and those change results: ``CAST(ts AS DATE)`` of a
``TIMESTAMPTZ`` depends on ``TimeZone``. So the session settings in which a passed connection
differs from a fresh cursor, read when the backend is built, are set on every cursor the loader
opens; one that a cursor refuses is an error naming it.

A database the backend opens itself (a path, or ``None``) gets a capped buffer pool
(:data:`DEFAULT_MEMORY_LIMIT`, DuckDB's ``memory_limit``), so the whole process stays flat as the
table grows: DuckDB's own default is 80 % of the machine's memory, which it fills with cached
table blocks. The cap belongs to DuckDB's database instance, which DuckDB shares between the
connections to one file in a process. ``DuckDBBackend(path, memory_limit=None)`` passed as
``source`` keeps DuckDB's default; a connection the user passes in keeps its own settings.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from .._core.errors import add_note

__all__ = ["DEFAULT_MEMORY_LIMIT", "DuckDBBackend"]

#: DuckDB ``memory_limit`` of a database the backend opens itself (see the module docstring).
DEFAULT_MEMORY_LIMIT = "256MB"

_CURSOR_HINT = (
    "ddbloader reads through cursor(), which does not see TEMP tables or objects "
    "registered with con.register() on your connection: create a regular TABLE or VIEW instead"
)


#: Session settings that change what is displayed, profiled or buffered, never a query's result:
#: not copied (a notebook's progress bar would otherwise be drawn by the fetch threads, and DuckDB
#: shows sizes rounded, so a buffer size would not carry over exactly).
_NOT_COPIED = frozenset(
    {
        "enable_progress_bar",
        "enable_progress_bar_print",
        "progress_bar_time",
        "enable_profiling",
        "profile_output",
        "profiling_output",
        "profiling_mode",
        "profiling_coverage",
        "profiling_renderer_settings",
        "tracked_metrics",
        "operator_memory_limit",
        "max_streaming_buffer_size",
        "streaming_buffer_size",
    }
)

_SETTINGS_SQL = "SELECT name, value FROM duckdb_settings()"


_VARIABLES_SQL = "SELECT name, value, type FROM duckdb_variables() ORDER BY name"

#: Serialises the loader's own queries on connections the user passes in: a DuckDB connection
#: runs one query at a time, and loaders may be built on one connection from several threads.
_PASSED_CONNECTION = threading.Lock()


def _settings(connection: duckdb.DuckDBPyConnection) -> dict[str, str | None]:
    return dict(connection.sql(_SETTINGS_SQL).fetchall())


def _variables(connection: duckdb.DuckDBPyConnection) -> tuple[tuple[str, str, str], ...]:
    """``SET VARIABLE`` values as (name, value as text, type), which cursors do not inherit."""
    return tuple(connection.sql(_VARIABLES_SQL).fetchall())


def _session_variables(connection: duckdb.DuckDBPyConnection) -> tuple[tuple[str, str, str], ...]:
    """``connection``'s variables, checked to carry over to a cursor exactly (value and type).

    Raises:
        ValueError: a variable that a cursor does not take as it is; names it.
    """
    with _PASSED_CONNECTION:
        variables = _variables(connection)
        cursor = connection.cursor()
    try:
        _set_variables(cursor, variables)
        taken = _variables(cursor)
    finally:
        cursor.close()
    for variable in set(variables) - set(taken):
        raise ValueError(
            f"the DuckDB connection's variable {variable[0]} = {variable[1]!r} ({variable[2]}) does not "
            f"carry over to the loader's cursors exactly, so getvariable() would differ in the "
            f"subqueries; reset it, or pass a database path"
        )
    return variables


def _set_variables(cursor: duckdb.DuckDBPyConnection, variables: tuple[tuple[str, str, str], ...]) -> None:
    for name, value, type_name in variables:
        try:
            kind = exp.DataType.build(type_name, dialect="duckdb")
        except Exception as error:  # sqlglot raises several types for a type it cannot read
            raise ValueError(
                f"the DuckDB connection's variable {name} is of type {type_name}, which ddbloader "
                f"cannot carry over to its cursors; reset it, or pass a database path"
            ) from error
        statement = f"SET VARIABLE {exp.to_identifier(name, quoted=True).sql('duckdb')} = " + (
            "NULL" if value is None else f"CAST(CAST($1 AS VARCHAR) AS {kind.sql('duckdb')})"
        )
        cursor.execute(statement, [] if value is None else [value])


def _session_settings(connection: duckdb.DuckDBPyConnection) -> tuple[tuple[str, str], ...]:
    """The settings in which ``connection`` differs from a fresh cursor of it, checked settable.

    Raises:
        ValueError: a cursor refuses one of them, or does not take its value; names the setting.
    """
    with _PASSED_CONNECTION:
        mine = _settings(connection)
        cursor = connection.cursor()
    try:
        fresh = _settings(cursor)
        differing = tuple(
            (name, value)
            for name, value in mine.items()
            if value is not None and fresh.get(name) != value and name not in _NOT_COPIED
        )
        if differing:
            _apply(cursor, differing)
            taken = _settings(cursor)
            for name, value in differing:
                if taken.get(name) != value:
                    raise ValueError(
                        f"the DuckDB connection's session setting {name} = {value!r} does not carry over to "
                        f"the loader's cursors (they get {taken.get(name)!r}), so subqueries might select "
                        f"other rows than your connection would; reset it, or pass a database path"
                    )
    finally:
        cursor.close()
    return differing


def _apply(cursor: duckdb.DuckDBPyConnection, settings: tuple[tuple[str, str], ...]) -> None:
    for name, value in settings:
        statement = exp.Set(
            expressions=[
                exp.SetItem(
                    this=exp.EQ(this=exp.to_identifier(name, quoted=True), expression=exp.Placeholder())
                )
            ]
        )
        try:
            cursor.execute(statement.sql("duckdb"), [value])
        except duckdb.Error as error:
            raise ValueError(
                f"the DuckDB connection's session setting {name} = {value!r} cannot be set on the loader's "
                f"cursors ({error}), so subqueries might select other rows than your connection would; "
                f"reset it, or pass a database path"
            ) from error


#: DuckDB's wording for a table or view the catalog does not have (not a missing function, type, ...).
_MISSING_RELATION = re.compile(r"\b(Table|View) with name .* does not exist")


@contextlib.contextmanager
def _hinted() -> Iterator[None]:
    """Add :data:`_CURSOR_HINT` to DuckDB's error for a table its cursor does not see."""
    try:
        yield
    except duckdb.CatalogException as exc:
        if _MISSING_RELATION.search(str(exc)):
            add_note(exc, _CURSOR_HINT)
        raise


class _DuckDBCursor:
    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        with _hinted():
            return self._connection.sql(sql, params=list(params)).to_arrow_table()

    def batches(self, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
        """``sql``'s rows through DuckDB's Arrow record batch reader, about ``rows`` per table,
        read from the engine as the iterator advances."""
        with _hinted():
            relation = self._connection.sql(sql, params=list(params))
            # to_arrow_reader since DuckDB 1.5; record_batch before it (removed in 1.5)
            to_reader: Callable[[int], pa.RecordBatchReader] = getattr(
                relation, "to_arrow_reader", None
            ) or getattr(relation, "record_batch")  # noqa: B009 -- absent from DuckDB 2's stubs
            reader = to_reader(rows)
        with contextlib.closing(reader):
            for batch in reader:
                yield pa.Table.from_batches([batch])

    def interrupt(self) -> None:
        with contextlib.suppress(duckdb.ConnectionException):  # closed already: nothing runs
            self._connection.interrupt()

    def close(self) -> None:
        self._connection.close()


def _cap_memory(connection: duckdb.DuckDBPyConnection, limit: str | None) -> duckdb.DuckDBPyConnection:
    """Set DuckDB's ``memory_limit`` on ``connection``'s database instance.

    Set after connecting rather than as a connect option: DuckDB shares one instance per file
    within a process and refuses a second connection whose options differ, so a user opening
    the same file later (``duckdb.connect(path)``) still can; that connection shares the cap.
    """
    if limit is not None:
        value = exp.Literal.string(limit)
        setting = exp.SetItem(this=exp.EQ(this=exp.column("memory_limit"), expression=value))
        connection.execute(exp.Set(expressions=[setting]).sql(dialect="duckdb"))
    return connection


class DuckDBBackend:
    """DuckDB through per-thread cursors of one database instance. Thread-safe."""

    dialect = "duckdb"
    engine = "duckdb"
    #: Fetch units bind each key's values as one list parameter (``key = ANY($1)``).
    binds_lists = True
    #: verify=True hashes rows with DuckDB's own ``hash`` (see ddbloader._sql.fingerprint).
    row_hash_dialect = "duckdb"

    def __init__(
        self,
        source: duckdb.DuckDBPyConnection | str | os.PathLike[str] | None,
        *,
        owned: bool = False,
        memory_limit: str | None = DEFAULT_MEMORY_LIMIT,
    ) -> None:
        """``owned``: close a passed-in connection with the backend (it was made for the loader).
        ``memory_limit``: DuckDB's buffer pool cap (``"1GB"``) for a database opened here, or None
        for DuckDB's default; a connection passed in keeps its own.

        Raises:
            ValueError: a session setting of a passed connection cannot be set on its cursors.
        """
        self._session: tuple[tuple[str, str], ...] = ()
        self._variables: tuple[tuple[str, str, str], ...] = ()
        if source is None:
            self._connection = _cap_memory(duckdb.connect(":memory:"), memory_limit)
            self._owned = True
            self.engine = "duckdb (in-memory)"
        elif isinstance(source, duckdb.DuckDBPyConnection):
            self._connection = source
            self._owned = owned
            self._session = _session_settings(source)
            self._variables = _session_variables(source)
        else:
            path = Path(source)
            if not path.exists():
                raise FileNotFoundError(f"DuckDB database file {str(path)!r} does not exist")
            try:
                self._connection = _cap_memory(duckdb.connect(str(path), read_only=True), memory_limit)
            except duckdb.ConnectionException as exc:
                if "different configuration" not in str(exc):
                    raise
                raise duckdb.ConnectionException(
                    f"{exc}. This process already holds a read-write connection to {str(path)!r}, so "
                    f"ddbloader cannot open it again read-only: pass that connection as source instead "
                    f"of the path (or close it first)"
                ) from exc
            except duckdb.IOException as exc:
                if "lock" not in str(exc):
                    raise
                raise duckdb.IOException(
                    f"{exc}\nAnother process holds {str(path)!r} open read-write (the process and PID "
                    f"above), and DuckDB lets a file have one writer or any number of readers, never "
                    f"both. Close that connection (or open it with read_only=True there too), or let the "
                    f"loader read a copy of the file."
                ) from exc
            self._owned = True
            self.engine = f"duckdb ({path.name}, read-only)"

    @staticmethod
    def accepts(source: Any) -> bool:
        """True for what this backend opens: ``None``, a DuckDB connection or a path."""
        return source is None or isinstance(source, (duckdb.DuckDBPyConnection, str, os.PathLike))

    def cursor(self) -> _DuckDBCursor:
        """A cursor of the database with the passed connection's settings and variables."""
        with _PASSED_CONNECTION:
            cursor = self._connection.cursor()
        if self._session:
            _apply(cursor, self._session)
        if self._variables:
            _set_variables(cursor, self._variables)
        return _DuckDBCursor(cursor)

    def syntax_error(self, sql: str) -> str | None:
        """DuckDB's own message for a syntax error in ``sql``, or None when its parser accepts it.

        Parses only (``extract_statements``): nothing of ``sql`` runs.
        """
        with _PASSED_CONNECTION:
            cursor = self._connection.cursor()
        try:
            cursor.extract_statements(sql)
        except duckdb.ParserException as error:
            return str(error)
        finally:
            cursor.close()
        return None

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """Never: an embedded engine has no network, and its connection cannot be reopened here."""
        return False

    def close(self) -> None:
        if self._owned:
            self._connection.close()
