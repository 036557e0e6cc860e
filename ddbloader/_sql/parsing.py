"""Parsing the user's SQL and the key expressions, and the refusals made at parse time.

Invariants: the user's query is a single read-only statement (SELECT / WITH / set operation /
PIVOT) without parameters of its own; ``group_col`` / ``repartition_col`` are each exactly one
scalar expression (one value per row, no query, no parameter). Anything else is refused, naming
the argument and the construct. DuckDB's ``PIVOT ... ORDER BY ... LIMIT ...`` is read as the
``SELECT * FROM (PIVOT ...) ORDER BY ...`` it means; ClickHouse's ``A UNION ALL B ORDER BY x``
(which ClickHouse applies to the last SELECT only) is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import SqlglotError
from sqlglot.generators.duckdb import DuckDBGenerator
from sqlglot.parsers.duckdb import DuckDBParser
from sqlglot.tokenizer_core import TokenType

from .aliases import PIVOT_ALIAS

__all__ = [
    "NOT_SCALAR",
    "NULLS_STATED",
    "WRITES",
    "describe_error",
    "parse_column_expression",
    "parse_statements",
    "reader",
    "refuse_last_branch_order",
    "short_sql",
    "unwrap",
]


WRITES: tuple[type[exp.Expr], ...] = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.Command,
    exp.Into,
    exp.Copy,
    exp.Set,
    exp.Use,
)


# A key is compared with ``=`` once per row, so it must be one scalar value per row.
NOT_SCALAR: tuple[type[exp.Expr], ...] = (exp.Alias, exp.Star, exp.AggFunc, exp.Window, exp.UDTF)


class _PivotStatementParser(DuckDBParser):
    """DuckDB's parser, reading ``PIVOT ... ORDER BY ... LIMIT ...`` too.

    sqlglot's DuckDB parser stops a PIVOT statement at its GROUP BY; DuckDB accepts the query
    modifiers after it, which mean the same as ``SELECT * FROM (PIVOT ...) ORDER BY ...``. That
    is the tree this parser builds for them (it renders as valid DuckDB with the same columns).
    """

    STATEMENT_PARSERS: ClassVar[dict[TokenType, Any]] = {
        **DuckDBParser.STATEMENT_PARSERS,
        TokenType.PIVOT: lambda self: self._parse_pivot_statement(unpivot=False),
        TokenType.UNPIVOT: lambda self: self._parse_pivot_statement(unpivot=True),
    }

    def _parse_pivot_statement(self, unpivot: bool) -> exp.Expr:
        pivot: exp.Expr = self._parse_simplified_pivot(is_unpivot=unpivot)
        if not self._match_set((TokenType.ORDER_BY, TokenType.LIMIT, TokenType.OFFSET), advance=False):
            return pivot
        select = exp.select("*").from_(
            exp.Subquery(this=pivot, alias=exp.TableAlias(this=exp.to_identifier(PIVOT_ALIAS)))
        )
        modified: exp.Expr = self._parse_query_modifiers(select)
        return modified

    def _parse_ordered(self, parse_method: Callable[[], exp.Expr | None] | None = None) -> exp.Ordered | None:
        ordered = super()._parse_ordered(parse_method)
        if ordered is not None and self._index >= 2 and self._tokens[self._index - 2].text.upper() == "NULLS":
            ordered.set(NULLS_STATED, True)
        return ordered


#: Set on an ORDER BY term whose NULL placement the user's text states: DuckDB's session may
#: place NULLs otherwise by default (``default_null_order``), so it is rendered as stated.
NULLS_STATED = "nulls_stated"


class _StatedNullsGenerator(DuckDBGenerator):
    """DuckDB's generator, writing a stated NULLS LAST too (sqlglot leaves out the placement it
    takes for DuckDB's default, which a session's ``default_null_order`` may change)."""

    def ordered_sql(self, expression: exp.Ordered) -> str:
        text: str = super().ordered_sql(expression)
        if expression.args.get(NULLS_STATED) and not expression.args.get("nulls_first"):
            return f"{text} NULLS LAST"
        return text


class _DuckDBWithPivotStatements(DuckDB):
    Parser = _PivotStatementParser
    Generator = _StatedNullsGenerator


def reader(dialect: str) -> Any:
    """The sqlglot dialect that reads and writes ``dialect``'s SQL as ddbloader does."""
    return _DuckDBWithPivotStatements if dialect == "duckdb" else dialect


