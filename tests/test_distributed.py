"""Rank sharding: disjoint shards whose union is complete, documented padding, equal batch counts.

In-process tests give rank/world_size explicitly; one test runs two real ranks under torchrun
(gloo, CPU) with tests/ddp_worker.py and trains a tiny DDP model. A sample is named by the rid of
its first x row, unique across groups.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import torch
from conftest import SERIES_SQL, make_series
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from servers import free_port

from ddbloader import DDBDataLoader

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:samples need 4 consecutive rows:UserWarning"),
]

REPO = Path(__file__).resolve().parents[1]

# Groups of 3, 42, 21, 1 and 25 rows: with a 3-row window (span 4) 0, 39, 18, 0 and 22 samples.
UNEVEN = [[3], [40, 2], [7, 7, 7], [1], [12, 13]]
WINDOWED: dict[str, Any] = {"window_size": 3, "group_col": "gid", "repartition_col": "part"}


def names(x: torch.Tensor) -> list[int]:
    first_rows = x[:, 0, 0] if x.dim() == 3 else x[:, 0]
    return [int(v) for v in first_rows.tolist()]


def epoch_names(loader: DDBDataLoader) -> list[list[int]]:
    return [names(x) for x, _ in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [v for batch in batches for v in batch]


def loader(source: Any, **kwargs: Any) -> DDBDataLoader:
    return DDBDataLoader(source, SERIES_SQL, "y", input_col=["f0"], **kwargs)


def index_order(source: Any, **kwargs: Any) -> list[int]:
    """Every sample of the epoch in index order (group by group, row order): one unsharded rank."""
    with loader(source, batch_size=64, shuffle=False, **kwargs) as whole:
        order = flat(epoch_names(whole))
        assert len(order) == whole.plan.samples == len(set(order))
    return order


def expected_shard(order: list[int], rank: int, world: int, even: str) -> list[int]:
    """The documented shard: a contiguous run of the index order, ``rank * total // world`` on.

    ``pad``: runs are topped up to ``ceil(total / world)`` with the run's own first samples.
    ``drop``: runs are cut to ``total // world``.
    """
    total = len(order)
    run = order[rank * total // world : (rank + 1) * total // world]
    if even == "drop":
        return run[: total // world]
    size = math.ceil(total / world)
    while len(run) < size:
        run += run[: size - len(run)]
    return run


@pytest.fixture
def uneven(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    make_series(con, UNEVEN)
    return con


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("even", ["pad", "drop"])
@pytest.mark.parametrize(
    ("window", "batch_size"),
    [pytest.param(WINDOWED, 4, id="windowed-grouped"), pytest.param({}, 5, id="rows")],
)
def test_ordered_shards_are_the_documented_runs(
    uneven: duckdb.DuckDBPyConnection, world: int, even: str, window: dict[str, Any], batch_size: int
) -> None:
    order = index_order(uneven, **window)
    lengths = []
    for rank in range(world):
        with loader(
            uneven, batch_size=batch_size, rank=rank, world_size=world, even_batches=even, **window
        ) as shard:
            batches = epoch_names(shard)
            lengths.append(len(shard))
            assert len(batches) == len(shard)
            assert flat(batches) == expected_shard(order, rank, world, even)
    assert len(set(lengths)) == 1, f"batch counts differ across ranks: {lengths}"


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("even", ["pad", "drop"])
def test_shuffled_shards_are_disjoint_and_complete(
    uneven: duckdb.DuckDBPyConnection, world: int, even: str
) -> None:
    every = set(index_order(uneven, **WINDOWED))
    total = len(every)
    shards: list[list[int]] = []
    lengths: list[int] = []
    for rank in range(world):
        with loader(
            uneven,
            batch_size=4,
            shuffle=True,
            seed=9,
            rank=rank,
            world_size=world,
            even_batches=even,
            **WINDOWED,
        ) as shard:
            batches = epoch_names(shard)
            assert len(batches) == len(shard)
            lengths.append(len(shard))
            shards.append(flat(batches))
    assert len(set(lengths)) == 1, f"batch counts differ across ranks: {lengths}"
    per_rank = math.ceil(total / world) if even == "pad" else total // world
    assert [len(s) for s in shards] == [per_rank] * world
    counts = Counter(v for shard in shards for v in shard)
    if even == "pad":
        assert set(counts) == every
        assert sum(counts.values()) - total == world * per_rank - total
        for sample in (v for v, n in counts.items() if n > 1):
            holders = [rank for rank, shard in enumerate(shards) if sample in shard]
            assert len(holders) == 1, f"padding {sample} repeats another rank's sample"
    else:
        assert set(counts.values()) == {1}
        assert set(counts) <= every
        assert total - len(counts) < world


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # partitions of 65-160 rows of 16 bytes are streamed in pieces of 33-64 rows under 1 KiB
    parts=st.lists(
        st.lists(st.integers(1, 12) | st.integers(65, 160), min_size=1, max_size=3), min_size=1, max_size=4
    ),
    window=st.integers(1, 4),
    stride=st.integers(1, 3),
    world=st.integers(1, 4),
    even=st.sampled_from(["pad", "drop"]),
    shuffle=st.booleans(),
    workers=st.integers(1, 3),
    fetch_bytes=st.sampled_from([8 * 2**20, 1024]),
)
def test_any_layout_shards_exactly(
    con: duckdb.DuckDBPyConnection,
    parts: list[list[int]],
    window: int,
    stride: int,
    world: int,
    even: str,
    shuffle: bool,
    workers: int,
    fetch_bytes: int,
) -> None:
    """Cuts inside groups and partitions (streamed ones too), windows straddling partitions, ranks
    split over workers."""
    assume(any(sum(sizes) > window for sizes in parts))  # else refused at construction (test_plan)
    make_series(con, parts)
    layout = {
        "window_size": window,
        "window_stride": stride,
        "group_col": "gid",
        "repartition_col": "part",
        "fetch_bytes": fetch_bytes,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # groups too short for a window are announced; fine here
        order = index_order(con, **layout)
    assume(len(order) >= world)
    options = {"batch_size": 3, "shuffle": shuffle, "seed": 4, "world_size": world, "even_batches": even}
    shards = []
    for rank in range(world):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shard = loader(con, rank=rank, prepartition_num=1, **options, **layout)
        with shard:
            served: list[int] = []
            for worker in range(workers):
                shard.set_epoch(0)
                served += flat([names(x) for x, _ in shard.iterate(worker, workers)])
        shards.append(served)
    if not shuffle:
        assert shards == [expected_shard(order, rank, world, even) for rank in range(world)]
    assert {len(s) for s in shards} == {len(expected_shard(order, 0, world, even))}
    counts = Counter(v for shard in shards for v in shard)
    if even == "pad":
        assert set(counts) == set(order)
    else:
        assert set(counts.values()) == {1} and set(counts) <= set(order)


def test_workers_of_a_rank_split_its_shard(uneven: duckdb.DuckDBPyConnection) -> None:
    with loader(uneven, batch_size=4, shuffle=True, seed=2, rank=1, world_size=3, **WINDOWED) as shard:
        whole = Counter(flat(epoch_names(shard)))
        parts = []
        for worker in range(3):
            shard.set_epoch(0)  # each worker process iterates its own copy of the loader at epoch 0
            parts.append(Counter(flat([names(x) for x, _ in shard.iterate(worker, 3)])))
        assert sum(parts, Counter()) == whole
        assert all(parts), "every worker gets samples"


def test_the_seed_must_agree_across_ranks(uneven: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match="give the same seed on every rank"):
        loader(uneven, shuffle=True, rank=0, world_size=2)
    with loader(uneven, shuffle=False, rank=0, world_size=2) as ordered:
        assert len(ordered) > 0
    with loader(uneven, shuffle=True, rank=0, world_size=1) as alone:
        assert alone.config.seed >= 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rank": 1}, ValueError, "give both rank and world_size, or neither"),
        ({"world_size": 2}, ValueError, "give both rank and world_size, or neither"),
        ({"rank": 2, "world_size": 2}, ValueError, r"rank must be in \[0, world_size\)"),
        ({"rank": 0, "world_size": 0}, ValueError, r"rank must be in \[0, world_size\)"),
        ({"rank": -1, "world_size": 2}, ValueError, r"rank must be in \[0, world_size\)"),
        ({"rank": 0.0, "world_size": 2}, TypeError, "rank must be an int"),
        ({"rank": True, "world_size": 2}, TypeError, "rank must be an int"),
        ({"even_batches": "wrap"}, ValueError, "even_batches must be 'pad' or 'drop'"),
    ],
)
def test_bad_sharding_arguments_are_refused(
    uneven: duckdb.DuckDBPyConnection, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        loader(uneven, **kwargs)


# --- two real ranks under torchrun ---------------------------------------------------------------


#: Seconds both ranks may take, per engine (Spark: ~0.1-1 s a query, ~30 queries a rank).
RANKS_SECONDS = {"duckdb": 150, "spark": 420}


@pytest.fixture(
    params=[
        # The module's timeout mark would cut the subprocess's own timeout short.
        pytest.param(engine, marks=pytest.mark.timeout(seconds + 30))
        for engine, seconds in RANKS_SECONDS.items()
    ]
)
def ranks_source(request: pytest.FixtureRequest, db_path: str) -> Iterator[tuple[str, str]]:
    """``(engine, source)``: the DuckDB file of :func:`db_path`, or a Spark server holding its table."""
    if request.param == "duckdb":
        yield request.param, db_path
        return
    from test_backends import SparkEngine

    spark = SparkEngine(request.getfixturevalue("spark_server").uri)
    with duckdb.connect(db_path, read_only=True) as con:
        spark.create("series", con.sql("SELECT * FROM series").to_arrow_table())
    yield request.param, spark.uri
    spark.close()


@pytest.mark.multiprocess
def test_torchrun_two_ranks_shard_evenly_and_train(ranks_source: tuple[str, str], tmp_path: Path) -> None:
    engine, source = ranks_source
    out = tmp_path / "out"
    out.mkdir()
    # The rank processes run tests/ddp_worker.py as a script: make them import this checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(REPO / "tests" / "ddp_worker.py"),
        source,
        str(out),
    ]
    done = subprocess.run(
        command, check=False, env=env, cwd=REPO, capture_output=True, text=True, timeout=RANKS_SECONDS[engine]
    )
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [r["loaders"]["ordered_pad"]["sharding"] for r in reports] == [[0, 2], [1, 2]]

    windowed = {"window_size": 3, "group_col": "gid", "repartition_col": "part"}
    order = index_order(source, **windowed)
    total = len(order)
    assert total % 2 == 1, "an odd sample count makes pad add and drop remove one"
    for name in ("shuffled_pad", "ordered_pad", "shuffled_drop"):
        entries = [r["loaders"][name] for r in reports]
        lengths = {e["len"] for e in entries} | {len(e["batches"]) for e in entries}
        assert len(lengths) == 1, f"{name}: batch counts differ across ranks"
        assert len({e["seed"] for e in entries}) == 1, f"{name}: ranks shuffle with different seeds"

    ordered = [flat(r["loaders"]["ordered_pad"]["batches"]) for r in reports]
    assert ordered == [expected_shard(order, rank, 2, "pad") for rank in range(2)]

    shuffled = [flat(r["loaders"]["shuffled_pad"]["batches"]) for r in reports]
    counts = Counter(shuffled[0] + shuffled[1])
    assert set(counts) == set(order)
    extras = [v for v, n in counts.items() if n > 1]
    assert len(extras) == 1 and counts[extras[0]] == 2
    assert any(shard.count(extras[0]) == 2 for shard in shuffled), "padding repeats the rank's own sample"

    dropped = [flat(r["loaders"]["shuffled_drop"]["batches"]) for r in reports]
    assert [len(s) for s in dropped] == [total // 2] * 2
    assert not set(dropped[0]) & set(dropped[1])
    assert len(set(order) - set(dropped[0]) - set(dropped[1])) == 1

    training = [r["loaders"]["shuffled_pad"]["training"] for r in reports]
    assert training[0]["steps"] == training[1]["steps"] == reports[0]["loaders"]["shuffled_pad"]["len"]
    assert all(math.isfinite(loss) for t in training for loss in t["losses"])
    assert training[0]["weights"] == training[1]["weights"], "DDP kept the replicas in sync"


_LAUNCHED_RANK = """
import json, sys
import torch.distributed as dist
from ddbloader import DDBDataLoader

