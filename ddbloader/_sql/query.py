"""The user's SQL, parsed once with sqlglot, and every query the loader derives from it.

Invariants: the user's query is a single read-only statement (SELECT / WITH / set operation /
PIVOT) without parameters of its own; every derived query carries scheme values only as
numbered parameters (``$1``, ``$2``), so the engine binds them and no scheme value ever becomes
SQL text. The one exception is data, not input: the values a dynamic PIVOT found in the table,
which :meth:`UserQuery.pinned` writes as literals built by the dialect's generator (DuckDB
accepts no parameter at all in a query that holds a dynamic PIVOT).

How a query is split: a partition is the rows of the query's *result* whose key expressions
(over its result columns) equal the key values, so every subquery is the query wrapped,
``SELECT * FROM (Q) AS _ddb_q WHERE (key) = $1``, and the engine pushes the predicate down
where that is the same rows (DuckDB and PostgreSQL push it through projections, UNION ALL
branches, ORDER BY, and grouping or windows by the key; they keep it above a LIMIT or a window
that does not partition by it). A key reading a column that is not a result column is refused
("select it"): whatever it read below the result could be another column of the same name
(``SELECT day AS g``, a UNION's positional columns, ``* REPLACE``). Q's ORDER BY is applied
again on the outer query, mapped to result columns; a term that is not one is refused by name,
except on DuckDB, which keeps a filtered subquery's order (WHERE and SELECT preserve order, per
its documentation).
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import SqlglotError
from sqlglot.parsers.duckdb import DuckDBParser
from sqlglot.tokenizer_core import TokenType

from .fingerprint import HASH_ALIAS, HASH_SUM_ALIAS, hash_sum

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
#: Column of :meth:`UserQuery.key_counts` holding the position of the matched scheme value.
INDEX_SUFFIX = "_index"
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
# A key is compared with ``=`` once per row, so it must be one scalar value per row.
_NOT_SCALAR: tuple[type[exp.Expr], ...] = (exp.Alias, exp.Star, exp.AggFunc, exp.Window, exp.UDTF)
#: Dialects that keep a subquery's order through an outer filter (DuckDB documents that WHERE
#: and SELECT preserve their input's order).
_KEEPS_SUBQUERY_ORDER = frozenset({"duckdb"})


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


class _DuckDBWithPivotStatements(DuckDB):
    Parser = _PivotStatementParser


def _reader(dialect: str) -> Any:
    return _DuckDBWithPivotStatements if dialect == "duckdb" else dialect


def _parse(text: str, dialect: str) -> list[exp.Expr]:
    return [s for s in sqlglot.parse(text, read=_reader(dialect)) if s is not None]


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


def _operand(expression: exp.Expr) -> exp.Expr:
    """``expression`` made safe as an operand: ``a OR b`` must not become ``a OR b = $1``.

    Everything but a column, a literal or a parenthesis is parenthesised: sqlglot models
    ``AND``/``OR`` and the operators as functions too, so "is it a function" cannot tell.
    """
    if isinstance(expression, (exp.Column, exp.Literal, exp.Paren)):
        return expression.copy()
    return exp.Paren(this=expression.copy())


def _parameter(number: int) -> exp.Parameter:
    return exp.Parameter(this=exp.Literal.number(number))


def _parameter_equals(expression: exp.Expr, number: int) -> exp.Expr:
    """``(expression) = $number``: numbered, so set-operation branches can share parameters."""
    return exp.EQ(this=_operand(expression), expression=_parameter(number))


def _parameter_in(expression: exp.Expr, first: int, count: int) -> exp.Expr:
    """``expression IN ($first, ..., $first+count-1)``: one bound parameter per value."""
    return exp.In(this=_operand(expression), expressions=[_parameter(first + n) for n in range(count)])


def _parameter_any(expression: exp.Expr, number: int) -> exp.Expr:
    """``expression = ANY($number)``: the values bound as one list parameter."""
    return exp.EQ(this=_operand(expression), expression=exp.Any(this=exp.Paren(this=_parameter(number))))


def _subquery(tree: exp.Expr, alias: str) -> exp.Subquery:
    return exp.Subquery(this=tree, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _text(node: exp.Expr, dialect: str, limit: int = 80) -> str:
    text = node.sql(dialect=dialect)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Query(Protocol):
    """What the plan needs from the user's parsed query, whatever the engine's SQL.

    :class:`UserQuery` implements it with sqlglot. An engine sqlglot cannot parse brings its own
    through ``Backend.query(sql)`` (DolphinDB's ``DolphinDBQuery``); column expressions are then
    whatever its ``column()`` returns, and its derived SQL carries its own parameter markers.
    """

    text: str

    def column(self, text: str, parameter: str) -> Any: ...
    def filtered(self, columns: Sequence[Any]) -> str: ...
    def filtered_many(
        self, columns: Sequence[Any], counts: Sequence[int | None], *, lists: bool = False
    ) -> str | None: ...
    def null_rows(self, columns: Sequence[Any]) -> str: ...
    def count(self, sql: str) -> str: ...
    def schema(self) -> str: ...
    def null_counts(self, columns: Sequence[str]) -> str: ...
    def distinct_values(self, columns: Sequence[Any], *, with_counts: bool) -> str: ...
    def counts_are_groupable(self) -> bool: ...
    def is_ordered(self) -> bool: ...
    def dynamic_pivot_fields(self) -> list[str]: ...
    def pinned(self, values: Sequence[Sequence[str]]) -> Query: ...
    def with_output(self, names: Sequence[str]) -> Query: ...


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
        if dialect == "clickhouse":
            _refuse_last_branch_order(tree, dialect)
        self._tree = tree
        self._output: tuple[str, ...] | None = None
        #: the engine's row hash (verify=True, see :mod:`ddbloader._sql.fingerprint`): when set,
        #: the fetch queries end with it and the planning counts sum it
        self._row_hash: exp.Expr | None = None

    def column(self, text: str, parameter: str) -> exp.Expr:
        """:func:`parse_column_expression` in this query's dialect."""
        return parse_column_expression(text, parameter, self.dialect)

    def render(self, tree: exp.Expr) -> str:
        """Render a derived query in the engine's dialect."""
        return tree.sql(dialect=self.dialect)

    def with_output(self, names: Sequence[str]) -> UserQuery:
        """This query knowing its result column names (from a schema probe), so keys and ORDER BY
        terms can be checked against the output of a ``SELECT *``."""
        query = copy.copy(self)
        query._output = tuple(names)
        return query

    def with_row_hash(self, row_hash: exp.Expr) -> UserQuery:
        """This query fingerprinting its rows with ``row_hash`` (an expression over ``_ddb_q``):
        :meth:`filtered` and :meth:`filtered_many` add it as column ``_ddb_hash`` after the
        query's own; :meth:`key_counts` and :meth:`count` (of a :meth:`filtered` query) sum it as
        text in ``_ddb_hash_sum``."""
        query = copy.copy(self)
        query._row_hash = row_hash
        return query

    @property
    def hashes_rows(self) -> bool:
        """Whether this query fingerprints its rows (see :meth:`with_row_hash`)."""
        return self._row_hash is not None

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
            inner, order = self._ordered_wrap()
            tree: exp.Expr = exp.select("*").from_(_subquery(inner, "_ddb_q"))
            if order is not None:
                tree.set("order", order)
        else:
            predicate = exp.and_(*(_parameter_equals(c, n) for n, c in enumerate(columns, start=1)))
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
        key (:func:`~ddbloader._epoch.unit_split.split_by_key`). Rows of one key keep the query's
        order, since the predicate and the added columns change no row's place.

        Never None for this class (the keys are selected by the outer query of the wrap, so
        they change nothing the query returns); an engine's own :class:`Query` may return None
        where it cannot select its keys, and those subqueries are fetched one by one.
        """
        self._check_keys(columns)
        inner, order = self._ordered_wrap()
        hashed = [] if self._row_hash is None else [self._row_hash.copy().as_(HASH_ALIAS)]
        outer = exp.select(
            exp.Star(),
            *hashed,
            *(_operand(c).as_(a) for c, a in zip(columns, KEY_ALIASES[: len(columns)], strict=True)),
        ).from_(_subquery(inner, "_ddb_q"))
        terms = []
        number = 1
        for column, count in zip(columns, counts, strict=True):
            if count is not None and lists:
                terms.append(_parameter_any(column, number))
                number += 1
            elif count is not None:
                terms.append(_parameter_in(column, number, count))
                number += count
        if terms:
            outer = outer.where(exp.and_(*terms), copy=False)
        if order is not None:
            outer.set("order", order)
        return self.render(outer)

    def null_rows(self, columns: Sequence[exp.Expr]) -> str:
        """Count the query's rows where any of ``columns`` is NULL: the rows no subquery matches."""
        predicate = exp.or_(*(exp.Is(this=_operand(c), expression=exp.Null()) for c in columns))
        return self.count(self.render(self._filter(columns, predicate)))

    def count(self, sql: str) -> str:
        """``SELECT count(*)`` over a (derived) query; with a row hash, also the sum of ``sql``'s
        hash column (``sql`` is then one of :meth:`filtered`)."""
        inner = sqlglot.parse_one(sql, read=_reader(self.dialect))
        return self.render(
            exp.select(exp.Count(this=exp.Star()).as_(ROWS_ALIAS), *self._hash_sum()).from_(
                _subquery(inner, "_ddb_count")
            )
        )

    def _hash_sum(self) -> list[exp.Expr]:
        """The exact sum of ``_ddb_hash`` as text (:func:`~ddbloader._sql.fingerprint.hash_sum`:
        a sum of 64-bit hashes is exact as text on every driver) ``AS _ddb_hash_sum`` with a row
        hash, else nothing."""
        if self._row_hash is None:
            return []
        return [hash_sum(self.dialect).as_(HASH_SUM_ALIAS)]

    def schema(self) -> str:
        """The user's query returning no rows, to read its result schema."""
        return self.render(self._wrapped("_ddb_schema").limit(0))

    def key_schema(self, columns: Sequence[exp.Expr]) -> str:
        """The key expressions over the query's result, returning no rows: to read their types."""
        return self.render(self._keys(columns).limit(0))

    def as_text(self, column: exp.Expr) -> exp.Expr:
        """``CAST(column AS TEXT)`` in the engine's dialect: the engine's own text of a key value."""
        return exp.Cast(this=_operand(column), to=exp.DataType.build("text"))

    def null_counts(self, columns: Sequence[str]) -> str:
        """Null count per result column, named like the columns."""
        counts = [
            (exp.Count(this=exp.Star()) - exp.Count(this=exp.column(c, quoted=True))).as_(c, quoted=True)
            for c in columns
        ]
        return self.render(self._wrapped("_ddb_nulls").select(*counts, append=False))

    def distinct_values(self, columns: Sequence[exp.Expr], *, with_counts: bool) -> str:
        """Distinct values of ``columns`` over the query's rows, sorted (NULL last), with counts.

        Exact for every query :meth:`filtered` can split: the keys are evaluated where the
        subqueries evaluate them, on the rows the subqueries hold.
        """
        aliases = [exp.column(a) for a in (GROUP_ALIAS, REPARTITION_ALIAS)[: len(columns)]]
        counted = [exp.Count(this=exp.Star()).as_(ROWS_ALIAS)] if with_counts else []
        outer = (
            exp.select(*aliases, *counted)
            .from_(_subquery(self._keys(columns), "_ddb_keys"))
            .group_by(*aliases)
        )
        outer.set(
            "order", exp.Order(expressions=[exp.Ordered(this=a.copy(), nulls_first=False) for a in aliases])
        )
        return self.render(outer)

    def key_counts(
        self,
        columns: Sequence[exp.Expr],
        schemes: Sequence[Sequence[Any] | None],
        *,
        lists: bool = False,
    ) -> tuple[str, tuple[Any, ...]]:
        """One query counting the rows of every subquery, and its parameters.

        Per distinct combination of the keys' values (as the engine groups them), it returns the
        values (``_ddb_group``, ``_ddb_repartition``), the row count (``_ddb_rows``) and, for each
        key with an explicit scheme, the position in that scheme of each value that equals it in
        SQL (``_ddb_group_index`` / ``_ddb_repartition_index``; a combination is returned once per
        matching scheme value, and not at all when none matches). The scheme values are bound as
        parameters (see :func:`_scheme_list`; ``lists``: the backend binds a list as one
        parameter) joined to the keys, so the engine compares them as a subquery's ``key = $1``
        does; one list per Python type, because a list column takes one type and an engine may
        refuse to unify, say, text with integers where it compares each with the key just fine.
        Rows are sorted by the key values, NULL last.
        """
        aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(columns)]
        counted = (
            exp.select(*aliases, exp.Count(this=exp.Star()).as_(ROWS_ALIAS), *self._hash_sum())
            .from_(_subquery(self._keys(columns), "_ddb_annotated"))
            .group_by(*aliases)
        )
        values: list[Any] = []
        scheme_tables: list[tuple[str, exp.Expr]] = []
        tables: list[list[str | None]] = []
        for alias, scheme in zip(aliases, schemes, strict=True):
            if scheme is None:
                tables.append([None])
                continue
            by_type: dict[type, list[int]] = {}
            for position, value in enumerate(scheme):
                by_type.setdefault(type(value), []).append(position)
            names = []
            for positions in by_type.values():
                names.append(f"{alias}_scheme{len(scheme_tables)}")
                scheme_tables.append(
                    (names[-1], _scheme_list(positions, [scheme[p] for p in positions], values, lists))
                )
            tables.append(list(names))
        branches: list[exp.Query] = [
            _matched_keys(aliases, c, self._row_hash is not None) for c in itertools.product(*tables)
        ]
        matched = functools.reduce(lambda a, b: exp.union(a, b, distinct=False, copy=False), branches)
        outer = (
            exp.select("*")
            .from_(_subquery(matched, "_ddb_matched"), copy=False)
            .with_("_ddb_keys", as_=counted, copy=False)
        )
        for name, rows_ in scheme_tables:
            alias_ = exp.TableAlias(
                this=exp.to_identifier(name),
                columns=[exp.to_identifier("_ddb_index"), exp.to_identifier("_ddb_value")],
            )
            outer = outer.with_(alias_, as_=rows_, copy=False)
        outer.set(
            "order",
            exp.Order(expressions=[exp.Ordered(this=exp.column(a), nulls_first=False) for a in aliases]),
        )
        return self.render(outer), tuple(values)

    def counts_are_groupable(self) -> bool:
        """True: :meth:`distinct_values` counts every subquery's rows exactly (see there)."""
        return True

    def order_key(self, keys: Sequence[exp.Expr]) -> exp.Ordered | None:
        """The leading term of the query's ORDER BY that is none of ``keys`` (the partition keys,
        constant within a partition), restated over its result columns as the split restates it
        (an ordinal becomes the column it names), or None: no ORDER BY, no such term, or a term
        that is not a result column (see :meth:`_outer_order`)."""
        try:
            order = self._outer_order()
        except ValueError:
            return None
        names = self._output_names()
        for ordered in order.expressions if order is not None else []:
            term = ordered.copy()
            if isinstance(term.this, exp.Literal):
                position = int(term.this.name)
                if names is None or not 0 < position <= len(names):
                    return None
                term.set("this", exp.column(names[position - 1], quoted=True))
            if not any(_same_expression(term.this, key) for key in keys):
                return term if isinstance(term, exp.Ordered) else None
        return None

    def filtered_where(self, columns: Sequence[exp.Expr], predicate: exp.Expr, *, ordered: bool) -> exp.Expr:
        """:meth:`filtered`'s query (``column_i = $i``) AND-ed with ``predicate`` over the
        result columns (its parameters numbered after the keys'), as a tree to render or wrap;
        in the query's order when ``ordered``, else without the outer ORDER BY. With a row hash,
        its column comes last, as in :meth:`filtered`."""
        keys = [_parameter_equals(c, n) for n, c in enumerate(columns, start=1)]
        tree = self._filter(columns, exp.and_(*keys, predicate))
        if not ordered:
            tree.set("order", None)
        if self._row_hash is not None:
            assert isinstance(tree, exp.Select)
            tree = tree.select(self._row_hash.copy().as_(HASH_ALIAS), copy=False)
        return tree

    def is_ordered(self) -> bool:
        """Whether the query states its rows' order (a top-level ORDER BY)."""
        return self._tree.args.get("order") is not None

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

    # --- how the query is split ---------------------------------------------------------------

    def _filter(self, columns: Sequence[exp.Expr], predicate: exp.Expr) -> exp.Expr:
        """``SELECT * FROM (Q) AS _ddb_q WHERE predicate``, ordered as Q (see the module docstring)."""
        self._check_keys(columns)
        inner, order = self._ordered_wrap()
        outer = exp.select("*").from_(_subquery(inner, "_ddb_q")).where(predicate, copy=False)
        if order is not None:
            outer.set("order", order)
        return outer

    def _ordered_wrap(self) -> tuple[exp.Expr, exp.Order | None]:
        """The query to wrap and the ORDER BY of the outer query.

        Where the outer ORDER BY restates the query's own, the query's is dropped (unless a
        LIMIT/OFFSET needs it): the engine then sorts each partition once, not twice.
        """
        inner = self._tree.copy()
        order = self._outer_order()
        if order is not None and not (inner.args.get("limit") or inner.args.get("offset")):
            inner.set("order", None)
        return inner, order

    def _keys(self, columns: Sequence[exp.Expr]) -> exp.Query:
        """The query's rows reduced to their keys (``_ddb_group``, ``_ddb_repartition``).

        Q's own top-level ORDER BY is dropped where no LIMIT/OFFSET needs it: counts ignore order.
        """
        self._check_keys(columns)
        aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(columns)]
        keyed = [_operand(c).as_(a) for c, a in zip(columns, aliases, strict=True)]
        if self._row_hash is not None:
            keyed.append(self._row_hash.copy().as_(HASH_ALIAS))
        tree = self._tree.copy()
        if not (tree.args.get("limit") or tree.args.get("offset")):
            tree.set("order", None)
        return exp.select(*keyed).from_(_subquery(tree, "_ddb_q"))

    def _check_keys(self, columns: Sequence[exp.Expr]) -> None:
        """Refuse keys the query's result cannot be filtered by, and an order the split cannot keep.

        Raises:
            ValueError: a key reads a column that is not one of the query's result columns (the
                message names it and says to select it), or an ORDER BY term cannot order the
                outer query (see :meth:`_outer_order`).
        """
        for key in columns:
            self.check_key(key, repr(_text(key, self.dialect)))
        if columns:
            self._outer_order()

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
            if output is not None and not any(_same(column.this, n) for n in output):
                return column.sql(dialect=self.dialect)
        return None

    def _output_names(self) -> tuple[str, ...] | None:
        if self._output is not None:
            return self._output
        select = _first_select(self._tree)
        if select is None or any(_starred(p) for p in select.expressions):
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
        select = _first_select(top)
        projections = list(select.expressions) if select is not None else []
        terms = []
        for term in order.expressions:
            mapped = self._output_term(term.this, projections)
            if mapped is None and self.dialect in _KEEPS_SUBQUERY_ORDER:
                return None  # the filter keeps the wrapped query's order as it is
            if mapped is None:
                raise ValueError(
                    f"cannot keep this query's order when splitting it: the split is applied to "
                    f"the query's result, whose order {self.dialect} keeps only when ORDER BY is "
                    f"applied to it again, and the ORDER BY term "
                    f"{_text(term.this, self.dialect)!r} is not a result column; select it"
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
        starred = any(_starred(p) for p in projections)
        for position, projection in enumerate(projections, start=1):
            inner = projection.this if isinstance(projection, exp.Alias) else projection
            named = (
                isinstance(term, exp.Column) and not term.table and _same(term.this, projection.alias_or_name)
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
            and any(_same(term.this, n) for n in output)
            and not any(_modified_star(p) for p in projections)
        ):
            return exp.Column(this=term.this.copy())
        if isinstance(term, exp.Column) or term.find(exp.Query, *_NOT_SCALAR) or not term.find(exp.Column):
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
        aliased = {_name_of(p.args["alias"]) for p in projections if isinstance(p, exp.Alias)}
        if _name(column) in aliased:
            return None
        for projection in projections:
            if isinstance(projection, exp.Column) and projection == column:
                return exp.Column(this=projection.this.copy())
        return None

    def _keep_with(self, tree: exp.Expr) -> None:
        """Give a query built from parts of the user's tree the user's CTEs."""
        with_ = self._tree.args.get("with_")
        if with_ is not None:
            tree.set("with_", with_.copy())

    def _wrapped(self, alias: str) -> exp.Select:
        return exp.select("*").from_(_subquery(self._tree.copy(), alias))


def _same_expression(a: exp.Expr, b: exp.Expr) -> bool:
    """Whether two expressions read the same: columns by name as the engine resolves them."""
    if isinstance(a, exp.Column) and isinstance(b, exp.Column) and not a.table and not b.table:
        return _name(a) == _name(b)
    return bool(a == b)


def _refuse_last_branch_order(tree: exp.Expr, dialect: str) -> None:
    """Refuse ClickHouse's ``A UNION ALL B ORDER BY x`` (or LIMIT/OFFSET): ClickHouse applies it
    to the last SELECT only, where every other engine (and a reader) applies it to the union.

    Raises:
        ValueError: naming the construct and the two ways to write what is meant.
    """
    node = _unwrap(tree)
    if not isinstance(node, exp.SetOperation):
        return
    last = node.expression
    modifier = next((m for m in ("order", "limit", "offset") if last.args.get(m) is not None), None)
    if isinstance(last, exp.Select) and modifier is not None:
        clause = {"order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET"}[modifier]
        raise ValueError(
            f"sql ends its {node.key.upper()} with {clause} ({_text(last.args[modifier], dialect)!r}), "
            f"which ClickHouse applies to the last SELECT only, not to the whole union: wrap the union "
            f"to apply it to all rows (SELECT * FROM (... UNION ALL ...) {clause} ...), or parenthesise "
            f"the last SELECT to mean that one"
        )


def _name(column: exp.Column) -> str:
    """A column's name as the engine resolves it: quoted exactly, unquoted case-insensitively."""
    return _name_of(column.this)


def _same(identifier: exp.Expr, name: str) -> bool:
    if isinstance(identifier, exp.Identifier) and identifier.args.get("quoted"):
        return identifier.name == name
    return identifier.name.casefold() == name.casefold()


def _name_of(identifier: exp.Expr) -> str:
    """An identifier's name as the engine resolves it (see :func:`_name`)."""
    name = str(identifier.name)
    return name if identifier.args.get("quoted") else name.casefold()


def _starred(projection: exp.Expr) -> bool:
    """True for ``*`` and ``t.*`` (with DuckDB's EXCLUDE/REPLACE): columns unknown to the text."""
    return isinstance(projection, exp.Star) or (
        isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
    )


def _modified_star(projection: exp.Expr) -> bool:
    """True for DuckDB's ``* REPLACE (...)`` / ``* RENAME (...)``: result names over other values."""
    star = projection.this if isinstance(projection, exp.Column) else projection
    return isinstance(star, exp.Star) and bool(star.args.get("replace") or star.args.get("rename"))


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Subquery):
        node = node.this
    return node


