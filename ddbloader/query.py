"""The user's SQL, parsed once with sqlglot, and every query the loader derives from it.

Invariants: the user's query is a single read-only statement (SELECT / WITH / set operation /
PIVOT) without parameters of its own; every derived query carries values only as numbered
parameters (``$1``, ``$2``), so the engine binds them and no value ever becomes SQL text.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

__all__ = ["GROUP_ALIAS", "REPARTITION_ALIAS", "ROWS_ALIAS", "UserQuery", "parse_column_expression"]

GROUP_ALIAS = "_ddb_group"
REPARTITION_ALIAS = "_ddb_repartition"
ROWS_ALIAS = "_ddb_rows"

_WRITES: tuple[type[exp.Expr], ...] = (
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
_ROW_CHANGING: tuple[type[exp.Expr], ...] = (exp.AggFunc, exp.Window, exp.UDTF)


def parse_column_expression(text: str, parameter: str, dialect: str) -> exp.Expr:
    """Parse ``group_col`` / ``repartition_col``: a column name or a scalar SQL expression.

    Raises:
        ValueError: the text is not exactly one scalar expression (a statement, a subquery, two
            expressions, or something that does not parse).
    """
    try:
        expressions = sqlglot.parse(text, read=dialect)
    except ParseError as exc:
        raise ValueError(f"{parameter}={text!r} is not a valid SQL expression: {_describe(exc)}") from exc
    if len(expressions) != 1 or expressions[0] is None:
        raise ValueError(f"{parameter}={text!r} must be one SQL expression")
    expression = expressions[0]
    if isinstance(expression, (exp.Query, *_WRITES)) or expression.find(exp.Query, *_WRITES):
        raise ValueError(f"{parameter}={text!r} must be a column or scalar expression, not a query")
    if expression.find(exp.Placeholder, exp.Parameter):
        raise ValueError(f"{parameter}={text!r} must not contain parameters")
    return expression


def _describe(error: ParseError) -> str:
    """A parse error as plain text (sqlglot's message carries terminal colour codes)."""
    if not error.errors:
        return str(error)
    first = error.errors[0]
    return f"{first.get('description')} at line {first.get('line')}, column {first.get('col')}"


def _parameter_equals(expression: exp.Expr, number: int) -> exp.Expr:
    """``expression = $number``: numbered, so set-operation branches can share parameters."""
    return exp.EQ(this=expression.copy(), expression=exp.Parameter(this=exp.Literal.number(number)))


class UserQuery:
    """The user's query and its rewrites. Immutable after construction; thread-safe.

    Args:
        sql: the user's query text.
        dialect: the sqlglot dialect of the engine.
    """

    def __init__(self, sql: str, dialect: str) -> None:
        if not isinstance(sql, str) or not sql.strip():
            raise TypeError(f"sql must be a non-empty query string, got {sql!r}")
        self.text = sql
        self.dialect = dialect
        try:
            statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
        except ParseError as exc:
            raise ValueError(f"sql does not parse as {dialect} SQL: {_describe(exc)}") from exc
        if len(statements) != 1:
            raise ValueError(f"sql must be exactly one query, got {len(statements)} statements")
        tree = statements[0]
        write = tree if not isinstance(tree, (exp.Query, exp.Pivot)) else tree.find(*_WRITES)
        if write is not None:
            raise ValueError(
                f"sql must be a read-only query (SELECT, WITH, UNION or PIVOT); "
                f"refusing its {write.key.upper()}"
            )
        if tree.find(exp.Placeholder, exp.Parameter):
            raise ValueError("sql must not contain parameters (?, $1, :name): ddbloader binds its own")
        self._tree = tree

    def render(self, tree: exp.Expr) -> str:
        """Render a derived query in the engine's dialect."""
        return tree.sql(dialect=self.dialect)

    def filtered(self, columns: Sequence[exp.Expr]) -> str:
        """The user's query with ``column_i = ?`` for each of ``columns`` AND-ed into its WHERE.

        The predicate lands in the top-level WHERE (in every branch of a set operation, in the
        source of a PIVOT), before GROUP BY, PIVOT and ORDER BY, so the columns need not be
        selected and the query's ORDER BY is kept. Parameters bind in the order of ``columns``.
        """
        if not columns:
            return self.text
        tree = self._tree.copy()
        predicate = exp.and_(*(_parameter_equals(c, n) for n, c in enumerate(columns, start=1)))
        return self.render(_inject(tree, predicate))

    def count(self, sql: str) -> str:
        """``SELECT count(*)`` over a (derived) query."""
        inner = sqlglot.parse_one(sql, read=self.dialect)
        return self.render(
            exp.select(exp.Count(this=exp.Star()).as_(ROWS_ALIAS)).from_(
                exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("_ddb_count")))
            )
        )

    def schema(self) -> str:
        """The user's query returning no rows, to read its result schema."""
        return self.render(self._wrapped("_ddb_schema").limit(0))

    def null_counts(self, columns: Sequence[str]) -> str:
        """Null count per result column, named like the columns."""
        counts = [
            (exp.Count(this=exp.Star()) - exp.Count(this=exp.column(c, quoted=True))).as_(c, quoted=True)
            for c in columns
        ]
        return self.render(self._wrapped("_ddb_nulls").select(*counts, append=False))

    def distinct_values(self, columns: Sequence[exp.Expr], *, with_counts: bool) -> str:
        """Distinct values of ``columns`` over the query's rows, sorted, optionally with counts.

        The values are evaluated in the scope of the query's FROM, so the columns need not be
        selected. ``with_counts`` is only exact for :meth:`counts_are_groupable` queries.
        """
        aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(columns)]
        keyed = [c.copy().as_(a) for c, a in zip(columns, aliases, strict=True)]
        order = [exp.Ordered(this=exp.Literal.number(i + 1), nulls_first=False) for i in range(len(columns))]
        if with_counts:
            select = self._tree.copy()
            assert isinstance(select, exp.Select)
            select.set("expressions", [*keyed, exp.Count(this=exp.Star()).as_(ROWS_ALIAS)])
            select.set(
                "group",
                exp.Group(expressions=[exp.Literal.number(i + 1) for i in range(len(columns))]),
            )
            select.set("order", exp.Order(expressions=order))
            return self.render(select)
        branches = [_distinct_branch(b, keyed) for b in _branches(self._tree)]
        union: exp.Query = branches[0]
        for branch in branches[1:]:
            union = exp.union(union, branch, distinct=True)
        outer = (
            exp.select(*aliases)
            .distinct()
            .from_(exp.Subquery(this=union, alias=exp.TableAlias(this=exp.to_identifier("_ddb_distinct"))))
        )
        outer.set("order", exp.Order(expressions=order))
        if self._tree.args.get("with") and not isinstance(self._tree, exp.Select):
            outer.set("with", self._tree.args["with"].copy())
        return self.render(outer)

    def counts_are_groupable(self) -> bool:
        """True when grouping the query's FROM/WHERE by the partition keys counts its rows exactly.

        That holds for a plain SELECT whose projections neither aggregate, window nor unnest.
        """
        tree = self._tree
        if not isinstance(tree, exp.Select):
            return False
        if any(tree.args.get(k) for k in ("group", "having", "qualify", "distinct", "limit", "offset")):
            return False
        return not any(e.find(*_ROW_CHANGING) for e in tree.expressions)

    def _wrapped(self, alias: str) -> exp.Select:
        return exp.select("*").from_(
            exp.Subquery(this=self._tree.copy(), alias=exp.TableAlias(this=exp.to_identifier(alias)))
        )