SQL = "SELECT f0, y FROM series ORDER BY rid"

def first_batch(**kwargs):
    with DDBDataLoader(sys.argv[1], SQL, "y", batch_size=4, **kwargs) as loader:
        try:
            return [len(loader), len(next(iter(loader))[0])]
        except RuntimeError as error:
            return str(error)

report = {"no group": first_batch(), "explicit": first_batch(rank=1, world_size=2)}
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
report["group"] = first_batch()
dist.destroy_process_group()
print(json.dumps(report))
"""


def test_a_rank_launched_without_a_process_group_is_refused_before_the_first_batch(
    db_path: str, tmp_path: Path
) -> None:
    """torchrun's environment (WORLD_SIZE=2, RANK=1) and no init_process_group: every rank would
    serve the whole epoch; explicit rank/world_size or a process group serve their share."""
    script = tmp_path / "launched_rank.py"
    script.write_text(_LAUNCHED_RANK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, str(script), db_path, str(free_port())],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["no group"].startswith("this process was launched as rank 1 of 2 (WORLD_SIZE and RANK")
    assert "torch.distributed.init_process_group()" in report["no group"]
    assert "Accelerator(cpu=True)" in report["no group"]
    with duckdb.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT count(*) FROM series").fetchone()[0]
    assert report["explicit"] == [math.ceil(math.ceil(rows / 2) / 4), 4]
    assert report["group"] == [math.ceil(rows / 4), 4]  # the process group's world of 1
