"""DolphinDB SQL text: the split of a DolphinDB query, and literals for its parameters.

sqlglot cannot parse DolphinDB SQL (``pivot by``, ``context by``, backtick symbols, ``loadTable``
in FROM), so :class:`DolphinDBQuery` works on tokens instead: it finds the top-level clauses of
one ``select`` and writes the partition predicate into its where-clause, before ``group by`` /
``context by`` / ``pivot by`` / ``order by``. The predicate is added as a further comma-separated
condition, which DolphinDB applies after the query's own conditions, so those see exactly the
rows they see in the unsplit query, whatever their operators' precedence.

Values never enter the query as the user wrote them: the derived SQL carries markers
(``__ddb_p1__``) that the cursor replaces with literals (:mod:`.dolphindb_literals`).

Verified here: the SQL texts and literals (tests/test_dolphindb.py). Not verified here (no
server): that a DolphinDB server accepts every generated text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .dolphindb_literals import MARKER

__all__ = ["DIALECT", "DolphinDBQuery", "parse_column_expression"]

DIALECT = "dolphindb"

_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>\"\"\".*?\"\"\"|'''.*?'''|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<symbol>`[^\s`,()\[\]{};]*)
  | (?P<word>[A-Za-z_][\w]*!?)
  | (?P<number>[0-9][\w.:]*)
  | (?P<open>[(\[{])
  | (?P<close>[)\]}])
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)

#: Words that start another statement or write: never allowed at the top level of the query.
_STATEMENTS = frozenset(
    {
        "select", "exec", "insert", "update", "delete", "create", "drop", "alter", "def", "share",
        "undef", "go", "if", "for", "do", "while", "try", "return", "module", "use", "union",
    }
)  # fmt: skip
#: Words that end the where-clause (the clauses evaluated after it).
_AFTER_WHERE = frozenset({"group", "context", "pivot", "cgroup", "csort", "having", "order", "limit", "map"})
#: Words a column expression may not contain.
_NOT_IN_EXPRESSIONS = _STATEMENTS | _AFTER_WHERE | {"from", "where", "by", "top"}

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int
    depth: int

    @property
    def word(self) -> str:
        return self.text.lower() if self.kind == "word" else ""


def _tokenize(text: str, what: str) -> list[_Token]:
    """Significant tokens (no spaces, no comments) with their bracket depth.

    Raises:
        ValueError: an unterminated string or comment, or unbalanced brackets.
    """
    tokens: list[_Token] = []
    depth = 0
    position = 0
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        assert match is not None  # the last alternative matches any character
        kind = match.lastgroup or "punct"
        value = match.group()
        if kind == "punct" and (value in "\"'" or text.startswith("/*", position)):
            raise ValueError(f"{what} has an unterminated string or comment at character {position}")
        if kind == "close":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{what} has an unmatched {value!r} at character {position}")
        if kind not in {"space", "comment"}:
            tokens.append(_Token(kind, value, match.start(), match.end(), depth))
        if kind == "open":
            depth += 1
        position = match.end()
    if depth:
        raise ValueError(f"{what} has an unclosed bracket")
    return tokens


def parse_column_expression(text: str, parameter: str) -> str:
    """Check ``group_col`` / ``repartition_col`` for DolphinDB: one column or scalar expression.

    Returns the expression without surrounding space.

    Raises:
        ValueError: empty, several expressions, a clause or statement keyword, a line break, a
            ``;``, or text that does not tokenize.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{parameter} must be a non-empty column name or expression, got {text!r}")
    tokens = _tokenize(text, f"{parameter}={text!r}")
    for token in tokens:
        if token.word in _NOT_IN_EXPRESSIONS:
            raise ValueError(f"{parameter}={text!r} must be a column or scalar expression, not a query")
        if token.text == ";" or (token.text == "," and token.depth == 0):
            raise ValueError(f"{parameter}={text!r} must be one expression")
    if "\n" in text or "\r" in text:
        raise ValueError(f"{parameter}={text!r} must be on one line")
    if MARKER in text:
        raise ValueError(f"{parameter}={text!r} must not contain {MARKER!r}")
    return text.strip()


#: Functions whose value depends on other rows: aggregates, and series functions (moving,
#: cumulative, shifting, ranking). Not exhaustive; what DolphinDB's tokens can show.
_ROWS_FUNCTION = re.compile(
    r"(?i)(sum|avg|mean|count|max|min|std|stdp|var|varp|med|first|last|percentile|wavg|wsum|corr|covar"
    r"|beta|prod|skew|kurtosis|mode|nunique|prev|next|move|deltas|ratios|percentChange|ema|wma|sma"
    r"|rank|denseRank|rowRank|rowNo|ffill|bfill|shift|cum\w+|m(avg|sum|max|min|count|std|var|med|rank"
    r"|corr|beta|first|last|prod|skew|kurtosis|percentile|wavg|wsum|imax|imin|covar)\w*|tm\w+)"
)


def _pairs(tokens: list[_Token]) -> list[tuple[_Token, str]]:
    """Each token with the text of the token after it ("" at the end)."""
    return [(t, tokens[i + 1].text if i + 1 < len(tokens) else "") for i, t in enumerate(tokens)]


