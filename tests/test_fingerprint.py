"""verify=True: each partition's rows checked against an engine hash recorded at planning.

Real DuckDB, PostgreSQL, ClickHouse (chDB) and Spark; the faults are real data changes between
planning and fetch (an UPDATE after construction, two groups swapping their rows), or a fetch
unit's key column altered on its way to the client (a fake that injects a fault into the real
path). ClickHouse runs the UPDATEs as synchronous mutations, Spark (Parquet tables: no UPDATE)
as the same CASE expressions rewritten into the table; Spark is slow, so only the tests that
use ``any_db`` run on it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pgserver
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import sparkserver
import sqlglot
import torch
from planned import views
from sqlglot import exp
from test_backends import ClickHouseEngine, SparkEngine

from ddbloader import DDBDataLoader, DDBIterableDataset
from ddbloader._core.engine import Cursor
from ddbloader._sql.fingerprint import HASH_ALIAS, planned_sum, row_hash, strip_hash
from ddbloader._sql.query import UserQuery
from ddbloader.backends import ADBCBackend, DuckDBBackend, connect

#: 3 groups × 4 days × 50 rows; ``id`` is unique, so every row differs from every other.
ROWS = 600
SQL = "SELECT id, g, d, f, y, n FROM fp ORDER BY id"
ARGS: dict[str, Any] = {
    "batch_size": 16,
    "shuffle": True,
    "seed": 3,
    "window_size": 4,
    "input_col": ["f"],
    "group_col": "g",
}
#: How the rows travel: each partition alone, fetch units, partitions read in pieces.
MODES: dict[str, dict[str, Any]] = {
    "partitions": {"fetch_bytes": 0, "repartition_col": "d"},
    "units": {"repartition_col": "d"},
    # 200 rows of 8 bytes (float32) a group: read front to back in 4 pieces each without shuffle,
    # cut into range pieces of the order key with it
    "streamed": {"fetch_bytes": 64 * 8, "shuffle": False},
    "range pieces": {"fetch_bytes": 64 * 8},
}


@dataclass
class Db:
    """An engine holding ``fp``: the loader's source and a connection for the test's writes."""

    name: str
    source: Any
    execute: Callable[[str], None]


def _table() -> pa.Table:
    ids = np.arange(ROWS)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "g": pa.array(ids % 3, pa.int32()),
            "d": pa.array(ids // 150, pa.int32()),
            "f": pa.array(ids * 0.5, pa.float64()),
            "y": pa.array(ids * 0.25, pa.float64()),
            # NULL every 7th row: a NULL hashes too (position and all)
            "n": pa.array([None if i % 7 == 0 else f"n{i}" for i in ids.tolist()], pa.string()),
        }
    )


@contextlib.contextmanager
def _duckdb(data: pa.Table) -> Iterator[Db]:
    con = duckdb.connect()
    con.register("data", data)
    con.execute("CREATE TABLE fp AS SELECT * FROM data")
    con.unregister("data")
    try:
        yield Db("duckdb", con, lambda sql: con.execute(sql) and None)
    finally:
        con.close()


@contextlib.contextmanager
def _postgres(server: pgserver.PostgresServer, table: pa.Table) -> Iterator[Db]:
    from adbc_driver_postgresql import dbapi

    admin = dbapi.connect(server.uri, autocommit=True)

    def execute(sql: str) -> None:
        with admin.cursor() as cursor:
            cursor.execute(sql)

    execute("DROP TABLE IF EXISTS fp")
    with admin.cursor() as cursor:
        cursor.adbc_ingest("fp", table, mode="create")
    try:
        # each query reads what is committed when it runs (no snapshot), so that changes made
        # after planning reach the fetches, which verify=True must then catch
        yield Db("postgres", functools.partial(ADBCBackend, server.uri, snapshot=False), execute)
    finally:
        execute("DROP TABLE fp")
        admin.close()


def _update_as_select(sql: str) -> tuple[dict[str, exp.Expr], exp.Expr]:
    """An ``UPDATE fp SET c = e, ... [WHERE w]`` as its assignments and condition (TRUE: none)."""
    update = sqlglot.parse_one(sql, read="postgres")
    assert isinstance(update, exp.Update)
    sets = {e.this.name: e.expression for e in update.expressions}
    where = update.args.get("where")
    return sets, where.this if where is not None else exp.true()


@contextlib.contextmanager
def _clickhouse(uri: str, table: pa.Table) -> Iterator[Db]:
    engine = ClickHouseEngine(uri)

    def execute(sql: str) -> None:
        sets, where = _update_as_select(sql)
        assigned = ", ".join(f"{c} = {e.sql('clickhouse')}" for c, e in sets.items())
        engine.execute(
            f"ALTER TABLE fp UPDATE {assigned} WHERE {where.sql('clickhouse')} SETTINGS mutations_sync = 2"
        )

    engine.create("fp", table)
    try:
        yield Db("clickhouse", uri, execute)
    finally:
        engine.close()


@contextlib.contextmanager
def _spark(uri: str, table: pa.Table) -> Iterator[Db]:
    engine = SparkEngine(uri)

    def execute(sql: str) -> None:  # the loader reads through this session: it sees the rewrite
        sets, where = _update_as_select(sql)
        columns = ", ".join(
            f"CASE WHEN {where.sql('spark')} THEN {sets[c].sql('spark')} ELSE {c} END AS {c}"
            if c in sets
            else c
            for c in table.column_names
        )
        engine.execute(f"CREATE TABLE fp_next AS SELECT {columns} FROM fp")
        engine.execute("INSERT OVERWRITE TABLE fp SELECT * FROM fp_next")
        engine.execute("DROP TABLE fp_next")

    engine.create("fp", table)
    try:
        yield Db("spark", engine.admin, execute)
    finally:
        engine.close()


@contextlib.contextmanager
def _open(request: pytest.FixtureRequest, name: str) -> Iterator[Db]:
    if name == "duckdb":
        with _duckdb(_table()) as made:
            yield made
    elif name == "postgres":
        with _postgres(request.getfixturevalue("pg_server"), _table()) as made:
            yield made
    elif name == "clickhouse":
        with _clickhouse(request.getfixturevalue("chdb_uri"), _table()) as made:
            yield made
    else:
        server: sparkserver.SparkServer = request.getfixturevalue("spark_server")
        with _spark(server.uri, _table()) as made:
            yield made


@pytest.fixture(params=["duckdb", "postgres", "clickhouse"])
def db(request: pytest.FixtureRequest) -> Iterator[Db]:
    with _open(request, request.param) as made:
        yield made


@pytest.fixture(params=["duckdb", "postgres", "clickhouse", "spark"])
def any_db(request: pytest.FixtureRequest) -> Iterator[Db]:
    """:func:`db` and Spark (a server start, then seconds a query)."""
    with _open(request, request.param) as made:
        yield made


def _epoch(loader: DDBDataLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def _equal(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(p, q) and torch.equal(r, s) for (p, r), (q, s) in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("mode", list(MODES))
def test_a_verified_epoch_is_the_unverified_one(any_db: Db, mode: str) -> None:
    db = any_db
    with (
        DDBDataLoader(db.source, SQL, "y", **{**ARGS, **MODES[mode]}, verify=True) as verified,
        DDBDataLoader(db.source, SQL, "y", **{**ARGS, **MODES[mode]}) as plain,
    ):
        specs = [s for g in verified.plan.groups for s in g.partitions]
        assert all(s.fingerprint is not None for s in specs)
        assert not any(s.fingerprint for g in plain.plan.groups for s in g.partitions)
        # the plain subquery stays as it was: only the fetches carry the hash column
        assert all(
            HASH_ALIAS not in s.sql and HASH_ALIAS in s.fingerprint.sql for s in specs if s.fingerprint
        )
        assert any(v.streamed for v in views(verified.plan)) == (mode in ("streamed", "range pieces"))
        assert any(v.ranges is not None for v in views(verified.plan)) == (mode == "range pieces")
        # a second epoch reuses the plan's fingerprints (the loader's part): checked on DuckDB
        for _ in range(2 if db.name == "duckdb" else 1):
            assert _equal(_epoch(verified), _epoch(plain))


@pytest.mark.parametrize("mode", list(MODES))
def test_a_value_changed_after_planning_raises_naming_the_partition(any_db: Db, mode: str) -> None:
    db = any_db
    with (
        DDBDataLoader(db.source, SQL, "y", **{**ARGS, **MODES[mode]}, verify=True) as verified,
        DDBDataLoader(db.source, SQL, "y", **{**ARGS, **MODES[mode]}) as plain,
    ):
        db.execute("UPDATE fp SET y = y + 1 WHERE id = 151")  # group 1, day 1: the same row count
        assert len(_epoch(plain)) == len(plain)  # the counts cannot see it
        keys = r"\[1, 1\]" if "repartition_col" in MODES[mode] else r"\[1\]"
        pieces = r", read in 4 pieces" if mode == "streamed" else ""
        with pytest.raises(
            ValueError,
            match=rf"{pieces}, key values {keys}, returned the \d+ rows planning counted, but their "
            r"content differs",
        ):
            _epoch(verified)


@pytest.mark.parametrize("change", ["n = 'n7'", "n = ''", "n = NULL WHERE id = 8"])
def test_a_null_turned_into_a_value_or_back_is_seen(any_db: Db, change: str) -> None:
    db = any_db
    where = "" if "WHERE" in change else " WHERE id = 7"  # group 1, NULL at planning
    with DDBDataLoader(db.source, SQL, "y", **ARGS, verify=True) as loader:
        db.execute(f"UPDATE fp SET {change}{where}")
        with pytest.raises(ValueError, match=r"key values \[[12]\], .*content differs"):
            _epoch(loader)


#: Rows ``(a, b, c)`` that differ only in where a NULL, an empty string or a zero is.
_NULL_ROWS = [
    ("NULL", "'x'", "0"),
    ("'x'", "NULL", "0"),
    ("''", "'x'", "0"),
    ("'x'", "''", "0"),
    ("'null'", "'x'", "0"),
    ("NULL", "NULL", "0"),
    ("NULL", "NULL", "NULL"),
    ("'x'", "'x'", "NULL"),
    ("'x'", "'x'", "0"),
]


def test_a_row_hash_is_never_null_and_tells_a_null_from_empty_zero_and_its_neighbour(any_db: Db) -> None:
    # cityHash64(a, b) is NULL when one is NULL (ClickHouse); xxhash64(a, b) skips NULLs, so
    # ('x', NULL) and (NULL, 'x') hash alike and (NULL, NULL) to its seed (Spark)
    backend = connect(any_db.source)
    rows = " UNION ALL ".join(
        f"SELECT CAST({a} AS TEXT) AS a, CAST({b} AS TEXT) AS b, CAST({c} AS INT) AS c"
        for a, b, c in _NULL_ROWS
    )
    query = UserQuery(sqlglot.transpile(rows, read="postgres", write=backend.dialect)[0], backend.dialect)
    fetch = query.with_row_hash(row_hash(backend, backend.dialect)).filtered([])
    with contextlib.closing(backend.cursor()) as cursor:
        hashes = cursor.fetch(fetch, []).column(HASH_ALIAS)
    backend.close()
    assert hashes.null_count == 0
    assert len(set(hashes.to_pylist())) == len(_NULL_ROWS)


def test_spark_s_row_hash_sees_microseconds(spark_server: sparkserver.SparkServer) -> None:
    # Spark's JSON writes timestamps to the millisecond unless told otherwise
    backend = connect(spark_server.uri)
    rows = " UNION ALL ".join(
        f"SELECT TIMESTAMP'2020-01-01 00:00:00.12345{i}' AS ts, "
        f"TIMESTAMP_NTZ'2020-01-01 00:00:00.12345{i}' AS ntz"
        for i in range(2)
    )
    fetch = UserQuery(rows, "spark").with_row_hash(row_hash(backend, "spark")).filtered([])
    try:
        hashes = backend.cursor().fetch(fetch, []).column(HASH_ALIAS).to_pylist()
    finally:
        backend.close()
    assert len(set(hashes)) == 2


def test_groups_swapping_their_rows_raise(any_db: Db) -> None:
    db = any_db
    # Groups 0 and 1 hold 200 rows each: after the swap every count is as planned.
    with DDBDataLoader(db.source, SQL, "y", **ARGS, verify=True) as loader:
        db.execute("UPDATE fp SET g = CASE g WHEN 0 THEN 1 WHEN 1 THEN 0 ELSE g END")
        with pytest.raises(ValueError, match=r"partition 0 of group [01] .*content differs"):
            _epoch(loader)


def test_a_duplicated_pair_changed_into_another_is_seen(db: Db) -> None:
    # Two equal rows become two other equal rows: an XOR of the row hashes is the same before
    # and after (each pair cancels out); their sum is not.
    db.execute(
        "UPDATE fp SET id = 0, f = 0, y = 0, n = NULL WHERE id = 3"
    )  # rows 0 and 3 of group 0: equal now
    with DDBDataLoader(db.source, SQL, "y", **ARGS, verify=True) as loader:
        spec = loader.plan.groups[0].partitions[0]
        assert spec.fingerprint is not None
        before = _hashes(db, loader)
        db.execute("UPDATE fp SET f = 7, y = 7 WHERE id = 0")
        after = _hashes(db, loader)
        assert np.bitwise_xor.reduce(before) == np.bitwise_xor.reduce(after)
        with pytest.raises(ValueError, match=r"key values \[0\], .*content differs"):
            _epoch(loader)


def _hashes(db: Db, loader: DDBDataLoader) -> np.ndarray[Any, Any]:
    """The row hashes of group 0's subquery, as the engine computes them at fetch."""
    spec = loader.plan.groups[0].partitions[0]
    assert spec.fingerprint is not None
    with contextlib.closing(loader._backend.cursor()) as cursor:  # type: ignore[union-attr]
        table = cursor.fetch(spec.fingerprint.sql, spec.params)
    return np.asarray(table.column(HASH_ALIAS).to_numpy()).astype(np.int64).view(np.uint64)


