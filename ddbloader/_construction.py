"""Building a loader: the argument bookkeeping of ``DDBDataLoader.__init__`` and the DuckDB
connections its ``from_parquet`` / ``from_arrow`` constructors open (owned: closed with the loader).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

import duckdb
from sqlglot import exp

from .backends import DuckDBBackend

__all__ = ["NO_SOURCE", "arrow_backend", "parquet_backend", "records_given_arguments"]

_Init = TypeVar("_Init", bound=Callable[..., None])

#: ``source``'s default, so that DolphinDB's ``ddbSession=`` keyword can give it instead.
NO_SOURCE: Any = object()


def records_given_arguments(init: _Init) -> _Init:
    """Store the names of the arguments the caller actually passed as ``self._given_arguments``,
    so a parameter given together with its DolphinDB alias is refused even at its default value."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        self._given_arguments = frozenset(signature.bind(self, *args, **kwargs).arguments) - {
            "self",
            "aliases",
        }
        init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def parquet_backend(path: str | os.PathLike[str]) -> DuckDBBackend:
    """An in-memory DuckDB that reads Parquet file(s) (a path or glob) in place as the view ``data``."""
    connection = duckdb.connect()
    source = exp.select("*").from_(exp.func("read_parquet", exp.Literal.string(str(path))))
    connection.execute(exp.Create(this=exp.to_table("data"), kind="VIEW", expression=source).sql("duckdb"))
    return DuckDBBackend(connection, owned=True)


def arrow_backend(table: Any) -> DuckDBBackend:
    """An in-memory DuckDB with ``table`` (anything DuckDB scans) copied into its table ``data``."""
    connection = duckdb.connect()
    connection.register("_ddbloader_input", table)
    connection.execute("CREATE TABLE data AS SELECT * FROM _ddbloader_input")
    connection.unregister("_ddbloader_input")
    return DuckDBBackend(connection, owned=True)