def _by_lists(tokens: list[_Token], tail: list[_Token]) -> list[tuple[str, set[str]]]:
    """The query's top-level ``group/context/pivot/cgroup by`` clauses and the column names in each."""
    starts = [t for t in tail if t.word in _AFTER_WHERE]
    lists = []
    for n, token in enumerate(starts):
        if token.word not in {"group", "context", "pivot", "cgroup"}:
            continue
        end = starts[n + 1].start if n + 1 < len(starts) else math.inf
        listed = [t for t in tokens if token.end <= t.start < end]
        names = {
            t.word for t, after in _pairs(listed) if t.kind == "word" and after != "(" and t.word != "by"
        }
        lists.append((token.word, names))
    return lists


def _operand(expression: str) -> str:
    return expression if _IDENTIFIER.fullmatch(expression) else f"({expression})"


def _column_reference(name: str) -> str:
    if _IDENTIFIER.fullmatch(name):
        return name
    if any(c in name for c in '"\\\n\r') or MARKER in name:
        raise ValueError(f"column name {name!r} cannot be referenced in DolphinDB SQL")
    return f'_"{name}"'


class DolphinDBQuery:
    """One DolphinDB ``select`` and the queries the loader derives from it. Immutable; thread-safe.

    The same public methods as :class:`ddbloader._sql.query.UserQuery`; column expressions are the
    strings :func:`parse_column_expression` returns, and parameters are markers that
    :func:`substitute` replaces with literals.

    Raises:
        ValueError: not a single ``select`` (an ``exec``, a script, several statements, a
            ``union``), no ``from``, or text that does not tokenize.
    """

    dialect = DIALECT

    def __init__(self, sql: str) -> None:
        if not isinstance(sql, str) or not sql.strip():
            raise TypeError(f"sql must be a non-empty query string, got {sql!r}")
        self.text = sql
        tokens = _tokenize(sql, "sql")
        while tokens and tokens[-1].text == ";":
            tokens.pop()
        if not tokens or tokens[0].word != "select":
            first = tokens[0].text if tokens else ""
            raise ValueError(f"sql must be one DolphinDB select query; it starts with {first!r}")
        if MARKER in sql:
            raise ValueError(f"sql must not contain {MARKER!r}, which ddbloader uses for its parameters")
        top = [t for t in tokens if t.depth == 0]
        for token in top[1:]:
            if token.text == ";":
                raise ValueError("sql must be exactly one query: it has several statements")
            if token.word in _STATEMENTS:
                raise ValueError(f"sql must be one read-only select query; refusing its {token.text.upper()}")
        self._body = sql[: tokens[-1].end]
        words = [t.word for t in top]
        if "from" not in words:
            raise ValueError("sql must select from a table: it has no top-level FROM")
        from_index = words.index("from")
        self._from = top[from_index]
        tail = next((i for i in range(from_index + 1, len(top)) if words[i] in _AFTER_WHERE), None)
        self._tail = top[tail] if tail is not None else None
        end = tail if tail is not None else len(top)
        self._where = any(w == "where" for w in words[from_index + 1 : end])
        # Where the predicate goes: right after the last token before the clauses that follow
        # the where-clause, so it can never land inside a trailing comment.
        self._insert_at = top[end - 1].end
        self._clauses = set(words[end:]) & _AFTER_WHERE
        self._top = len(top) > 1 and top[1].word in {"top", "distinct"}
        projection = top[1:from_index]
        self._plain_projection = all(
            t.kind == "word" or t.text in {",", "*"} for t in projection
        ) and not any(t.kind == "open" for t in projection)
        self._by_lists = _by_lists(tokens, top[end:])
        inside = [t for t in tokens if top[0].end <= t.start < self._from.start]
        self._row_functions = [
            t.text for t, after in _pairs(inside) if after == "(" and _ROWS_FUNCTION.fullmatch(t.text)
        ]

    def filtered(self, columns: Sequence[str]) -> str:
        """The query with ``column_i = __ddb_pi__`` added to its where-clause (one per column).

        Raises:
            ValueError: the query has a top-level ``top``/``limit``/``distinct``, which would then
                apply to every subquery.
        """
        if not columns:
            return self._body
        if self._top or "limit" in self._clauses:
            raise ValueError(
                "sql has a top-level TOP/LIMIT/DISTINCT, which would apply to every subquery once the "
                "query is split by group_col/repartition_col; move it into a subquery"
            )
        self._refuse_uncovered(columns)
        return self._with_condition(
            ", ".join(f"{_operand(c)} = {MARKER}{n}__" for n, c in enumerate(columns, start=1))
        )

    def _refuse_uncovered(self, columns: Sequence[str]) -> None:
        """Refuse keys that the query's grouping does not hold constant, as far as tokens tell.

        The predicate filters rows before ``group by`` / ``pivot by`` / ``cgroup by`` /
        ``context by`` and before the select list's aggregates and series functions (``prev``,
        ``mavg``, ``cumsum``, ...): only a key whose columns are in every by-list leaves those
        computations as the whole query makes them. A ``context by`` without such functions
        (nor ``having``) changes no value, so it needs no key.
        """
        for column in columns:
            names = {
                t.word for t, after in _pairs(_tokenize(column, column)) if t.kind == "word" and after != "("
            }
            for clause, listed in self._by_lists:
                if clause == "context" and not self._row_functions and "having" not in self._clauses:
                    continue
                if not names <= listed:
                    raise ValueError(
                        f"sql has a top-level {clause.upper()} BY whose list does not hold {column!r}: "
                        f"filtering before it would change what it computes; add the key's columns "
                        f"to the {clause} by list, or split by a column that is in it"
                    )
            if not self._by_lists and self._row_functions:
                raise ValueError(
                    f"sql's select list calls {self._row_functions[0]}(), which computes over several "
                    f"rows: split by {column!r} it would see one subquery's rows; add "
                    f"`context by` (or `group by`) with the key's columns"
                )

    def filtered_many(
        self, columns: Sequence[str], counts: Sequence[int | None], *, lists: bool = False
    ) -> str | None:
        """Many subqueries in one: ``column_i in [markers]`` for each column with a count (markers
        numbered on across the columns), every column selected after the query's own as
        ``_ddb_group`` / ``_ddb_repartition``, as :meth:`ddbloader._sql.query.UserQuery.filtered_many`.

        Returns None unless the query is a plain ``select`` of columns (see
        :meth:`counts_are_groupable`): selecting the keys next to a ``group by``, ``context by``
        or ``pivot by`` would change its result. ``lists`` is ignored: values become literals.
        """
        del lists
        if not self.counts_are_groupable():
            return None
        aliases = ("_ddb_group", "_ddb_repartition")[: len(columns)]
        keys = "".join(f", {_operand(c)} as {a}" for c, a in zip(columns, aliases, strict=True))
        terms = []
        number = 1
        for column, count in zip(columns, counts, strict=True):
            if count is not None:
                markers = ", ".join(f"{MARKER}{n}__" for n in range(number, number + count))
                terms.append(f"{_operand(column)} in [{markers}]")
                number += count
        text = self._with_condition(", ".join(terms)) if terms else self._body
        at = self._from.start  # the condition goes after FROM, so FROM has not moved
        return f"{text[:at].rstrip()}{keys} {text[at:]}"

    def null_rows(self, columns: Sequence[str]) -> str:
        """Count the query's rows where any of ``columns`` is NULL: the rows no subquery matches."""
        return self.count(self._with_condition(" or ".join(f"isNull({c})" for c in columns)))

    def _with_condition(self, condition: str) -> str:
        joint = ", " if self._where else " where "
        return f"{self._body[: self._insert_at]}{joint}{condition}{self._body[self._insert_at :]}"

    def count(self, sql: str) -> str:
        """``select count(*)`` over a (derived) query."""
        return f"select count(*) as _ddb_rows from ({sql})"

    def schema(self) -> str:
        """The query's first row, to read its result columns and types."""
        return f"select top 1 * from ({self._body})"

    def null_counts(self, columns: Sequence[str]) -> str:
        """Null count per result column, named like the columns."""
        counts = ", ".join(
            f"count(*) - count({_column_reference(c)}) as {_column_reference(c)}" for c in columns
        )
        return f"select {counts} from ({self._body})"

    def distinct_values(self, columns: Sequence[str], *, with_counts: bool) -> str:
        """Distinct values of ``columns`` (aliased ``_ddb_group``, ``_ddb_repartition``) with row counts.

        Evaluated over the query's FROM and WHERE, so the columns need not be selected; the
        counts are exact only for :meth:`counts_are_groupable` queries (``with_counts`` only
        documents the caller's intent: the count comes either way).
        """
        del with_counts
        aliases = ("_ddb_group", "_ddb_repartition")[: len(columns)]
        keys = ", ".join(f"{_operand(c)} as {a}" for c, a in zip(columns, aliases, strict=True))
        source = self._body[self._from.start : self._insert_at]
        return f"select count(*) as _ddb_rows {source} group by {keys} order by {', '.join(aliases)}"

    def is_ordered(self) -> bool:
        """Whether the query states its rows' order (an ``order by`` or ``csort`` clause)."""
        return bool(self._clauses & {"order", "csort"})

    def counts_are_groupable(self) -> bool:
        """True for a plain ``select`` of columns: no aggregation, grouping, top or limit."""
        return self._plain_projection and not self._top and not (self._clauses - {"order"})

    def dynamic_pivot_fields(self) -> list[str]:
        """None: ``pivot by`` runs on the server per subquery, as in DolphinDB's own loader."""
        return []

    def pinned(self, values: Sequence[Sequence[str]]) -> DolphinDBQuery:
        """This query: it has no dynamic pivot fields to pin."""
        del values
        return self

    def with_output(self, names: Sequence[str]) -> DolphinDBQuery:
        """This query: the predicate always goes into its where-clause, so output names are unused."""
        del names
        return self

    @staticmethod
    def column(text: str, parameter: str) -> str:
        """:func:`parse_column_expression`, for callers that hold only the query."""
        return parse_column_expression(text, parameter)
