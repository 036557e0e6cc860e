"""PostgreSQL sessions of the ADBC backend: connecting, replicating the user's session, one snapshot.

One snapshot: :class:`SnapshotHolder` keeps one REPEATABLE READ transaction open that exports its
snapshot (``pg_export_snapshot()``); every cursor of the backend reads in a read-only REPEATABLE
READ transaction that imports it (``SET TRANSACTION SNAPSHOT``, see :func:`begin_snapshot`). So
planning's counts and fingerprints and every fetch of every epoch see the same rows, whatever
other sessions commit meanwhile. Writers are never blocked; the cost is that VACUUM keeps the row
versions the snapshot may see until the holder closes (the loader's ``close()``, or with
``replan="epoch"`` when the next snapshot is taken). A DDP rank that reads rank 0's snapshot holds
its own copy of it (a holder that imports it), so it outlives rank 0's loader.
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "SnapshotHolder",
    "begin_snapshot",
    "check_postgres_values",
    "floats_for_numeric",
    "lost_snapshot",
    "postgres_connect",
    "postgres_session",
    "replicate",
]

_INSTALL_HINT = "PostgreSQL needs adbc-driver-postgresql: pip install 'ddbloader[postgres]'"


def postgres_connect(uri: str) -> Callable[[], Any]:
    try:
        from adbc_driver_postgresql import dbapi
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error

    def connect() -> Any:
        return dbapi.connect(uri, autocommit=True)

    return connect


def floats_for_numeric(table: pa.Table) -> pa.Table:
    """PostgreSQL ``numeric`` comes as an opaque text extension type; make it float64."""
    for index, field in enumerate(table.schema):
        kind = field.type
        if isinstance(kind, pa.BaseExtensionType) and getattr(kind, "type_name", None) == "numeric":
            column = table.column(index)
            storage = pa.chunked_array([chunk.storage for chunk in column.chunks], type=kind.storage_type)
            table = table.set_column(
                index,
                pa.field(field.name, pa.float64(), metadata=field.metadata),  # keeps the PostgreSQL type
                pc.cast(storage, pa.float64()),
            )
    return table


#: GUCs a session changed (``SET``), as PostgreSQL lists them for the session that asks.
_SESSION_GUCS_SQL = (
    "SELECT name, current_setting(name) FROM pg_settings WHERE source = 'session' ORDER BY name"
)
#: Session GUCs the loader sets itself (its sessions are read-only) or that describe the client.
_OWN_GUCS = frozenset({"default_transaction_read_only", "transaction_read_only", "application_name"})
_TEMP_RELATIONS_SQL = "SELECT relname FROM pg_class WHERE relnamespace = pg_my_temp_schema() ORDER BY 1"


def _rows(connection: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    cursor = connection.cursor()
    try:
        cursor.execute(sql, list(params) or None)
        return [tuple(row.values()) for row in cursor.fetch_arrow_table().to_pylist()]
    finally:
        cursor.close()


def postgres_session(connection: Any) -> tuple[tuple[str, str], ...]:
    """The GUCs the user's session changed (search_path, TimeZone, role, ...), to replicate.

    Raises:
        ValueError: the session holds temporary tables, which no other session can see (a
            clone would read another relation of the same name, or none); names them.
    """
    temporary = [name for (name,) in _rows(connection, _TEMP_RELATIONS_SQL)]
    if temporary:
        raise ValueError(
            f"the PostgreSQL connection holds temporary relations {temporary[:5]}, which the "
            f"loader's sessions cannot see; make them regular tables, or pass a URI or a factory"
        )
    changed = [(n, v) for n, v in _rows(connection, _SESSION_GUCS_SQL) if n not in _OWN_GUCS]
    # SET ROLE is a GUC that pg_settings does not list; "none" means no SET ROLE.
    ((role,),) = _rows(connection, "SELECT current_setting('role')")
    return (*changed, *([("role", role)] if role != "none" else []))


def replicate(connection: Any, session: tuple[tuple[str, str], ...]) -> Any:
    """Set ``session``'s GUCs on a new connection (bound, never spliced), and check they took.

    Raises:
        ValueError: a GUC the new session does not take as the user's session has it; names it.
    """
    for name, value in session:
        _rows(connection, "SELECT set_config($1, $2, false)", (name, value))
    for name, value in session:
        ((taken,),) = _rows(connection, "SELECT current_setting($1)", (name,))
        if taken != value:
            connection.close()
            raise ValueError(
                f"the PostgreSQL connection's session setting {name} = {value!r} does not carry over "
                f"to the loader's sessions (they get {taken!r}); reset it, or pass a URI"
            )
    return connection


def check_postgres_values(params: Sequence[Any]) -> None:
    for number, param in enumerate(params, start=1):
        for value in param if isinstance(param, list) else [param]:
            if isinstance(value, str) and "\x00" in value:
                raise ValueError(
                    f"parameter ${number} {value!r} contains a NUL character, which PostgreSQL text "
                    f"cannot hold (so no row could equal it); remove it from the scheme"
                )


#: An id as ``pg_export_snapshot()`` returns it (hex words joined by dashes): safe as a literal.
_SNAPSHOT_ID = re.compile(r"[0-9A-F]+(-[0-9A-F]+)+")


class SnapshotHolder:
    """The session whose open REPEATABLE READ transaction keeps snapshot :attr:`id` importable.

    Its transaction takes a snapshot of its own, or imports ``imported`` (another session's
    exported id, which may be closed once this one is made: :attr:`id` stays importable while this
    holder is open). :attr:`visibility` is the snapshot's ``txid_current_snapshot()``
    (``xmin:xmax:xip``): two snapshots of one server with equal visibility see the same rows.
    Owns ``connection`` (closed by :meth:`close`, or here if the snapshot cannot be taken).

    Raises:
        adbc_driver_manager.Error: ``imported`` can no longer be imported (its holder ended).
    """

    def __init__(self, connection: Any, imported: str | None = None) -> None:
        self._connection: Any = connection
        try:
            _rows(connection, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if imported is not None:
                _rows(connection, f"SET TRANSACTION SNAPSHOT '{checked_snapshot(imported)}'")
            ((found, visibility),) = _rows(
                connection, "SELECT pg_export_snapshot(), txid_current_snapshot()::text"
            )
        except BaseException:
            connection.close()
            raise
        self.id = checked_snapshot(str(found))
        self.visibility = str(visibility)
        _HOLDERS.add(self)

    def close(self) -> None:
        """End the transaction; cursors already reading the snapshot keep it, new ones cannot.
        In a process forked after the holder was made, a no-op: the session is the parent's."""
        connection, self._connection = self._connection, None
        if connection is not None:
            # ending the transaction first releases the snapshot when close() returns: a closed
            # connection's server session ends a moment later, when the server gets to it
            with contextlib.suppress(Exception), contextlib.closing(connection.cursor()) as cursor:
                cursor.execute("ROLLBACK")
            with contextlib.suppress(Exception):
                connection.close()