def _inject(node: exp.Expr, predicate: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Subquery):
        node.set("this", _inject(node.this, predicate))
        return node
    if isinstance(node, (exp.Select, exp.SetOperation)) and (
        node.args.get("limit") or node.args.get("offset")
    ):
        raise ValueError(
            "sql has a top-level LIMIT/OFFSET, which would apply to every subquery once the query is "
            "split by group_col/repartition_col; move the LIMIT into a subquery or CTE"
        )
    if isinstance(node, exp.Select):
        return node.where(predicate, append=True, copy=False)
    if isinstance(node, exp.SetOperation):
        node.set("this", _inject(node.left, predicate.copy()))
        node.set("expression", _inject(node.right, predicate.copy()))
        return node
    if isinstance(node, exp.Pivot):
        source = node.this
        if isinstance(source, exp.Subquery):
            node.set("this", _inject(source, predicate))
        else:
            filtered = exp.select("*").from_(source.copy()).where(predicate, copy=False)
            node.set("this", exp.Subquery(this=filtered))
        return node
    raise ValueError(f"cannot split a {node.key.upper()} query by group_col/repartition_col")


def _branches(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Subquery):
        return _branches(node.this)
    if isinstance(node, exp.SetOperation):
        return [*_branches(node.left), *_branches(node.right)]
    return [node]


def _distinct_branch(branch: exp.Expr, keyed: Sequence[exp.Expr]) -> exp.Select:
    if isinstance(branch, exp.Pivot):
        return exp.select(*(k.copy() for k in keyed)).distinct().from_(branch.this.copy())
    if not isinstance(branch, exp.Select):
        raise ValueError(f"cannot discover scheme values in a {branch.key.upper()} query; give the scheme")
    select = branch.copy()
    select.set("expressions", [k.copy() for k in keyed])
    select.set("distinct", exp.Distinct())
    select.set("order", None)
    return select
