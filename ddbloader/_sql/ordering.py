"""ORDER BY restating: the user's query's order, applied again on the outer query of the wrap.

Each term of Q's ORDER BY is resolved against Q's result columns by the SQL scope rules the
engines share, never by matching expression text:

- an ordinal names the result column at that position;
- an unqualified name names the result column of that name (an output name comes first in
  ORDER BY on DuckDB, PostgreSQL, SQLite, ClickHouse, DataFusion and Spark); a name that no
  result column has reads the query's input;
- anything else (a qualified column, an expression) is evaluated over the query's input.

A term over the input is *carried*: added to Q's own SELECT list as a hidden column
(``_ddb_order1`` …, see :data:`~ddbloader._sql.aliases.ORDER_ALIAS`), evaluated in the same scope
as the ORDER BY evaluates it, so the outer query can be ordered by it and the filter pushed
below the sort. The outer query then lists Q's result columns, leaving the hidden ones out. A
term that cannot be resolved exactly is refused by name: a name that is both an alias and an
input column inside an expression (engines disagree which it means), a name several result
columns have, a term over the input of a DISTINCT or a set operation (a hidden column would
change its rows).

Each term keeps its direction and NULL placement as written: where it states neither, the
engine's session defaults order the outer query as they order the whole query (DuckDB's
``default_order`` and ``default_null_order``). :meth:`ResultOrder.direction_probe` asks the
engine what a term's direction and NULL placement are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from sqlglot import exp

from .aliases import ORDER_ALIAS
from .names import (
    column_name,
    first_select,
    is_modified_star,
    is_starred,
    result_name,
    same_expression,
    same_name,
)
from .parsing import NOT_SCALAR, reader, short_sql

__all__ = ["ResolvedOrder", "ResultOrder", "is_carried", "order_owner", "read_direction", "same_name"]

_PROBE_KEY = "_ddb_k"
_AS_WRITTEN = "_ddb_as_written"
_BY_DEFAULT = "_ddb_by_default"


@dataclass(frozen=True)
class ResolvedOrder:
    """The query's ORDER BY resolved against its result columns.

    ``terms``: each term over a result column (or a carried one), with the user's direction and
    NULL placement; ``hidden``: the carried terms, as ``expression AS _ddb_orderN`` to append to
    the query's SELECT list (empty when every term is a result column).
    """

    terms: tuple[exp.Ordered, ...]
    hidden: tuple[exp.Alias, ...]


def is_carried(term: exp.Expr) -> bool:
    """Whether ``term`` (of :meth:`ResultOrder.order_terms`) is a hidden carried column."""
    return isinstance(term, exp.Column) and str(term.name).startswith(ORDER_ALIAS)


class ResultOrder:
    """The query's ORDER BY, restated over its result columns for the outer query of the wrap.

    A base of :class:`~ddbloader._sql.query.UserQuery`, which sets the attributes declared here;
    it holds no state of its own.
    """

    dialect: str
    _tree: exp.Expr
    _output: tuple[str, ...] | None

    def order_key(self, keys: Sequence[exp.Expr]) -> exp.Ordered | None:
        """The leading term of :meth:`order_terms`, or None."""
        terms = self.order_terms(keys)
        return terms[0] if terms else None

    def order_terms(self, keys: Sequence[exp.Expr]) -> list[exp.Ordered] | None:
        """The terms of the query's ORDER BY that are none of ``keys`` (the partition keys, over
        the result columns, constant within a partition), in order, each over a result column
        (an ordinal becomes the column it names) or a carried column (:func:`is_carried`); None
        when there is no ORDER BY or it cannot be resolved exactly."""
        try:
            resolved = self.resolved_order()
        except ValueError:
            return None
        if resolved is None:
            return None
        same = same_expression
        return [t.copy() for t in resolved.terms if not any(same(t.this, k, self.dialect) for k in keys)]

    def resolved_order(self) -> ResolvedOrder | None:
        """The query's ORDER BY resolved against its result columns (see the module docstring);
        None without one.

        Raises:
            ValueError: naming the ORDER BY term that cannot be resolved exactly, and why.
        """
        owner = order_owner(self._tree)
        if owner is None:
            return None
        select = first_select(owner)
        projections = list(select.expressions) if select is not None else []
        carries = isinstance(owner, exp.Select) and not owner.args.get("distinct")
        terms: list[exp.Ordered] = []
        hidden: list[exp.Alias] = []
        for ordered in _expand_all(owner.args["order"].expressions, self._result_names(projections)):
            term = ordered.this
            if ordered.args.get("with_fill"):
                raise ValueError(self._refusal(term, "WITH FILL adds rows between the whole result's keys"))
            name = self._result_column(term, projections, isinstance(owner, exp.Select))
            restated = ordered.copy()
            if name is None:
                if not carries:
                    raise ValueError(self._refusal(term, _why_not_carried(owner)))
                self._check_input_term(term, projections)
                over_result = self._over_result(term, projections)
                if over_result is not None:  # range pieces can be cut by it
                    restated.set("this", over_result)
                    terms.append(restated)
                    continue
                name = f"{ORDER_ALIAS}{len(hidden) + 1}"
                hidden.append(term.copy().as_(name))
            restated.set("this", exp.column(name, quoted=True))
            terms.append(restated)
        return ResolvedOrder(tuple(terms), tuple(hidden))

    def _result_column(self, term: exp.Expr, projections: list[exp.Expr], select: bool) -> str | None:
        """The name of the result column ``term`` names (as the engine reports it), or None
        for a term over the query's input.

        Raises:
            ValueError: the term names several result columns, or none that can be told.
        """
        names = self._result_names(projections)
        starred = any(is_starred(p) for p in projections)
        if isinstance(term, exp.Literal) and term.is_int:
            position = int(term.name)
            if names is None or not 0 < position <= len(names) or names[position - 1] is None:
                raise ValueError(self._refusal(term, "its result column's name is not known"))
            return self._unique(term, names, names[position - 1])
        if not isinstance(term, exp.Column) or term.table:
            if not select:
                raise ValueError(self._refusal(term, "a set operation is ordered by its result columns only"))
            return None
        matches = [n for n in names or () if n is not None and same_name(term.this, n, self.dialect)]
        if len(matches) > 1:
            raise ValueError(self._refusal(term, f"the result has {len(matches)} columns named so"))
        if matches:
            if self.dialect == "clickhouse" and _in_alias_cycle(term, projections):
                raise ValueError(
                    self._refusal(
                        term,
                        "ClickHouse substitutes aliases wherever their names appear, and the aliases "
                        "of this SELECT read each other, so its ORDER BY may read another value than "
                        "the result column of that name; rename the aliases",
                    )
                )
            return matches[0]
        if names is None and starred:
            # Before the result's names are known (planning reads them first), a name is taken
            # to be the star's column of that name: if the result has none, the engine says so.
            if any(is_modified_star(p) for p in projections):
                raise ValueError(self._refusal(term, "the star renames or replaces columns"))
            return result_name(term, self.dialect)
        if not select:
            raise ValueError(self._refusal(term, "it is not one of the union's result columns"))
        return None

    def _output_names(self) -> tuple[str, ...] | None:
        """The result columns' names: as the engine reported them, else as the text names them;
        None where a star hides them."""
        if self._output is not None:
            return self._output
        select = first_select(self._tree)
        if select is None or any(is_starred(p) for p in select.expressions):
            return None
        return tuple(p.alias_or_name for p in select.expressions)

    def _result_names(self, projections: list[exp.Expr]) -> list[str | None] | None:
        """The result columns' names: as the engine reported them, else as the text names them
        (None for an unnamed expression); None where a star hides them."""
        if self._output is not None:
            return list(self._output)
        if any(is_starred(p) for p in projections):
            return None
        return [
            result_name(p, self.dialect) if isinstance(p, (exp.Alias, exp.Column)) else None
            for p in projections
        ]

    def _unique(self, term: exp.Expr, names: list[str | None], name: str | None) -> str:
        assert name is not None
        if names.count(name) > 1:
            why = f"the result has {names.count(name)} columns named {name!r}"
            raise ValueError(self._refusal(term, why))
        return name

    def _check_input_term(self, term: exp.Expr, projections: list[exp.Expr]) -> None:
        """Refuse a term over the input that reads a name an alias of the result also has: inside
        an ORDER BY expression PostgreSQL reads the input column, DuckDB, SQLite and ClickHouse
        may read the alias.

        Raises:
            ValueError: naming the term and the name.
        """
        # an alias over the input column of its own name (``x AS x``) reads the same either way
        aliases = [
            p
            for p in projections
            if isinstance(p, exp.Alias)
            and not (isinstance(p.this, exp.Column) and same_name(p.this.this, p.alias, self.dialect))
        ]
        for column in term.find_all(exp.Column):
            if column.table:
                continue
            for alias in aliases:
                if same_name(column.this, result_name(alias, self.dialect), self.dialect):
                    raise ValueError(
                        self._refusal(
                            term,
                            f"it reads {column.name!r}, which is both a column of the query's input and an "
                            f"alias of its result, and engines differ on which an ORDER BY expression "
                            f"means; select the expression and order by its alias",
                        )
                    )
            if any(is_modified_star(p) for p in projections):
                raise ValueError(self._refusal(term, "the star renames or replaces columns"))

    def _over_result(self, term: exp.Expr, projections: list[exp.Expr]) -> exp.Expr | None:
        """``term`` (over the input, checked by :meth:`_check_input_term`) as the same expression
        over result columns, where each column it reads is passed through unrenamed by exactly
        one projection and it is a scalar function of the row (no aggregate, window or query);
        else None."""
        names = self._result_names(projections)
        if names is None or term.find(exp.Query, *NOT_SCALAR) or not term.find(exp.Column):
            return None
        mapped = term.copy()
        for column in list(mapped.find_all(exp.Column)):
            passing = [
                p
                for p in projections
                if isinstance(p, exp.Column)
                and same_name(p.this, column_name(column, self.dialect), self.dialect)
                and (not column.table or column.table == p.table)
            ]
            if len(passing) != 1:
                return None
            name = names[projections.index(passing[0])]
            if name is None or names.count(name) != 1:
                return None
            if column is mapped:
                return exp.column(name, quoted=True)
            column.replace(exp.column(name, quoted=True))
        return mapped

    def _refusal(self, term: exp.Expr, why: str) -> str:
        return (
            f"cannot keep this query's order when splitting it: the ORDER BY term "
            f"{short_sql(term, self.dialect)!r} cannot be resolved against the query's result "
            f"columns exactly: {why}"
        )

    def direction_probe(self, ordered: exp.Ordered) -> str:
        """A query asking the engine how ``ordered`` (a term of :meth:`order_terms`) sorts, and
        how a term stating no direction sorts, in this session: read by :func:`read_direction`."""
        key = exp.column(_PROBE_KEY)
        as_written = ordered.copy()
        as_written.set("this", key.copy())
        values = exp.union(
            exp.union(
                exp.select(exp.Literal.number(1).as_(_PROBE_KEY)),
                exp.select(exp.Literal.number(2)),
                distinct=False,
            ),
            exp.select(exp.Null()),
            distinct=False,
        )
        numbered = [
            exp.Window(this=exp.Anonymous(this="ROW_NUMBER"), order=exp.Order(expressions=[o])).as_(alias)
            for o, alias in ((as_written, _AS_WRITTEN), (exp.Ordered(this=key.copy()), _BY_DEFAULT))
        ]
        probe = exp.select(key, *numbered).from_(
            exp.Subquery(this=values, alias=exp.TableAlias(this=exp.to_identifier("_ddb_p")))
        )
        return probe.sql(dialect=reader(self.dialect))


def read_direction(table: pa.Table) -> tuple[bool, bool, bool]:
    """``(descending, nulls_first, default_descending)`` from :meth:`ResultOrder.direction_probe`'s
    result: the term's direction and NULL placement, and whether a term stating no direction
    sorts descending in this session."""
    rows = {r[_PROBE_KEY]: r for r in table.to_pylist()}
    return (
        rows[2][_AS_WRITTEN] < rows[1][_AS_WRITTEN],
        rows[None][_AS_WRITTEN] == 1,
        rows[2][_BY_DEFAULT] < rows[1][_BY_DEFAULT],
    )


def _in_alias_cycle(term: exp.Column, projections: list[exp.Expr]) -> bool:
    """Whether the alias ``term`` names reads itself through the SELECT's aliases (compared as
    ClickHouse compares names: exactly)."""
    reads = {
        p.alias: {c.name for c in p.this.find_all(exp.Column) if not c.table}
        for p in projections
        if isinstance(p, exp.Alias)
    }
    seen: set[str] = set()
    pending = set(reads.get(term.name, ()))
    while pending:
        name = pending.pop()
        if name == term.name:
            return True
        if name not in seen:
            seen.add(name)
            pending |= reads.get(name, set())
    return False


def _expand_all(terms: list[exp.Ordered], names: list[str | None] | None) -> list[exp.Ordered]:
    """DuckDB's ``ORDER BY ALL``: every result column, left to right, as the term orders.

    Raises:
        ValueError: the result's column names are not known.
    """
    expanded = []
    for ordered in terms:
        if not (isinstance(ordered.this, exp.Var) and ordered.this.name.upper() == "ALL"):
            expanded.append(ordered)
            continue
        if names is None:
            raise ValueError(
                "cannot keep this query's order when splitting it: ORDER BY ALL over unknown columns"
            )
        for position in range(1, len(names) + 1):
            term = ordered.copy()
            term.set("this", exp.Literal.number(position))
            expanded.append(term)
    return expanded


def order_owner(tree: exp.Expr) -> exp.Expr | None:
    """The node of ``tree`` whose ORDER BY orders the result (inside parentheses), or None."""
    node: exp.Expr = tree
    while node.args.get("order") is None and isinstance(node, exp.Subquery):
        node = node.this
    return node if node.args.get("order") is not None else None


def _why_not_carried(owner: exp.Expr) -> str:
    if isinstance(owner, exp.Select):
        return (
            "it is not a result column of a SELECT DISTINCT, whose rows a hidden column would "
            "change; select it"
        )
    return "a set operation is ordered by its result columns only; order by a column name or position"
