"""The reader (``ddbloader._io.reader``): one job runs any read that is not streamed and hands each
wanted partition the rows of its own subquery, or refuses."""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import pytest
from conftest import make_series

from ddbloader import DDBDataLoader
from ddbloader._io.convert import to_block
from ddbloader._io.reader import Alone, ReadJob
from ddbloader._io.threads import ThreadFailure
from ddbloader._io.unit_split import UnitPartitions
from ddbloader._sql.read import keys_read, whole_read
from ddbloader.backends import DuckDBBackend

SQL = "SELECT gid, part, pos, f0, y FROM series ORDER BY pos DESC, rid"
OPTIONS: dict[str, Any] = {"input_col": ["f0"], "group_col": "gid", "repartition_col": "part"}


class Delivered:
    """Waiters that keep what the reader hands them."""

    def __init__(self) -> None:
        self.partitions: UnitPartitions | None = None
        self.split_failures = 0

    def deliver(self, partitions: UnitPartitions) -> None:
        self.partitions = partitions

    def fail(self, failure: ThreadFailure) -> None:
        raise AssertionError(failure)

    def cancel(self) -> None:
        raise AssertionError("cancelled")

    def split_failed(self) -> None:
        self.split_failures += 1


def test_one_job_reads_a_partition_alone_or_many_by_keys_each_its_own_rows(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """A whole read delivers its partition's rows; a keys read of two groups' partitions, one of
    them wanted, delivers that one's own subquery's rows, split without falling back."""
    make_series(con, [[4, 3, 5], [6, 2, 3]])
    with DDBDataLoader(con, SQL, "y", repartition_scheme=[0, 1, 2], **OPTIONS) as loader:
        plan = loader.plan
    backend = DuckDBBackend(con)
    cursor = backend.cursor()
    cells = tuple(g.partitions[1] for g in plan.groups)
    alone = Alone(cells[0])
    job = ReadJob(whole_read(cells[0]), alone, "alone", plan.layout, backend, threading.Event())
    assert job.run(cursor) == (1, cells[0].rows, 1)
    own = to_block(cursor.fetch(cells[0].sql, cells[0].params), plan.layout)
    assert alone.result.wait(threading.Event(), 5).y.tolist() == own.y.tolist()
    read = keys_read(plan, [2, 1], (*(c.params[0] for c in cells), 1), cells, [cells[1].key], lists=False)
    assert read is not None
    delivered = Delivered()
    assert ReadJob(read, delivered, "unit", plan.layout, backend, threading.Event()).run(cursor) == (
        1,
        cells[1].rows,
        1,
    )
    assert delivered.partitions is not None and delivered.split_failures == 0
    assert delivered.partitions.specs == (cells[1],)
    own = to_block(cursor.fetch(cells[1].sql, cells[1].params), plan.layout)
    assert delivered.partitions.block(0).y.tolist() == own.y.tolist()


def test_a_whole_read_of_changed_data_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    """A partition whose rows differ from planning's count is refused, naming its subquery."""
    make_series(con, [[4, 3, 5]])
    with DDBDataLoader(con, SQL, "y", repartition_scheme=[0, 1, 2], **OPTIONS) as loader:
        plan = loader.plan
    spec = plan.groups[0].partitions[0]
    con.execute("DELETE FROM series WHERE rid = (SELECT min(rid) FROM series WHERE part = 0)")
    backend = DuckDBBackend(con)
    job = ReadJob(whole_read(spec), Alone(spec), "alone", plan.layout, backend, threading.Event())
    with pytest.raises(ValueError, match="planning counted"):
        job.run(backend.cursor())