def parse_statements(text: str, dialect: str) -> list[exp.Expr]:
    return [s for s in sqlglot.parse(text, read=reader(dialect)) if s is not None]


def parse_column_expression(text: str, parameter: str, dialect: str) -> exp.Expr:
    """Parse ``group_col`` / ``repartition_col``: a column name or a scalar SQL expression.

    Raises:
        ValueError: the text is not exactly one scalar expression (a statement, a subquery, two
            expressions, an alias, an aggregate or window function, or something that does not
            parse).
    """
    try:
        expressions = parse_statements(text, dialect)
    except SqlglotError as exc:
        raise ValueError(
            f"{parameter}={text!r} is not a valid SQL expression: {describe_error(exc)}"
        ) from exc
    if len(expressions) != 1:
        raise ValueError(f"{parameter}={text!r} must be one SQL expression")
    expression = expressions[0]
    if isinstance(expression, (exp.Query, *WRITES)) or expression.find(exp.Query, *WRITES):
        raise ValueError(f"{parameter}={text!r} must be a column or scalar expression, not a query")
    if expression.find(exp.Placeholder, exp.Parameter):
        raise ValueError(f"{parameter}={text!r} must not contain parameters")
    not_scalar = expression.find(*NOT_SCALAR)
    if not_scalar is not None:
        raise ValueError(
            f"{parameter}={text!r} must be one value per row (a column or scalar expression); "
            f"{not_scalar.sql(dialect=dialect)!r} is not"
        )
    return expression


def describe_error(error: SqlglotError) -> str:
    """A sqlglot error as plain text (its message carries terminal colour codes)."""
    errors = getattr(error, "errors", None)
    if not errors:
        return str(error)
    first = errors[0]
    description = str(first.get("description"))
    missing = _MISSING_PART.fullmatch(description)
    if missing:
        description = (
            f"an incomplete {missing.group(2).lower()} expression (its {missing.group(1)} is missing)"
        )
    near = f"{first.get('start_context') or ''}{first.get('highlight') or ''}"[-40:]
    return f"{description} at line {first.get('line')}, column {first.get('col')}, near {near!r}"


#: sqlglot's message for an expression lacking a part, naming its internal class
_MISSING_PART = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*\.(\w+)'>")


def short_sql(node: exp.Expr, dialect: str, limit: int = 80) -> str:
    text = node.sql(dialect=dialect)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse_last_branch_order(tree: exp.Expr, dialect: str) -> None:
    """Refuse ClickHouse's ``A UNION ALL B ORDER BY x`` (or LIMIT/OFFSET): ClickHouse applies it
    to the last SELECT only, where every other engine (and a reader) applies it to the union.

    Raises:
        ValueError: naming the construct and the two ways to write what is meant.
    """
    node = unwrap(tree)
    if not isinstance(node, exp.SetOperation):
        return
    last = node.expression
    modifier = next((m for m in ("order", "limit", "offset") if last.args.get(m) is not None), None)
    if isinstance(last, exp.Select) and modifier is not None:
        clause = {"order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET"}[modifier]
        raise ValueError(
            f"sql ends its {node.key.upper()} with {clause} ({short_sql(last.args[modifier], dialect)!r}), "
            f"which ClickHouse applies to the last SELECT only, not to the whole union: wrap the union "
            f"to apply it to all rows (SELECT * FROM (... UNION ALL ...) {clause} ...), or parenthesise "
            f"the last SELECT to mean that one"
        )


def unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Subquery):
        node = node.this
    return node