def _first_select(node: exp.Expr) -> exp.Select | None:
    """The SELECT whose list names the query's result columns (a set operation's first branch)."""
    node = _unwrap(node)
    while isinstance(node, exp.SetOperation):
        node = _unwrap(node.left)
    return node if isinstance(node, exp.Select) else None


def _scheme_list(positions: list[int], listed: list[Any], values: list[Any], lists: bool) -> exp.Expr:
    """Rows (position, value) of one scheme's values of one type; their parameters go to ``values``.

    With ``lists`` (DuckDB, PostgreSQL) two list parameters are bound and unnested side by side:
    one statement of constant size, where thousands of markers cost more to build, parse and
    bind than the count costs to run. Other engines get a VALUES list with a parameter per value.
    """
    if lists:
        values.extend([positions, listed])
        first, second = (exp.Parameter(this=exp.Literal.number(len(values) - n)) for n in (1, 0))
        return exp.select(exp.Unnest(expressions=[first]), exp.Unnest(expressions=[second]))
    rows = []
    for position, value in zip(positions, listed, strict=True):
        values.append(value)
        parameter = exp.Parameter(this=exp.Literal.number(len(values)))
        rows.append(exp.Tuple(expressions=[exp.Literal.number(position), parameter]))
    if len(rows) == 1:
        # sqlglot writes a one-row VALUES for ClickHouse as its values() table function, which
        # reads each item as a row of one column: one row is a plain SELECT on every engine.
        return exp.select(*rows[0].expressions)
    return exp.Values(expressions=rows)


def _matched_keys(aliases: Sequence[str], tables: Sequence[str | None], hashed: bool) -> exp.Select:
    """The counted keys joined to one VALUES list per explicit key (None: a discovered key);
    ``hashed``: with their hash sums."""
    indexes = [
        exp.column("_ddb_index", table=t).as_(a + INDEX_SUFFIX)
        for a, t in zip(aliases, tables, strict=True)
        if t
    ]
    keys = [exp.column(a, table="_ddb_keys") for a in aliases]
    sums = [exp.column(HASH_SUM_ALIAS, table="_ddb_keys")] if hashed else []
    select = exp.select(*indexes, *keys, exp.column(ROWS_ALIAS, table="_ddb_keys"), *sums).from_("_ddb_keys")
    for alias, table in zip(aliases, tables, strict=True):
        if table is not None:
            on = exp.EQ(
                this=exp.column(alias, table="_ddb_keys"), expression=exp.column("_ddb_value", table=table)
            )
            select = select.join(table, on=on, copy=False)
    return select


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
