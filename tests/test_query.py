"""SQL rewriting: where the partition predicate lands, what is refused, and hostile values.

Rewritten queries are executed on DuckDB and compared with the query a person would write by
hand, so a predicate in the wrong place (HAVING, after a LIMIT, outside a parenthesis) shows up as
wrong rows, not only as different text.
"""

from __future__ import annotations

import datetime
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from ddbloader import DDBDataLoader
from ddbloader._sql.parsing import parse_column_expression
from ddbloader._sql.query import UserQuery

DIALECT = "duckdb"


@pytest.fixture(scope="module")
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    """``t`` and ``u``: 24 rows each, g in 0..2, k in a/b/c, ts 5 h apart, v unique."""
    connection = duckdb.connect()
    for table, base in (("t", 0), ("u", 100)):
        connection.execute(
            f"""
            CREATE TABLE {table} AS
            SELECT (i + {base})::INTEGER AS id, (i % 3)::INTEGER AS g, ['a', 'b', 'c'][i % 4 % 3 + 1] AS k,
                   TIMESTAMP '2024-01-01' + INTERVAL (5 * i) HOUR AS ts, (i + {base}) * 1.5 AS v
            FROM range(24) r(i)
            """
        )
    yield connection
    connection.close()


def key(text: str) -> exp.Expr:
    return parse_column_expression(text, "group_col", DIALECT)


def filtered(sql: str, *columns: str) -> str:
    return UserQuery(sql, DIALECT).filtered([key(c) for c in columns])


def rows(con: duckdb.DuckDBPyConnection, sql: str, *values: Any) -> list[tuple[Any, ...]]:
    return con.execute(sql, list(values)).fetchall()


def top_where(sql: str) -> exp.Expr:
    tree = sqlglot.parse_one(sql, read=DIALECT)
    where = tree.args.get("where")
    assert where is not None, sql
    return where.this


def parameters(node: exp.Expr | str) -> list[str]:
    """The parameters in ``node`` (sqlglot reads DuckDB's ``$1`` back as a placeholder)."""
    tree = sqlglot.parse_one(node, read=DIALECT) if isinstance(node, str) else node
    return [p.sql(dialect=DIALECT) for p in tree.find_all(exp.Parameter, exp.Placeholder)]


# --- the predicate applies to the query's result ------------------------------------------

NOT_SELECTED = r"is not one of its result columns; select it"


def outer_where(sql: str) -> exp.Expr:
    """The WHERE of the outer query of a wrap, checking that the user's query is inside intact."""
    tree = sqlglot.parse_one(sql, read=DIALECT)
    assert isinstance(tree, exp.Select)
    assert isinstance(tree.args["from_"].this, exp.Subquery)
    return top_where(sql)


def test_predicate_applies_to_the_result_and_leaves_the_users_or_intact(
    db: duckdb.DuckDBPyConnection,
) -> None:
    sql = "SELECT id, g FROM t WHERE v < 6 OR v > 30 ORDER BY id DESC"
    statement = filtered(sql, "g")
    assert isinstance(outer_where(statement), exp.EQ)
    inner = sqlglot.parse_one(statement, read=DIALECT).args["from_"].this.this
    # The ORDER BY moves to the outer query (one sort per partition, not two); the rest is intact.
    unordered = sqlglot.parse_one(sql, read=DIALECT)
    unordered.set("order", None)
    assert inner == unordered
    got = rows(db, statement, 1)
    assert got == rows(db, "SELECT id, g FROM t WHERE (v < 6 OR v > 30) AND g = 1 ORDER BY id DESC")
    assert got == [(22, 1), (1, 1)]


def test_grouped_query_split_by_a_selected_grouping_column(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT k, g, count(*) AS n, sum(v) AS s FROM t {} GROUP BY k, g HAVING count(*) > 1 ORDER BY k, n"
    statement = filtered(sql.format(""), "g")
    for g in range(3):
        expected = rows(db, sql.format(f"WHERE g = {g}"))
        assert rows(db, statement, g) == expected
        assert expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, count(*) AS n FROM t GROUP BY k, g ORDER BY k",
        "SELECT k, count(*) AS n FROM t GROUP BY k ORDER BY k",
        "SELECT id FROM t ORDER BY id",
        "SELECT id, v FROM t WHERE g = 1",
    ],
)
def test_a_key_that_is_not_a_result_column_is_refused(sql: str) -> None:
    with pytest.raises(ValueError, match=rf"by 'g':.*'g' {NOT_SELECTED}"):
        filtered(sql, "g")


