"""ORDER BY restating: the user's query's order, applied again on the outer query of the wrap.

Q's ORDER BY is applied again on the outer query, mapped to result columns (an alias, a column
passed through unrenamed, an ordinal, or an expression over such columns); a term that is not
one is refused by name, except on DuckDB, which keeps a filtered subquery's order (WHERE and
SELECT preserve order, per its documentation). Columns are compared by name as the engine
resolves them: quoted exactly, unquoted case-insensitively.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect, NormalizationStrategy

from .parsing import NOT_SCALAR, short_sql, unwrap

__all__ = [
    "KEEPS_SUBQUERY_ORDER",
    "ResultOrder",
    "column_name",
    "first_select",
    "identifier_name",
    "is_modified_star",
    "is_starred",
    "same_expression",
    "same_name",
]


class ResultOrder:
    """The query's ORDER BY, restated over its result columns for the outer query of the wrap.

    A base of :class:`~ddbloader._sql.query.UserQuery`, which sets the attributes declared here;
    it holds no state of its own.
    """

    dialect: str
    _tree: exp.Expr
    _output: tuple[str, ...] | None

    def order_key(self, keys: Sequence[exp.Expr]) -> exp.Ordered | None:
        """The leading term of the query's ORDER BY that is none of ``keys`` (the partition keys,
        constant within a partition), restated over its result columns as the split restates it
        (an ordinal becomes the column it names), or None: no ORDER BY, no such term, or a term
        that is not a result column (see :meth:`_outer_order`)."""
        terms = self.order_terms(keys)
        return terms[0] if terms else None

    def order_terms(self, keys: Sequence[exp.Expr]) -> list[exp.Ordered] | None:
        """The terms of the query's ORDER BY that are none of ``keys``, in order, restated as
        :meth:`order_key` restates its one; None when one cannot be (an ordinal past the result
        columns, or a term that is not a result column) or there is no ORDER BY."""
        try:
            order = self._outer_order()
        except ValueError:
            return None
        if order is None:
            return None
        names = self._output_names()
        terms = []
        for ordered in order.expressions:
            term = ordered.copy()
            if isinstance(term.this, exp.Literal):
                position = int(term.this.name)
                if names is None or not 0 < position <= len(names):
                    return None
                term.set("this", exp.column(names[position - 1], quoted=True))
            if not isinstance(term, exp.Ordered):
                return None
            if not any(same_expression(term.this, key, self.dialect) for key in keys):
                terms.append(term)
        return terms

    def _output_names(self) -> tuple[str, ...] | None:
        if self._output is not None:
            return self._output
        select = first_select(self._tree)
        if select is None or any(is_starred(p) for p in select.expressions):
            return None
        return tuple(p.alias_or_name for p in select.expressions)

    def _outer_order(self) -> exp.Order | None:
        """The query's ORDER BY for the outer query of the wrap, over its result columns.

        Applied again even where the engine keeps a filtered subquery's order (DuckDB, unless
        ``preserve_insertion_order`` is off); there a term that is not a result column leaves
        the order to the engine instead of being refused. PostgreSQL and SQLite keep it in
        practice (the filter is pushed below the subquery's sort) but promise nothing, so there
        such a term is refused.

        Raises:
            ValueError: a term that is not a result column (so cannot order the outer query).
        """
        top = self._tree
        order = top.args.get("order")
        if order is None and isinstance(top, exp.Subquery):
            order = top.this.args.get("order")
        if order is None:
            return None
        select = first_select(top)
        projections = list(select.expressions) if select is not None else []
        terms = []
        for term in order.expressions:
            mapped = self._output_term(term.this, projections)
            if mapped is None and self.dialect in KEEPS_SUBQUERY_ORDER:
                return None  # the filter keeps the wrapped query's order as it is
            if mapped is None:
                raise ValueError(
                    f"cannot keep this query's order when splitting it: the split is applied to "
                    f"the query's result, whose order {self.dialect} keeps only when ORDER BY is "
                    f"applied to it again, and the ORDER BY term "
                    f"{short_sql(term.this, self.dialect)!r} is not a result column; select it"
                )
            ordered = term.copy()
            ordered.set("this", mapped)
            terms.append(ordered)
        return exp.Order(expressions=terms)

    def _output_term(self, term: exp.Expr, projections: list[exp.Expr]) -> exp.Expr | None:
        """``term`` of the query's ORDER BY as an expression over its result columns, if it is one.

        A bare name may be a result column's alias; inside an expression a name reads the FROM's
        column (PostgreSQL's rule), so it maps only to a projection that passes that column
        through unrenamed and that no alias of the same name shadows.
        """
        if isinstance(term, exp.Literal) and term.is_int:
            return term.copy()
        starred = any(is_starred(p) for p in projections)
        for position, projection in enumerate(projections, start=1):
            inner = projection.this if isinstance(projection, exp.Alias) else projection
            named = (
                isinstance(term, exp.Column)
                and not term.table
                and same_name(term.this, _result_name(projection, self.dialect), self.dialect)
            )
            if inner == term or named:
                if isinstance(projection, exp.Alias):
                    return exp.Column(this=projection.args["alias"].copy())
                if isinstance(projection, exp.Column):
                    return exp.Column(this=projection.this.copy())
                return None if starred else exp.Literal.number(position)
        output = self._output_names()
        if (
            isinstance(term, exp.Column)
            and not term.table
            and output
            and any(same_name(term.this, n, self.dialect) for n in output)
            and not any(is_modified_star(p) for p in projections)
        ):
            return exp.Column(this=term.this.copy())
        if isinstance(term, exp.Column) or term.find(exp.Query, *NOT_SCALAR) or not term.find(exp.Column):
            return None
        mapped = term.copy()
        for column in list(mapped.find_all(exp.Column)):
            passed = self._passed_through(column, projections)
            if passed is None:
                return None
            column.replace(passed)
        return mapped

    def _passed_through(self, column: exp.Column, projections: list[exp.Expr]) -> exp.Column | None:
        """The result column that passes ``column`` of the FROM through unchanged, if one does."""
        aliased = {
            identifier_name(p.args["alias"], self.dialect) for p in projections if isinstance(p, exp.Alias)
        }
        if column_name(column, self.dialect) in aliased:
            return None
        for projection in projections:
            if isinstance(projection, exp.Column) and projection == column:
                return exp.Column(this=projection.this.copy())
        return None


#: Dialects that keep a subquery's order through an outer filter (DuckDB documents that WHERE
#: and SELECT preserve their input's order).
KEEPS_SUBQUERY_ORDER = frozenset({"duckdb"})


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


def _result_name(projection: exp.Expr, dialect: str) -> str:
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
