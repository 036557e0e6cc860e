"""ADBC engines: PostgreSQL (Arrow straight from COPY binary), and any other ADBC driver.

Connections are one per cursor, so one per fetch thread, never shared between threads:

- a ``postgresql://`` URI: each cursor connects with adbc-driver-postgresql;
- an ADBC DB-API connection the user made: each cursor opens a sibling connection on the same
  ADBC database handle (``adbc_clone``: for PostgreSQL a new libpq session, given every GUC the
  user's session changed, search_path, TimeZone and role included, checked to have taken); the
  user's own connection is only read from at construction (its changed settings; temporary
  relations, which no other session sees, are refused by name), never used to fetch, nor closed;
- a factory returning ADBC connections: called once per cursor.

Every connection the backend opens runs in autocommit mode, and every query runs right after
the session was switched to read-only where the engine has a switch
(:func:`~ddbloader._core.engine.read_only_statement`: PostgreSQL, SQLite), so a SELECT that calls
a side-effecting function is refused by the engine. On PostgreSQL every cursor reads one
snapshot, held from construction to :meth:`ADBCBackend.close` or replaced by
:meth:`ADBCBackend.fresh_snapshot` (see :mod:`ddbloader.backends.postgres`), in a read-only
transaction of its own.
Parameters are bound by the driver: ``$n`` as rendered for PostgreSQL and DuckDB, rewritten to
``?`` for the other drivers. PostgreSQL ``numeric`` (which the driver returns as text) arrives as
float64, the type the loader converts decimals to anyway.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .._core.engine import describe_uri, read_only_statement, redact_uri
from .dbapi import bind_parameters
from .postgres import (
    SnapshotHolder,
    begin_snapshot,
    check_postgres_values,
    checked_snapshot,
    floats_for_numeric,
    lost_snapshot,
    postgres_connect,
    postgres_session,
    replicate,
)

__all__ = ["POSTGRES_SCHEMES", "ADBCBackend", "is_adbc_connection"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")

_LOG = logging.getLogger("ddbloader")

#: ADBC ``vendor_name`` → sqlglot dialect.
_DIALECTS = {
    "postgresql": "postgres",
    "duckdb": "duckdb",
    "sqlite": "sqlite",
    "snowflake": "snowflake",
    "bigquery": "bigquery",
    "google bigquery": "bigquery",
    "microsoft sql server": "tsql",
    "mysql": "mysql",
    "spark": "spark",
    "spark sql": "spark",
    "trino": "trino",
    "clickhouse": "clickhouse",
    "redshift": "redshift",
}

#: Dialects whose drivers take ``$n`` as sqlglot renders it; the others get ``?``.
_NUMBERED = frozenset({"postgres", "duckdb"})

#: ADBC vendors whose engine computes the row hash of verify=True, and its dialect.
_HASHED_VENDORS = {"postgresql": "postgres", "duckdb": "duckdb", "clickhouse": "clickhouse"}


def is_adbc_connection(source: Any) -> bool:
    """True for an ``adbc_driver_manager.dbapi.Connection`` (without importing ADBC needlessly)."""
    if not type(source).__module__.startswith("adbc_driver_"):
        return False
    from adbc_driver_manager import dbapi

    return isinstance(source, dbapi.Connection)


def _autocommit(connection: Any) -> Any:
    import adbc_driver_manager

    # Drivers without transactions are always in autocommit and may refuse the option.
    with contextlib.suppress(adbc_driver_manager.Error):
        connection.adbc_connection.set_autocommit(True)
    return connection


def _typed_parameters(cursor: Any, sql: str, params: Sequence[Any]) -> pa.RecordBatch:
    """``params``, one of them a list (a fetch unit's key values), as one Arrow row typed as the
    engine infers its parameters when it prepares ``sql``.

    The types matter: PostgreSQL compares ``int4_column = ANY(int8[])`` element by element,
    about ten times slower than the same types (a hashed lookup). A value that does not convert
    to the inferred type keeps the type Arrow infers, and the engine reports the mismatch.
    """
    import adbc_driver_manager

    try:
        schema = cursor.adbc_prepare(sql)
    except adbc_driver_manager.Error:
        schema = None  # the driver does not describe parameters; execute reports a bad query
    columns = []
    for number, value in enumerate(params):
        inferred = schema.field(number).type if schema is not None and number < len(schema) else None
        try:
            columns.append(pa.array([value], type=inferred))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            columns.append(pa.array([value]))
    return pa.record_batch(columns, names=[f"p{n}" for n in range(len(params))])


class _ADBCCursor:
    def __init__(self, backend: ADBCBackend) -> None:
        self._backend = backend
        self._connection: Any = None
        self._cursor: Any = None
        self._lock = threading.Lock()

    def _connect(self) -> None:
        connection = self._backend.open()
        with self._lock:
            self._connection = connection
            self._cursor = connection.cursor()

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        self._execute(sql, params)
        table = self._cursor.fetch_arrow_table()
        self._end_snapshot()
        return floats_for_numeric(table)

    def batches(self, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
        """``sql``'s rows through the driver's Arrow record batch reader, read as the iterator
        advances (the driver sizes the batches; ``rows`` is not passed on)."""
        self._execute(sql, params)
        reader = self._cursor.fetch_record_batch()
        try:
            with contextlib.closing(reader):
                for batch in reader:
                    yield floats_for_numeric(pa.Table.from_batches([batch]))
        finally:
            self._end_snapshot()

    def _execute(self, sql: str, params: Sequence[Any]) -> None:
        backend = self._backend
        if backend.dialect == "postgres":
            check_postgres_values(params)
        bound: Sequence[Any] | dict[str, Any]
        lists = any(isinstance(p, list) for p in params)
        if lists or backend.dialect in _NUMBERED or not params:
            text, bound = sql, list(params)
        else:
            text, bound = bind_parameters(sql, params, backend.dialect, "qmark")

        if self._cursor is None:
            self._connect()
        if lists:
            if backend.snapshot is not None:
                self._cursor.execute("ROLLBACK")  # a failed prepare must not abort the query's transaction
            bound = _typed_parameters(self._cursor, text, params)
        if backend.snapshot is not None:
            self._begin(backend.snapshot)
        if backend.read_only_sql is not None:
            self._cursor.execute(backend.read_only_sql)
        self._cursor.execute(text, bound or None)

    def _begin(self, snapshot: str) -> None:
        """Open the query's transaction on ``snapshot``, or on a new one if the server no longer
        has it (see :meth:`ADBCBackend.renew_snapshot`)."""
        try:
            begin_snapshot(self._cursor, snapshot)
        except Exception as error:
            if not lost_snapshot(error):
                raise
            begin_snapshot(self._cursor, self._backend.renew_snapshot(snapshot))

    def _end_snapshot(self) -> None:
        """End the query's snapshot transaction, releasing its locks (a lock held until the next
        query would block another session's ALTER or DROP of the tables read)."""
        if self._backend.snapshot is not None and self._cursor is not None:
            self._cursor.execute("ROLLBACK")

    def interrupt(self) -> None:
        if not self._backend.cancels:
            return
        with self._lock:
            if self._cursor is not None:
                # Cancelling an idle statement is a no-op; a closed one has nothing to stop.
                with contextlib.suppress(Exception):
                    self._cursor.adbc_cancel()

    def _disconnect(self) -> None:
        with self._lock:
            cursor, connection = self._cursor, self._connection
            self._cursor = self._connection = None
        for handle in (cursor, connection):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()

    def close(self) -> None:
        self._disconnect()


class ADBCBackend:
    """An ADBC engine through one connection per cursor. Thread-safe.

    Args:
        source: a ``postgresql://`` URI, an ADBC DB-API connection, or a callable returning one.
        dialect: sqlglot dialect; default: from the driver's ``vendor_name``.
        snapshot: on PostgreSQL, read one snapshot from construction to :meth:`close` (see
            :mod:`ddbloader.backends.postgres`); False: each query reads what is committed when
            it runs (then ``verify=True`` is the check that rows did not change).

    Raises:
        ImportError: the URI's driver is not installed.
        TypeError: the dialect cannot be told from the driver; pass ``dialect=``.
    """

    def __init__(self, source: Any, *, dialect: str | None = None, snapshot: bool = True) -> None:
        self._spare: Any = None
        if isinstance(source, str):
            if not source.startswith(POSTGRES_SCHEMES):
                raise ValueError(f"ADBCBackend takes postgresql:// URIs, got {redact_uri(source)!r}")
            self._open: Callable[[], Any] = postgres_connect(source)
            self.engine = describe_uri(source)
        elif is_adbc_connection(source):
            self._open = source.adbc_clone
            self.engine = "adbc (connection)"
        elif callable(source):
            self._open = source
            self.engine = "adbc (factory)"
        else:
            raise TypeError(f"ADBCBackend needs a URI, an ADBC connection or a factory, got {type(source)!r}")
        self._lock = threading.Lock()
        self._session: tuple[tuple[str, str], ...] = ()
        self._holder: SnapshotHolder | None = None
        #: The PostgreSQL snapshot every cursor reads (its id); None on other engines.
        self.snapshot: str | None = None
        #: That snapshot's ``xmin:xmax:xip`` (see :class:`SnapshotHolder`); None where unknown:
        #: on other engines, or in a worker that reads its parent's snapshot.
        self.visibility: str | None = None
        self._spare = _autocommit(self._open())
        try:
            vendor = str(self._spare.adbc_get_info().get("vendor_name", ""))
        except BaseException:  # an unreachable server: the connection object still holds a handle
            self.close()
            raise
        found = dialect or _DIALECTS.get(vendor.lower())
        if found is None:
            self.close()
            raise TypeError(f"cannot tell the SQL dialect of ADBC vendor {vendor!r}: pass dialect=")
        self.dialect: str = found
        # chDB cancels a streamed read, but a cancel from another thread racing the reading
        # thread's close of that result can hang the close and stop chDB's embedded server
        # ("The server is shutting down due to a fatal error"): there, close() lets a running
        # query reach its next batch instead.
        self.cancels: bool = found != "clickhouse"
        if found == "postgres" and is_adbc_connection(source):
            # A clone is a fresh libpq session: the user's SET search_path / TimeZone / ROLE are
            # not in it, so the loader would read other tables or other days than the user's query.
            try:
                self._session = postgres_session(source)
                self._spare = replicate(self._spare, self._session)
            except BaseException:
                self.close()
                raise
        #: PostgreSQL binds a fetch unit's key values as one array parameter (``key = ANY($1)``).
        self.binds_lists = found == "postgres"
        hashed = _HASHED_VENDORS.get(vendor.lower())
        #: verify=True: the vendor's own row hash (see ddbloader._sql.fingerprint), where it has one
        self.row_hash_dialect = hashed if hashed == found else None
        if self.engine.startswith("adbc"):
            self.engine = f"{vendor or 'adbc'} {self.engine.removeprefix('adbc ')}"
        self.read_only_sql = read_only_statement(found)
        if found == "postgres" and snapshot:
            try:
                self._hold()
            except BaseException:
                self.close()
                raise

    def open(self) -> Any:
        """A new autocommit connection (the one made to read the vendor is handed out first)."""
        with self._lock:
            spare, self._spare = self._spare, None
        return spare if spare is not None else replicate(_autocommit(self._open()), self._session)

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """A lost or refused connection (ADBC status IO, SQLSTATE 08xxx / 57P0x); not a bad login."""
        import adbc_driver_manager

        if isinstance(error, OSError):
            return True
        if not isinstance(error, adbc_driver_manager.OperationalError):
            return False
        sqlstate = str(getattr(error, "sqlstate", None) or "")
        if sqlstate.startswith(("08", "57P0")):
            return True
        io = getattr(adbc_driver_manager.AdbcStatusCode, "IO", None)
        return getattr(error, "status_code", None) == io and "authentication" not in str(error)

    def cursor(self) -> _ADBCCursor:
        return _ADBCCursor(self)

    def follow(self, snapshot: str | None, hold: bool = True) -> None:
        """Read ``snapshot`` instead of this backend's own, which is released. No-op for None.

        ``hold``: import it into a holder of this backend's (see :class:`SnapshotHolder`), so it
        stays readable after the session that exported it ends (a DDP rank reading rank 0's).
        Otherwise only read it: a DataLoader worker reads its parent's, which the parent holds.

        Raises:
            ValueError: ``snapshot`` is not a PostgreSQL snapshot id, or this backend reads none.
            adbc_driver_manager.Error: ``hold`` and ``snapshot`` can no longer be imported.
        """
        if snapshot is None:
            return
        if self.snapshot is None:
            raise ValueError(f"a {self.engine} backend reads no PostgreSQL snapshot")
        if hold:
            self._hold(checked_snapshot(snapshot))
            return
        checked_snapshot(snapshot)
        with self._lock:
            holder, self._holder = self._holder, None
            self.snapshot, self.visibility = snapshot, None
        if holder is not None:
            holder.close()

    def fresh_snapshot(self) -> str:
        """Take a new snapshot that every cursor reads from now on (``replan="epoch"``), and return
        its id; the previous one is released (queries reading it keep it until they end).

        Raises:
            ValueError: this backend reads no PostgreSQL snapshot.
        """
        if self.snapshot is None:
            raise ValueError(f"a {self.engine} backend reads no PostgreSQL snapshot")
        return self._hold()

    def renew_snapshot(self, lost: str) -> str:
        """A new snapshot for every cursor, when ``lost`` can no longer be imported (the server
        restarted, or ended the holding session): the rest of the loader's life reads that one,
        and the planned counts (and ``verify=True``) check that rows did not change. Logs a
        WARNING. Thread-safe: the cursors that lost the same snapshot share one new one.
        """
        with self._lock:
            if self.snapshot != lost:
                assert self.snapshot is not None
                return self.snapshot
            holder, self._holder = (
                self._holder,
                SnapshotHolder(replicate(_autocommit(self._open()), self._session)),
            )
            self.snapshot, self.visibility = self._holder.id, self._holder.visibility
        if holder is not None:
            holder.close()
        _LOG.warning(
            "PostgreSQL snapshot %s is gone (the server restarted or ended the session holding it); the "
            "loader reads snapshot %s from now on, and the planned row counts check that nothing changed",
            lost,
            self.snapshot,
        )
        return self.snapshot

    def _hold(self, imported: str | None = None) -> str:
        """Hold a new snapshot (``imported``'s, or one of its own) that every cursor reads from
        now on, release the one held before, and return the new one's id."""
        holder = SnapshotHolder(replicate(_autocommit(self._open()), self._session), imported)
        with self._lock:
            retired, self._holder = self._holder, holder
            self.snapshot, self.visibility = holder.id, holder.visibility
        if retired is not None:
            retired.close()
        return holder.id

    def close(self) -> None:
        """Close the spare connection and release the snapshot; a connection the user passed in
        stays open."""
        with self._lock:
            spare, self._spare = self._spare, None
            holder, self._holder = self._holder, None
        if holder is not None:
            holder.close()
        if spare is not None:
            with contextlib.suppress(Exception):
                spare.close()
