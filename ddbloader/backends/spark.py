"""Spark: data in a lakehouse, read through Spark Connect (``sc://host:port``) or a SparkSession.

One session serves every cursor, so every fetch thread: a Spark Connect session is a thin gRPC
client that several threads may share, and each query is planned and run in parallel by the
cluster. A ``sc://`` URI opens a new session (``SparkSession.builder.remote(uri).create()``)
that the backend stops on ``close``; a SparkSession the user passes (Connect or classic) is used
as it is and left running.

Parameters are always bound by Spark (``spark.sql(text, args={...})``, named ``:pN`` markers,
sent as literals in the protocol), never formatted into the text. Rows come back as Arrow
(``DataFrame.toArrow()``).

Cancelling: every cursor tags its queries with its own tag (``addTag``, thread-local in
PySpark; job tags on a classic session); ``interrupt()`` cancels that tag from any thread. A
query that has not reached the server when ``interrupt()`` is called is not cancelled: it runs
to its end.

Sessions opened from a URI get three settings:

- ``spark.sql.codegen.maxFields`` = :data:`MAX_FIELDS` (Spark's default is 100): a scan of a
  table wider than ``maxFields`` columns falls back from whole-stage code generation and from
  the vectorised (columnar) Parquet/ORC reader, which is several times slower for the wide
  feature tables training reads. A session you pass in keeps its own settings: set it there.
- no server stack traces in error messages (``spark.sql.connect.serverStacktrace.enabled``,
  ``spark.sql.pyspark.jvmStacktrace.enabled``): the message and error class stay, the JVM
  frames go.
- the client's own gRPC retries bounded to :data:`CLIENT_RETRIES` (the default policy waits up
  to ten minutes for an unreachable server); the loader's retry layer then retries the fetch
  (:meth:`SparkBackend.is_transient`).

The Connect client logs every server error at length to stderr (loggers
``SQLQueryContextLogger``, ``DataFrameQueryContextLogger``) before raising it. Those records are
dropped while a ddbloader cursor runs a query; the error itself is raised unchanged.

Security: Spark has no read-only session; the loader sends only the single SELECT it was given
and its own derived queries. Whoever writes ``sql`` may read what the session may read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from .._core.engine import redact_uri
from .dbapi import bind_parameters

__all__ = ["CLIENT_RETRIES", "MAX_FIELDS", "URI_SCHEME", "SparkBackend", "is_spark_session"]

URI_SCHEME = "sc://"

#: ``spark.sql.codegen.maxFields`` for sessions the backend opens (Spark's default: 100).
MAX_FIELDS = 10_000

#: gRPC retries of the Connect client in sessions the backend opens (about 4 s of backoff).
CLIENT_RETRIES = 4

_SESSION_SETTINGS = {
    "spark.sql.codegen.maxFields": str(MAX_FIELDS),
    "spark.sql.connect.serverStacktrace.enabled": "false",
    "spark.sql.pyspark.jvmStacktrace.enabled": "false",
}

#: PySpark loggers that write every server error to stderr as it is raised.
_ERROR_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")

_INSTALL_HINT = "Spark Connect needs pyspark with its Connect client: pip install 'ddbloader[spark]'"


def is_spark_session(source: Any) -> bool:
    """True for a PySpark ``SparkSession``, classic or Connect (without importing PySpark)."""
    kind = type(source)
    return kind.__name__ == "SparkSession" and kind.__module__.startswith("pyspark.sql")


class _QuietInThisThread(logging.Filter):
    """Drops records logged by a thread while it is inside :meth:`quiet` (errors are raised anyway)."""

    def __init__(self) -> None:
        super().__init__()
        self._state = threading.local()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self._state.active = True
        try:
            yield
        finally:
            self._state.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self._state, "active", False)


_QUIET = _QuietInThisThread()


def _silence_error_loggers() -> None:
    """Install :data:`_QUIET` on PySpark's error loggers (``addFilter`` adds a filter once)."""
    from pyspark.logger import PySparkLogger

    for name in _ERROR_LOGGERS:
        # PySparkLogger.getLogger makes the logger of PySpark's own class, as PySpark would.
        PySparkLogger.getLogger(name).addFilter(_QUIET)


