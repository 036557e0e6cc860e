"""The Flight SQL backend's own behaviour against Sail's Flight SQL server (in this process).

The backend contract runs in tests/test_backends.py with ``flightsql`` among its engines. Here:
the dialect the server does not tell, the parameter probe, the typed literals that replace
parameters (each value read back unchanged by the engine, for Spark SQL on Sail and for DuckDB),
cancelling, and credentials.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import threading
import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from ddbloader.backends import FlightSQLBackend, connect
from ddbloader.backends.flightsql import inline_parameters, sql_literal

pytestmark = pytest.mark.timeout(120)


def test_the_dialect_is_asked_for_and_parameters_are_probed_once(flight_sql_uri: str) -> None:
    with pytest.raises(TypeError, match="pass dialect="):
        connect(flight_sql_uri)  # Sail's vendor_name is "Flight SQL": no dialect in it
    backend = FlightSQLBackend(flight_sql_uri, dialect="spark")
    assert backend.binds_parameters is False  # Sail 0.7 takes no bound parameters
    assert backend.engine == f"flight sql ({flight_sql_uri.removeprefix('grpc://')})"
    cursor = backend.cursor()
    assert cursor.fetch("SELECT 41 + ${1} AS v", [1]).column("v").to_pylist() == [42]
    cursor.close()
    backend.close()
    with pytest.raises(ValueError, match="grpc://"):
        FlightSQLBackend("postgresql://u:pw@h/db")


def test_a_passed_flight_sql_connection_is_cloned(flight_sql_uri: str) -> None:
    from adbc_driver_flightsql import dbapi

    mine = dbapi.connect(flight_sql_uri, autocommit=True)
    backend = FlightSQLBackend(mine, dialect="spark")
    cursor = backend.cursor()
    assert cursor.fetch("SELECT ${1} AS s", ["x'y"]).column("s").to_pylist() == ["x'y"]
    cursor.close()
    backend.close()
    with mine.cursor() as cursor:  # still open
        cursor.execute("SELECT 1 AS one")
        assert cursor.fetch_arrow_table().num_rows == 1
    mine.close()


def test_an_unreachable_server_fails_naming_it_and_leaves_no_connection_open() -> None:
    import adbc_driver_manager
    from adbc_driver_flightsql import dbapi

    opened: list[Any] = []

    def factory() -> Any:
        opened.append(dbapi.connect("grpc://127.0.0.1:1", autocommit=True))  # nothing listens on port 1
        return opened[-1]

    with pytest.raises(adbc_driver_manager.OperationalError, match="connection refused"):
        FlightSQLBackend(factory, dialect="duckdb")
    assert len(opened) == 1 and opened[0]._closed


def test_credentials_never_appear_in_the_engine_name() -> None:
    with pytest.raises(Exception) as caught:
        FlightSQLBackend("grpc://me:secret-pw-xyz@127.0.0.1:9", dialect="spark")
    assert "secret-pw-xyz" not in str(caught.value)


def test_interrupt_cancels_the_running_query(flight_sql_uri: str) -> None:
    backend = FlightSQLBackend(flight_sql_uri, dialect="spark")
    cursor = backend.cursor()
    cursor.interrupt()  # idle: nothing to stop
    assert cursor.fetch("SELECT 1 AS one", []).num_rows == 1
    timer = threading.Timer(1.0, cursor.interrupt)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)cancel"):
        cursor.fetch("SELECT count(*) AS n FROM range(0, 100000000000) WHERE hash(id) = 5", [])
    assert time.monotonic() - started < 60
    timer.join()
    cursor.close()
    backend.close()


# --- typed literals -------------------------------------------------------------------------------

EXACT = [
    None,
    True,
    0,
    -5,
    2**53 + 1,
    -(2**63),
    0.1,
    -1e-300,
    decimal.Decimal("12345678901234567.89"),
    decimal.Decimal("-0.001"),
    "",
    "it's",
    "back\\slash",
    "a\x00b",
    "line\nbreak\ttab",
    "中文😀",
    dt.date(2024, 1, 2),
    dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
]


def _select(value: Any, dialect: str) -> str:
    """``SELECT <literal of value> AS v`` in ``dialect``, from the parameter as the loader renders it."""
    parameter = exp.Parameter(this=exp.Literal.number(1))
    return inline_parameters(exp.select(parameter.as_("v")).sql(dialect=dialect), [value], dialect)


@pytest.fixture(scope="module")
def sail(flight_sql_uri: str) -> Any:
    backend = FlightSQLBackend(flight_sql_uri, dialect="spark")
    cursor = backend.cursor()
    yield lambda sql: cursor.fetch(sql, []).column("v").to_pylist()
    cursor.close()
    backend.close()


def _duck(sql: str) -> list[Any]:
    return [row[0] for row in duckdb.sql(sql).fetchall()]


@pytest.mark.parametrize("value", EXACT, ids=repr)
def test_literals_read_back_as_the_value_on_sail_and_duckdb(sail: Any, value: Any) -> None:
    for run, dialect in ((sail, "spark"), (_duck, "duckdb")):
        (got,) = run(_select(value, dialect))
        if isinstance(got, dt.datetime) and got.tzinfo is not None:  # Sail's TIMESTAMP is UTC-aware
            got = got.replace(tzinfo=None)
        # an integer beyond BIGINT is a DECIMAL literal in Spark SQL: the same number
        same_type = type(got) is type(value) or (isinstance(value, int) and isinstance(got, decimal.Decimal))
        assert got == value and same_type, (dialect, got)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=12))
@example(text="\x000")  # Spark's dialect escapes NUL as \0: an octal escape with the digits after it
@example(text="a\x0012\x00")
def test_any_text_reads_back_unchanged(sail: Any, text: str) -> None:
    """Whatever the characters, the literal holds the value: it never ends early nor runs."""
    assert sail(_select(text, "spark")) == [text]
    assert _duck(_select(text, "duckdb")) == [text]


def test_floats_nan_and_infinities() -> None:
    for value in (math.nan, math.inf, -math.inf):
        (got,) = _duck(_select(value, "duckdb"))
        assert (math.isnan(got) and math.isnan(value)) or got == value


def test_numpy_and_arrow_scalars_become_their_values() -> None:
    assert _duck(_select(np.int32(7), "duckdb")) == [7]
    assert _duck(_select(np.datetime64("2024-01-02"), "duckdb")) == [dt.date(2024, 1, 2)]
    assert _duck(_select(pa.scalar(1.5), "duckdb")) == [1.5]
    moment = pa.scalar(1_700_000_000_123_456_789, pa.timestamp("ns"))
    assert "'2023-11-14 22:13:20.123456789'" in _select(moment, "duckdb")  # nanoseconds kept in the text


def test_values_without_a_literal_are_refused_by_type() -> None:
    with pytest.raises(TypeError, match="bytes"):
        sql_literal(b"raw")
    with pytest.raises(ValueError, match="finite"):
        sql_literal(decimal.Decimal("NaN"))
    with pytest.raises(ValueError, match="parameter \\$2"):
        inline_parameters("SELECT $2 AS v", [1], "postgres")
