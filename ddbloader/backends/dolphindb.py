"""DolphinDB through the ``dolphindb`` package's Session.

The query's split and the literals of its parameters are in :mod:`.dolphindb_sql`. Verified
here: the SQL texts and literals (tests/test_dolphindb.py). Not verified here (no server): that
a DolphinDB server accepts every generated text; the live contract test runs when
``DDBLOADER_DOLPHINDB_URI`` is set.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa

from .._core.engine import describe_uri, redact_uri
from .dolphindb_literals import substitute
from .dolphindb_sql import DIALECT, DolphinDBQuery

__all__ = ["DolphinDBBackend", "is_dolphindb_session"]

URI_SCHEME = "dolphindb://"


def is_dolphindb_session(source: Any) -> bool:
    """True for a ``dolphindb.Session`` (without importing dolphindb needlessly)."""
    if not type(source).__module__.startswith("dolphindb"):
        return False
    import dolphindb

    return isinstance(source, dolphindb.Session)


def _to_arrow(result: Any) -> pa.Table:
    if isinstance(result, pa.Table):
        return result
    import pandas as pd

    if isinstance(result, pd.DataFrame):
        return pa.Table.from_pandas(result, preserve_index=False)
    raise TypeError(f"the query returned a {type(result).__name__}, not a table: use select, not exec")


def _uri_session(uri: str) -> Callable[[], Any]:
    """A factory of sessions for ``dolphindb://user:password@host:port[?protocol=arrow]``."""
    parts = urlsplit(uri)
    if not parts.hostname or not parts.port:
        raise ValueError(f"a DolphinDB URI needs a host and a port: {redact_uri(uri)!r}")
    arrow = parse_qs(parts.query).get("protocol", [""])[0].lower() == "arrow"
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    host, port = parts.hostname, parts.port

    def open_session() -> Any:
        try:
            import dolphindb
            import dolphindb.settings as keys
        except ImportError as error:
            raise ImportError(
                "DolphinDB needs the dolphindb package: pip install 'ddbloader[dolphindb]'"
            ) from error
        protocol = keys.PROTOCOL_ARROW if arrow else keys.PROTOCOL_DEFAULT
        session = dolphindb.Session(protocol=protocol)
        if not session.connect(host, port, user, password):
            raise ConnectionError(f"cannot connect to DolphinDB at {host}:{port}")
        return session

    return open_session


class _DolphinDBCursor:
    def __init__(self, backend: DolphinDBBackend, session: Any, shared: bool) -> None:
        self._backend = backend
        self._session: Any = session
        self._shared = shared

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        script = substitute(sql, params)

        if self._shared:
            with self._backend.lock:
                return _to_arrow(self._session.run(script))
        if self._session is None:
            self._session = self._backend.open()
        return _to_arrow(self._session.run(script))

    def interrupt(self) -> None:
        """Nothing to do: the Python API cannot cancel a running script from another thread, so
        the fetch finishes and its thread then sees the stop."""

    def close(self) -> None:
        if self._shared:
            return
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()


class DolphinDBBackend:
    """DolphinDB sessions. Thread-safe.

    Args:
        source: a ``dolphindb.Session`` (shared: its scripts run one at a time), a URI
            ``dolphindb://user:password@host:port`` (add ``?protocol=arrow`` when the server has
            the formatArrow plugin), or a callable returning a connected Session. URIs and
            factories give every fetch thread its own session.
    """

    dialect = DIALECT

    def __init__(self, source: Any) -> None:
        self._factory: Callable[[], Any] | None
        self._shared: Any = None
        if isinstance(source, str):
            self._factory = _uri_session(source)
            self.engine = describe_uri(source)
        elif is_dolphindb_session(source):
            self._factory = None
            self._shared = source
            self.engine = f"dolphindb ({source.host}:{source.port}, shared session)"
        elif callable(source):
            self._factory = source
            self.engine = "dolphindb (factory)"
        else:
            raise TypeError(f"DolphinDBBackend needs a Session, a URI or a factory, got {type(source)!r}")
        self.lock = threading.Lock()

    @staticmethod
    def query(sql: str) -> DolphinDBQuery:
        """Parse the user's query (the hook the plan calls instead of sqlglot)."""
        return DolphinDBQuery(sql)

    def open(self) -> Any:
        """A new session from the URI or factory."""
        if self._factory is None:
            raise RuntimeError("a shared DolphinDB session cannot be reopened")
        return self._factory()

    def is_transient(self, error: BaseException) -> bool:
        """Connection failures: OS-level errors, or an API error that mentions the connection.

        Never on a shared session, which cannot be reopened."""
        return self._factory is not None and (
            isinstance(error, OSError) or "connection" in str(error).lower()
        )

    def cursor(self) -> _DolphinDBCursor:
        if self._factory is None:
            return _DolphinDBCursor(self, self._shared, shared=True)
        return _DolphinDBCursor(self, None, shared=False)

    def close(self) -> None:
        """Nothing to close: cursors close their own sessions; a shared session is the caller's."""
