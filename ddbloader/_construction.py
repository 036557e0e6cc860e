"""Building a loader: the argument bookkeeping of ``DDBDataLoader.__init__``, and its other
constructors (:class:`LoaderConstructors`: ``split`` and ``from_*``, whose DuckDB connections the
loader owns and closes).
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import itertools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import duckdb
from sqlglot import exp

from .backends import DuckDBBackend

__all__ = [
    "NO_SOURCE",
    "LoaderConstructors",
    "arrow_backend",
    "build_splits",
    "parquet_backend",
    "records_given_arguments",
    "split_ranges",
]

_Init = TypeVar("_Init", bound=Callable[..., None])


class _Closable(Protocol):
    def close(self) -> None: ...


_Loader = TypeVar("_Loader", bound=_Closable)
_Made = TypeVar("_Made", bound="LoaderConstructors")

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


def split_ranges(at: Sequence[Any], gap: Any = None) -> list[tuple[Any, Any]]:
    """The ``split_range`` of each split cut at the points ``at`` (ascending): ``(None, at[0])``,
    ``(at[0] + gap, at[1])``, ..., ``(at[-1] + gap, None)``.

    ``gap`` (an embargo; None: none) is of the kind ``split_col``'s values take arithmetic in: a
    number for numbers, a ``datetime.timedelta`` for dates and datetimes. A sample whose y starts
    in ``[at[i], at[i] + gap)``, or whose y straddles a cut, is served by no split.

    Raises:
        ValueError / TypeError: no cut point, points not strictly ascending, a negative gap, or a
            gap that leaves a split no values.
    """
    if isinstance(at, (str, bytes)) or not isinstance(at, Sequence) or not at:
        raise TypeError(f"at must be a non-empty list of cut points, got {at!r}")
    cuts = list(at)
    if any(c is None for c in cuts):
        raise ValueError(f"at must not contain None: {cuts!r}")
    for a, b in itertools.pairwise(cuts):
        if not a < b:
            raise ValueError(f"at must be strictly ascending, got {a!r} before {b!r}")
    if gap is not None:
        if isinstance(gap, bool) or not isinstance(gap, (int, float, dt.timedelta)):
            raise TypeError(f"gap must be a number or a datetime.timedelta (or None), got {gap!r}")
        if (gap < dt.timedelta(0)) if isinstance(gap, dt.timedelta) else gap < 0:
            raise ValueError(f"gap must not be negative, got {gap!r}")
    starts: list[Any] = [None]
    for cut in cuts:
        if type(cut) is dt.date and isinstance(gap, dt.timedelta) and gap % dt.timedelta(days=1):
            raise ValueError(
                f"gap {gap!r} is not whole days, which is all a date cut point {cut!r} can move by"
            )
        try:
            starts.append(cut if gap is None else cut + gap)
        except TypeError as error:
            raise TypeError(
                f"gap {gap!r} cannot be added to the cut point {cut!r}: give a gap of its kind"
            ) from error
    ranges = list(zip(starts, [*cuts, None], strict=True))
    for lo, hi in ranges:
        if lo is not None and hi is not None and not lo < hi:
            raise ValueError(f"gap {gap!r} leaves the split from {lo!r} to {hi!r} empty: cut further apart")
    return ranges


def build_splits(
    make: Callable[..., _Loader],
    args: tuple[Any, ...],
    split_col: str,
    at: Sequence[Any],
    gap: Any,
    kwargs: dict[str, Any],
) -> tuple[_Loader, ...]:
    """One loader per :func:`split_ranges` range, made by ``make(*args, **kwargs)`` with the split;
    ``shuffle`` (given in ``kwargs``) only on the first (training) one. A loader that fails closes
    those already made."""
    shuffle = kwargs.pop("shuffle", False)
    made: list[_Loader] = []
    try:
        for number, bounds in enumerate(split_ranges(at, gap)):
            try:
                made.append(
                    make(
                        *args,
                        shuffle=shuffle and number == 0,
                        split_col=split_col,
                        split_range=bounds,
                        **kwargs,
                    )
                )
            except ValueError as error:
                raise ValueError(f"split {number} (split_range={bounds!r}): {error}") from error
    except BaseException:
        for loader in made:
            loader.close()
        raise
    return tuple(made)


class LoaderConstructors:
    """The constructors of :class:`~ddbloader.DDBDataLoader` besides ``__init__``, a base of it:
    each calls the class with a source it opens (owned by the loader) or with a split's range."""

    if TYPE_CHECKING:  # the loader's own, used here

        def close(self) -> None: ...

    @classmethod
    def split(
        cls: type[_Made], *args: Any, split_col: str, at: Sequence[Any], gap: Any = None, **kwargs: Any
    ) -> tuple[_Made, ...]:
        """Train, validation, test (...) loaders of one query (``args``: source, sql, target_col),
        cut at the ascending points ``at`` of ``split_col``: ``len(at) + 1`` loaders with
        ``split_range`` ``(None, at[0])``, ``(at[0] + gap, at[1])``, ..., ``(at[-1] + gap, None)``;
        ``shuffle`` only on the first. ``gap`` (an embargo: a number, or a ``timedelta`` for dates
        and datetimes) leaves the samples whose y starts within it after a cut in no split."""
        return build_splits(cls, args, split_col, at, gap, kwargs)

    @classmethod
    def from_parquet(
        cls: type[_Made],
        path: str | os.PathLike[str],
        target_col: Any,
        sql: str = "SELECT * FROM data",
        **kwargs: Any,
    ) -> _Made:
        """A loader over Parquet file(s) (a path or glob), read in place as the view ``data``."""
        make: Callable[..., _Made] = cls
        return make(parquet_backend(path), sql, target_col, **kwargs)

    @classmethod
    def from_arrow(
        cls: type[_Made], table: Any, target_col: Any, sql: str = "SELECT * FROM data", **kwargs: Any
    ) -> _Made:
        """A loader over an Arrow table (or anything DuckDB scans: a pandas DataFrame), copied into
        an in-memory DuckDB table ``data``."""
        make: Callable[..., _Made] = cls
        return make(arrow_backend(table), sql, target_col, **kwargs)

    @classmethod
    def from_pandas(
        cls: type[_Made], frame: Any, target_col: Any, sql: str = "SELECT * FROM data", **kwargs: Any
    ) -> _Made:
        """A loader over a pandas DataFrame, copied into an in-memory DuckDB table ``data``."""
        return cls.from_arrow(frame, target_col, sql, **kwargs)
