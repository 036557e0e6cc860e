"""Embedded DuckDB: the default engine.

A path is opened read-only so that several processes (ranks, workers) can share one file. A
connection the user passes in is used only through its own cursors; note that DuckDB cursors do
not see the parent connection's TEMP tables or ``register()``-ed objects.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ..errors import add_note

__all__ = ["DuckDBBackend"]

_CURSOR_HINT = (
    "ddbloader reads through cursor(), which does not see TEMP tables or objects "
    "registered with con.register() on your connection: create a regular TABLE or VIEW instead"
)


class _DuckDBCursor:
    def __init__(self, connection: duckdb.DuckDBPyConnection) -> None:
        self._connection = connection

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        try:
            return self._connection.sql(sql, params=list(params)).to_arrow_table()
        except duckdb.CatalogException as exc:
            add_note(exc, _CURSOR_HINT)
            raise

    def interrupt(self) -> None:
        with contextlib.suppress(duckdb.ConnectionException):  # closed already: nothing runs
            self._connection.interrupt()

    def close(self) -> None:
        self._connection.close()


class DuckDBBackend:
    """DuckDB through per-thread cursors of one database instance. Thread-safe."""

    dialect = "duckdb"
    engine = "duckdb"

    def __init__(
        self, source: duckdb.DuckDBPyConnection | str | os.PathLike[str] | None, *, owned: bool = False
    ) -> None:
        """``owned``: close a passed-in connection with the backend (it was made for the loader)."""
        if source is None:
            self._connection = duckdb.connect(":memory:")
            self._owned = True
            self.engine = "duckdb (in-memory)"
        elif isinstance(source, duckdb.DuckDBPyConnection):
            self._connection = source
            self._owned = owned
        else:
            path = Path(source)
            if not path.exists():
                raise FileNotFoundError(f"DuckDB database file {str(path)!r} does not exist")
            self._connection = duckdb.connect(str(path), read_only=True)
            self._owned = True
            self.engine = f"duckdb ({path.name}, read-only)"

    @staticmethod
    def accepts(source: Any) -> bool:
        """True for what this backend opens: ``None``, a DuckDB connection or a path."""
        return source is None or isinstance(source, (duckdb.DuckDBPyConnection, str, os.PathLike))

    def cursor(self) -> _DuckDBCursor:
        return _DuckDBCursor(self._connection.cursor())

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """Never: an embedded engine has no network, and its connection cannot be reopened here."""
        return False

    def close(self) -> None:
        if self._owned:
            self._connection.close()
