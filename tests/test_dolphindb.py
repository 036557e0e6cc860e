"""DolphinDB: the SQL texts and literals the backend generates, and a live test when a server exists.

No DolphinDB server can run here, so the generated texts are checked against expected strings,
and literals against DolphinDB's published string grammar (double-quoted, backslash escapes,
``\\xHH`` bytes). The loader runs against a real server only when ``DDBLOADER_DOLPHINDB_URI``
(``dolphindb://user:password@host:port``) is set.
"""

from __future__ import annotations

import datetime as dt
import os
import re

import numpy as np
import pandas as pd
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader.backends import DolphinDBBackend, connect
from ddbloader.backends.dolphindb_literals import substitute, to_literal
from ddbloader.backends.dolphindb_sql import DolphinDBQuery, parse_column_expression

DFS = 'select ts, sym, price, qty from loadTable("dfs://trades where group by", "t")'


# --- predicate injection ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("select * from t", "select * from t where sym = __ddb_p1__"),
        ("select * from t;", "select * from t where sym = __ddb_p1__"),
        ("SELECT * FROM t WHERE x > 1", "SELECT * FROM t WHERE x > 1, sym = __ddb_p1__"),
        # The predicate comes after the query's own conditions, whatever their precedence.
        ("select * from t where a = 1 or b = 2", "select * from t where a = 1 or b = 2, sym = __ddb_p1__"),
        (
            "select * from t where a in (1, 2), b = 3",
            "select * from t where a in (1, 2), b = 3, sym = __ddb_p1__",
        ),
        (
            "select price from t where qty > 0 pivot by ts, sym",
            "select price from t where qty > 0, sym = __ddb_p1__ pivot by ts, sym",
        ),
        (
            "select ts, mavg(price, 5) as m from t context by sym csort ts order by ts",
            "select ts, mavg(price, 5) as m from t where sym = __ddb_p1__ "
            "context by sym csort ts order by ts",
        ),
        (
            "select avg(price) from t where qty > 0 group by sym having avg(price) > 1",
            "select avg(price) from t where qty > 0, sym = __ddb_p1__ group by sym having avg(price) > 1",
        ),
        (
            "select * from t cgroup by sym, minute(ts) order by ts",
            "select * from t where sym = __ddb_p1__ cgroup by sym, minute(ts) order by ts",
        ),
        # Keywords inside strings, brackets and comments are not clauses.
        (f"{DFS} order by ts", f"{DFS} where sym = __ddb_p1__ order by ts"),
        (
            'select * from t /* where group by */ where s = "order by" // group by\norder by ts',
            'select * from t /* where group by */ where s = "order by", sym = __ddb_p1__ '
            "// group by\norder by ts",
        ),
        # A trailing comment is dropped: it would swallow the predicate or a closing bracket.
        ("select * from t // all rows", "select * from t where sym = __ddb_p1__"),
        (
            "select * from ej(t1, t2, `id) where t1.x > (select max(x) from t3 where y = 1)",
            "select * from ej(t1, t2, `id) where t1.x > (select max(x) from t3 where y = 1), "
            "sym = __ddb_p1__",
        ),
    ],
)
def test_predicate_lands_in_the_where_clause(sql: str, expected: str) -> None:
    assert DolphinDBQuery(sql).filtered(["sym"]) == expected


def test_comments_never_swallow_derived_text() -> None:
    query = DolphinDBQuery("select * from t // everything\n;")
    assert query.count(query.filtered(["sym"])) == (
        "select count(*) as _ddb_rows from (select * from t where sym = __ddb_p1__)"
    )
    assert query.schema() == "select top 1 * from (select * from t)"


def test_two_keys_and_expressions() -> None:
    query = DolphinDBQuery("select * from t where qty > 0 order by ts")
    assert query.filtered(["sym", "date(ts)"]) == (
        "select * from t where qty > 0, sym = __ddb_p1__, (date(ts)) = __ddb_p2__ order by ts"
    )
    assert query.filtered([]) == "select * from t where qty > 0 order by ts"


