"""Apache DataFusion: an embedded Arrow-native engine, read through a ``SessionContext``.

The context the user passes is the session: every cursor runs its queries on it, so the tables,
views and settings registered there are what the loader sees (and the loader never closes it).
DataFusion plans and runs a query on threads of its own, so cursors of several fetch threads
share the one context.

Read-only: every query goes through ``sql_with_options`` with DDL, DML and statements (``SET``)
disallowed, so the engine refuses anything but a query, whoever opened the context (a Python
UDF registered on it can still do what Python can: whoever writes ``sql`` runs it).

Parameters are bound by DataFusion (``param_values``, ``$1`` as sqlglot's PostgreSQL dialect
renders it), after parsing: a value is never SQL text. DataFusion's SQL is PostgreSQL-like (its
parser's default dialect), so the loader parses and renders queries as ``postgres``. Fetch units
bind one parameter per key value (``key IN ($1, $2, ...)``): DataFusion binds a list to
``= ANY($1)`` but cannot ``UNNEST`` a list parameter, which the plan's count query needs.

Rows come as the engine's record-batch stream (``execute_stream``); ``interrupt()`` stops a
stream at its next batch (DataFusion's Python API has no cancel for a running plan: a query that
computes long before its first batch, an aggregate, runs until that batch). DataFusion returns
text as ``string_view`` (Parquet strings, ``CAST(... AS VARCHAR)``), which pyarrow can neither
take nor filter: every column of a view type comes out as its plain type (same values), so the
client splits fetch units and binds text keys back as it does for any engine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["DataFusionBackend", "QueryInterrupted", "is_datafusion_context"]

DIALECT = "postgres"


class QueryInterrupted(RuntimeError):
    """A query stopped by :meth:`~_DataFusionCursor.interrupt` before its last batch."""


def is_datafusion_context(source: Any) -> bool:
    """True for a ``datafusion.SessionContext`` (without importing DataFusion needlessly)."""
    if not type(source).__module__.startswith("datafusion"):
        return False
    from datafusion import SessionContext

    return isinstance(source, SessionContext)


def _read_only_options() -> Any:
    from datafusion import SQLOptions

    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


class _DataFusionCursor:
    """Runs queries on the backend's context; ``interrupt`` stops the running stream. The flag
    is an Event, so ``interrupt`` is safe from another thread."""

    def __init__(self, backend: DataFusionBackend) -> None:
        self._backend = backend
        self._interrupted = threading.Event()

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        """Every row of ``sql`` as one table; the schema is the engine's even with no rows."""
        frame = self._frame(sql, params)
        batches = list(self._stream(frame))
        return pa.Table.from_batches(batches) if batches else _plain_schema(frame.schema()).empty_table()

    def batches(self, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
        """``sql``'s rows through DataFusion's record-batch stream, read as the iterator advances
        (DataFusion sizes the batches, ``datafusion.execution.batch_size``; ``rows`` is not passed on)."""
        for batch in self._stream(self._frame(sql, params)):
            yield pa.Table.from_batches([batch])

    def _frame(self, sql: str, params: Sequence[Any]) -> Any:
        self._interrupted.clear()
        values = {str(number): value for number, value in enumerate(params, start=1)}
        return self._backend.context.sql_with_options(sql, self._backend.options, param_values=values)

    def _stream(self, frame: Any) -> Iterator[pa.RecordBatch]:
        for batch in frame.execute_stream():
            if self._interrupted.is_set():
                raise QueryInterrupted("the query was interrupted (the loader is closing)")
            yield _plain(batch.to_pyarrow())

    def interrupt(self) -> None:
        self._interrupted.set()

    def close(self) -> None:
        """Nothing to release: the context belongs to the user."""


#: View types and the plain type of the same values.
_PLAIN = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each top-level view type replaced by its plain type."""
    return pa.schema([field.with_type(_PLAIN.get(field.type, field.type)) for field in schema])


def _plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its view columns cast to their plain types (the batch itself if none)."""
    if not any(field.type in _PLAIN for field in batch.schema):
        return batch
    return batch.cast(_plain_schema(batch.schema))


class DataFusionBackend:
    """DataFusion through a ``SessionContext`` shared by every cursor. Thread-safe.

    Args:
        source: a ``datafusion.SessionContext`` holding the tables the query reads.

    Raises:
        TypeError: ``source`` is not a SessionContext.
    """

    dialect = DIALECT
    engine = "datafusion (session)"

    def __init__(self, source: Any) -> None:
        if not is_datafusion_context(source):
            raise TypeError(f"DataFusionBackend needs a datafusion.SessionContext, got {type(source)!r}")
        self.context = source
        self.options = _read_only_options()

    def cursor(self) -> _DataFusionCursor:
        return _DataFusionCursor(self)

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """Never: an embedded engine has no connection to lose."""
        return False

    def close(self) -> None:
        """Nothing to close: the context is the user's."""