def test_a_qualified_key_is_refused_even_when_its_name_is_selected() -> None:
    # `t.g` names the FROM's column; the result has only `g`, which may be another one.
    with pytest.raises(ValueError, match=rf"'t\.g' {NOT_SELECTED}"):
        filtered("SELECT t.id, u.g FROM t JOIN u ON t.id + 100 = u.id", "t.g")


def test_order_by_is_kept(db: duckdb.DuckDBPyConnection) -> None:
    statement = filtered("SELECT id, g FROM t ORDER BY v DESC", "g")
    ids = [r[0] for r in rows(db, statement, 2)]
    assert ids == [i for i in range(23, -1, -1) if i % 3 == 2]


@pytest.mark.parametrize(
    ("dialect", "sql", "refusal"),
    [
        ("postgres", "SELECT a, b AS a, g FROM t ORDER BY a", "the result has 2 columns named so"),
        ("postgres", "SELECT a, a, g FROM t ORDER BY 2", "the result has 2 columns named 'a'"),
        ("postgres", "SELECT DISTINCT g, v FROM t ORDER BY id", "it is not a result column of a SELECT"),
        (
            "postgres",
            "SELECT g, v FROM t UNION SELECT g, v FROM u ORDER BY g + 1",
            "a set operation is ordered",
        ),
        ("duckdb", "SELECT * REPLACE (v * 2 AS v) FROM t ORDER BY v", "the star renames or replaces columns"),
        ("clickhouse", "SELECT g, v FROM t ORDER BY v WITH FILL", "WITH FILL adds rows"),
    ],
)
def test_an_order_by_term_that_cannot_be_resolved_exactly_is_refused_by_name(
    dialect: str, sql: str, refusal: str
) -> None:
    with pytest.raises(
        ValueError, match=r"the ORDER BY term '.*' cannot be resolved .*: " + re.escape(refusal)
    ):
        UserQuery(sql, dialect).filtered([key("g")])


def test_an_alias_over_the_input_column_of_its_name_is_read_alike_in_an_expression() -> None:
    statement = UserQuery("SELECT g, v AS v FROM t ORDER BY v * 2", "postgres").filtered([key("g")])
    assert 'ORDER BY "_ddb_order1"' in statement and "v * 2 AS _ddb_order1" in statement


def test_order_by_terms_over_the_input_are_carried_as_hidden_columns() -> None:
    sql = "SELECT s.id AS i, s.g, s.v FROM t AS s ORDER BY s.id DESC, s.g * 2 - s.v, 3"
    statement = UserQuery(sql, "postgres").with_output(["i", "g", "v"]).filtered([key("g")])
    tree = sqlglot.parse_one(statement, read="postgres")
    # s.id is renamed, so carried; s.g and s.v are passed through, so read from the result
    assert tree.args["order"].sql(dialect="postgres") == 'ORDER BY "_ddb_order1" DESC, "g" * 2 - "v", "v"'
    assert [p.alias_or_name for p in tree.expressions] == ["i", "g", "v"]  # the hidden one left out
    inner = tree.find(exp.Subquery).this
    assert [p.sql(dialect="postgres") for p in inner.expressions[3:]] == ["s.id AS _ddb_order1"]
    # Inside an expression PostgreSQL reads `g` as the FROM's column, DuckDB may read the alias.
    with pytest.raises(ValueError, match=r"ORDER BY term 'g \* 2' .*both a column of the query's input"):
        UserQuery("SELECT id, g + 1 AS g FROM t ORDER BY g * 2", "postgres").filtered([key("g")])


def test_trailing_line_comment_does_not_swallow_the_predicate(db: duckdb.DuckDBPyConnection) -> None:
    statement = filtered("SELECT id, g FROM t -- every row\nORDER BY id -- sorted", "g")
    assert rows(db, statement, 0) == [(i, 0) for i in range(0, 24, 3)]


