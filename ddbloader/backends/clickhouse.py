"""ClickHouse in-process (chDB), through the ADBC driver chDB ships.

A ``chdb://<path>`` URI (``chdb://`` alone: an in-memory database) gives every cursor its own
ADBC connection to that database (``adbc_driver_chdb.dbapi.connect``); an ADBC connection to
chDB that the user made is cloned per cursor, as every ADBC connection is
(:class:`~ddbloader.backends.adbc.ADBCBackend`). Either way the connections are the loader's,
so every query runs right after ``SET readonly = 2``: the engine refuses writes, and neither
a later ``SET`` nor a query's ``SETTINGS readonly = 0`` lifts it (2, not 1, so the query's own
``SETTINGS`` clause still works).

chDB holds one database per process: every ``chdb://`` URI (and connection) of a process must
name the same path, or chDB refuses the connection. chDB stops its embedded server when the
process's last connection to it closes and starts it again at the next (about 25 ms here, and
each restart leaves threads and file descriptors behind): a backend made from a URI holds one
connection of its own from construction to :meth:`ClickHouseBackend.close`, so the server stays
up between the cursors of a loader.

chDB serves one process: a process forked from one that opened chDB inherits its state but none
of its threads, and would hang at its first query (a DataLoader worker under ``fork``), so a
backend refuses to open chDB there; a spawned process finds the database locked by the first.
The loader fetches in threads: keep ``num_workers=0`` with chDB.

The SQL is ClickHouse's (sqlglot's ``clickhouse`` dialect); parameters are bound by the driver
(``?``), one per key value in a fetch unit. Rows come through the driver's Arrow record batch
reader. ``interrupt()`` does nothing on chDB (4.4): a cancel from another thread that races
the close of a streamed result can hang that close and stop chDB's embedded server, so the
loader's ``close()`` lets a running query finish, and a streamed read stops at its next piece.

``verify=True`` hashes each row as ``cityHash64(tuple(*))`` (the ADBC vendor ``ClickHouse``
says so, see :mod:`ddbloader._sql.fingerprint`): a tuple hashes its NULL elements by position,
where ``cityHash64(a, b)`` is NULL as soon as one of them is.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

from .._core.engine import redact_uri
from .._core.errors import add_note
from .adbc import ADBCBackend

__all__ = ["CHDB_SCHEME", "ClickHouseBackend"]

CHDB_SCHEME = "chdb://"

_INSTALL_HINT = "ClickHouse (chDB) needs the chdb package: pip install 'ddbloader[clickhouse]'"

_ONE_PROCESS = "chDB serves one process; keep DataLoader's num_workers=0 (the loader fetches in threads)"

#: The processes in which a backend here opened chDB (a forked child inherits the set).
_OPENED_IN: set[int] = set()


def _chdb_connect(uri: str) -> Callable[[], Any]:
    try:
        from adbc_driver_chdb import dbapi
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return functools.partial(dbapi.connect, uri)


class ClickHouseBackend(ADBCBackend):
    """chDB through one ADBC connection per cursor. Thread-safe.

    Args:
        source: a ``chdb://<path>`` URI, an ADBC connection to chDB, or a callable returning one.

    Raises:
        ImportError: chdb is not installed.
        ValueError: a URI that is not ``chdb://``.
        RuntimeError: this process was forked from one that opened chDB.
    """

    def __init__(self, source: Any) -> None:
        self._keeper: Any = None
        if isinstance(source, str):
            if not source.startswith(CHDB_SCHEME):
                raise ValueError(f"ClickHouseBackend takes chdb:// URIs, got {redact_uri(source)!r}")
            if _OPENED_IN and os.getpid() not in _OPENED_IN:
                raise RuntimeError(
                    f"this process was forked from one that opened chDB: a forked chDB has none of its "
                    f"threads and would hang at the first query; {_ONE_PROCESS}"
                )
            connect = _chdb_connect(source)
            try:
                self._keeper = connect()
            except Exception as error:
                add_note(error, f"ddbloader: if another process holds this database, {_ONE_PROCESS}")
                raise
            _OPENED_IN.add(os.getpid())
            try:
                super().__init__(connect, dialect="clickhouse")
            except BaseException:
                self._keeper.close()
                raise
            self.engine = f"chdb ({source.removeprefix(CHDB_SCHEME) or 'in-memory'})"
        else:
            super().__init__(source, dialect="clickhouse")

    def close(self) -> None:
        """Close the spare connection, then the one that keeps chDB's server up."""
        super().close()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            with contextlib.suppress(Exception):
                keeper.close()

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """Never: an in-process engine has no connection to lose."""
        return False
