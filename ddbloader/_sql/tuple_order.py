"""Comparisons of rows with ORDER BY tuples, written in SQL: the predicates range pieces are cut by.

A row's place relative to a :data:`Point` (one value per ORDER BY term) is lexicographic, each
term by its own direction and NULL placement as the engine orders it; :func:`compare` writes
one such comparison, :func:`search` a balanced tree of them over many points. Pure: builds
sqlglot expressions, runs nothing. Bound values are parameters (a NULL is written as SQL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from sqlglot import exp

__all__ = ["Point", "Term", "bound_count", "compare", "paren", "search"]

#: A tile boundary: the first row's values of the ORDER BY terms (a tuple, one value per term).
Point = tuple[Any, ...]


class Term(Protocol):
    """One ORDER BY term over the query's result, as the engine orders it."""

    @property
    def expression(self) -> exp.Expr: ...
    @property
    def descending(self) -> bool: ...
    @property
    def nulls_first(self) -> bool: ...


def bound_count(point: Point) -> int:
    """How many parameters ``point`` binds: its non-NULL values (a NULL is written as SQL)."""
    return sum(value is not None for value in point)


def compare(
    terms: Sequence[Term], nullable: Sequence[bool], point: Point, first: int, *, after: bool
) -> exp.Expr:
    """Whether a row comes at or after ``point`` (``after``), else strictly before it, in the
    query's order of the ``terms``: lexicographic, each term by its direction and NULL
    placement; ``point``'s non-NULL values are parameters numbered from ``first``.

    Written without NOT, so a comparison with a NULL (unknown) only ever stands where the answer
    is false: the condition is exact in SQL's three-valued logic."""
    number = first
    levels: list[tuple[exp.Expr, exp.Expr]] = []  # per term but the last: (strictly beyond, equal)
    last: exp.Expr = exp.true()
    for index, (term, value) in enumerate(zip(terms, point, strict=True)):
        key = paren(term.expression)
        parameter: exp.Expr | None = None if value is None else _parameter(number)
        number += value is not None
        can_null = nullable[index]
        if index == len(terms) - 1:
            last = _side(key, parameter, term, can_null, after=after, inclusive=after)
        else:
            equal: exp.Expr = (
                exp.Is(this=key.copy(), expression=exp.Null())
                if parameter is None
                else exp.EQ(this=key.copy(), expression=parameter.copy())
            )
            levels.append((_side(key, parameter, term, can_null, after=after, inclusive=False), equal))
    for beyond, equal in reversed(levels):
        last = _or(beyond, _and(equal, last))
    return last


def search(
    terms: Sequence[Term],
    nullable: Sequence[bool],
    points: Sequence[Point],
    first: int,
    leaf: Callable[[int], exp.Expr],
    start: int = 0,
    stop: int | None = None,
) -> exp.Expr:
    """``leaf(r)`` of the row's region ``r`` (how many of ``points``, in the query's order and
    their non-NULL values parameters ``first`` on, are at or before the row), known to lie in
    ``[start, stop]`` (default: any): a balanced tree of CASEs, ``log2`` comparisons per row."""
    stop = len(points) if stop is None else stop
    offsets = np.cumsum([first] + [bound_count(point) for point in points]).tolist()

    def tree(start: int, stop: int) -> exp.Expr:
        if start == stop:
            return leaf(start)
        middle = (
            start + stop + 1
        ) // 2  # region >= middle exactly when the row is at or after point middle - 1
        before = compare(terms, nullable, points[middle - 1], offsets[middle - 1], after=False)
        return exp.Case(ifs=[exp.If(this=before, true=tree(start, middle - 1))], default=tree(middle, stop))

    return tree(start, stop)


def _side(
    key: exp.Expr, parameter: exp.Expr | None, term: Term, can_null: bool, *, after: bool, inclusive: bool
) -> exp.Expr:
    """One term: the key after (``after``) or before the value, or equal to it (``inclusive``)."""
    null = exp.Is(this=key.copy(), expression=exp.Null())
    # NULLs come after every value when they come last (ascending or not)
    nulls_beyond = term.nulls_first != after
    if parameter is None:  # the value is NULL
        if inclusive:  # at or after NULL: everything when NULLs come first, else the NULLs
            return exp.true() if term.nulls_first else null
        # strictly beyond NULL: the values when NULLs come first (after) or last (before)
        return exp.Not(this=null) if after == term.nulls_first else exp.false()
    greater = after != term.descending
    kind: type[exp.Binary] = (
        (exp.GTE if inclusive else exp.GT) if greater else (exp.LTE if inclusive else exp.LT)
    )
    compared: exp.Expr = kind(this=key.copy(), expression=parameter.copy())
    return _or(compared, null) if can_null and nulls_beyond else compared


def _or(left: exp.Expr, right: exp.Expr) -> exp.Expr:
    if left == exp.false():
        return right
    if right == exp.false():
        return left
    return exp.or_(left, right)


def _and(left: exp.Expr, right: exp.Expr) -> exp.Expr:
    if left == exp.true():
        return right
    if right == exp.true():
        return left
    return exp.and_(left, right)


def _parameter(number: int) -> exp.Parameter:
    return exp.Parameter(this=exp.Literal.number(number))


def paren(expression: exp.Expr) -> exp.Expr:
    """A copy of ``expression``, in parentheses unless it is a column, a literal or already so."""
    if isinstance(expression, (exp.Column, exp.Literal, exp.Paren)):
        return expression.copy()
    return exp.Paren(this=expression.copy())