def test_union_is_filtered_on_its_result_with_numbered_parameters(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT id, g, k FROM t WHERE v < 20 UNION ALL SELECT id, g, k FROM u WHERE k <> 'c' ORDER BY id"
    statement = filtered(sql, "g", "k")
    assert parameters(outer_where(statement)) == ["$1", "$2"]
    got = rows(db, statement, 1, "a")
    expected = rows(
        db,
        "SELECT id, g, k FROM t WHERE v < 20 AND g = 1 AND k = 'a' "
        "UNION ALL SELECT id, g, k FROM u WHERE k <> 'c' AND g = 1 AND k = 'a' ORDER BY id",
    )
    assert got == expected
    assert any(i < 100 for i, _, _ in got)
    assert any(i >= 100 for i, _, _ in got)


def test_union_key_is_the_result_column_whatever_each_branch_calls_it(
    db: duckdb.DuckDBPyConnection,
) -> None:
    # Result columns are positional: the second branch's `k` and constant are the result's `g`.
    sql = "SELECT id, CAST(g AS VARCHAR) AS g FROM t UNION ALL SELECT id, k FROM u UNION ALL SELECT 0, 'x'"
    statement = filtered(sql, "g")
    whole = rows(db, sql)
    for value in ("0", "a", "x"):
        assert sorted(rows(db, statement, value)) == sorted(r for r in whole if r[1] == value)


def test_intersect_is_split_on_its_result(db: duckdb.DuckDBPyConnection) -> None:
    sql = "(SELECT id % 100 AS j, g FROM t) INTERSECT (SELECT id % 100 AS j, g FROM u) ORDER BY j"
    got = rows(db, filtered(sql, "g"), 0)
    assert got == [(i, 0) for i in range(0, 24, 3)]
    with pytest.raises(ValueError, match=NOT_SELECTED):
        filtered("(SELECT id % 100 AS j FROM t) INTERSECT (SELECT id % 100 AS j FROM u)", "g")


def test_cte_query_is_filtered_at_its_top_level(db: duckdb.DuckDBPyConnection) -> None:
    sql = "WITH c AS (SELECT * FROM t WHERE v > 3) SELECT id, g FROM c ORDER BY id"
    statement = filtered(sql, "g")
    assert parameters(outer_where(statement)) == ["$1"]
    assert rows(db, statement, 1) == [(i, 1) for i in range(4, 24, 3)]


@pytest.mark.parametrize(
    ("sql", "clause"),
    [
        ("SELECT 1 AS g UNION ALL SELECT 2 AS g ORDER BY g", "ORDER BY"),
        ("SELECT 1 AS g UNION ALL SELECT 2 AS g UNION ALL SELECT 3 AS g LIMIT 2", "LIMIT"),
        ("WITH a AS (SELECT 1 AS g) SELECT g FROM a UNION DISTINCT SELECT 2 ORDER BY 1 DESC", "ORDER BY"),
    ],
)
def test_clickhouse_union_ending_in_an_order_or_limit_is_refused(sql: str, clause: str) -> None:
    # ClickHouse applies it to the last SELECT only; everyone else (sqlglot too) to the union.
    with pytest.raises(ValueError, match=rf"ends its UNION with {clause} .*ClickHouse applies to the last"):
        UserQuery(sql, "clickhouse")
    UserQuery(sql, "duckdb")  # the same text means the union's order elsewhere


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM (SELECT 1 AS g UNION ALL SELECT 2 AS g) ORDER BY g",
        "(SELECT 1 AS g) UNION ALL (SELECT 2 AS g ORDER BY g LIMIT 1)",
        "SELECT 1 AS g UNION ALL SELECT 2 AS g",
    ],
)
def test_clickhouse_union_ordered_as_written_is_accepted(sql: str) -> None:
    assert UserQuery(sql, "clickhouse").text == sql


def test_cte_with_union_keeps_its_with_clause_in_derived_queries(db: duckdb.DuckDBPyConnection) -> None:
    query = UserQuery(
        "WITH c AS (SELECT * FROM t) SELECT id, g FROM c UNION ALL SELECT id, g FROM u", DIALECT
    )
    distinct = query.distinct_values([key("g")], with_counts=False)
    assert rows(db, distinct) == [(0,), (1,), (2,)]
    assert rows(db, query.count(query.filtered([key("g")])), 2) == [(16,)]


def test_repartition_col_may_be_an_expression(db: duckdb.DuckDBPyConnection) -> None:
    statement = filtered("SELECT id, g, ts FROM t ORDER BY id", "g", "CAST(ts AS DATE)")
    day = datetime.date(2024, 1, 2)
    expected = rows(
        db, "SELECT id, g, ts FROM t WHERE g = 0 AND CAST(ts AS DATE) = DATE '2024-01-02' ORDER BY id"
    )
    assert rows(db, statement, 0, day) == expected
    assert [r[0] for r in expected] == [6, 9]


@pytest.mark.parametrize("expression", ["v > 20", "g + 1", "k || 'x'", "v BETWEEN 3 AND 9", "NOT g = 1"])
def test_operator_expressions_are_parenthesised(db: duckdb.DuckDBPyConnection, expression: str) -> None:
    statement = filtered("SELECT id, g, k, v FROM t ORDER BY id", expression)
    values = [r[0] for r in rows(db, f"SELECT DISTINCT {expression} FROM t")]
    assert len(values) >= 2
    total = 0
    for value in values:
        got = rows(db, statement, value)
        expected = db.execute(
            f"SELECT id, g, k, v FROM t WHERE ({expression}) = $1 ORDER BY id", [value]
        ).fetchall()
        assert got == expected
        total += len(got)
    assert total == 24


