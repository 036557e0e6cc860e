"""Scheme values written in DolphinDB's literal syntax, recognised so that other engines' messages can
say how to write them (a ```000001.SH`` symbol, a ``2024.01.02`` date)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["DOLPHINDB_TEMPORAL", "dolphindb_literal_hint"]

DOLPHINDB_TEMPORAL = re.compile(
    r"\d{4}\.\d{2}\.\d{2}(?:T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?)?"  # date, datetime, timestamp
    r"|\d{4}\.\d{2}M"  # month
    r"|\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?"  # second, time, nanotime
    r"|\d{2}:\d{2}m"  # minute
)


def dolphindb_literal_hint(value: Any) -> str | None:
    """How to write ``value`` for an engine other than DolphinDB, if it is a DolphinDB-style literal.

    >>> dolphindb_literal_hint("`000001.SH")
    "'`000001.SH' is DolphinDB symbol syntax: elsewhere write '000001.SH'"
    """
    if not isinstance(value, str):
        return None
    if value.startswith("`"):
        return f"{value!r} is DolphinDB symbol syntax: elsewhere write {value[1:]!r}"
    if DOLPHINDB_TEMPORAL.fullmatch(value) and "." in value[:8]:
        if value[4:5] == value[7:8] == ".":
            iso = value.replace(".", "-", 2)
            return f"{value!r} is a DolphinDB temporal literal: elsewhere write {iso!r} or a datetime object"
        return f"{value!r} is a DolphinDB temporal literal: elsewhere write a date or datetime object"
    return None
