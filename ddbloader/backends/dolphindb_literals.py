"""DolphinDB literals for the parameters of a split query.

The derived SQL carries markers (``__ddb_p1__``), and the cursor replaces each with a typed
literal built by :func:`to_literal` at fetch time. Strings become double-quoted literals in which
every character other than ASCII letters, digits, ``_``, ``.``, ``-`` and space is written as
``\\xHH`` escapes of its UTF-8 bytes, so a literal never contains a quote, a backslash escape of
the user's, ``#{`` or a newline.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._sql.literals import DOLPHINDB_TEMPORAL

__all__ = ["MARKER", "substitute", "to_literal"]

#: the prefix of a parameter marker, ``__ddb_p<n>__`` (n from 1)
MARKER = "__ddb_p"
_MARKER_RE = re.compile(r"__ddb_p(\d+)__")
_SAFE_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.- ")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _string_literal(value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{value!r} contains a NUL character, which a DolphinDB string cannot hold")
    parts: list[str] = []
    escaped = False
    for character in value:
        # A hex digit right after \xHH is escaped as well, in case the parser reads on.
        if character in _SAFE_CHARACTERS and not (escaped and character in _HEX_DIGITS):
            parts.append(character)
            escaped = False
        else:
            parts.extend(f"\\x{byte:02X}" for byte in character.encode("utf-8"))
            escaped = True
    return '"' + "".join(parts) + '"'


def _temporal_literal(value: dt.datetime | dt.date | dt.time, nanosecond: int = 0) -> str:
    if isinstance(value, (dt.datetime, dt.time)) and value.tzinfo is not None:
        raise ValueError(f"{value!r} has a time zone; DolphinDB temporals have none: convert it first")
    if isinstance(value, dt.datetime):
        head = value.strftime("%Y.%m.%dT%H:%M:%S")
    elif isinstance(value, dt.date):
        return value.strftime("%Y.%m.%d")
    else:
        head = value.strftime("%H:%M:%S")
    if nanosecond or value.microsecond % 1000:
        return f"{head}.{value.microsecond * 1000 + nanosecond:09d}"
    if value.microsecond:
        return f"{head}.{value.microsecond // 1000:03d}"
    return head


def to_literal(value: Any) -> str:
    """A typed DolphinDB literal for one scheme value.

    bool → ``true``/``false``; int → digits; float → digits (finite only); date → ``2020.01.01``;
    datetime → ``2020.01.01T09:30:00`` (``.fff`` or ``.fffffffff`` when it has fractions);
    time → ``09:30:00``; numpy datetime64 likewise. A str is a string literal, except the
    DDB-style literals accepted for migration: ``"`000001.SH"`` (a symbol: the text after the
    backtick) and temporal literals such as ``"2020.01.01"`` or ``"2020.01.01T09:30:00.000"``,
    which pass through as the temporal they spell.

    Raises:
        ValueError: NUL in a string, NaN/infinity, a time zone, or a backtick vector.
        TypeError: a value of another type.
    """
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating, decimal.Decimal)):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not a finite number, so it equals no row")
        return repr(number)
    if isinstance(value, np.datetime64):
        unit = np.datetime_data(value.dtype)[0]
        if np.isnat(value):
            raise ValueError("NaT equals no row")
        if unit in {"Y", "M", "W", "D"}:
            return _temporal_literal(value.astype("datetime64[D]").astype(dt.date))
        nanoseconds = int(value.astype("datetime64[ns]").astype(np.int64))
        seconds, fraction = divmod(nanoseconds, 1_000_000_000)
        moment = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds, microseconds=fraction // 1000)
        return _temporal_literal(moment, fraction % 1000)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return _temporal_literal(value, int(getattr(value, "nanosecond", 0)))
    if isinstance(value, str):
        if value.startswith("`"):
            symbol = value[1:]
            if "`" in symbol:
                raise ValueError(f"{value!r} is a DolphinDB symbol vector; give its values one by one")
            return _string_literal(symbol)
        if DOLPHINDB_TEMPORAL.fullmatch(value):
            return value
        return _string_literal(value)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a DolphinDB literal")


def substitute(sql: str, params: Sequence[Any]) -> str:
    """Replace the parameter markers of a derived query with typed literals of ``params``.

    Raises:
        ValueError: a marker numbered beyond ``params``, or a value :func:`to_literal` refuses.
    """

    def literal(match: re.Match[str]) -> str:
        number = int(match.group(1))
        if not 1 <= number <= len(params):
            raise ValueError(f"the query uses parameter {number} but only {len(params)} were given")
        return to_literal(params[number - 1])

    return _MARKER_RE.sub(literal, sql)