def test_explicit_pivot_is_filtered_on_its_result(db: duckdb.DuckDBPyConnection) -> None:
    sql = "PIVOT (SELECT *, ts::DATE AS day FROM t {}) ON k IN ('a', 'b', 'c') USING sum(v) GROUP BY day, g"
    statement = filtered(sql.format(""), "g")
    assert parameters(outer_where(statement)) == ["$1"]
    got = sorted(rows(db, statement, 1))
    assert got == sorted(rows(db, sql.format("WHERE g = 1")))
    assert got == sorted(r for r in rows(db, sql.format("")) if r[1] == 1)
    assert len(got) == 5


def test_pivot_not_grouped_by_the_key_is_refused(db: duckdb.DuckDBPyConnection) -> None:
    # The key has no value on the pivot's rows: each sums every g.
    sql = "PIVOT (SELECT *, ts::DATE AS day FROM t) ON k IN ('a', 'b', 'c') USING sum(v) GROUP BY day"
    query = UserQuery(sql, DIALECT).with_output(db.sql(sql).columns)
    with pytest.raises(ValueError, match=NOT_SELECTED):
        query.filtered([key("g")])


def pin(db: duckdb.DuckDBPyConnection, query: UserQuery) -> UserQuery:
    return query.pinned([[r[0] for r in rows(db, field)] for field in query.dynamic_pivot_fields()])


def test_dynamic_pivot_is_pinned_so_every_subquery_has_every_column(db: duckdb.DuckDBPyConnection) -> None:
    # g = 0 has no k = 'c' row after the WHERE, so a pivot of its rows alone would lack column c.
    sql = "PIVOT (SELECT * FROM t WHERE NOT (g = 0 AND k = 'c')) ON k USING sum(v) GROUP BY g"
    query = UserQuery(sql, DIALECT)
    fields = query.dynamic_pivot_fields()
    assert len(fields) == 1
    assert [r[0] for r in rows(db, fields[0])] == ["a", "b", "c"]
    statement = pin(db, query).filtered([key("g")])
    assert parameters(statement) == ["$1"]
    whole = db.sql(sql)
    for g in range(3):
        part = db.execute(statement, [g])
        assert [d[0] for d in part.description] == whole.columns
        assert part.fetchall() == [r for r in whole.fetchall() if r[0] == g]
    # Unpinned, DuckDB refuses the parameter outright.
    with pytest.raises(duckdb.Error, match="parameters"):
        db.execute(query.filtered([key("g")]), [0])


def test_dynamic_pivot_pinning_keeps_duckdb_column_names_and_order(db: duckdb.DuckDBPyConnection) -> None:
    source = (
        "SELECT g, id % 12 AS n, (id % 4 / 4)::DECIMAL(4, 2) AS d, CAST(ts AS DATE) AS day, "
        "k || ' ''q'' \\' AS s, v FROM t"
    )
    sql = f"WITH src AS ({source}) PIVOT src ON n, d, day, s USING sum(v) GROUP BY g"
    pinned = pin(db, UserQuery(sql, DIALECT))
    columns = [d[0] for d in db.execute(pinned.schema()).description]
    assert columns == db.sql(sql).columns
    assert "10_0.25_2024-01-03_a 'q' \\" in columns
    assert rows(db, pinned.filtered([])) == rows(db, sql)


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4, unique=True))
def test_dynamic_pivot_pinning_round_trips_any_text(values: list[str]) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE p (g INTEGER, k VARCHAR, v DOUBLE)")
    con.executemany("INSERT INTO p VALUES (?, ?, ?)", [(i % 2, k, float(i)) for i, k in enumerate(values)])
    sql = "PIVOT p ON k USING sum(v) GROUP BY g"
    pinned = pin(con, UserQuery(sql, DIALECT))
    whole = con.sql(sql)
    assert [d[0] for d in con.execute(pinned.schema()).description] == whole.columns
    assert sorted(rows(con, pinned.filtered([]))) == sorted(whole.fetchall())
    con.close()


def test_dynamic_pivot_without_values_is_refused() -> None:
    query = UserQuery("PIVOT t ON k USING sum(v)", DIALECT)
    with pytest.raises(ValueError, match=r"PIVOT field 'k' has no non-NULL values"):
        query.pinned([[]])