def _open_session(uri: str) -> Any:
    try:
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.client.retries import DefaultPolicy
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    session = SparkSession.builder.remote(uri).create()
    try:
        session.client.set_retry_policies([DefaultPolicy(max_retries=CLIENT_RETRIES)])
        for key, value in _SESSION_SETTINGS.items():
            session.conf.set(key, value)
    except BaseException:
        session.stop()
        raise
    return session


def _describe(uri: str) -> str:
    """``spark connect (host:port)``: no token, user or other parameters."""
    parts = urlsplit(uri)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a malformed port is reported by the client when it connects
        port = ""
    return f"spark connect ({parts.hostname or 'localhost'}{port})"


class _SparkCursor:
    """Runs queries tagged with its own tag, so that ``interrupt`` cancels only its own.

    A Connect session tags operations (``addTag`` / ``interruptTag``). A classic session's tags
    do not reach the JVM thread that serves ``toArrow()``, so there the SparkContext's job tags
    (inherited by that thread) mark the jobs, and ``cancelJobsWithTag`` cancels them.
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self._tag = f"ddbloader-{uuid.uuid4().hex}"
        if type(session).__module__.startswith("pyspark.sql.connect"):
            self._add, self._remove, self._cancel = session.addTag, session.removeTag, session.interruptTag
        else:
            context = session.sparkContext
            self._add, self._remove = context.addJobTag, context.removeJobTag
            self._cancel = context.cancelJobsWithTag

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        text, bound = bind_parameters(sql, params, "spark", "named")
        self._add(self._tag)
        try:
            with _QUIET.quiet():
                table: pa.Table = self._session.sql(text, args=bound or None).toArrow()
        finally:
            self._remove(self._tag)
        return table

    def interrupt(self) -> None:
        # Nothing running under the tag (idle, or a stopped session) means nothing to stop.
        with contextlib.suppress(Exception):
            self._cancel(self._tag)

    def close(self) -> None:
        """Nothing to release: the session belongs to the backend."""


class SparkBackend:
    """Spark through one shared session. Thread-safe.

    Args:
        source: a Spark Connect URI (``sc://host:port``, optionally ``/;token=...``) or a
            SparkSession, Connect or classic (PySpark 4 or newer).

    Raises:
        ImportError: PySpark (with its Connect client, for a URI) is not installed.
        ValueError: a URI that is not ``sc://``.
        TypeError: ``source`` is neither a URI nor a SparkSession.
    """

    dialect = "spark"
    #: verify=True: Spark's ``xxhash64`` of each row as JSON (see ddbloader._sql.fingerprint)
    row_hash_dialect = "spark"

    def __init__(self, source: Any) -> None:
        if isinstance(source, str):
            if not source.startswith(URI_SCHEME):
                raise ValueError(f"SparkBackend takes sc:// URIs, got {redact_uri(source)!r}")
            self._session = _open_session(source)
            self._owned = True
            self.engine = _describe(source)
        elif is_spark_session(source):
            self._session = source
            self._owned = False
            connect = type(source).__module__.startswith("pyspark.sql.connect")
            self.engine = f"spark {'connect ' if connect else ''}(session)"
        else:
            raise TypeError(f"SparkBackend needs an sc:// URI or a SparkSession, got {type(source)!r}")
        _silence_error_loggers()

    def cursor(self) -> _SparkCursor:
        return _SparkCursor(self._session)

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """The server could not be reached (gRPC ``UNAVAILABLE``): worth another attempt."""
        status = getattr(error, "getGrpcStatusCode", None)
        return callable(status) and getattr(status(), "name", None) == "UNAVAILABLE"

    def close(self) -> None:
        """Stop the session opened from a URI; a session passed in stays open. Idempotent."""
        if self._owned:
            self._owned = False
            self._session.stop()
