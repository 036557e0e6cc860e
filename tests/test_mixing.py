"""The mixing figures of a shuffled epoch (ddbloader/_epoch/mixing.py) against a brute force."""

from __future__ import annotations

import itertools

import duckdb
import numpy as np
import pytest

from ddbloader import DDBDataLoader
from ddbloader._diagnostics import mixing
from ddbloader._diagnostics.mixing import measure
from ddbloader._epoch.schedule import BatchSchedule
from ddbloader._epoch.shard import epoch_units


@pytest.mark.parametrize(
    ("window_size", "seed", "sampled"), [(None, 0, None), (3, 1, None), (5, 2, None), (3, 3, 7)]
)
def test_measure_is_the_brute_force_of_the_schedule(
    con: duckdb.DuckDBPyConnection,
    monkeypatch: pytest.MonkeyPatch,
    window_size: int | None,
    seed: int,
    sampled: int | None,
) -> None:
    # sampled: measure at most that many batches (an epoch longer than SAMPLED_BATCHES), strided
    if sampled is not None:
        monkeypatch.setattr(mixing, "SAMPLED_BATCHES", sampled)
    # groups of several days of uneven lengths, one group with no rows in the scheme's last day
    con.execute(
        "CREATE TABLE t AS SELECT i % 5 AS g, (i // 5) % 4 AS d, i AS id, i * 0.5 AS f, i * 1.0 AS y "
        "FROM range(997) r(i) WHERE NOT (i % 5 = 4 AND (i // 5) % 4 = 3)"
    )
    options = {"group_col": "g", "repartition_col": "d", "shuffle": True, "seed": seed, "batch_size": 16}
    with DDBDataLoader(
        con, "SELECT * FROM t ORDER BY g, d, id", "y", input_col=["f"], window_size=window_size, **options
    ) as loader:
        plan, config = loader.plan, loader.config
        units = epoch_units(plan, config, 0)
        figures = measure(plan, units, config, 0, loader.batches())
    firsts = {}  # (group, first row of each partition) in plan order, and the plan's partition index
    index = 0
    group_starts = []
    offset = 0
    for group in plan.groups:
        bounds = list(itertools.accumulate((p.rows for p in group.partitions), initial=0))
        firsts[group.index] = (bounds, index)
        index += len(group.partitions)
        group_starts.append(offset)
        offset += group.rows
    distinct, order = [], []
    stride = plan.geometry.stride
    batches = loader.batches()
    every = -(-batches // mixing.SAMPLED_BATCHES)
    assert sampled is None or every > 1
    for batch in BatchSchedule(units, plan.geometry, config, 0, batches):
        if batch.index % every:
            continue
        seen = set()
        for group, sample in zip(batch.groups.tolist(), batch.samples.tolist(), strict=True):
            row = sample * stride
            bounds, first = firsts[group]
            seen.add(first + max(k for k in range(len(bounds) - 1) if bounds[k] <= row))
            order.append(group_starts[group] + row)
        distinct.append(len(seen))
    ranks = np.argsort(np.argsort(np.array(order, np.float64), kind="stable"))
    expected = float(np.corrcoef(np.arange(len(order)), ranks)[0, 1])
    assert (figures.batches, figures.samples) == (len(distinct), len(order))
    assert figures.partitions_per_batch == float(np.median(distinct))
    assert figures.rank_correlation == pytest.approx(expected, abs=1e-12)


def test_an_epoch_of_no_units_is_measured_as_empty(con: duckdb.DuckDBPyConnection) -> None:
    """A share with nothing to serve (a query without rows is refused at construction): its
    mixing is measured as no batches, no samples, and an undefined rank correlation."""
    con.execute("CREATE TABLE nothing (g INTEGER, f DOUBLE, y DOUBLE)")
    with pytest.raises(ValueError, match="can make no sample"):
        DDBDataLoader(con, "SELECT * FROM nothing ORDER BY g", "y", group_col="g", shuffle=True)
    con.execute("INSERT INTO nothing VALUES (1, 0.5, 1.5)")
    with DDBDataLoader(con, "SELECT * FROM nothing ORDER BY g", "y", group_col="g", shuffle=True) as loader:
        figures = measure(loader.plan, [], loader.config, 0, 0)
    assert (figures.batches, figures.samples) == (0, 0)
    assert np.isnan(figures.rank_correlation)


def _groups(con: duckdb.DuckDBPyConnection, groups: int, rows: int, table: str = "s") -> None:
    """``groups`` series of ``rows`` rows, ordered by id."""
    values = "i AS id, i * 0.5 AS f, i * 1.0 AS y"
    con.execute(f"CREATE TABLE {table} AS SELECT i // {rows} AS g, {values} FROM range({groups * rows}) r(i)")


def test_an_epoch_that_cannot_come_close_to_row_order_is_not_measured_at_its_end(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a fresh loader's first epoch draws no schedule again (the check's cost, tens
    of ms) when its plan cannot come close to row order; stats() still measures when asked."""
    calls = []

    def counted(*args: object) -> mixing.Mixing:
        calls.append(args)
        return measure(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(mixing, "measure", counted)
    _groups(con, 64, 100)
    options = {"group_col": "g", "input_col": ["f"], "batch_size": 32, "shuffle": True, "seed": 1}
    with DDBDataLoader(con, "SELECT * FROM s ORDER BY g, id", "y", **options) as loader:
        assert not mixing.can_follow_row_order(
            epoch_units(loader.plan, loader.config, 0), loader.plan.geometry
        )
        list(loader)
        assert calls == []
        assert abs(loader.stats().rank_correlation) < mixing.ROW_ORDER
        assert len(calls) == 1


@pytest.mark.parametrize("seed", range(8))
def test_a_plan_of_enough_visit_blocks_stays_away_from_row_order(
    con: duckdb.DuckDBPyConnection, seed: int
) -> None:
    """The bound that lets the check skip a plan: 32 equal groups served one at a time (a pool of
    one, the least mixing) in a random order stay below ROW_ORDER; 4 groups may not (a sorted
    order of 4 blocks has a rank correlation of 1 - 1/16), so such a plan is measured."""
    _groups(con, 32, 160)
    options = {"group_col": "g", "input_col": ["f"], "batch_size": 64, "shuffle": True, "seed": seed}
    with DDBDataLoader(con, "SELECT * FROM s ORDER BY g, id", "y", group_pool_size=1, **options) as loader:
        plan, config = loader.plan, loader.config
        units = epoch_units(plan, config, 0)
        assert not mixing.can_follow_row_order(units, plan.geometry)
        assert abs(measure(plan, units, config, 0, loader.batches()).rank_correlation) < mixing.ROW_ORDER
    con.execute(
        "CREATE TABLE few AS SELECT i // 1100 AS g, i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range(4400) r(i)"
    )
    with DDBDataLoader(con, "SELECT * FROM few ORDER BY g, id", "y", group_pool_size=1, **options) as few:
        assert mixing.can_follow_row_order(epoch_units(few.plan, few.config, 0), few.plan.geometry)
    with DDBDataLoader(con, "SELECT * FROM s WHERE g < 4 ORDER BY g, id", "y", **options) as small:
        # 640 samples: too few to judge, whatever their order
        assert not mixing.can_follow_row_order(epoch_units(small.plan, small.config, 0), small.plan.geometry)
