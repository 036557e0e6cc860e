"""The backend contract: how the loader talks to an engine, and what every backend shares.

A :class:`Backend` is shared by every thread of a loader; a :class:`Cursor` is confined to the
thread that opened it. The loader never sends SQL text that contains user values: every value
travels as a bound parameter, rendered by the backend's dialect from sqlglot placeholders (or,
for DolphinDB, turned into a typed literal by the backend's own literal builder).

A backend runs every query once. Whether an error is worth another attempt (a lost connection)
is the backend's call, through :meth:`Backend.is_transient`; the one retry loop is the
fetcher's (:class:`~ddbloader._io.retry.RetryPolicy`, configured by the loader's ``retries`` and
``retry_backoff``), which closes the failed cursor and opens a fresh one, so a backend that
connects per cursor reconnects. Credentials never appear in ``engine`` or in messages
written here: URIs pass through :func:`redact_uri`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import pyarrow as pa

__all__ = ["Backend", "Cursor", "describe_uri", "read_only_statement", "redact_uri"]


class Cursor(Protocol):
    """A thread-confined handle that runs read-only queries. Not thread-safe."""

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        """Run ``sql`` with ``params`` bound and return every row as an Arrow table."""
        ...

    def interrupt(self) -> None:
        """Ask a running query to stop; safe to call from another thread, or when idle."""
        ...

    def close(self) -> None:
        """Release the handle; idempotent."""
        ...


class Backend(Protocol):
    """An engine connection shared by the loader's threads. ``cursor()`` is thread-safe."""

    #: sqlglot dialect name used to parse the user's SQL and render rewritten queries.
    dialect: str
    #: Short engine name for ``repr`` and messages (never contains credentials).
    engine: str

    def cursor(self) -> Cursor:
        """Open a new cursor for the calling thread."""
        ...

    def is_transient(self, error: BaseException) -> bool:
        """True when ``error`` may go away on a fresh cursor (a lost or refused connection).

        The fetcher then closes the cursor, waits, and fetches again on a new one. False for
        what a new cursor cannot cure: a bad query, a bad login, a connection the user passed in
        (it cannot be reopened), or anything an embedded engine raises.
        """
        ...

    def close(self) -> None:
        """Close what this backend opened itself (not a connection the user passed in)."""
        ...


#: Per sqlglot dialect, the statement that makes a whole session refuse writes.
_READ_ONLY_SESSION = {
    "postgres": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "sqlite": "PRAGMA query_only = ON",
    # 2, not 1: the query's own SETTINGS clause still works; neither lets a query lift it.
    "clickhouse": "SET readonly = 2",
}


def read_only_statement(dialect: str) -> str | None:
    """The statement that switches a session of ``dialect`` to read-only; None where there is none.

    Backends run it on connections they open for themselves (from a URI, a clone or a factory)
    before every query, so that a SELECT calling a side-effecting function (``setval()``, a
    function that deletes rows) is refused by the engine, not only by the loader's statement
    check. Before every query, not once: a query can lift the switch for the queries after it
    (PostgreSQL ``set_config('default_transaction_read_only', 'off', false)``), though not for
    itself.
    """
    return _READ_ONLY_SESSION.get(dialect)


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_SECRET_PARAMETER = re.compile(r"(?i)((?:password|passwd|pwd|token|secret|key)=)[^&;\s]*")


def redact_uri(uri: str) -> str:
    """``uri`` without credentials: the user-info part and secret query parameters become ``***``.

    >>> redact_uri("postgresql://me:pw@db:5432/x?sslmode=require&password=pw")
    'postgresql://***@db:5432/x?sslmode=require&password=***'
    """
    return _SECRET_PARAMETER.sub(r"\1***", _USERINFO.sub("***@", uri, count=1))


def describe_uri(uri: str) -> str:
    """``scheme (host:port/path)`` for an engine name: no user, no password, no parameters."""
    parts = urlsplit(uri)
    host = parts.hostname or "localhost"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a malformed port is reported by the driver when it connects
        port = ""
    return f"{parts.scheme} ({host}{port}{parts.path})"
