"""Ranks that share one plan; a fresh snapshot and plan per epoch (``replan="epoch"``).

Real PostgreSQL (tests/pgserver.py) and real ranks (two processes, gloo on CPU): a write lands
between two ranks' constructions. Built before the process group, the ranks' plans differ and every
rank refuses before its first batch; built after it, rank 1 reads rank 0's snapshot and the two
shards are the query run whole on the data before the write.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pgserver
import pytest
import torch
from servers import free_port
from torch.utils.data import DataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset

REPO = Path(__file__).resolve().parents[1]

SQL = "SELECT g, ts, v, y FROM t ORDER BY g, ts"
ROWS = 600

#: One rank: builds its loader before or after init_process_group, with a write between the two
#: ranks' constructions (argv: uri, port, rank, order, flag file), and prints what it served.
_RANK = """
import json, sys, time
import torch.distributed as dist
from adbc_driver_postgresql import dbapi
from torch.utils.data import DataLoader
from ddbloader import DDBDataLoader, DDBIterableDataset
from ddbloader.backends import ADBCBackend

SQL = __SQL__
uri, port, rank, order, flag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
ARGS = dict(input_col=["v", "ts"], group_col="g", batch_size=16, shuffle=True, seed=5, fetch_bytes=4096)

# a change that keeps every count; without snapshots only verify=True's row hashes see it
UPDATE_ONLY = order in ("before_update", "before_unpinned_verify")
ARGS["verify"] = order == "before_unpinned_verify"
source = ADBCBackend(uri, snapshot=False) if "unpinned" in order else uri

def write():
    with dbapi.connect(uri, autocommit=True) as writer, writer.cursor() as cursor:
        if not UPDATE_ONLY:
            cursor.execute("INSERT INTO t SELECT i % 6, 1000 + i, -1, 0.5 FROM generate_series(0, 59) i")
        cursor.execute("UPDATE t SET v = -1")

def snapshot_held():
    with dbapi.connect(uri, autocommit=True) as admin, admin.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                       "AND query LIKE '%pg_export_snapshot()%'")
        return cursor.fetchone()[0] > 0

def wait(ready):
    deadline = time.monotonic() + 60
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)

def init():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

if order.startswith(("before", "workers")):  # rank 0 builds, writes, rank 1 builds; then the group
    if rank == 1:
        wait(lambda: open(flag).read() == "written")
    if order == "workers":
        dataset = DDBIterableDataset(source, SQL, "y", num_workers=2, **ARGS)
        loader = dataset.loader
    else:
        loader = DDBDataLoader(source, SQL, "y", **ARGS)
    if rank == 0:
        write()
        open(flag, "w").write("written")
    init()
elif order == "epoch":  # replan='epoch': rank 1 writes between epochs 1 and 2; report epoch 2
    init()
    loader = DDBDataLoader(uri, SQL, "y", replan="epoch", **ARGS)
    list(loader)
    dist.barrier()
    if rank == 1:
        write()
    dist.barrier()
    planned = len(loader)  # before iter(), as Lightning asks: plans epoch 2 (a collective)
elif order == "rank0_closes":  # rank 0 closes its loader before rank 1 reads; then a write
    init()
    loader = DDBDataLoader(uri, SQL, "y", **ARGS)
    if rank == 0:
        loader.close()
    dist.barrier()
    if rank == 0:
        write()
    dist.barrier()
else:  # the process group first; rank 1 writes once rank 0 holds its snapshot, then builds
    init()
    if rank == 1:
        wait(snapshot_held)
        write()
    loader = DDBDataLoader(uri, SQL, "y", **ARGS)
try:
    if order == "rank0_closes" and rank == 0:
        report = {"rows": [], "len": 0}
    elif order == "workers":  # refused until the main process agreed (len(), as Lightning calls it)
        try:
            next(iter(DataLoader(dataset, batch_size=None, num_workers=2)))
            refused = None
        except RuntimeError as error:
            refused = str(error)
        batches = len(dataset)
        rows = [row for x, _ in DataLoader(dataset, batch_size=None, num_workers=2) for row in x.tolist()]
        report = {"refused": refused, "rows": rows, "len": batches}
    else:
        report = {"rows": [row for x, _ in loader for row in x.tolist()], "len": len(loader)}
        if order == "epoch":
            report["planned"] = planned
except RuntimeError as error:
    report = {"error": str(error)}