@pytest.mark.parametrize(
    "args",
    [
        {"group_col": None},
        {"group_scheme": [2, 0, 1]},
        {"repartition_col": "d", "repartition_scheme": [3, 1]},
    ],
    ids=["no-keys", "group-scheme", "repartition-scheme"],
)
def test_whole_queries_and_explicit_schemes_are_verified(db: Db, args: dict[str, Any]) -> None:
    with DDBDataLoader(db.source, SQL, "y", **{**ARGS, **args}, verify=True) as loader:
        planned = [s.fingerprint.content for g in loader.plan.groups for s in g.partitions if s.fingerprint]
        assert len(planned) == loader.plan.partitions
        _epoch(loader)
        db.execute("UPDATE fp SET f = -f WHERE id = 599")  # group 2, day 3: in every plan here
        with pytest.raises(ValueError, match="content differs"):
            _epoch(loader)


def test_planned_sums_are_the_engine_hash_sums_mod_2_64(db: Db) -> None:
    with (
        DDBDataLoader(db.source, SQL, "y", **ARGS, repartition_col="d", verify=True) as loader,
        contextlib.closing(loader._backend.cursor()) as cursor,  # type: ignore[union-attr]
    ):
        for spec in (s for g in loader.plan.groups for s in g.partitions):
            assert spec.fingerprint is not None
            table, total = strip_hash(cursor.fetch(spec.fingerprint.sql, spec.params))
            assert table.num_rows == spec.rows
            assert total == spec.fingerprint.content
            hashes = pc.cast(
                cursor.fetch(spec.fingerprint.sql, spec.params).column(HASH_ALIAS), pa.int64(), safe=False
            )
            assert planned_sum(sum(hashes.to_pylist())) == total  # Python ints: no wrap-around


