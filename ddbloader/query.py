"""The user's SQL, parsed once with sqlglot, and every query the loader derives from it.

Invariants: the user's query is a single read-only statement (SELECT / WITH / set operation /
PIVOT) without parameters of its own; every derived query carries scheme values only as
numbered parameters (``$1``, ``$2``), so the engine binds them and no scheme value ever becomes
SQL text. The one exception is data, not input: the values a dynamic PIVOT found in the table,
which :meth:`UserQuery.pinned` writes as literals built by the dialect's generator (DuckDB
accepts no parameter at all in a query that holds a dynamic PIVOT).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

__all__ = [
    "GROUP_ALIAS",
    "KEY_ALIASES",
    "PIVOT_ALIAS",
    "REPARTITION_ALIAS",
    "ROWS_ALIAS",
    "Query",
    "UserQuery",
    "parse_column_expression",
]

GROUP_ALIAS = "_ddb_group"
REPARTITION_ALIAS = "_ddb_repartition"
ROWS_ALIAS = "_ddb_rows"
PIVOT_ALIAS = "_ddb_pivot"
#: The key columns :meth:`UserQuery.filtered_many` selects after the query's own, in key order.
KEY_ALIASES = (GROUP_ALIAS, REPARTITION_ALIAS)

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
# A key is compared with ``=`` once per row, so it must be one scalar value per row.
_NOT_SCALAR: tuple[type[exp.Expr], ...] = (exp.Alias, exp.Star, exp.AggFunc, exp.Window, exp.UDTF)


def _parse(text: str, dialect: str) -> list[exp.Expr]:
    return [s for s in sqlglot.parse(text, read=dialect) if s is not None]


def parse_column_expression(text: str, parameter: str, dialect: str) -> exp.Expr:
    """Parse ``group_col`` / ``repartition_col``: a column name or a scalar SQL expression.

    Raises:
        ValueError: the text is not exactly one scalar expression (a statement, a subquery, two
            expressions, an alias, an aggregate or window function, or something that does not
            parse).
    """
    try:
        expressions = _parse(text, dialect)
    except SqlglotError as exc:
        raise ValueError(f"{parameter}={text!r} is not a valid SQL expression: {_describe(exc)}") from exc
    if len(expressions) != 1:
        raise ValueError(f"{parameter}={text!r} must be one SQL expression")
    expression = expressions[0]
    if isinstance(expression, (exp.Query, *_WRITES)) or expression.find(exp.Query, *_WRITES):
        raise ValueError(f"{parameter}={text!r} must be a column or scalar expression, not a query")
    if expression.find(exp.Placeholder, exp.Parameter):
        raise ValueError(f"{parameter}={text!r} must not contain parameters")
    not_scalar = expression.find(*_NOT_SCALAR)
    if not_scalar is not None:
        raise ValueError(
            f"{parameter}={text!r} must be one value per row (a column or scalar expression); "
            f"{not_scalar.sql(dialect=dialect)!r} is not"
        )
    return expression


def _describe(error: SqlglotError) -> str:
    """A sqlglot error as plain text (its message carries terminal colour codes)."""
    errors = getattr(error, "errors", None)
    if not errors:
        return str(error)
    first = errors[0]
    return f"{first.get('description')} at line {first.get('line')}, column {first.get('col')}"


def _operand(expression: exp.Expr) -> exp.Expr:
    """``expression`` made safe as an operand: ``a > 1`` must not become ``a > 1 = $1``."""
    if isinstance(expression, (exp.Column, exp.Func, exp.Cast, exp.Literal, exp.Paren)):
        return expression.copy()
    return exp.Paren(this=expression.copy())


def _parameter(number: int) -> exp.Parameter:
    return exp.Parameter(this=exp.Literal.number(number))


def _parameter_equals(expression: exp.Expr, number: int) -> exp.Expr:
    """``expression = $number``: numbered, so set-operation branches can share parameters."""
    return exp.EQ(this=_operand(expression), expression=_parameter(number))


def _parameter_in(expression: exp.Expr, first: int, count: int) -> exp.Expr:
    """``expression IN ($first, ..., $first+count-1)``: one bound parameter per value."""
    return exp.In(this=_operand(expression), expressions=[_parameter(first + n) for n in range(count)])


class Query(Protocol):
    """What the plan needs from the user's parsed query, whatever the engine's SQL.

    :class:`UserQuery` implements it with sqlglot. An engine sqlglot cannot parse brings its own
    through ``Backend.query(sql)`` (DolphinDB's ``DolphinDBQuery``); column expressions are then
    whatever its ``column()`` returns, and its derived SQL carries its own parameter markers.
    """

    text: str

    def column(self, text: str, parameter: str) -> Any: ...
    def filtered(self, columns: Sequence[Any]) -> str: ...
    def filtered_many(self, columns: Sequence[Any], counts: Sequence[int | None]) -> str | None: ...
    def null_rows(self, columns: Sequence[Any]) -> str: ...
    def count(self, sql: str) -> str: ...
    def schema(self) -> str: ...
    def null_counts(self, columns: Sequence[str]) -> str: ...
    def distinct_values(self, columns: Sequence[Any], *, with_counts: bool) -> str: ...
    def counts_are_groupable(self) -> bool: ...
    def dynamic_pivot_fields(self) -> list[str]: ...
    def pinned(self, values: Sequence[Sequence[str]]) -> Query: ...


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
            statements = _parse(sql, dialect)
        except SqlglotError as exc:
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

    def column(self, text: str, parameter: str) -> exp.Expr:
        """:func:`parse_column_expression` in this query's dialect."""
        return parse_column_expression(text, parameter, self.dialect)

    def render(self, tree: exp.Expr) -> str:
        """Render a derived query in the engine's dialect."""
        return tree.sql(dialect=self.dialect)

    def filtered(self, columns: Sequence[exp.Expr]) -> str:
        """The user's query with ``column_i = $k`` for each of ``columns`` AND-ed into its WHERE.

        The predicate lands in the top-level WHERE (in every branch of a set operation, in the
        source of a PIVOT), before GROUP BY, PIVOT and ORDER BY, so the columns need not be
        selected and the query's ORDER BY is kept. Parameters bind in the order of ``columns``.
        Aggregates and window functions therefore see one subquery's rows: the union of the
        subqueries is the whole query only when they are grouped/partitioned by the keys.
        """
        tree = self._tree.copy()
        if not columns:
            return self.render(tree)
        predicate = exp.and_(*(_parameter_equals(c, n) for n, c in enumerate(columns, start=1)))
        return self.render(_inject(tree, predicate))

    def filtered_many(self, columns: Sequence[exp.Expr], counts: Sequence[int | None]) -> str | None:
        """The rows of many subqueries in one query, each row tagged with its key values.

        ``column_i IN ($k, ..., $k+n_i-1)`` for each of ``columns`` whose count ``n_i`` is not None
        is AND-ed into the WHERE as :meth:`filtered` does it (parameters numbered on across the
        columns, in order), and every one of ``columns`` is selected after the query's own columns
        as :data:`KEY_ALIASES`, so the client can split the result by key
        (:func:`~ddbloader.units.split_by_key`). Rows of one key keep the query's order, since
        the predicate and the added columns change no row's place.

        Returns None where selecting the keys would change what the query returns (grouping,
        DISTINCT, window functions, aggregates, LIMIT, PIVOT): those subqueries are fetched one
        by one with :meth:`filtered`.
        """
        tree = self._tree.copy()
        branches = _branches(tree)
        if not all(isinstance(b, exp.Select) and _selects_rows(b) for b in branches):
            return None
        for branch in branches:
            assert isinstance(branch, exp.Select)
            branch.select(
                *(c.copy().as_(a) for c, a in zip(columns, KEY_ALIASES[: len(columns)], strict=True)),
                copy=False,
            )
        terms = []
        number = 1
        for column, count in zip(columns, counts, strict=True):
            if count is not None:
                terms.append(_parameter_in(column, number, count))
                number += count
        return self.render(_inject(tree, exp.and_(*terms)) if terms else tree)

    def null_rows(self, columns: Sequence[exp.Expr]) -> str:
        """Count the query's rows where any of ``columns`` is NULL: the rows no subquery matches."""
        predicate = exp.or_(*(exp.Is(this=_operand(c), expression=exp.Null()) for c in columns))
        return self.count(self.render(_inject(self._tree.copy(), predicate)))

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
        if not isinstance(self._tree, exp.Select):
            self._keep_with(outer)
        return self.render(outer)

    def counts_are_groupable(self) -> bool:
        """True when grouping the query's FROM/WHERE by the partition keys counts its rows exactly.

        That holds for a plain SELECT whose projections neither aggregate, window nor unnest.
        """
        return isinstance(self._tree, exp.Select) and _selects_rows(self._tree)

    def dynamic_pivot_fields(self) -> list[str]:
        """One query per ``ON`` field of a PIVOT statement that takes its values from the data.

        DuckDB refuses every parameter in a query holding such a PIVOT (it expands into several
        statements), and a filtered source would give each subquery its own column set. Each
        query returns the field's distinct non-NULL values as text (column ``_ddb_pivot``), in
        the order DuckDB gives the columns (it sorts them as text).
        """
        queries: list[str] = []
        for pivot in _dynamic_pivots(self._tree):
            for field in pivot.expressions:
                if isinstance(field, exp.In):
                    continue
                distinct = (
                    exp.select(exp.cast(_operand(field), exp.DataType.build("text")).as_(PIVOT_ALIAS))
                    .distinct()
                    .from_(pivot.this.copy())
                    .where(exp.Not(this=exp.Is(this=_operand(field), expression=exp.Null())))
                )
                distinct.set("order", exp.Order(expressions=[exp.Ordered(this=exp.Literal.number(1))]))
                self._keep_with(distinct)
                queries.append(self.render(distinct))
        return queries

    def pinned(self, values: Sequence[Sequence[str]]) -> UserQuery:
        """This query with each dynamic PIVOT field's values listed (``ON k IN ('a', ...)``).

        ``values`` holds one list of texts per query of :meth:`dynamic_pivot_fields`, in that
        order. They become string literals built by the dialect's generator (which escapes
        them) and compare with the field as DuckDB casts them, exactly as its dynamic PIVOT does,
        so the columns keep their names and order.

        Raises:
            ValueError: a field without values (DuckDB cannot list an empty IN).
        """
        query = copy.copy(self)
        query._tree = self._tree.copy()
        remaining = iter(values)
        for pivot in _dynamic_pivots(query._tree):
            fields = []
            for field in pivot.expressions:
                if isinstance(field, exp.In):
                    fields.append(field)
                    continue
                listed = list(next(remaining))
                if not listed:
                    raise ValueError(
                        f"the PIVOT field {field.sql(dialect=self.dialect)!r} has no non-NULL values, "
                        f"so its columns are unknown; list them with ON ... IN (...)"
                    )
                literals = [exp.Literal.string(v) for v in listed]
                fields.append(exp.In(this=_operand(field), expressions=literals))
            pivot.set("expressions", fields)
        return query

    def _keep_with(self, tree: exp.Expr) -> None:
        """Give a query built from parts of the user's tree the user's CTEs."""
        with_ = self._tree.args.get("with_")
        if with_ is not None:
            tree.set("with_", with_.copy())

    def _wrapped(self, alias: str) -> exp.Select:
        return exp.select("*").from_(
            exp.Subquery(this=self._tree.copy(), alias=exp.TableAlias(this=exp.to_identifier(alias)))
        )


def _dynamic_pivots(tree: exp.Expr) -> list[exp.Pivot]:
    """PIVOT statements (anywhere in ``tree``) with an ``ON`` field whose values come from data."""
    return [
        p
        for p in tree.find_all(exp.Pivot)
        # Only the statement form has a source in ``this``; ``t PIVOT (... FOR k IN ...)`` lists its values.
        if p.this is not None
        and not p.args.get("unpivot")
        and not all(isinstance(f, exp.In) for f in p.expressions)
    ]


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


def _selects_rows(select: exp.Select) -> bool:
    """True when ``select`` returns its FROM/WHERE rows one for one: no grouping, DISTINCT,
    limit, nor a projection that aggregates, windows or unnests."""
    if any(select.args.get(k) for k in ("group", "having", "qualify", "distinct", "limit", "offset")):
        return False
    return not any(e.find(*_ROW_CHANGING) for e in select.expressions)


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
    # The keys range over the rows the WHERE lets through (that is where subqueries filter), so
    # what groups, windows or limits those rows goes: it may not even admit the keys.
    for clause in ("group", "having", "qualify", "windows", "order", "limit", "offset"):
        select.set(clause, None)
    return select
