"""The reader (``ddbloader._io.reader``): one job runs any read, streamed or not, and hands each
wanted partition the rows of its own subquery, or refuses."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import duckdb
import pytest
from conftest import SERIES_SQL, make_series

from ddbloader import DDBDataLoader
from ddbloader._io.block import Block
from ddbloader._io.convert import to_block
from ddbloader._io.reader import Alone, ReadJob
from ddbloader._io.threads import ThreadFailure
from ddbloader._io.unit_split import UnitPartitions
from ddbloader._sql.partition import PartitionSpec, whole_read
from ddbloader._sql.read import keys_read
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


class Asked:
    """Claims of a read split by rows: the pieces ``specs`` asked for, in order."""

    def __init__(self, specs: Sequence[PartitionSpec]) -> None:
        self.asked = list(specs)
        self.delivered: list[tuple[PartitionSpec, Block]] = []
        self.opened_on = 0

    def next_claim(self) -> PartitionSpec | None:
        return self.asked[0] if self.asked else None

    def opened(self) -> None:
        self.opened_on += 1

    def running(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def deliver(self, partitions: UnitPartitions) -> None:
        assert partitions.specs[0] is self.asked.pop(0)
        self.delivered.append((partitions.specs[0], partitions.block(0)))

    def fail(self, failure: ThreadFailure) -> None:
        raise AssertionError(failure)

    def cancel(self) -> None:
        raise AssertionError("cancelled")

    def split_failed(self) -> None:
        raise AssertionError("a read split by rows is not split by keys")


@pytest.mark.parametrize("asked", [range(10), [1, 4, 9], [9]])
def test_a_streamed_read_serves_each_piece_asked_for_its_rows_of_the_subquery_run_whole(
    con: duckdb.DuckDBPyConnection, asked: Sequence[int]
) -> None:
    """A streamed subquery's read (split by rows) is run by the same job as any read: each piece
    asked for gets exactly its rows of the subquery run whole (the rows before it skipped), in
    one query."""
    make_series(con, [[640]])
    with DDBDataLoader(con, SERIES_SQL, "y", input_col=["f0"], fetch_bytes=8 * 64) as loader:
        plan = loader.plan
    group = plan.groups[0]
    read = group.reads[0]
    assert (
        read is not None and read.split == "rows" and read.cells == group.partitions and len(read.cells) == 10
    )
    backend = DuckDBBackend(con)
    cursor = backend.cursor()
    whole = to_block(cursor.fetch(read.sql, read.params), plan.layout)
    claims = Asked([group.partitions[i] for i in asked])
    job = ReadJob(read, claims, "stream", plan.layout, backend, threading.Event())
    assert job.run(cursor) == (len(asked), sum(group.partitions[i].rows for i in asked), 1)
    assert claims.opened_on == 1 and not claims.asked
    for spec, block in claims.delivered:
        first = read.first_rows[spec.position]
        assert block.y.tolist() == whole.y[first : first + spec.rows].tolist()
