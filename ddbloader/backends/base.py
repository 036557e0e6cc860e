"""The backend contract: how the loader talks to an engine, and what every backend shares.

A :class:`Backend` is shared by every thread of a loader; a :class:`Cursor` is confined to the
thread that opened it. The loader never sends SQL text that contains user values: every value
travels as a bound parameter, rendered by the backend's dialect from sqlglot placeholders (or,
for DolphinDB, turned into a typed literal by the backend's own literal builder).

Server backends retry a fetch that failed on a network error (:class:`Retry`), reconnecting
first; any other error is raised at once. Credentials never appear in ``engine`` or in messages
written here: URIs pass through :func:`redact_uri`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa

from ..errors import add_note

__all__ = ["Backend", "Cursor", "Retry", "backoff_delay", "describe_uri", "redact_uri"]

T = TypeVar("T")


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


def backoff_delay(backoff: float, attempt: int, cap: float) -> float:
    """Exponential backoff: seconds to wait after failed attempt ``attempt`` (1-based)."""
    return float(min(backoff * 2 ** (attempt - 1), cap))


@dataclass(frozen=True)
class Retry:
    """How often a fetch that failed on a network error is tried, and how long to wait between.

    Invariants: ``attempts >= 1`` (1 means no retry); the n-th wait is
    ``min(backoff * 2**(n-1), max_backoff)`` seconds; an interrupted cursor never retries.
    """

    attempts: int = 3
    backoff: float = 0.2
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"Retry.attempts must be an int >= 1, got {self.attempts!r}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"Retry backoff must be >= 0, got {self.backoff!r} / {self.max_backoff!r}")

    def run(
        self,
        operation: Callable[[], T],
        *,
        transient: Callable[[BaseException], bool],
        reset: Callable[[], None],
        stop: threading.Event,
    ) -> T:
        """Run ``operation``; after a transient error, ``reset()`` (reconnect), wait and retry.

        ``stop`` set (the cursor was interrupted) ends the retries at once. The error that is
        finally raised carries a note saying how many attempts were made.
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except Exception as error:
                if attempt == self.attempts or stop.is_set() or not transient(error):
                    if attempt > 1:
                        add_note(error, f"ddbloader gave up after {attempt} attempts (network errors)")
                    raise
                reset()
                if stop.wait(backoff_delay(self.backoff, attempt, self.max_backoff)):
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")


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
