"""Ranks that share one plan; a fresh snapshot and plan per epoch (``replan="epoch"``).

Real PostgreSQL (tests/pgserver.py) and real ranks (two processes, gloo on CPU): a write lands
between two ranks' constructions. Built before the process group, the ranks' plans differ and every
rank refuses before its first batch; built after it, rank 1 reads rank 0's snapshot and the two
shards are the query run whole on the data before the write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pgserver
import pytest
from servers import free_port

REPO = Path(__file__).resolve().parents[1]

SQL = "SELECT g, ts, v, y FROM t ORDER BY g, ts"
ROWS = 600

#: One rank: builds its loader before or after init_process_group, with a write between the two
#: ranks' constructions (argv: uri, port, rank, order, flag file), and prints what it served.
_RANK = """
import json, sys, time
import torch.distributed as dist
from adbc_driver_postgresql import dbapi
from ddbloader import DDBDataLoader

SQL = __SQL__
uri, port, rank, order, flag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
ARGS = dict(input_col=["v", "ts"], group_col="g", batch_size=16, shuffle=True, seed=5, fetch_bytes=4096)

def write():
    with dbapi.connect(uri, autocommit=True) as writer, writer.cursor() as cursor:
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

if order == "before":  # rank 0 builds, writes, then rank 1 builds; then the process group
    if rank == 1:
        wait(lambda: open(flag).read() == "written")
    loader = DDBDataLoader(uri, SQL, "y", **ARGS)
    if rank == 0:
        write()
        open(flag, "w").write("written")
    init()
else:  # the process group first; rank 1 writes once rank 0 holds its snapshot, then builds
    init()
    if rank == 1:
        wait(snapshot_held)
        write()
    loader = DDBDataLoader(uri, SQL, "y", **ARGS)
try:
    report = {"rows": [row for x, _ in loader for row in x.tolist()], "len": len(loader)}
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
def test_ranks_built_on_different_data_refuse_before_the_first_batch(
    pg_server: pgserver.PostgresServer, table: list[list[float]], tmp_path: Path
) -> None:
    """Built before the process group, each rank pins its own snapshot: an INSERT between the two
    constructions gives rank 1 more rows; every rank refuses at its first batch, naming why."""
    reports = _two_ranks(pg_server.uri, "before", tmp_path)
    for report in reports:
        assert "error" in report, report.keys()
        assert report["error"].startswith("rank(s) [1] planned another plan than rank 0")
        assert "the planned row counts per partition" in report["error"]
        assert "the data changed between the ranks' constructions" in report["error"]


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
