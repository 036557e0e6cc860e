"""The backend contract: how the loader talks to an engine.

A :class:`Backend` is shared by every thread of a loader; a :class:`Cursor` is confined to the
thread that opened it. The loader never sends SQL text that contains user values: every value
travels as a bound parameter, rendered by the backend's dialect from sqlglot placeholders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa

__all__ = ["Backend", "Cursor"]


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

    def close(self) -> None:
        """Close what this backend opened itself (not a connection the user passed in)."""
        ...