def test_dynamic_pivot_in_a_subquery_or_cte_is_pinned_too(db: duckdb.DuckDBPyConnection) -> None:
    for sql in (
        "SELECT * FROM (PIVOT t ON k USING sum(v) GROUP BY g) ORDER BY g",
        "WITH p AS (PIVOT t ON k USING sum(v) GROUP BY g) SELECT * FROM p ORDER BY g",
    ):
        query = pin(db, UserQuery(sql, DIALECT))
        statement = query.filtered([key("g")])
        assert rows(db, statement, 2) == [r for r in rows(db, sql) if r[0] == 2]


def test_standard_pivot_and_unpivot_need_no_pinning(db: duckdb.DuckDBPyConnection) -> None:
    unpivot = "UNPIVOT (SELECT g, v, id * 1.0 AS w FROM t) ON v, w INTO NAME name VALUE value"
    for sql in ("SELECT * FROM t PIVOT (sum(v) FOR k IN ('a', 'b'))", unpivot):
        assert UserQuery(sql, DIALECT).dynamic_pivot_fields() == []
    assert len(rows(db, filtered(unpivot, "g"), 1)) == 16


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT id, g + 1 AS g FROM t",
        "SELECT id, k AS g FROM t",
        "SELECT id, g AS k, k AS g FROM t",
        "SELECT * REPLACE (g * 10 AS g) FROM t",
        "SELECT * RENAME (g AS gg, k AS g) FROM t",
    ],
)
def test_a_key_is_the_result_column_the_select_list_defines(db: duckdb.DuckDBPyConnection, sql: str) -> None:
    # Injected into the WHERE, `g = $1` would read t.g; the split means the result's g.
    statement = filtered(sql, "g")
    whole = db.sql(sql).to_arrow_table().to_pylist()
    values = {r["g"] for r in whole}
    assert len(values) >= 3
    for value in values:
        assert db.sql(statement, params=[value]).to_arrow_table().to_pylist() == [
            r for r in whole if r["g"] == value
        ]


def test_top_level_limit_is_refused_when_splitting_by_a_column_not_selected() -> None:
    with pytest.raises(ValueError, match=NOT_SELECTED):
        filtered("SELECT id FROM t ORDER BY id LIMIT 5", "g")
    assert "LIMIT" in filtered("SELECT * FROM (SELECT id, g FROM t LIMIT 5)", "g")


def test_top_level_limit_is_applied_before_the_split_when_the_key_is_selected(
    db: duckdb.DuckDBPyConnection,
) -> None:
    sql = "SELECT id, g FROM t ORDER BY id DESC LIMIT 7"
    statement = filtered(sql, "g")
    whole = rows(db, sql)
    assert [r for g in range(3) for r in rows(db, statement, g)] == sorted(whole, key=lambda r: (r[1], -r[0]))