def test_a_resumed_stream_hashes_the_rows_it_skips(db: Db) -> None:
    args = {**ARGS, **MODES["streamed"], "verify": True}
    with DDBDataLoader(db.source, SQL, "y", **args) as first:
        iterator = iter(first)
        served = [(x.clone(), y.clone()) for x, y in (next(iterator) for _ in range(len(first) // 2))]
        state = first.state_dict()
        rest = [(x.clone(), y.clone()) for x, y in iterator]
    with DDBDataLoader(db.source, SQL, "y", **args) as resumed:
        resumed.load_state_dict(state)
        # its streams start mid-subquery and read the rows before it too: all of them are hashed
        assert _equal(_epoch(resumed), rest)
    assert served and rest


class _MislabellingCursor:
    """A real cursor whose fetch units' results come back with two rows' group keys swapped:
    each cell keeps its row count, but two rows land in the wrong partition (as a client that
    compared a key value differently from the engine would split them)."""

    def __init__(self, inner: Cursor) -> None:
        self._inner = inner

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        table = self._inner.fetch(sql, params)
        if "_ddb_group" not in table.column_names or "_ddb_rows" in table.column_names:
            return table  # not a fetch unit's result (a planning count)
        at = table.column_names.index("_ddb_group")
        keys = table.column(at).to_pylist()
        if 0 not in keys or 1 not in keys:
            return table  # the keys' types, read at planning
        first = keys.index(0)
        second = keys.index(1)
        keys[first], keys[second] = keys[second], keys[first]
        return table.set_column(at, "_ddb_group", pa.array(keys, table.schema.field(at).type))

    def interrupt(self) -> None:
        self._inner.interrupt()

    def close(self) -> None:
        self._inner.close()


class _MislabellingBackend(DuckDBBackend):
    def cursor(self) -> Any:
        return _MislabellingCursor(super().cursor())


def test_a_fetch_unit_split_wrongly_falls_back_to_the_subqueries(caplog: pytest.LogCaptureFixture) -> None:
    with _duckdb(_table()) as clean:
        with DDBDataLoader(clean.source, SQL, "y", **ARGS) as reference:
            expected = _epoch(reference)
        with DDBDataLoader(_MislabellingBackend(clean.source), SQL, "y", **ARGS) as unverified:
            assert not _equal(_epoch(unverified), expected)  # silently wrong: the counts agree
        with (
            caplog.at_level(logging.WARNING, logger="ddbloader"),
            DDBDataLoader(_MislabellingBackend(clean.source), SQL, "y", **ARGS, verify=True) as verified,
        ):
            assert _equal(_epoch(verified), expected)
    assert any(
        "content differs" in r.message and "fetching its partitions one by one" in r.message
        for r in caplog.records
    )


@pytest.mark.parametrize("engine", ["sqlite", "datafusion"])
def test_engines_without_a_row_hash_are_refused_by_name(engine: str) -> None:
    if engine == "sqlite":
        source: Any = sqlite3.connect(":memory:")
        source.execute("CREATE TABLE fp (g INTEGER, y REAL)")
        name = "sqlite3"
    else:
        datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
        source = datafusion.SessionContext()
        source.register_record_batches("fp", [_table().to_batches()])
        name = "datafusion"
    engines = "DuckDB, PostgreSQL, ClickHouse, Spark"
    with pytest.raises(ValueError, match=rf"verify=True needs .* {engines} only, not on {name}"):
        DDBDataLoader(source, "SELECT g, y FROM fp", "y", group_col="g", verify=True)


def test_the_iterable_dataset_takes_verify() -> None:
    with _duckdb(_table()) as clean:
        dataset = DDBIterableDataset(clean.source, SQL, "y", **ARGS, verify=True)
        assert dataset.loader.config.verify
        clean.execute("UPDATE fp SET f = f + 1 WHERE id = 10")
        with pytest.raises(ValueError, match=r"key values \[1\], .*content differs"):
            list(torch.utils.data.DataLoader(dataset, batch_size=None))
        dataset.loader.close()


def test_hash_sums_wrap_around_and_a_null_hash_is_refused() -> None:
    big = [2**64 - 1, 2**63, 5]
    table = pa.table({"a": [1, 2, 3], HASH_ALIAS: pa.array(big, pa.uint64())})
    stripped, total = strip_hash(table)
    assert stripped.column_names == ["a"]
    assert total == sum(big) % 2**64 == planned_sum(sum(big))
    signed = pa.table({HASH_ALIAS: pa.array([-1, -(2**63), 5], pa.int64())})  # PostgreSQL's int8
    assert strip_hash(signed)[1] == (2**64 - 1 + 2**63 + 5) % 2**64
    with pytest.raises(ValueError, match=r"row hash \(_ddb_hash\) is NULL for 1 rows"):
        strip_hash(pa.table({HASH_ALIAS: pa.array([1, None], pa.uint64())}))