dist.barrier()
loader.close()
dist.destroy_process_group()
print(json.dumps(report))
""".replace("__SQL__", repr(SQL))


@pytest.fixture
def table(pg_server: pgserver.PostgresServer) -> Iterator[list[list[float]]]:
    """A fresh table ``t`` (6 groups x 100 rows, v = 1); yields its (v, ts) rows sorted by ts."""
    from adbc_driver_postgresql import dbapi

    with dbapi.connect(pg_server.uri, autocommit=True) as writer, writer.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS t")
        cursor.execute(
            f"CREATE TABLE t AS SELECT (i % 6) AS g, i AS ts, 1.0::float8 AS v, 0.5::float8 AS y "
            f"FROM generate_series(0, {ROWS - 1}) i"
        )
        cursor.execute("SELECT v, ts FROM t ORDER BY ts")
        yield [[float(v), float(ts)] for v, ts in cursor.fetchall()]


def _two_ranks(uri: str, order: str, tmp_path: Path) -> list[dict[str, Any]]:
    script, flag = tmp_path / "rank.py", tmp_path / "flag"
    script.write_text(_RANK)
    flag.write_text("")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    port = str(free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), uri, port, str(rank), order, str(flag)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [rank.communicate(timeout=150) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.communicate()
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(err[-3000:] for _, err in outputs)
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("order", ["before", "before_update"])
def test_ranks_built_before_the_process_group_read_rank_0_s_snapshot_from_the_first_batch(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path, order: str
) -> None:
    """Built before the process group, each rank pins its own snapshot; a write lands between the
    two constructions (an INSERT and an UPDATE, or an UPDATE alone, which keeps every count). At
    the first batch rank 1 finds that its snapshot sees other rows than rank 0's, reads rank 0's
    and plans again: the two shards are the query run whole before the write, each sample once."""
    reports = _two_ranks(pg_server.uri, order, tmp_path)
    served = sorted((row for report in reports for row in report["rows"]), key=lambda row: row[1])
    assert served == table
    assert reports[0]["len"] == reports[1]["len"]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("order", "difference"),
    [
        ("before_unpinned", "the planned row counts per partition"),
        ("before_unpinned_verify", "the rows' content"),
    ],
)
def test_ranks_without_a_snapshot_built_on_different_data_refuse_before_the_first_batch(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path, order: str, difference: str
) -> None:
    """Without snapshots (``ADBCBackend(uri, snapshot=False)``) each rank plans what is committed
    when it is built: an INSERT between the two constructions gives rank 1 more rows, an UPDATE
    other values (seen by verify=True's row hashes); every rank refuses at its first batch."""
    reports = _two_ranks(pg_server.uri, order, tmp_path)
    for report in reports:
        assert "error" in report, report.keys()
        assert report["error"].startswith("rank(s) [1] planned another plan than rank 0")
        assert difference in report["error"]
        assert "the data changed between the ranks' constructions" in report["error"]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_dataloader_workers_serve_a_plan_their_main_process_checked_against_rank_0(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path
) -> None:
    """A DDBIterableDataset built before the process group (a write between the two ranks'
    constructions), served by DataLoader workers, which cannot talk to the other ranks: refused
    until the main process agreed; after len(dataset) (as Lightning calls it on every rank) the
    workers inherit rank 0's snapshot and plan, and the ranks' shards are the query run whole."""
    reports = _two_ranks(pg_server.uri, "workers", tmp_path)
    for report in reports:
        assert report["refused"] is not None and "call len(dataset) or dataset.set_epoch" in report["refused"]
    served = sorted((row for report in reports for row in report["rows"]), key=lambda row: row[1])
    assert served == table
    assert reports[0]["len"] == reports[1]["len"]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_ranks_built_after_the_process_group_read_rank_0_s_snapshot(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path
) -> None:
    """Built after init_process_group, rank 1 reads the snapshot rank 0 took before the write: the
    two shards together are the query run whole on the data before it, each sample once."""
    reports = _two_ranks(pg_server.uri, "after", tmp_path)
    served = sorted((row for report in reports for row in report["rows"]), key=lambda row: row[1])
    assert served == table
    assert reports[0]["len"] == reports[1]["len"]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_rank_reads_rank_0_s_snapshot_after_rank_0_closed_its_loader(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path
) -> None:
    """Rank 1 holds its own copy of the snapshot it follows: rank 0 closes its loader, another
    session writes, and rank 1's shard is still its half of the rows before the write."""
    _, follower = _two_ranks(pg_server.uri, "rank0_closes", tmp_path)
    assert "error" not in follower, follower
    assert len(follower["rows"]) == ROWS // 2
    assert {v for v, _ in follower["rows"]} == {1.0}
    assert {tuple(row) for row in follower["rows"]} <= {tuple(row) for row in table}


# --- replan="epoch" -------------------------------------------------------------------------

FRESH: dict[str, Any] = {
    "input_col": ["v", "ts"],
    "group_col": "g",
    "batch_size": 32,
    "shuffle": True,
    "seed": 7,
    "fetch_bytes": 4096,
    "dtype": torch.float64,
}
#: The oracle: the loader's query run whole, its x columns sorted by ts.
ORACLE = f"SELECT v, ts FROM ({SQL}) q ORDER BY ts"
#: Written between epochs (or mid-epoch) by another session: new rows and changed values.
WRITES = (
    "INSERT INTO t SELECT i % 6, 1000 + i, 2.0, 0.5 FROM generate_series(0, 69) s(i)",
    "UPDATE t SET v = 3.0 WHERE ts % 5 = 0",
)


def _served(batches: Any) -> list[list[float]]:
    """Every (v, ts) row of an epoch's batches, sorted by ts."""
    return sorted(([float(v), float(ts)] for x, _ in batches for v, ts in x.tolist()), key=lambda r: r[1])


class _Postgres:
    """The table ``t`` on the session's PostgreSQL, written by another session."""

    def __init__(self, uri: str) -> None:
        from adbc_driver_postgresql import dbapi

        self.source = uri
        self.writer = dbapi.connect(uri, autocommit=True)

    def run(self, sql: str) -> list[list[float]]:
        with self.writer.cursor() as cursor:
            cursor.execute(sql)
            return [[float(v) for v in row] for row in cursor.fetchall()] if cursor.description else []


class _DuckDB:
    """The table ``t`` in an in-memory DuckDB whose connection the loader is given."""

    def __init__(self) -> None:
        self.source = duckdb.connect()
        self.writer = self.source

    def run(self, sql: str) -> list[list[float]]:
        rows = self.source.execute(sql).fetchall()
        return [[float(v) for v in row] for row in rows] if rows and rows[0] is not None else []


@pytest.fixture(params=["duckdb", "postgres"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A table ``t`` of 6 groups x 100 rows on a real engine, and how to run SQL there."""
    made = _Postgres(request.getfixturevalue("pg_server").uri) if request.param == "postgres" else _DuckDB()
    made.run("DROP TABLE IF EXISTS t")
    made.run(
        "CREATE TABLE t AS SELECT (i % 6) AS g, i AS ts, CAST(1 AS DOUBLE PRECISION) AS v, "
        f"CAST(0.5 AS DOUBLE PRECISION) AS y FROM generate_series(0, {ROWS - 1}) s(i)"
    )
    yield made
    made.writer.close()


def test_each_epoch_is_the_query_run_whole_on_the_data_committed_before_it(engine: Any) -> None:
    """A write mid-epoch 1 changes nothing in epoch 1 where a snapshot holds (PostgreSQL); epoch 2
    is the query run whole after it, and len() counts epoch 2's batches once it starts."""
    before = engine.run(ORACLE)
    with DDBDataLoader(engine.source, SQL, "y", replan="epoch", **FRESH) as loader:
        first_len = len(loader)
        iterator = iter(loader)
        first = next(iterator)
        if engine.source is not engine.writer:  # PostgreSQL: written by another session mid-epoch
            for statement in WRITES:
                engine.run(statement)
        epoch1 = _served([first, *iterator])
        if engine.source is engine.writer:  # DuckDB: a passed connection sees writes between queries
            for statement in WRITES:
                engine.run(statement)
        assert epoch1 == before
        after = engine.run(ORACLE)
        assert len(after) == len(before) + 70 and after != before
        iterator = iter(loader)
        assert len(loader) == len(iterator) == -(-len(after) // 32) != first_len
        assert _served(iterator) == after
        assert _served(loader) == after  # a later epoch with no write: the same rows again


def test_len_before_iter_counts_the_epoch_that_replan_will_serve(engine: Any) -> None:
    """Lightning asks len() before each epoch's iter(): the first len() after an epoch ended plans
    the next one, so it counts the batches that epoch yields; len() during an epoch leaves the
    running plan (and on PostgreSQL its snapshot) alone."""
    before = engine.run(ORACLE)
    with DDBDataLoader(engine.source, SQL, "y", replan="epoch", **FRESH) as loader:
        iterator = iter(loader)
        first = next(iterator)
        if engine.source is not engine.writer:  # PostgreSQL: written by another session mid-epoch
            for statement in WRITES:
                engine.run(statement)
        assert len(loader) == -(-len(before) // 32)  # the next epoch on the running plan
        assert _served([first, *iterator]) == before
        if engine.source is engine.writer:  # DuckDB: a passed connection sees writes between queries
            for statement in WRITES:
                engine.run(statement)
        after = engine.run(ORACLE)
        assert len(loader) == -(-len(after) // 32) != -(-len(before) // 32)
        iterator = iter(loader)  # planned by len() already: not again
        assert len(iterator) == len(loader) == -(-len(after) // 32)
        assert _served(iterator) == after
        loader.set_epoch(5)  # an epoch set by hand after one ended: len() plans it too
        engine.run("DELETE FROM t WHERE ts >= 1000")
        again = engine.run(ORACLE)
        assert len(loader) == -(-len(again) // 32) == -(-len(before) // 32)
        assert _served(loader) == again


def test_replan_never_keeps_one_snapshot(pg_server: pgserver.PostgresServer) -> None:
    """The default: epoch 2 reads the snapshot of construction, not the rows written since."""
    engine = _Postgres(pg_server.uri)
    try:
        engine.run("DROP TABLE IF EXISTS t")
        engine.run(
            "CREATE TABLE t AS SELECT (i % 6) AS g, i AS ts, CAST(1 AS DOUBLE PRECISION) AS v, "
            f"CAST(0.5 AS DOUBLE PRECISION) AS y FROM generate_series(0, {ROWS - 1}) s(i)"
        )
        before = engine.run(ORACLE)
        with DDBDataLoader(pg_server.uri, SQL, "y", **FRESH) as loader:
            assert _served(loader) == before
            for statement in WRITES:
                engine.run(statement)
            assert _served(loader) == before
    finally:
        engine.writer.close()


def test_a_state_inside_an_epoch_needs_its_plan_one_at_its_end_takes_a_fresh_one(engine: Any) -> None:
    """Resume under replan='epoch': a state saved mid-epoch is refused once the data changed (its
    snapshot is gone), naming why; a state saved after an epoch ended resumes on a fresh plan."""
    with DDBDataLoader(engine.source, SQL, "y", replan="epoch", **FRESH) as loader:
        iterator = iter(loader)
        next(iterator)
        inside = loader.state_dict()
        list(iterator)
        ended = loader.state_dict()
    assert inside["batches"] == 1 and ended["batches"] == 0
    for statement in WRITES:
        engine.run(statement)
    after = engine.run(ORACLE)
    with DDBDataLoader(engine.source, SQL, "y", replan="epoch", **FRESH) as loader:
        with pytest.raises(ValueError, match="the snapshot this state's epoch was planned on is gone"):
            loader.load_state_dict(inside)
        loader.load_state_dict(ended)
        assert loader.epoch == 1
        assert _served(loader) == after
    with (
        DDBDataLoader(engine.source, SQL, "y", **FRESH) as loader,  # replan='never': a change refuses
        pytest.raises(ValueError, match="600 samples per epoch; this one has 670"),
    ):
        loader.load_state_dict(ended)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"replan": "always"}, "replan must be 'never' or 'epoch', got 'always'"),
        ({"replan": "epoch", "cache_bytes": 2**20}, "replan='epoch' with cache_bytes=1048576"),
    ],
)
def test_bad_replan_arguments_are_refused(arguments: dict[str, Any], message: str) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i % 6 AS g, i AS ts, 1.0 AS v, 0.5 AS y FROM range(60) r(i)")
    with pytest.raises(ValueError, match=re.escape(message)):
        DDBDataLoader(con, SQL, "y", **{**FRESH, **arguments})


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_ranks_replan_each_epoch_on_rank_0_s_snapshot(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path
) -> None:
    """replan='epoch' under two ranks: a write between epochs 1 and 2; len() before epoch 2's
    iter() counts its batches, and the ranks' epoch-2 shards together are the query run whole
    after it, each sample once."""
    reports = _two_ranks(pg_server.uri, "epoch", tmp_path)
    from adbc_driver_postgresql import dbapi

    with dbapi.connect(pg_server.uri, autocommit=True) as admin, admin.cursor() as cursor:
        cursor.execute(ORACLE)
        after = [[float(v), float(ts)] for v, ts in cursor.fetchall()]
    assert len(after) == ROWS + 60
    served = sorted((row for report in reports for row in report["rows"]), key=lambda row: row[1])
    assert served == after
    # len() before epoch 2's iter() counted epoch 2's batches: 330 samples a rank, batches of 16
    assert [report["planned"] for report in reports] == [-(-len(after) // 2 // 16)] * 2


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_replan_is_refused_in_a_dataloader_worker(db_path: str) -> None:
    """A worker is a copy of the loader that cannot follow its parent's new plan: its first batch
    refuses, naming the combination (torch re-raises it in the main process, same type)."""
    data = DDBIterableDataset(db_path, "SELECT f0, y FROM series ORDER BY rid", "y", replan="epoch")
    try:
        with pytest.raises(ValueError, match=r"replan='epoch' in a DataLoader worker process.*num_workers=0"):
            next(iter(DataLoader(data, batch_size=None, num_workers=1)))
        assert len(list(DataLoader(data, batch_size=None, num_workers=0))) == len(data.loader)
    finally:
        data.loader.close()
    # told the worker count, the dataset refuses at construction
    with pytest.raises(ValueError, match=r"num_workers=2\) with replan='epoch' in a DataLoader worker"):
        DDBIterableDataset(
            db_path, "SELECT f0, y FROM series ORDER BY rid", "y", replan="epoch", num_workers=2
        )