def test_without_columns_the_query_is_unchanged(db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT id FROM t WHERE v < 6 OR v > 30 ORDER BY id DESC"
    statement = UserQuery(sql, DIALECT).filtered([])
    assert parameters(statement) == []
    assert rows(db, statement) == rows(db, sql)


# --- refused queries ------------------------------------------------------------------------

REFUSED_SQL = [
    ("DELETE FROM t", r"read-only query.*refusing its DELETE"),
    ("INSERT INTO t SELECT * FROM t", r"read-only query.*refusing its INSERT"),
    ("UPDATE t SET v = 0", r"read-only query.*refusing its UPDATE"),
    ("CREATE TABLE z AS SELECT 1 AS v", r"read-only query.*refusing its CREATE"),
    ("CREATE OR REPLACE TABLE t AS SELECT 1 AS v", r"read-only query.*refusing its CREATE"),
    ("DROP TABLE t", r"read-only query.*refusing its DROP"),
    ("ALTER TABLE t ADD COLUMN z INTEGER", r"read-only query.*refusing its ALTER"),
    ("TRUNCATE t", r"read-only query.*refusing"),
    ("COPY t TO 'out.csv'", r"read-only query.*refusing its COPY"),
    ("ATTACH 'other.duckdb' AS other", r"read-only query.*refusing its ATTACH"),
    ("DETACH other", r"read-only query.*refusing its DETACH"),
    ("SELECT * INTO z FROM t", r"read-only query.*refusing its INTO"),
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", r"read-only query.*refusing its DELETE"),
    ("SET threads = 1", r"read-only query.*refusing its SET"),
    ("PRAGMA version", r"read-only query.*refusing"),
    ("BEGIN", r"read-only query.*refusing"),
    ("CALL pragma_version()", r"read-only query.*refusing"),
    ("SELECT 1 AS v; SELECT 2 AS v", r"exactly one query, got 2 statements"),
    ("SELECT 1 AS v; DROP TABLE t", r"exactly one query, got 2 statements"),
    ("-- nothing but a comment", r"exactly one query, got 0 statements"),
    ("SELECT FROM WHERE", r"does not parse as duckdb SQL"),
    ("SELEC v FROM t", r"does not parse as duckdb SQL"),
    ("SELECT 'unterminated FROM t", r"does not parse as duckdb SQL"),
    ("SELECT v FROM t /* unterminated", r"does not parse as duckdb SQL"),
    ("SELECT v FROM t WHERE g = ?", r"must not contain parameters"),
    ("SELECT v FROM t WHERE g = $1", r"must not contain parameters"),
    ("SELECT v FROM t WHERE g = :g", r"must not contain parameters"),
]


@pytest.mark.parametrize(("sql", "message"), REFUSED_SQL)
def test_non_read_only_or_malformed_sql_is_refused(sql: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        UserQuery(sql, DIALECT)


@pytest.mark.parametrize(("sql", "message"), REFUSED_SQL[:14])
def test_loader_refuses_writes_before_they_reach_the_engine(
    sql: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # were COPY or ATTACH to run, their files would land here
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS v, range % 2 AS g FROM range(5)")
    before = con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
    with pytest.raises(ValueError, match=message):
        DDBDataLoader(con, sql, target_col="v")
    assert con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall() == before
    assert con.execute("SELECT sum(v), count(*) FROM t").fetchall() == [(10.0, 5)]
    assert con.execute("SELECT count(*) FROM duckdb_databases() WHERE NOT internal").fetchall() == [(1,)]
    con.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sql", [None, "", "   \n", 42])
def test_empty_or_non_string_sql_is_a_type_error(sql: Any) -> None:
    with pytest.raises(TypeError, match=r"sql must be a non-empty query string"):
        UserQuery(sql, DIALECT)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a; DROP TABLE t", r"must be one SQL expression"),
        ("(SELECT 1)", r"not a query"),
        ("g IN (SELECT g FROM t)", r"not a query"),
        ("EXISTS (SELECT 1)", r"not a query"),
        ("SELECT g FROM t", r"not a query"),
        ("g, k", r"is not a valid SQL expression"),
        ("g /* open", r"is not a valid SQL expression"),
        ("'open", r"is not a valid SQL expression"),
        ("g AS h", r"one value per row.*'g AS h'"),
        ("g h", r"one value per row"),
        ("*", r"one value per row"),
        ("max(v)", r"one value per row.*MAX\(v\)"),
        ("row_number() OVER ()", r"one value per row"),
        ("unnest([g, 1])", r"one value per row"),
        ("$1", r"must not contain parameters"),
        ("g = ?", r"must not contain parameters"),
    ],
)
def test_group_col_that_is_not_one_scalar_expression_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"group_col={text!r}") + r".*" + message):
        parse_column_expression(text, "group_col", DIALECT)


@pytest.mark.parametrize("column", ["group_col", "repartition_col"])
@pytest.mark.parametrize("text", ["a; DROP TABLE t", "(SELECT 1)", "g AS h"])
def test_loader_refuses_bad_key_expressions_and_leaves_the_table(column: str, text: str) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS v, range % 2 AS g FROM range(5)")
    with pytest.raises(ValueError, match=rf"^{column}="):
        DDBDataLoader(con, "SELECT v FROM t", target_col="v", **{column: text})
    assert con.execute("SELECT count(*) FROM t").fetchall() == [(5,)]
    con.close()


# --- hostile scheme values ------------------------------------------------------------------

HOSTILE = [
    "'",
    "''",
    "' OR '1'='1",
    "' OR 1=1 --",
    "'; DROP TABLE h; --",
    "x'); DROP TABLE h; --",
    '" OR ""="',
    "-- comment",
    "/* open comment",
    "*/ OR 1=1 /*",
    "\\",
    "\\'",
    "\\' OR 1=1 --",
    "a\x00b",
    "\x00",
    ";",
    "$1",
    "?",
    ":name",
    "%",
    "_",
    "NULL",
    "",
    " ",
    "\n",
    "ünïcødé ✓ 🚀 中文",
    "\u202eRTL override",
    "' UNION SELECT 1, 2 --",
    "1); DELETE FROM h WHERE (1=1",
]
#: Values stored in ``h``; every second one of HOSTILE, so half the queries hit rows.
STORED = HOSTILE[::2]


@pytest.fixture(scope="module")
def hostile_db() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    groups = [s for s in STORED for _ in range(2)] + ["plain", "plain"]
    connection.execute("CREATE TABLE h (g VARCHAR, id INTEGER, v DOUBLE)")
    connection.executemany("INSERT INTO h VALUES (?, ?, ?)", [(g, i, float(i)) for i, g in enumerate(groups)])
    yield connection
    connection.close()