def test_many_subqueries_in_one_query() -> None:
    query = DolphinDBQuery("select * from t where qty > 0 order by ts")
    assert query.filtered_many(["sym", "date(ts)"], [2, None]) == (
        "select *, sym as _ddb_group, (date(ts)) as _ddb_repartition from t where qty > 0, "
        "sym in [__ddb_p1__, __ddb_p2__] order by ts"
    )
    assert DolphinDBQuery("select a, b from t").filtered_many(["sym", "d"], [1, 3]) == (
        "select a, b, sym as _ddb_group, d as _ddb_repartition from t "
        "where sym in [__ddb_p1__], d in [__ddb_p2__, __ddb_p3__, __ddb_p4__]"
    )
    assert DolphinDBQuery(f"{DFS} context by sym").filtered_many(["sym"], [2]) is None


def test_derived_queries() -> None:
    query = DolphinDBQuery(f"{DFS} where qty > 0 context by sym csort ts order by ts")
    filtered = query.filtered(["sym", "date(ts)"])
    assert query.count(filtered) == f"select count(*) as _ddb_rows from ({filtered})"
    assert query.schema() == f"select top 1 * from ({query.text})"
    assert query.null_counts(["qty", "my col"]) == (
        f'select count(*) - count(qty) as qty, count(*) - count(_"my col") as _"my col" from ({query.text})'
    )
    # Scheme values come from the query's FROM and WHERE, before its context by / pivot by.
    assert query.distinct_values(["sym", "date(ts)"], with_counts=False) == (
        f"select count(*) as _ddb_rows {DFS[DFS.index('from') :]} where qty > 0 "
        "group by sym as _ddb_group, (date(ts)) as _ddb_repartition order by _ddb_group, _ddb_repartition"
    )
    assert query.null_rows(["sym", "date(ts)"]) == (
        f"select count(*) as _ddb_rows from ({DFS} where qty > 0, isNull(sym) or isNull(date(ts)) "
        "context by sym csort ts order by ts)"
    )
    assert query.dynamic_pivot_fields() == [] and query.pinned([]) is query
    with pytest.raises(ValueError, match="cannot be referenced"):
        query.null_counts(['a"b'])


@pytest.mark.parametrize(
    ("sql", "groupable"),
    [
        ("select * from t", True),
        ("select ts, sym, price from t where qty > 0 order by ts", True),
        ("select ts, price * 2 as p from t", False),
        ("select avg(price) from t", False),
        ("select * from t group by sym", False),
        ("select price from t pivot by ts, sym", False),
        ("select * from t context by sym", False),
        ("select top 5 * from t", False),
        ("select * from t limit 5", False),
    ],
)
def test_counts_are_groupable_only_for_plain_selects(sql: str, groupable: bool) -> None:
    assert DolphinDBQuery(sql).counts_are_groupable() is groupable


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("exec price from t", "select query"),
        ("t = loadTable('dfs://x', 't')", "select query"),
        ("select * from t; dropTable(db, `t)", "several statements"),
        ("select * from t\ndelete from t", "DELETE"),
        ("select * from t union select * from u", "UNION"),
        ("select 1", "FROM"),
        ('select * from t where a = "open', "unterminated"),
        ("select * from t where (a = 1", "unclosed"),
        ("select * from t where __ddb_p1__ = 1", "__ddb_p"),
    ],
)
def test_queries_that_are_refused(sql: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DolphinDBQuery(sql)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        # Issue 12: these were split by filtering before the grouping, silently changing values.
        ("select * from t cgroup by minute(ts) order by ts", r"CGROUP BY whose list does not hold 'sym'"),
        ("select avg(price) from t group by date(ts)", r"GROUP BY whose list does not hold 'sym'"),
        ("select price from t pivot by ts, venue", r"PIVOT BY whose list does not hold 'sym'"),
        ("select ts, mavg(price, 5) as m from t context by venue", r"CONTEXT BY whose list does not hold"),
        ("select ts, price - prev(price) as d from t", r"calls prev\(\), which computes over several rows"),
        ("select avg(price) as p from t", r"calls avg\(\)"),
        ("select ts, cumsum(qty) as q from t order by ts", r"calls cumsum\(\)"),
    ],
)
def test_groupings_that_do_not_hold_the_key_are_refused(sql: str, message: str) -> None:
    query = DolphinDBQuery(sql)
    assert query.filtered([]) == sql
    with pytest.raises(ValueError, match=message):
        query.filtered(["sym"])


