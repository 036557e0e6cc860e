"""The user's SQL, parsed once with sqlglot, and every query the loader derives from it.

Invariants: the user's query is a single read-only statement (SELECT / WITH / set operation /
PIVOT) without parameters of its own; every derived query carries scheme values only as
numbered parameters (``$1``, ``$2``), so the engine binds them and no scheme value ever becomes
SQL text. The one exception is data, not input: the values a dynamic PIVOT found in the table,
which :meth:`UserQuery.pinned` writes as literals built by the dialect's generator (DuckDB
accepts no parameter at all in a query that holds a dynamic PIVOT).

This module holds the :class:`Query` protocol the plan needs, and :class:`UserQuery` with the
planning queries (counts, distinct values, schemas, a dynamic PIVOT's values). Parsing and its
refusals are in :mod:`ddbloader._sql.parsing`, how the query is split (the wrap and its filters)
in :mod:`ddbloader._sql.rewrites`, and how its order is kept in :mod:`ddbloader._sql.ordering`.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from .aliases import GROUP_ALIAS, PIVOT_ALIAS, REPARTITION_ALIAS, ROWS_ALIAS
from .fingerprint import HASH_SUM_ALIAS, hash_sum
from .parsing import (
    WRITES,
    describe_error,
    parse_column_expression,
    parse_statements,
    reader,
    refuse_last_branch_order,
)
from .rewrites import Tally, WrappedQuery, operand, subquery
from .scheme_lists import matched_keys, scheme_list

__all__ = ["Query", "UserQuery"]


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


class UserQuery(WrappedQuery):
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
            statements = parse_statements(sql, dialect)
        except SqlglotError as exc:
            raise ValueError(f"sql does not parse as {dialect} SQL: {describe_error(exc)}") from exc
        if len(statements) != 1:
            raise ValueError(f"sql must be exactly one query, got {len(statements)} statements")
        tree = statements[0]
        write = tree if not isinstance(tree, (exp.Query, exp.Pivot)) else tree.find(*WRITES)
        if write is not None:
            raise ValueError(
                f"sql must be a read-only query (SELECT, WITH, UNION or PIVOT); "
                f"refusing its {write.key.upper()}"
            )
        if tree.find(exp.Placeholder, exp.Parameter):
            raise ValueError("sql must not contain parameters (?, $1, :name): ddbloader binds its own")
        if dialect == "clickhouse":
            refuse_last_branch_order(tree, dialect)
        self._tree = tree
        self._output: tuple[str, ...] | None = None
        #: the engine's row hash (verify=True, see :mod:`ddbloader._sql.fingerprint`): when set,
        #: the fetch queries end with it and the planning counts sum it
        self._row_hash: exp.Expr | None = None
        #: figures :meth:`key_counts` adds per subquery (see :meth:`with_tallies`)
        self._tallies: tuple[Tally, ...] = ()

    def column(self, text: str, parameter: str) -> exp.Expr:
        """:func:`parse_column_expression` in this query's dialect."""
        return parse_column_expression(text, parameter, self.dialect)

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

    def with_tallies(self, tallies: Sequence[Tally]) -> UserQuery:
        """This query with :meth:`key_counts` adding each of ``tallies`` per subquery, as a column
        of its alias (``()``: none)."""
        query = copy.copy(self)
        query._tallies = tuple(tallies)
        return query

    def source(self) -> exp.Expr:
        """A copy of the parsed query, to read its rows from in a derived planning query."""
        return self._tree.copy()

    def narrowed(self, predicate: exp.Expr) -> UserQuery:
        """This query keeping only its rows where ``predicate`` (over its result columns) holds, in
        its order: ``SELECT * FROM (Q) AS _ddb_q WHERE predicate ORDER BY ...``, a query of its own
        (parsed again, knowing the same result columns), so every query derived from it reads only
        those rows and the engine pushes the predicate down."""
        narrowed = UserQuery(self.render(self._filter([], predicate)), self.dialect)
        return narrowed if self._output is None else narrowed.with_output(self._output)

    @property
    def tallies(self) -> tuple[Tally, ...]:
        """The figures :meth:`key_counts` adds per subquery (see :meth:`with_tallies`)."""
        return self._tallies

    @property
    def hashes_rows(self) -> bool:
        """Whether this query fingerprints its rows (see :meth:`with_row_hash`)."""
        return self._row_hash is not None

    def null_rows(self, columns: Sequence[exp.Expr]) -> str:
        """Count the query's rows where any of ``columns`` is NULL: the rows no subquery matches."""
        predicate = exp.or_(*(exp.Is(this=operand(c), expression=exp.Null()) for c in columns))
        return self.count(self.render(self._filter(columns, predicate)))

    def count(self, sql: str) -> str:
        """``SELECT count(*)`` over a (derived) query; with a row hash, also the sum of ``sql``'s
        hash column (``sql`` is then one of :meth:`filtered`)."""
        inner = sqlglot.parse_one(sql, read=reader(self.dialect))
        return self.render(
            exp.select(exp.Count(this=exp.Star()).as_(ROWS_ALIAS), *self._hash_sum()).from_(
                subquery(inner, "_ddb_count")
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
        return exp.Cast(this=operand(column), to=exp.DataType.build("text"))

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
            .from_(subquery(self._keys(columns), "_ddb_keys"))
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
        parameters (see :func:`~ddbloader._sql.scheme_lists.scheme_list`; ``lists``: the backend
        binds a list as one parameter) joined to the keys, so the engine compares them as a
        subquery's ``key = $1`` does; one list per Python type, because a list column takes one
        type and an engine may refuse to unify, say, text with integers where it compares each
        with the key just fine.
        Rows are sorted by the key values, NULL last.
        """
        aliases = (GROUP_ALIAS, REPARTITION_ALIAS)[: len(columns)]
        tallied = [t.aggregate(this=exp.column(t.alias)).as_(t.alias) for t in self._tallies]
        counted = exp.select(
            *aliases, exp.Count(this=exp.Star()).as_(ROWS_ALIAS), *self._hash_sum(), *tallied
        ).from_(subquery(self._keys(columns), "_ddb_annotated"))
        if aliases:
            counted = counted.group_by(*aliases)
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
                    (names[-1], scheme_list(positions, [scheme[p] for p in positions], values, lists))
                )
            tables.append(list(names))
        extra = [t.alias for t in self._tallies]
        branches: list[exp.Query] = [
            matched_keys(aliases, c, self._row_hash is not None, extra) for c in itertools.product(*tables)
        ]
        matched = functools.reduce(lambda a, b: exp.union(a, b, distinct=False, copy=False), branches)
        outer = (
            exp.select("*")
            .from_(subquery(matched, "_ddb_matched"), copy=False)
            .with_("_ddb_keys", as_=counted, copy=False)
        )
        for name, rows_ in scheme_tables:
            alias_ = exp.TableAlias(
                this=exp.to_identifier(name),
                columns=[exp.to_identifier("_ddb_index"), exp.to_identifier("_ddb_value")],
            )
            outer = outer.with_(alias_, as_=rows_, copy=False)
        if aliases:
            outer.set(
                "order",
                exp.Order(expressions=[exp.Ordered(this=exp.column(a), nulls_first=False) for a in aliases]),
            )
        return self.render(outer), tuple(values)

    def counts_are_groupable(self) -> bool:
        """True: :meth:`distinct_values` counts every subquery's rows exactly (see there)."""
        return True

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
                    exp.select(exp.cast(operand(field), exp.DataType.build("text")).as_(PIVOT_ALIAS))
                    .distinct()
                    .from_(pivot.this.copy())
                    .where(exp.Not(this=exp.Is(this=operand(field), expression=exp.Null())))
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
                fields.append(exp.In(this=operand(field), expressions=literals))
            pivot.set("expressions", fields)
        return query


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