def snapshot(con: duckdb.DuckDBPyConnection) -> tuple[list[Any], list[Any]]:
    tables = con.execute("SELECT database_name, table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
    return tables, con.execute("SELECT g, id, v FROM h ORDER BY id").fetchall()


def ids_matching(con: duckdb.DuckDBPyConnection, value: str) -> list[int]:
    return [i for g, i, _ in snapshot(con)[1] if g == value]


def loaded_ids(con: duckdb.DuckDBPyConnection, **kwargs: Any) -> tuple[int, list[int]]:
    with DDBDataLoader(
        con,
        "SELECT id, g, v FROM h ORDER BY id",
        target_col="v",
        input_col=["id"],
        batch_size=128,
        prefetch_batch=0,
        fetch_threads=1,
        **kwargs,
    ) as loader:
        ids = [int(i) for x, _ in loader for i in x[:, 0].tolist()]
        return loader.plan.samples, ids


def check_value_matches_only_itself(con: duckdb.DuckDBPyConnection, value: str, column: str) -> None:
    before = snapshot(con)
    scheme = {"group_col": "group_scheme", "repartition_col": "repartition_scheme"}[column]
    expected = ids_matching(con, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if expected:
            samples, ids = loaded_ids(con, **{column: "g", scheme: [value]})
        else:  # a loader that can make no sample is refused at construction
            with pytest.raises(ValueError, match=r"can make no sample: the query .* returns no rows"):
                loaded_ids(con, **{column: "g", scheme: [value]})
            samples, ids = 0, []
    unmatched = [str(w.message) for w in caught if "match no rows" in str(w.message)]
    message = f"{scheme} value(s) {[value]!r} match no rows of {column} 'g', so they load nothing"
    assert [m.startswith(message) for m in unmatched] == ([] if expected else [True])
    assert samples == len(expected)
    assert ids == expected
    assert snapshot(con) == before


@pytest.mark.parametrize("column", ["group_col", "repartition_col"])
@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v) for v in HOSTILE])
def test_classic_injection_values_match_only_equal_rows(
    hostile_db: duckdb.DuckDBPyConnection, value: str, column: str
) -> None:
    check_value_matches_only_itself(hostile_db, value, column)
    assert (value in STORED) == bool(ids_matching(hostile_db, value))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(value=st.one_of(st.sampled_from(STORED), st.text(max_size=12)), as_group=st.booleans())
def test_arbitrary_text_matches_only_equal_rows(
    hostile_db: duckdb.DuckDBPyConnection, value: str, as_group: bool
) -> None:
    check_value_matches_only_itself(hostile_db, value, "group_col" if as_group else "repartition_col")


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_discovered_hostile_values_round_trip(hostile_db: duckdb.DuckDBPyConnection) -> None:
    before = snapshot(hostile_db)
    with DDBDataLoader(hostile_db, "SELECT id, g, v FROM h", target_col="v", group_col="g") as loader:
        found = {g.value: g.rows for g in loader.plan.groups}
    assert found == dict.fromkeys([*STORED, "plain"], 2)
    assert snapshot(hostile_db) == before


@pytest.mark.filterwarnings("ignore:.* match no rows of:UserWarning")  # hostile values match nothing
def test_several_hostile_values_in_one_scheme_keep_their_order(hostile_db: duckdb.DuckDBPyConnection) -> None:
    scheme: Sequence[str] = ["plain", HOSTILE[4], HOSTILE[3], "' OR '1'='1", HOSTILE[0]]
    samples, ids = loaded_ids(hostile_db, repartition_col="g", repartition_scheme=scheme)
    expected = [i for value in scheme for i in ids_matching(hostile_db, value)]
    assert ids == expected
    assert samples == len(expected) == 8


# --- many subqueries in one query (fetch units) --------------------------------------------------


