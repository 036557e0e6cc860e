"""The key-type matrix: a partition key of every type the engine groups by is exact or refused.

For each type, a table ``k`` holds 12 rows whose ``key`` cycles through a few values of that type
chosen near its limits (2^53 + 1 next to 2^53, nanoseconds within one microsecond, blank-padded
text, ...). The loader splits ``SELECT id, key, y FROM k ORDER BY id`` by ``key``. Then either
the constructor refused it with a ValueError naming the column and its type, or:

- each partition's rows, fetched as the loader fetches them, are exactly one of the engine's own
  groups (``GROUP BY key``), in the query's order, and every group is one partition;
- a whole epoch runs and yields every row once (never a failure mid-epoch).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import pgserver
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader
from ddbloader.backends import ADBCBackend, connect

ROWS = 12
SQL = "SELECT id, key, y FROM k ORDER BY id"


@dataclass(frozen=True)
class KeyType:
    """A column type, literal values of it (SQL text), and whether the split must be refused."""

    name: str
    values: tuple[str, ...]
    refused: str | None = None


DUCKDB_TYPES = [
    KeyType("BOOLEAN", ("true", "false")),
    KeyType("TINYINT", ("-128", "127", "0")),
    KeyType("SMALLINT", ("-32768", "32767", "1")),
    KeyType("INTEGER", ("-2147483648", "2147483647", "2")),
    KeyType("BIGINT", ("9007199254740993", "9007199254740992", "-9223372036854775808")),
    KeyType(
        "HUGEINT", ("170141183460469231731687303715884105727", "170141183460469231731687303715884105726")
    ),
    KeyType("UTINYINT", ("255", "254")),
    KeyType("USMALLINT", ("65535", "65534")),
    KeyType("UINTEGER", ("4294967295", "4294967294")),
    KeyType("UBIGINT", ("18446744073709551615", "18446744073709551614")),
    KeyType(
        "UHUGEINT", ("340282366920938463463374607431768211455", "340282366920938463463374607431768211454")
    ),
    KeyType("FLOAT", ("0.1", "3.4028235e38", "-0.0")),
    KeyType("DOUBLE", ("0.1", "0.30000000000000004", "1.7976931348623157e308", "'nan'", "'-inf'")),
    KeyType("DECIMAL(4,1)", ("999.9", "-999.9", "0.1")),
    KeyType("DECIMAL(18,3)", ("999999999999999.999", "999999999999999.998")),
    KeyType(
        "DECIMAL(38,0)", ("99999999999999999999999999999999999999", "99999999999999999999999999999999999998")
    ),
    KeyType(
        "DECIMAL(38,10)",
        ("9999999999999999999999999999.9999999999", "9999999999999999999999999999.9999999998"),
    ),
    KeyType("VARCHAR", ("'a'", "'a '", "''", "'ünï ✓ 🚀'", "'O''Brien'")),
    KeyType("BLOB", ("'\\x00'::BLOB", "'\\x00\\x00'::BLOB", "'\\xFF'::BLOB")),
    KeyType("BIT", ("'0'::BIT", "'00'::BIT", "'1'::BIT")),
    KeyType("DATE", ("DATE '0001-01-01'", "DATE '9999-12-31'", "DATE '2024-02-29'")),
    KeyType(
        "DATE",
        ("DATE '2024-01-01'", "'infinity'::DATE"),
        refused=r"group_col 'key' \(date32\[day\]\) holds values Python cannot represent",
    ),
    KeyType("TIME", ("TIME '00:00:00'", "TIME '23:59:59.999999'", "TIME '12:00:00.000001'")),
    KeyType("TIME_NS", ("'12:00:00.000000001'::TIME_NS", "'12:00:00.000000002'::TIME_NS")),
    KeyType("TIMETZ", ("TIMETZ '12:00:00+01'", "TIMETZ '12:00:00+02'", "TIMETZ '11:00:00+00'")),
    KeyType(
        "TIMESTAMP", ("TIMESTAMP '2024-01-01 00:00:00.000001'", "TIMESTAMP '2024-01-01 00:00:00.000002'")
    ),
    KeyType("TIMESTAMP_S", ("TIMESTAMP_S '2024-01-01 00:00:01'", "TIMESTAMP_S '2024-01-01 00:00:02'")),
    KeyType(
        "TIMESTAMP_MS", ("TIMESTAMP_MS '2024-01-01 00:00:00.001'", "TIMESTAMP_MS '2024-01-01 00:00:00.002'")
    ),
    KeyType(
        "TIMESTAMP_NS",
        (
            "make_timestamp_ns(1704067200000001000)",
            "make_timestamp_ns(1704067200000001500)",
            "make_timestamp_ns(1704067200000001001)",
        ),
    ),
    KeyType(
        "TIMESTAMPTZ", ("TIMESTAMPTZ '2024-01-01 00:00:00.000001+00'", "TIMESTAMPTZ '2024-01-01 01:00:00+01'")
    ),
    KeyType("INTERVAL", ("INTERVAL 1 DAY", "INTERVAL 1 MICROSECOND", "INTERVAL 1 MONTH", "INTERVAL 2 DAY")),
    KeyType("UUID", ("'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'")),
    KeyType("ENUM ('x', 'y', 'z')", ("'x'", "'z'")),
    KeyType("INTEGER[]", ("[1, 2]", "[2, 1]", "[]", "[NULL]")),
    KeyType("VARCHAR[]", ("['a', 'b']", "['a,b']", "['']")),
    KeyType("INTEGER[2]", ("[1, 2]::INTEGER[2]", "[2, 1]::INTEGER[2]")),
    KeyType(
        "STRUCT(a INTEGER, b VARCHAR)", ("{'a': 1, 'b': 'x'}", "{'a': 1, 'b': 'y'}", "{'a': NULL, 'b': 'x'}")
    ),
    KeyType("MAP(VARCHAR, INTEGER)", ("MAP {'a': 1}", "MAP {'a': 2}", "MAP {'b': 1}")),
    KeyType(
        "UNION(n INTEGER, s VARCHAR)",
        ("union_value(n := 1)", "union_value(s := '1')"),
        refused=r"group_col 'key' is of type .*union.*nor be told apart by their text",
    ),
    KeyType("JSON", ("'{\"a\": 1}'", "'[1, 2]'", "'\"x\"'")),
    KeyType("VARINT", ("'123456789012345678901234567890123456789012'::VARINT", "'-1'::VARINT")),
    KeyType("TIMESTAMP WITH TIME ZONE[]", ("[TIMESTAMPTZ '2024-01-01 00:00:00+00']", "[]")),
]

POSTGRES_TYPES = [
    KeyType("smallint", ("-32768", "32767")),
    KeyType("integer", ("-2147483648", "2147483647")),
    KeyType("bigint", ("9007199254740993", "9007199254740992", "-9223372036854775808")),
    KeyType("numeric(20,0)", ("90071992547409930001", "90071992547409930002", "90071992547409930003")),
    KeyType(
        "numeric(38,10)",
        ("9999999999999999999999999999.9999999999", "9999999999999999999999999999.9999999998"),
    ),
    KeyType("real", ("0.1", "3.4028235e38")),
    KeyType("double precision", ("0.1", "0.30000000000000004", "'NaN'", "'-Infinity'")),
    KeyType("text", ("'a'", "'a '", "''", "'ünï ✓'")),
    KeyType("varchar(5)", ("'ab'", "'ab '")),
    KeyType("char(4)", ("'ab'", "'abc'", "'a'")),
    KeyType("boolean", ("true", "false")),
    KeyType("date", ("DATE '0001-01-01'", "DATE '9999-12-31'")),
    KeyType(
        "timestamp", ("TIMESTAMP '2024-01-01 00:00:00.000001'", "TIMESTAMP '2024-01-01 00:00:00.000002'")
    ),
    KeyType(
        "timestamptz", ("TIMESTAMPTZ '2024-01-01 00:00:00.000001+00'", "TIMESTAMPTZ '2024-01-01 01:00:00+05'")
    ),
    KeyType("time", ("TIME '00:00:00'", "TIME '23:59:59.999999'")),
    KeyType("timetz", ("TIMETZ '12:00:00+01'", "TIMETZ '12:00:00+02'")),
    KeyType("interval", ("INTERVAL '1 day'", "INTERVAL '1 month'", "INTERVAL '1 microsecond'")),
    KeyType("uuid", ("'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'")),
    KeyType("bytea", ("'\\x00'::bytea", "'\\x0000'::bytea", "'\\xff'::bytea")),
    KeyType("jsonb", ("'{\"a\": 1}'", "'[1, 2]'", "'\"x\"'")),
    KeyType("money", ("12.34", "-0.01", "92233720368547758.07")),
    KeyType("inet", ("'10.0.0.1'", "'10.0.0.1/8'", "'::1'")),
    KeyType("cidr", ("'10.0.0.0/8'", "'192.168.0.0/16'")),
    KeyType("macaddr", ("'08:00:2b:01:02:03'", "'08:00:2b:01:02:04'")),
    KeyType("mood", ("'sad'", "'ok'", "'happy'")),
    KeyType("integer[]", ("ARRAY[1, 2]", "ARRAY[2, 1]", "'{}'")),
    KeyType("bit(3)", ("B'101'", "B'010'")),
    KeyType("varbit", ("B'1'", "B'01'")),
    KeyType("int4range", ("'[1,3)'", "'[1,4)'", "'empty'")),
    KeyType("oid", ("1", "4294967295")),
]


@dataclass
class Engine:
    name: str
    source: Any
    fetch: Callable[[str, tuple[Any, ...]], pa.Table]
    create: Callable[[KeyType], None]
    groups_sql: str


@contextlib.contextmanager
def cursor_of(source: Any) -> Iterator[Callable[[str, tuple[Any, ...]], pa.Table]]:
    backend = connect(source)
    cursor = backend.cursor()
    try:
        yield lambda sql, params=(): cursor.fetch(sql, params)
    finally:
        cursor.close()
        backend.close()


def rows_sql(key_type: KeyType) -> str:
    values = key_type.values
    return ", ".join(f"({i}, {values[i % len(values)]}, {i}.5)" for i in range(ROWS))


@pytest.fixture(scope="module")
def duck() -> Iterator[Engine]:
    con = duckdb.connect()

    def create(key_type: KeyType) -> None:
        con.execute(f"CREATE OR REPLACE TABLE k (id INTEGER, key {key_type.name}, y DOUBLE)")
        con.execute(f"INSERT INTO k VALUES {rows_sql(key_type)}")

    with cursor_of(con) as fetch:
        yield Engine("duckdb", con, fetch, create, "SELECT list(id ORDER BY id) AS ids FROM k GROUP BY key")
    con.close()


@pytest.fixture(scope="module")
def postgres(pg_server: pgserver.PostgresServer) -> Iterator[Engine]:
    from adbc_driver_postgresql import dbapi

    admin = dbapi.connect(pg_server.uri, autocommit=True)

    def execute(sql: str) -> None:
        with admin.cursor() as cursor:
            cursor.execute(sql)

    execute("DROP TYPE IF EXISTS mood CASCADE")
    execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")

    def create(key_type: KeyType) -> None:
        execute("DROP TABLE IF EXISTS k")
        execute(f"CREATE TABLE k (id integer, key {key_type.name}, y double precision)")
        execute(f"INSERT INTO k VALUES {rows_sql(key_type)}")

    # the oracle reads each case's table as it is now: no snapshot pinned when the fixture began
    with cursor_of(functools.partial(ADBCBackend, pg_server.uri, snapshot=False)) as fetch:
        yield Engine(
            "postgres",
            pg_server.uri,
            fetch,
            create,
            "SELECT array_agg(id ORDER BY id) AS ids FROM k GROUP BY key",
        )
    execute("DROP TABLE IF EXISTS k")
    execute("DROP TYPE mood")
    admin.close()


def check_key_type(engine: Engine, key_type: KeyType) -> None:
    engine.create(key_type)
    groups = sorted(r["ids"] for r in engine.fetch(engine.groups_sql, ()).to_pylist())
    assert len(groups) == len(key_type.values), "the values must be distinct in SQL: fix the case"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # target_col in x
        if key_type.refused is not None:
            with pytest.raises(ValueError, match=key_type.refused):
                DDBDataLoader(engine.source, SQL, "y", input_col=["y"], group_col="key")
            return
        loader = DDBDataLoader(engine.source, SQL, "y", input_col=["y", "id"], group_col="key", batch_size=5)
    with loader:
        partitions = [
            [r["id"] for r in engine.fetch(spec.sql, spec.params).to_pylist()]
            for group in loader.plan.groups
            for spec in group.partitions
        ]
        epoch = sorted(int(i) for x, _ in loader for i in x[:, 1].tolist())
    # Each partition is one of the engine's groups, in the query's order (ORDER BY id).
    assert sorted(partitions) == groups
    assert epoch == list(range(ROWS))


@pytest.mark.parametrize("key_type", DUCKDB_TYPES, ids=lambda t: f"{t.name}-{t.values[-1][:12]}")
def test_duckdb_key_type_is_exact_or_refused(duck: Engine, key_type: KeyType) -> None:
    check_key_type(duck, key_type)


@pytest.mark.parametrize("key_type", POSTGRES_TYPES, ids=lambda t: t.name)
def test_postgres_key_type_is_exact_or_refused(postgres: Engine, key_type: KeyType) -> None:
    check_key_type(postgres, key_type)


def test_matrix_size() -> None:
    assert len({t.name for t in DUCKDB_TYPES}) >= 40
    assert len({t.name for t in POSTGRES_TYPES}) >= 20


# --- values near the limits of their type --------------------------------------------------------

NEAR_2_53 = st.integers(-3, 3).map(lambda k: 2**53 + k)
NS_WITHIN_A_MICROSECOND = st.integers(0, 999).map(lambda ns: f"make_timestamp_ns({1704067200000001000 + ns})")
PADDED = st.text(alphabet="ab ", min_size=0, max_size=4).map(lambda s: "'" + s + "'")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.one_of(
        st.lists(NEAR_2_53, min_size=2, max_size=4, unique=True).map(
            lambda vs: KeyType("BIGINT", tuple(map(str, vs)))
        ),
        st.lists(NS_WITHIN_A_MICROSECOND, min_size=2, max_size=4, unique=True).map(
            lambda vs: KeyType("TIMESTAMP_NS", tuple(vs))
        ),
        st.lists(PADDED, min_size=2, max_size=4, unique=True).map(lambda vs: KeyType("VARCHAR", tuple(vs))),
    )
)
def test_duckdb_keys_near_their_type_limits_keep_their_identity(duck: Engine, case: KeyType) -> None:
    check_key_type(duck, case)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.one_of(
        st.lists(NEAR_2_53, min_size=2, max_size=4, unique=True).map(
            lambda vs: KeyType("numeric(20,0)", tuple(map(str, vs)))
        ),
        # char(n) ignores trailing blanks: values distinct once stripped.
        st.lists(st.text(alphabet="ab", min_size=1, max_size=3), min_size=2, max_size=4, unique=True).map(
            lambda vs: KeyType("char(4)", tuple(f"'{v}'" for v in vs))
        ),
    )
)
def test_postgres_keys_near_their_type_limits_keep_their_identity(postgres: Engine, case: KeyType) -> None:
    check_key_type(postgres, case)


def test_a_scheme_for_a_key_that_cannot_be_bound_exactly_is_refused_by_name(duck: Engine) -> None:
    duck.create(KeyType("TIMESTAMP_NS", ("make_timestamp_ns(1)", "make_timestamp_ns(2)")))
    with pytest.raises(ValueError, match=r"group_col 'key' is of type timestamp\[ns\].*group_scheme cannot"):
        DDBDataLoader(
            duck.source,
            SQL,
            "y",
            input_col=["y"],
            group_col="key",
            group_scheme=[datetime.datetime(1970, 1, 1)],
        )