def test_plain_context_by_and_scalar_functions_need_no_key_in_a_list() -> None:
    query = DolphinDBQuery("select ts, log(price) as p from t context by venue csort ts")
    assert query.filtered(["sym", "date(ts)"]).startswith("select ts, log(price) as p from t where sym")
    query = DolphinDBQuery("select ts, price from t context by sym csort ts")
    assert "date(ts)" in query.filtered(["sym", "date(ts)"])


@pytest.mark.parametrize(
    "sql", ["select top 10 * from t", "select * from t limit 10", "select distinct sym from t"]
)
def test_top_and_limit_cannot_be_split(sql: str) -> None:
    query = DolphinDBQuery(sql)
    assert query.filtered([]) == sql
    with pytest.raises(ValueError, match="TOP/LIMIT"):
        query.filtered(["sym"])


@pytest.mark.parametrize(
    "text", ["sym", " date(ts) ", 'temporalFormat(ts, "yyyy.MM")', "iif(sym == `A, 1, 2)"]
)
def test_column_expressions_accepted(text: str) -> None:
    assert parse_column_expression(text, "group_col") == text.strip()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a, b",
        "a; dropTable(db, `t)",
        "(select max(x) from t)",
        "x\ny",
        "sym from t where 1",
        "__ddb_p1__",
        "f(",
    ],
)
def test_column_expressions_refused(text: str) -> None:
    with pytest.raises(ValueError, match="group_col"):
        parse_column_expression(text, "group_col")


# --- literals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        (True, "true"),
        (np.bool_(False), "false"),
        (42, "42"),
        (np.int32(-7), "-7"),
        (2.5, "2.5"),
        ("AAPL", '"AAPL"'),
        ("`000001.SH", '"000001.SH"'),
        ("2020.01.01", "2020.01.01"),
        ("2020.01.01T09:30:00.000", "2020.01.01T09:30:00.000"),
        ("2020.01M", "2020.01M"),
        ("09:30:00", "09:30:00"),
        ("2020-01-01", '"2020-01-01"'),  # not a DDB literal: a string
        # Two literals (a vector) in DolphinDB, so a string; a hex digit after an escape is escaped.
        ("2020.01.01 09:30:00", '"2020.01.01 09\\x3A\\x33\\x30\\x3A\\x30\\x30"'),
        (dt.date(2020, 1, 2), "2020.01.02"),
        (dt.datetime(2020, 1, 2, 9, 30), "2020.01.02T09:30:00"),
        (dt.datetime(2020, 1, 2, 9, 30, 1, 123000), "2020.01.02T09:30:01.123"),
        (dt.datetime(2020, 1, 2, 9, 30, 1, 123456), "2020.01.02T09:30:01.123456000"),
        (pd.Timestamp("2020-01-02 09:30:00.000000001"), "2020.01.02T09:30:00.000000001"),
        (np.datetime64("2020-01-02"), "2020.01.02"),
        (np.datetime64("2020-01-02T09:30:00.123456789"), "2020.01.02T09:30:00.123456789"),
        (dt.time(9, 30, 5), "09:30:05"),
        ('say "hi"', '"say \\x22hi\\x22"'),
        ("a\\b", '"a\\x5C\\x62"'),
        ("#{evil()}", '"\\x23\\x7B\\x65vil\\x28\\x29\\x7D"'),  # e after an escape: escaped too
        ("é", '"\\xC3\\xA9"'),
        ("", '""'),
    ],
)
def test_literals(value: object, literal: str) -> None:
    assert to_literal(value) == literal


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("a\x00b", ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("`a`b", ValueError),
        (dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc), ValueError),
        (np.datetime64("NaT"), ValueError),
        (None, TypeError),
        (b"bytes", TypeError),
    ],
)
def test_literals_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        to_literal(value)


