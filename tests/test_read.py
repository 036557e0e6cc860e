"""The Read value (``ddbloader._sql.read``): one query over many partitions, rendered from the
partitions the schedule chose, and how its result is split among them."""

from __future__ import annotations

from typing import Any

import duckdb
from conftest import make_series
from planned import views

from ddbloader import DDBDataLoader
from ddbloader._io.unit_split import split_by_key
from ddbloader._sql.partition import whole_read
from ddbloader._sql.read import keys_read, run_read
from ddbloader.backends import DuckDBBackend


def test_a_keys_read_binds_each_key_flat_or_as_one_list_and_splits_by_its_key_columns(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Two groups' partitions of repartition 1: the group key bound to two values, the
    repartition key to one; flat parameters for engines that bind scalars, one list per key
    for those that bind lists; the result splits into each partition's own subquery's rows."""
    make_series(con, [[4, 3, 5], [6, 2, 3]])
    sql = "SELECT gid, part, pos, f0, y FROM series ORDER BY pos DESC, rid"
    options: dict[str, Any] = {"input_col": ["f0"], "group_col": "gid", "repartition_col": "part"}
    with DDBDataLoader(con, sql, "y", repartition_scheme=[0, 1, 2], **options) as loader:
        plan = loader.plan
    cells = tuple(g.partitions[1] for g in plan.groups)
    groups = tuple(c.params[0] for c in cells)
    wanted = [cells[1].key]
    flat = keys_read(plan, [2, 1], (*groups, 1), cells, wanted, lists=False)
    listed = keys_read(plan, [2, 1], (*groups, 1), cells, wanted, lists=True)
    assert flat is not None and listed is not None
    assert flat.params == (*groups, 1) and listed.params == (list(groups), [1])
    assert flat.wanted == {cells[1].key} and flat.split == "keys" and flat.key_columns == 2
    assert flat.rows == sum(c.rows for c in cells)
    cursor = DuckDBBackend(con).cursor()
    parts = split_by_key(cursor.fetch(flat.sql, flat.params), cells)
    assert parts is not None
    for part, cell in zip(parts, cells, strict=True):
        alone = cursor.fetch(cell.sql, cell.params)
        assert part.to_pylist() == alone.to_pylist()


def test_a_run_read_wants_every_partition_of_its_run_and_splits_by_a_cell_index(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Two consecutive partitions of one read run (tagged range pieces): every one wanted, the
    result split by its last column, each partition's rows those of its own query."""
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(4 * 2048) r(i)")
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": 1}
    with DDBDataLoader(con, "SELECT * FROM big ORDER BY id", "y", fetch_bytes=2048 * 8, **options) as loader:
        plan = loader.plan
    group = plan.groups[0]
    assert group.read_together(1, 2)
    cells = group.partitions[1:3]
    read = run_read(plan, cells)
    assert read is not None
    assert read.split == "cells" and read.key_columns == 1 and read.wanted == {c.key for c in cells}
    cursor = DuckDBBackend(con).cursor()
    parts = split_by_key(cursor.fetch(read.sql, read.params), cells, cell_index=True)
    assert parts is not None
    for part, cell in zip(parts, cells, strict=True):
        own = read.read_alone(cell)
        assert own is group.reads[cell.position] and own.cells == (cell,)
        alone = cursor.fetch(own.sql, own.params)
        assert sorted(part.column("id").to_pylist()) == sorted(alone.column("id").to_pylist())
        assert read.in_order(cell, part).to_pylist() == alone.to_pylist()


def test_pieces_of_a_streamed_subquery_share_no_read_with_other_partitions(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Without shuffle a subquery larger than ``fetch_bytes`` is read in pieces by one streaming
    query: no key-list query reads them, no read run holds them, so no fetch unit may; a range
    piece of a shuffled one is in a read run, so a unit may read it."""
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(4 * 2048) r(i)")
    sql, options = (
        "SELECT * FROM big ORDER BY id",
        {"input_col": ["f"], "batch_size": 64, "fetch_bytes": 2048 * 8},
    )
    with DDBDataLoader(con, sql, "y", **options) as loader:
        streamed = loader.plan.groups[0]
    with DDBDataLoader(con, sql, "y", shuffle=True, seed=1, **options) as loader:
        ranged = loader.plan.groups[0]
    assert len(streamed.partitions) > 1 and len(ranged.partitions) > 1
    assert not any(streamed.keyed) and set(streamed.read_runs) == {None}
    assert set(streamed.heads) == {0} and all(read is streamed.reads[0] for read in streamed.reads)
    assert not any(ranged.keyed) and None not in ranged.read_runs


def test_a_whole_read_is_a_partitions_own_subquery_and_of_a_piece_its_whole_subquery(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """A partition read alone runs its own subquery, with ``verify=True`` the fingerprinting one
    (its rows' hash column after theirs); every piece of a streamed subquery reads the whole
    subquery, whose rows its pieces' counts cut."""
    con.execute("CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(4 * 2048) r(i)")
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 64, "fetch_bytes": 2048 * 8}
    for verify in (False, True):
        with DDBDataLoader(con, "SELECT * FROM big ORDER BY id", "y", verify=verify, **options) as loader:
            plan = loader.plan
        pieces = plan.groups[0].partitions
        assert len(pieces) > 1 and all(p.pieces == len(pieces) for p in views(plan.groups[0]))
        reads = [whole_read(p) for p in pieces]
        assert {(r.sql, r.params) for r in reads} == {(reads[0].sql, pieces[0].params)}
        assert all(r.split == "whole" and r.key_columns == 0 and r.hashed == verify for r in reads)
        assert [r.cells for r in reads] == [(p,) for p in pieces] and reads[1].wanted == {pieces[1].key}
        result = DuckDBBackend(con).cursor().fetch(reads[0].sql, reads[0].params)
        plain = DuckDBBackend(con).cursor().fetch(pieces[0].sql, pieces[0].params)
        assert result.num_rows == sum(p.rows for p in pieces) == plain.num_rows
        assert result.num_columns == plain.num_columns + verify
        assert result.select(plain.column_names).to_pylist() == plain.to_pylist()
