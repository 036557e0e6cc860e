"""The wrap-and-filter rewrites: the user's query split into subqueries by its keys.

How a query is split: a partition is the rows of the query's *result* whose key expressions
(over its result columns) equal the key values, so every subquery is the query wrapped,
``SELECT * FROM (Q) AS _ddb_q WHERE (key) = $1``, and the engine pushes the predicate down
where that is the same rows (DuckDB and PostgreSQL push it through projections, UNION ALL
branches, ORDER BY, and grouping or windows by the key; they keep it above a LIMIT or a window
that does not partition by it). A key reading a column that is not a result column is refused
("select it"): whatever it read below the result could be another column of the same name
(``SELECT day AS g``, a UNION's positional columns, ``* REPLACE``). Scheme values are carried
only as numbered parameters (``$1``, ``$2``), never as SQL text. The outer query is ordered as Q
(see :mod:`ddbloader._sql.ordering`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from .aliases import GROUP_ALIAS, KEY_ALIASES, REPARTITION_ALIAS
from .fingerprint import HASH_ALIAS
from .names import same_name
from .ordering import ResolvedOrder, ResultOrder, order_owner
from .parsing import reader, short_sql

__all__ = [
    "Tally",
    "WrappedQuery",
    "operand",
    "parameter_any",
    "parameter_equals",
    "parameter_in",
    "subquery",
]


def operand(expression: exp.Expr) -> exp.Expr:
    """``expression`` made safe as an operand: ``a OR b`` must not become ``a OR b = $1``.

    Everything but a column, a literal or a parenthesis is parenthesised: sqlglot models
    ``AND``/``OR`` and the operators as functions too, so "is it a function" cannot tell.
    """
    if isinstance(expression, (exp.Column, exp.Literal, exp.Paren)):
        return expression.copy()
    return exp.Paren(this=expression.copy())


def _parameter(number: int) -> exp.Parameter:
    return exp.Parameter(this=exp.Literal.number(number))


def parameter_equals(expression: exp.Expr, number: int) -> exp.Expr:
    """``(expression) = $number``: numbered, so set-operation branches can share parameters."""
    return exp.EQ(this=operand(expression), expression=_parameter(number))


def parameter_in(expression: exp.Expr, first: int, count: int) -> exp.Expr:
    """``expression IN ($first, ..., $first+count-1)``: one bound parameter per value."""
    return exp.In(this=operand(expression), expressions=[_parameter(first + n) for n in range(count)])


def parameter_any(expression: exp.Expr, number: int) -> exp.Expr:
    """``expression = ANY($number)``: the values bound as one list parameter."""
    return exp.EQ(this=operand(expression), expression=exp.Any(this=exp.Paren(this=_parameter(number))))


def subquery(tree: exp.Expr, alias: str) -> exp.Subquery:
    return exp.Subquery(this=tree, alias=exp.TableAlias(this=exp.to_identifier(alias)))


@dataclass(frozen=True)
class Tally:
    """A figure the planning counts add per subquery: ``aggregate`` over ``row``, a per-row
    expression over the query's result, as column ``alias`` (see
    :meth:`~ddbloader._sql.query.UserQuery.with_tallies`). With ``descents``, ``row`` is compared
    with its value on the previous row of its subquery (the query's order): the row counts 1 where
    it is lower, else 0."""

    alias: str
    row: exp.Expr
    aggregate: type[exp.AggFunc]
    descents: bool = False


class WrappedQuery(ResultOrder):
    """The user's query wrapped and filtered by its keys (see the module docstring).

    A base of :class:`~ddbloader._sql.query.UserQuery`, which sets the attributes declared here;
    it holds no state of its own.
    """

    _row_hash: exp.Expr | None
    _tallies: tuple[Tally, ...]

    def render(self, tree: exp.Expr) -> str:
        """Render a derived query in the engine's dialect."""
        return tree.sql(dialect=reader(self.dialect))

    def filtered(self, columns: Sequence[exp.Expr]) -> str:
        """The query's rows where ``column_i = $i`` for each of ``columns``, in the query's order.

        The query is wrapped (see the module docstring). Parameters bind in the order of
        ``columns``. With a row hash, its column comes last.

        Raises:
            ValueError: the query can be neither injected into nor wrapped for these keys; the
                message names the construct and the key, and says what to select.
        """
        if not columns and self._row_hash is None:
            return self.render(self._tree.copy())
        if not columns:
            inner, order, listed = self._ordered_wrap()
            tree: exp.Expr = exp.select(*listed).from_(subquery(inner, "_ddb_q"))
            if order is not None:
                tree.set("order", order)
        else:
            predicate = exp.and_(*(parameter_equals(c, n) for n, c in enumerate(columns, start=1)))
            tree = self._filter(columns, predicate)
        if self._row_hash is not None:
            assert isinstance(tree, exp.Select)
            tree = tree.select(self._row_hash.copy().as_(HASH_ALIAS), copy=False)
        return self.render(tree)

    def filtered_many(
        self, columns: Sequence[exp.Expr], counts: Sequence[int | None], *, lists: bool = False
    ) -> str | None:
        """The rows of many subqueries in one query, each row tagged with its key values.

        ``column_i IN ($k, ..., $k+n_i-1)`` for each of ``columns`` whose count ``n_i`` is not None
        is AND-ed into the WHERE as :meth:`filtered` does it (parameters numbered on across the
        columns, in order); with ``lists``, ``column_i = ANY($k)`` binds the values as one list
        parameter instead (an engine that binds lists compares them as a set, where a long IN
        list of parameters is compared one by one). Every one of ``columns`` is selected after
        the query's own columns as :data:`KEY_ALIASES`, so the client can split the result by
        key (:func:`~ddbloader._io.unit_split.split_by_key`). Rows of one key keep the query's
        order, since the predicate and the added columns change no row's place.

        Never None for this class (the keys are selected by the outer query of the wrap, so
        they change nothing the query returns); an engine's own :class:`Query` may return None
        where it cannot select its keys, and those subqueries are fetched one by one.
        """
        self._check_keys(columns)
        inner, order, listed = self._ordered_wrap()
        hashed = [] if self._row_hash is None else [self._row_hash.copy().as_(HASH_ALIAS)]
        outer = exp.select(
            *listed,
            *hashed,
            *(operand(c).as_(a) for c, a in zip(columns, KEY_ALIASES[: len(columns)], strict=True)),
        ).from_(subquery(inner, "_ddb_q"))
        terms = []
        number = 1
        for column, count in zip(columns, counts, strict=True):
            if count is not None and lists:
                terms.append(parameter_any(column, number))
                number += 1
            elif count is not None:
                terms.append(parameter_in(column, number, count))
                number += count
        if terms:
            outer = outer.where(exp.and_(*terms), copy=False)
        if order is not None:
            outer.set("order", order)
        return self.render(outer)

    def filtered_where(self, columns: Sequence[exp.Expr], predicate: exp.Expr, *, ordered: bool) -> exp.Expr:
        """:meth:`filtered`'s query (``column_i = $i``) AND-ed with ``predicate`` over the
        result columns (its parameters numbered after the keys'), as a tree to render or wrap;
        in the query's order when ``ordered``, else without the outer ORDER BY. With a row hash,
        its column comes last, as in :meth:`filtered`."""
        keys = [parameter_equals(c, n) for n, c in enumerate(columns, start=1)]
        tree = self._filter(columns, exp.and_(*keys, predicate))
        if not ordered:
            tree.set("order", None)
        if self._row_hash is not None:
            assert isinstance(tree, exp.Select)
            tree = tree.select(self._row_hash.copy().as_(HASH_ALIAS), copy=False)
        return tree

    def _filter(self, columns: Sequence[exp.Expr], predicate: exp.Expr) -> exp.Expr:
        """``SELECT * FROM (Q) AS _ddb_q WHERE predicate``, ordered as Q (see the module docstring)."""
        self._check_keys(columns)
        inner, order, listed = self._ordered_wrap()
        outer = exp.select(*listed).from_(subquery(inner, "_ddb_q")).where(predicate, copy=False)
        if order is not None:
            outer.set("order", order)
        return outer

    def _ordered_wrap(self) -> tuple[exp.Expr, exp.Order | None, list[exp.Expr]]:
        """The query to wrap, the ORDER BY of the outer query, and the outer query's columns.

        The query carries the ORDER BY terms it does not select as hidden columns (see
        :mod:`ddbloader._sql.ordering`); the outer query then lists the result columns by name,
        leaving those out, else selects ``*``. Where the outer ORDER BY restates the query's
        own, the query's is dropped (unless a LIMIT/OFFSET needs it): the engine then sorts
        each partition once, not twice.

        Raises:
            ValueError: an ORDER BY term that cannot be resolved exactly (see
                :meth:`~ddbloader._sql.ordering.ResultOrder.resolved_order`), or hidden columns
                over a result whose column names are not known or not unique.
        """
        resolved = self.resolved_order()
        inner = self._carried(resolved)
        if resolved is None:
            return inner, None, [exp.Star()]
        if not (inner.args.get("limit") or inner.args.get("offset")):
            inner.set("order", None)
        order = exp.Order(expressions=[t.copy() for t in resolved.terms])
        return inner, order, self._listed(resolved)

    def _carried(self, resolved: ResolvedOrder | None) -> exp.Expr:
        """A copy of the query with the hidden ORDER BY columns added to its SELECT list."""
        tree = self._tree.copy()
        if resolved is None or not resolved.hidden:
            return tree
        owner = order_owner(tree)
        assert isinstance(owner, exp.Select)
        owner.select(*(h.copy() for h in resolved.hidden), copy=False)
        return tree

    def _listed(self, resolved: ResolvedOrder) -> list[exp.Expr]:
        """The outer query's columns: ``*``, or the result columns by name where hidden ones
        must be left out."""
        if not resolved.hidden:
            return [exp.Star()]
        output = self._output_names()
        names = None if output is None else list(output)
        if names is None or len(set(names)) != len(names):
            term = resolved.hidden[0].this
            raise ValueError(
                f"cannot keep this query's order when splitting it: the ORDER BY term "
                f"{short_sql(term, self.dialect)!r} is not a result column, and the result's columns "
                f"{'are not known' if names is None else 'repeat a name'}, so it cannot be carried "
                f"alongside them; select it"
            )
        return [exp.column(n, table="_ddb_q", quoted=True) for n in names]

    def _keys(self, columns: Sequence[exp.Expr]) -> exp.Query:
        """The query's rows reduced to their keys (``_ddb_group``, ``_ddb_repartition``).

        Q's own top-level ORDER BY is dropped where no LIMIT/OFFSET needs it: counts ignore order.
        """
        self._check_keys(columns)
        aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(columns)]
        keyed = [operand(c).as_(a) for c, a in zip(columns, aliases, strict=True)]
        tree = self._tree.copy()
        if self._row_hash is not None:  # hashed over the rows the fetches hash
            keyed.append(self._row_hash.copy().as_(HASH_ALIAS))
            tree = self._carried(self.resolved_order())
        for tally in self._tallies:
            row = operand(tally.row)
            if tally.descents:
                tree = self._carried(self.resolved_order())
                row = self._descent(row, columns)
            keyed.append(row.as_(tally.alias))
        if not (tree.args.get("limit") or tree.args.get("offset")):
            tree.set("order", None)
        return exp.select(*keyed).from_(subquery(tree, "_ddb_q"))

    def _descent(self, row: exp.Expr, columns: Sequence[exp.Expr]) -> exp.Expr:
        """``CASE WHEN row < LAG(row) OVER (PARTITION BY keys ORDER BY the query's order) THEN 1
        ELSE 0 END``: 1 on each row where ``row`` is lower than on the row before it in its subquery.

        Raises:
            ValueError: the query has no ORDER BY, so its rows have no previous row.
        """
        resolved = self.resolved_order()
        if resolved is None:
            raise ValueError(
                "the query has no ORDER BY, so its rows have no order in which a column could be checked "
                "to never decrease; add an ORDER BY that orders each series' rows"
            )
        window = exp.Window(
            this=exp.Lag(this=row.copy()),
            partition_by=[operand(c) for c in columns],
            order=exp.Order(expressions=[t.copy() for t in resolved.terms]),
        )
        lower = exp.LT(this=row, expression=window)
        return exp.Case(ifs=[exp.If(this=lower, true=exp.Literal.number(1))], default=exp.Literal.number(0))

    def _check_keys(self, columns: Sequence[exp.Expr]) -> None:
        """Refuse keys the query's result cannot be filtered by, and an order the split cannot keep.

        Raises:
            ValueError: a key reads a column that is not one of the query's result columns (the
                message names it and says to select it), or an ORDER BY term cannot order the
                outer query (see :meth:`_ordered_wrap`).
        """
        for key in columns:
            self.check_key(key, repr(short_sql(key, self.dialect)))
        if columns:
            self._ordered_wrap()

    def check_key(self, column: exp.Expr, name: str) -> None:
        """Refuse a key (called ``name`` in the message) that reads a column the result lacks.

        Raises:
            ValueError: naming the key and the column, and saying to select it.
        """
        missing = self._not_output(column)
        if missing:
            raise ValueError(
                f"cannot split this query by {name}: a partition is the rows of the query's result "
                f"whose key equals a value, and {missing!r} is not one of its result columns; "
                f"select it (or split by a column the query selects)"
            )

    def _not_output(self, key: exp.Expr) -> str | None:
        """The first column of ``key`` that the query's result does not have, as written."""
        output = self._output_names()
        for column in key.find_all(exp.Column):
            if column.table:
                return column.sql(dialect=self.dialect)
            if output is not None and not any(same_name(column.this, n) for n in output):
                return column.sql(dialect=self.dialect)
        return None

    def _keep_with(self, tree: exp.Expr) -> None:
        """Give a query built from parts of the user's tree the user's CTEs."""
        with_ = self._tree.args.get("with_")
        if with_ is not None:
            tree.set("with_", with_.copy())

    def _wrapped(self, alias: str) -> exp.Select:
        return exp.select("*").from_(subquery(self._tree.copy(), alias))
