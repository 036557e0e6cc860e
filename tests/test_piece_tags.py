"""Tagged pieces (ddbloader/_sql/piece_tags.py): the regions, pure, and the tag SQL on DuckDB.

Several range pieces of one subquery are read by one query whose rows are tagged with their
piece: every key must get the tag of the piece whose ranges hold it (NULL outside them), as the
regions say and as the engine computes the CASE tree. Combed pieces of windows share rows (a
stripe's context is the next piece's stripe): one query reads the union of their ranges.
"""

from __future__ import annotations

import bisect
from typing import Any

import duckdb
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from ddbloader._sql.piece_tags import TAG_ALIAS, tag_regions, tagged_sql
from ddbloader._sql.pieces import KeyRanges
from ddbloader._sql.query import UserQuery
from ddbloader._sql.range_cutter import OrderKey

#: The one ascending ORDER BY term the tagged pieces are cut on.
_K = OrderKey(exp.column("k"), False, False, "k")


def _ranges(pairs: Any) -> KeyRanges:
    """A tagged piece of ``(low, high)`` values of one ascending, never-NULL term."""
    return KeyRanges(
        tuple((None if lo is None else (lo,), None if hi is None else (hi,)) for lo, hi in pairs),
        (False,),
        sort=(0, False),
    )


def _pieces(lows: list[int], owners: list[int | None], count: int) -> list[KeyRanges]:
    """Per piece, the ranges of the tiles it owns (tile ``i`` is ``[lows[i], lows[i + 1])``, the
    first unbounded below when ``lows[0]`` is None, the last above), consecutive tiles merged as
    :func:`ddbloader._sql.pieces.layout` merges them; tiles owned by None belong to no piece."""
    pieces: list[list[list[int | None]]] = [[] for _ in range(count)]
    for i, owner in enumerate(owners):
        if owner is None:
            continue
        low = lows[i]
        high = lows[i + 1] if i + 1 < len(lows) else None
        ranges = pieces[owner]
        if ranges and ranges[-1][1] == low and low is not None and owners[i - 1] == owner:
            ranges[-1][1] = high
        else:
            ranges.append([low, high])
    return [_ranges(ranges) for ranges in pieces if ranges]


def _owner(pieces: list[KeyRanges], key: int) -> int | None:
    held = [
        n
        for n, piece in enumerate(pieces)
        if any((lo is None or key >= lo[0]) and (hi is None or key < hi[0]) for lo, hi in piece.spans)
    ]
    assert len(held) <= 1
    return held[0] if held else None


tiles = st.integers(1, 14).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(-50, 50), min_size=n, max_size=n, unique=True).map(sorted),
        st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n),
        st.booleans(),
    )
)


@settings(max_examples=examples(300), deadline=None)
@given(tiles)
def test_each_key_is_tagged_with_the_piece_that_holds_it(
    drawn: tuple[list[int], list[int | None], bool],
) -> None:
    lows, owners, open_low = drawn
    pieces = _pieces([None, *lows[1:]] if open_low else list(lows), owners, 4)
    if not pieces:
        return
    points, tags = tag_regions(pieces)
    assert list(points) == sorted(set(points)) and len(tags) == len(points) + 1
    for key in range(-60, 61):
        assert tags[bisect.bisect_right(points, key)] == _owner(pieces, key), key


def test_touching_ranges_of_two_pieces_share_their_point() -> None:
    first = _ranges(((None, 10), (30, 40)))
    second = _ranges(((10, 20), (40, None)))
    assert tag_regions([first, second]) == ((10, 20, 30, 40), (0, 1, None, 0, 1))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(tiles)
def test_duckdb_computes_the_tags_the_regions_say(drawn: tuple[list[int], list[int | None], bool]) -> None:
    lows, owners, open_low = drawn
    pieces = _pieces([None, *lows[1:]] if open_low else list(lows), owners, 4)
    if not pieces:
        return
    points, tags = tag_regions(pieces)
    query = UserQuery("SELECT k, k * 2 AS v FROM range(-60, 61) AS r(k) ORDER BY k", "duckdb")
    sql = tagged_sql(query, [], _K, tags)
    with duckdb.connect() as con:
        result = con.execute(sql, list(points))
        assert [d[0] for d in result.description] == ["k", "v", TAG_ALIAS]
        rows = result.fetchall()
    got = {k: tag for k, _, tag in rows}
    want = {key: owner for key in range(-60, 61) if (owner := _owner(pieces, key)) is not None}
    assert got == want
    assert "ORDER BY" not in sql.upper()  # the reader orders each piece's rows


def test_the_tags_keep_a_partition_key_parameter_first() -> None:
    """With partition keys, their values come first and the points after them."""
    pieces = [_ranges(((0, 5), (20, 25))), _ranges(((5, 10),))]
    points, tags = tag_regions(pieces)
    query = UserQuery(
        "SELECT g, k FROM range(0, 30) AS r(k), (VALUES (1), (2)) AS s(g) ORDER BY g, k", "duckdb"
    )
    sql = tagged_sql(query, [exp.column("g")], _K, tags)
    with duckdb.connect() as con:
        rows = con.execute(sql, [2, *points]).fetchall()
    assert {g for g, _, _ in rows} == {2}
    by_tag = {tag: sorted(k for _, k, t in rows if t == tag) for tag in (0, 1)}
    assert by_tag == {0: [*range(0, 5), *range(20, 25)], 1: list(range(5, 10))}
    assert (points, tags) == ((0, 5, 10, 20, 25), (None, 0, 1, None, 0, None))