#: Every open holder of this process, so that a forked child can disown them.
_HOLDERS: weakref.WeakSet[SnapshotHolder] = weakref.WeakSet()
#: The connections of holders a forked child inherited. Closing one (``close()``, or its garbage
#: collection) would end the parent's session, and with it the snapshot the child reads: the
#: child keeps them referenced and never closes them.
_INHERITED: list[Any] = []


def _disown_after_fork() -> None:
    for holder in list(_HOLDERS):
        _INHERITED.append(holder._connection)
        holder._connection = None


os.register_at_fork(after_in_child=_disown_after_fork)


def checked_snapshot(snapshot: str) -> str:
    """``snapshot`` if it is a PostgreSQL snapshot id (so it may be written as a literal).

    Raises:
        ValueError: it is not one.
    """
    if not _SNAPSHOT_ID.fullmatch(snapshot):
        raise ValueError(f"{snapshot!r} is not a PostgreSQL snapshot id")
    return snapshot


def begin_snapshot(cursor: Any, snapshot: str) -> None:
    """End ``cursor``'s open transaction, if any (one a failed query aborted), and open a read-only
    one that reads ``snapshot``. One transaction per query: the caller ends it after reading, so
    no lock on a table outlives the query that took it.

    Raises:
        adbc_driver_manager.Error: the snapshot can no longer be imported (see :func:`lost_snapshot`).
    """
    cursor.execute("ROLLBACK")  # outside a transaction only a warning, which the driver drops
    cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    cursor.execute(f"SET TRANSACTION SNAPSHOT '{checked_snapshot(snapshot)}'")


def lost_snapshot(error: BaseException) -> bool:
    """Whether ``error`` says a snapshot id is unknown to the server (its holder's session ended)."""
    return "invalid snapshot identifier" in str(error)