def test_filtered_many_returns_the_rows_of_the_subqueries_with_their_keys(
    db: duckdb.DuckDBPyConnection,
) -> None:
    sql = "SELECT id, v, g, k FROM t WHERE v < 9 OR v > 30 ORDER BY v DESC"
    query = UserQuery(sql, DIALECT)
    statement = query.filtered_many([key("g"), key("k")], [2, None])
    assert statement is not None
    assert parameters(top_where(statement)) == ["$1", "$2"]
    got = rows(db, statement, 0, 2)
    single = query.filtered([key("g"), key("k")])
    for g in (0, 2):
        for k in "abc":
            expected = rows(db, single, g, k)
            assert [r[:4] for r in got if r[4:] == (g, k)] == expected  # same rows, same order
    assert {r[4] for r in got} == {0, 2}
    both = query.filtered_many([key("g"), key("k")], [1, 2])
    assert both is not None
    assert {r[4:] for r in rows(db, both, 1, "a", "c")} == {(1, "a"), (1, "c")}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT id, g FROM t UNION ALL SELECT id, g FROM u",
        "SELECT g, count(*) AS n FROM t GROUP BY g",
        "SELECT DISTINCT g, k FROM t",
        "SELECT id, g, sum(v) OVER (ORDER BY id) AS s FROM t",
        "SELECT id, g FROM t UNION SELECT id, g FROM u",
        "PIVOT t ON k IN ('a', 'b') USING sum(v) GROUP BY g",
    ],
)
def test_filtered_many_selects_the_keys_on_the_result_of_any_query(
    db: duckdb.DuckDBPyConnection, sql: str
) -> None:
    query = UserQuery(sql, DIALECT)
    statement = query.filtered_many([key("g")], [2])
    assert statement is not None
    got = rows(db, statement, 0, 1)
    single = query.filtered([key("g")])
    expected = [(*r, g) for g in (0, 1) for r in rows(db, single, g)]
    assert sorted(got) == sorted(expected)
    assert {r[-1] for r in got} == {0, 1}


def test_filtered_many_binds_each_keys_values_as_one_list(db: duckdb.DuckDBPyConnection) -> None:
    query = UserQuery("SELECT id, g, k FROM t ORDER BY id", DIALECT)
    statement = query.filtered_many([key("g"), key("k")], [2, None], lists=True)
    assert statement is not None
    assert parameters(top_where(statement)) == ["$1"]
    assert rows(db, statement, [0, 2]) == rows(
        db, "SELECT id, g, k, g, k FROM t WHERE g IN (0, 2) ORDER BY id"
    )


@pytest.mark.parametrize("lists", [True, False], ids=["two-lists", "values-list"])
def test_key_counts_count_an_explicit_scheme_bound_as_lists_or_values(
    db: duckdb.DuckDBPyConnection, lists: bool
) -> None:
    scheme = [2, 0, 7, *range(100, 1100)]  # 7 and 100.. match no row
    sql, params = UserQuery("SELECT id, g FROM t ORDER BY id", DIALECT).key_counts(
        [key("g")], [scheme], lists=lists
    )
    # A list-binding engine gets a statement of constant size, however long the scheme.
    assert len(params) == (2 if lists else len(scheme))
    got = {
        (r["_ddb_group_index"], r["_ddb_group"], r["_ddb_rows"])
        for r in db.sql(sql, params=list(params)).to_arrow_table().to_pylist()
    }
    assert got == {(0, 2, 8), (1, 0, 8)}


@pytest.mark.parametrize(
    ("dialect", "order", "mapped"),
    [
        ("postgres", "U", "u"),  # folded to lowercase: the column u, never "U"
        ("postgres", '"U"', "U"),
        ("postgres", "FOO", "foo"),  # the unquoted alias Foo: both fold to foo
        ("clickhouse", "U", "U"),  # case-sensitive: the alias U
        ("clickhouse", "u", "u"),
        ("duckdb", "Foo", "Foo"),  # case-insensitive: the first match, as DuckDB keeps names
    ],
)
def test_an_order_by_name_maps_to_the_result_column_the_engine_resolves(
    dialect: str, order: str, mapped: str
) -> None:
    select = 'SELECT a AS "U", u, b AS Foo FROM t' if dialect != "clickhouse" else "SELECT a AS U, u FROM t"
    query = UserQuery(f"{select} ORDER BY {order}", dialect)
    term = query.order_key([])
    assert term is not None and isinstance(term.this, exp.Column)
    assert term.this.name == mapped


@pytest.mark.parametrize(
    ("dialect", "order", "left"),
    [
        ("clickhouse", "U, v", ["U", "v"]),  # case-sensitive: U is not the key u
        ("postgres", "U, v", ["v"]),  # U folds to the key u
        ("postgres", '"U", v', ["U", "v"]),
    ],
)
def test_an_order_by_term_is_a_key_only_by_the_name_the_engine_resolves(
    dialect: str, order: str, left: list[str]
) -> None:
    select = 'SELECT "U", u, v FROM t' if dialect != "clickhouse" else "SELECT U, u, v FROM t"
    query = UserQuery(f"{select} ORDER BY {order}", dialect)
    terms = query.order_terms([exp.column("u")])
    assert terms is not None and [t.this.name for t in terms] == left
