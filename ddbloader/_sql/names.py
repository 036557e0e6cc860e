"""Names as the engine resolves them: identifiers folded per dialect, result column names,
and the projections whose names the text cannot tell (``*``).
"""

from __future__ import annotations

import string

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect, NormalizationStrategy

from .parsing import unwrap

__all__ = [
    "column_name",
    "first_select",
    "identifier_name",
    "is_modified_star",
    "is_starred",
    "result_name",
    "same_expression",
    "same_name",
]


def same_expression(a: exp.Expr, b: exp.Expr, dialect: str = "") -> bool:
    """Whether two expressions read the same: columns by name as the engine resolves them."""
    if isinstance(a, exp.Column) and isinstance(b, exp.Column) and not a.table and not b.table:
        return column_name(a, dialect) == column_name(b, dialect)
    return bool(a == b)


def column_name(column: exp.Column, dialect: str = "") -> str:
    """A column's name as the engine resolves it (see :func:`identifier_name`)."""
    return identifier_name(column.this, dialect)


def same_name(identifier: exp.Expr, name: str, dialect: str = "") -> bool:
    """Whether ``identifier`` names the result column the engine reports as ``name``: quoted
    exactly; unquoted as ``dialect`` folds it (PostgreSQL lowercases it, ClickHouse keeps it, so
    there ``U`` never names a column ``"U"``), case-insensitively where the dialect is (DuckDB,
    SQLite) or unknown."""
    folded = _folded(identifier, dialect)
    return folded == name if folded is not None else str(identifier.name).casefold() == name.casefold()


def identifier_name(identifier: exp.Expr, dialect: str = "") -> str:
    """An identifier's name as the engine resolves it: quoted exactly, unquoted folded as
    ``dialect`` folds it, case-insensitively (casefolded) where it is case-insensitive or unknown."""
    folded = _folded(identifier, dialect)
    return folded if folded is not None else str(identifier.name).casefold()


def _folded(identifier: exp.Expr, dialect: str) -> str | None:
    """``identifier``'s name as the engine compares it exactly, or None where it compares
    case-insensitively (an unquoted name in DuckDB, SQLite, Spark or an unknown dialect)."""
    name = str(identifier.name)
    if isinstance(identifier, exp.Identifier) and identifier.args.get("quoted"):
        return name
    strategy = _folding(dialect)
    if strategy is NormalizationStrategy.LOWERCASE:  # PostgreSQL folds ASCII letters only
        return name.translate(_ASCII_LOWER)
    if strategy is NormalizationStrategy.UPPERCASE:
        return name.translate(_ASCII_UPPER)
    if strategy is NormalizationStrategy.CASE_SENSITIVE:
        return name
    return None


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ASCII_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)


def _folding(dialect: str) -> NormalizationStrategy | None:
    """How ``dialect`` folds unquoted identifiers; None for a dialect sqlglot does not know."""
    if not dialect:
        return None
    try:
        return Dialect.get_or_raise(dialect).normalization_strategy
    except ValueError:
        return None


def result_name(projection: exp.Expr, dialect: str) -> str:
    """The name the engine reports for ``projection``'s result column, as far as the text says:
    a quoted alias or column as written, an unquoted one folded as ``dialect`` folds it (kept as
    written where the dialect is case-insensitive, :func:`same_name` then comparing so)."""
    identifier = projection.args.get("alias") if isinstance(projection, exp.Alias) else None
    if identifier is None and isinstance(projection, exp.Column):
        identifier = projection.this
    if not isinstance(identifier, exp.Identifier):
        return str(projection.alias_or_name)
    folded = _folded(identifier, dialect)
    return folded if folded is not None else str(identifier.name)


def is_starred(projection: exp.Expr) -> bool:
    """True for ``*`` and ``t.*`` (with DuckDB's EXCLUDE/REPLACE): columns unknown to the text."""
    return isinstance(projection, exp.Star) or (
        isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
    )


def is_modified_star(projection: exp.Expr) -> bool:
    """True for DuckDB's ``* REPLACE (...)`` / ``* RENAME (...)``: result names over other values."""
    star = projection.this if isinstance(projection, exp.Column) else projection
    return isinstance(star, exp.Star) and bool(star.args.get("replace") or star.args.get("rename"))


def first_select(node: exp.Expr) -> exp.Select | None:
    """The SELECT whose list names the query's result columns (a set operation's first branch)."""
    node = unwrap(node)
    while isinstance(node, exp.SetOperation):
        node = unwrap(node.left)
    return node if isinstance(node, exp.Select) else None
