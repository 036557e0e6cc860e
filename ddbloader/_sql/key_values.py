"""Partition keys and the values planning finds for them, checked before they are bound back to
the engine: a value Python cannot hold, two values SQL's ``=`` cannot tell apart, scheme values
that match the same rows or none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .._core.errors import warn_caller
from .literals import dolphindb_literal_hint

__all__ = ["PlanKey", "check_discovered", "check_scheme", "python_rows"]


@dataclass(frozen=True)
class PlanKey:
    """A partition key: ``group_col`` or ``repartition_col``, parsed, and its scheme."""

    expression: Any  # what query.column() returns: a sqlglot expression, or DolphinDB text
    scheme: tuple[Any, ...] | None
    parameter: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.parameter} {self.text!r}"


def python_rows(table: pa.Table, keys: list[PlanKey], aliases: Sequence[str]) -> list[dict[str, Any]]:
    """``table``'s rows as dicts.

    Raises:
        ValueError: a key's values include one Python cannot represent (an infinite date, a year
            past 9999), naming the key and its type.
    """
    for key, alias in zip(keys, aliases, strict=True):
        column = table.column(alias)
        try:
            column.to_pylist()
        except (OverflowError, ValueError, pa.ArrowException) as error:
            raise ValueError(
                f"{key.name} ({column.type}) holds values Python cannot represent ({error}), so they "
                f"cannot be bound back to the engine; cast the key to text in the query, or filter "
                f"those rows out"
            ) from error
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def check_discovered(key: PlanKey, values: list[Any]) -> None:
    """Refuse key values the engine grouped apart that ``key = value`` cannot tell apart: a float
    key holding both -0.0 and 0.0 (ClickHouse groups them apart), whose subqueries would each
    read both groups' rows.

    Raises:
        ValueError: naming the key and the fix.
    """
    zeros = [v for v in values if isinstance(v, float) and v == 0.0]
    if len(zeros) > 1:
        raise ValueError(
            f"{key.parameter} {key.text!r} holds both -0.0 and 0.0: the engine groups them apart, but "
            f"`{key.text} = 0.0` matches both, so their rows would load twice; key by an expression "
            f'that makes them one value (e.g. {key.parameter}="{key.text} + 0.0")'
        )


def check_scheme(key: PlanKey, positions: list[int], matched: list[Any]) -> None:
    """Refuse scheme values that equal the same key value in SQL; warn about values matching none."""
    assert key.scheme is not None
    scheme_name = key.parameter.replace("_col", "_scheme")
    by_key: dict[str, set[int]] = {}
    for position, value in zip(positions, matched, strict=True):
        by_key.setdefault(repr(value), set()).add(position)
    for value, found in by_key.items():
        if len(found) > 1:
            equal = [key.scheme[p] for p in sorted(found)]
            raise ValueError(
                f"{scheme_name} values {equal!r} are equal in SQL: each matches the rows where "
                f"{key.parameter} {key.text!r} = {value}, so those rows would load more than once; "
                f"keep one of them"
            )
    seen = set(positions)
    unmatched = [key.scheme[p] for p in range(len(key.scheme)) if p not in seen]
    if unmatched:
        hints = [h for h in (dolphindb_literal_hint(v) for v in unmatched) if h]
        warn_caller(
            f"{scheme_name} value(s) {unmatched[:10]!r}{' (and more)' if len(unmatched) > 10 else ''} "
            f"match no rows of {key.parameter} {key.text!r}, so they load nothing"
            + (f"; {'; '.join(hints[:3])}" if hints else "")
        )