# DolphinDB's published grammar: a double-quoted string is any run of characters other than `"`
# and `\`, or `\` followed by an escape; `\xHH` is one byte.
_STRING_TOKEN = re.compile(r'"(?:[^"\\]|\\x[0-9A-F]{2})*"')


def _decode(literal: str) -> str:
    body = literal[1:-1].encode("utf-8")
    return re.sub(rb"\\x([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), body).decode("utf-8")


@settings(max_examples=examples(200), deadline=None)
@given(st.text().filter(lambda s: "\x00" not in s and not s.startswith("`")))
def test_string_literals_are_one_token_that_decodes_to_the_value(value: str) -> None:
    literal = to_literal(value)
    if literal == value:  # a DDB temporal literal passes through, made of digits . : T M m only
        assert re.fullmatch(r"[0-9.:TMm]+", value)
        return
    assert _STRING_TOKEN.fullmatch(literal)
    assert _decode(literal) == value
    assert "#{" not in literal and "\n" not in literal and "\r" not in literal
    # No escape is followed by a hex digit, so a greedy \x reader decodes the same bytes.
    assert not re.search(r"\\x[0-9A-F]{2}[0-9A-Fa-f]", literal)


def test_substitute_replaces_markers_with_literals() -> None:
    sql = DolphinDBQuery("select * from t where qty > 0").filtered(["sym", "date"])
    assert substitute(sql, ["'; dropTable(db, `t) //", "2020.01.01"]) == (
        'select * from t where qty > 0, sym = "\\x27\\x3B dropTable\\x28\\x64\\x62\\x2C '
        '\\x60t\\x29 \\x2F\\x2F", date = 2020.01.01'
    )
    with pytest.raises(ValueError, match="parameter 2"):
        substitute(sql, ["only one"])


# --- backend ------------------------------------------------------------------------------------


def test_uri_backend_is_lazy_and_redacted() -> None:
    backend = connect("dolphindb://admin:s3cret@db.example:8848")
    assert isinstance(backend, DolphinDBBackend)
    assert backend.dialect == "dolphindb"
    assert backend.engine == "dolphindb (db.example:8848)"
    assert isinstance(backend.query("select * from t"), DolphinDBQuery)
    backend.close()
    with pytest.raises(ValueError, match="host and a port") as caught:
        DolphinDBBackend("dolphindb://admin:s3cret@db.example")
    assert "s3cret" not in str(caught.value)


def test_session_is_shared() -> None:
    dolphindb = pytest.importorskip("dolphindb")
    backend = connect(dolphindb.Session())
    assert isinstance(backend, DolphinDBBackend) and "shared session" in backend.engine
    with pytest.raises(RuntimeError, match="cannot be reopened"):
        backend.open()


def test_live_server_contract() -> None:
    uri = os.environ.get("DDBLOADER_DOLPHINDB_URI")
    if not uri:
        pytest.skip("DDBLOADER_DOLPHINDB_URI is not set: no DolphinDB server to test against")
    from ddbloader import DDBDataLoader

    session = DolphinDBBackend(uri).open()
    session.run(
        "share table(take(`A`B, 40) as sym, 0..39 as pos, double(0..39) as f0, double(0..39) + 0.5 as y) "
        "as ddbloader_contract"
    )
    session.close()
    sql = "select sym, pos, f0, y from ddbloader_contract order by pos"
    with DDBDataLoader(uri, sql, "y", batch_size=8, input_col="f0", window_size=2, group_col="sym") as loader:
        starts = sorted(int(v) for x, _ in loader for v in x[:, 0, 0].tolist())
    # Group A holds the even positions, B the odd; a sample spans three consecutive rows of one group.
    assert starts == sorted([*range(0, 35, 2), *range(1, 36, 2)])
    scheme = ['"; undef all //', "`A"]
    with DDBDataLoader(uri, sql, "y", input_col="f0", group_col="sym", group_scheme=scheme) as loader:
        assert [len(g.partitions) for g in loader.plan.groups if g.rows] == [1]
