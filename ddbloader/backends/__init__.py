"""Engine backends. :func:`connect` turns whatever the user passed as ``source`` into one."""

from __future__ import annotations

from typing import Any

from .base import Backend, Cursor
from .duckdb import DuckDBBackend

__all__ = ["Backend", "Cursor", "DuckDBBackend", "connect"]


def connect(source: Any) -> Backend:
    """Wrap ``source`` (a DuckDB connection, a DuckDB path or ``None``) in a :class:`Backend`.

    An object that already implements :class:`Backend` is used as it is (the loader will close it).

    Raises:
        TypeError: ``source`` is not something ddbloader can read from.
        FileNotFoundError: a database path that does not exist.
    """
    if all(hasattr(source, attribute) for attribute in ("cursor", "dialect", "engine", "close")):
        return source  # type: ignore[no-any-return]
    if DuckDBBackend.accepts(source):
        return DuckDBBackend(source)
    raise TypeError(
        f"source must be a DuckDB connection, a DuckDB database path or None, "
        f"got {type(source).__module__}.{type(source).__qualname__}"
    )
