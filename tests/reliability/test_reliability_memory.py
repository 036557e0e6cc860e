"""Memory bound: peak RSS does not grow with the table, and the partitions held stay bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pytest
from conftest import SERIES_SQL, FaultyBackend, make_series
from reliability_support import REPO, delivered_windows, expected_windows, soak

from ddbloader import DDBDataLoader
from ddbloader._pipeline import pool as pool_module
from ddbloader.backends import DuckDBBackend

pytestmark = pytest.mark.timeout(180)

GROUPS, ROWS_PER_PARTITION, FEATURES = 8, 4096, 16
#: DuckDB caches the blocks it reads up to its memory_limit (default: 80% of RAM), whatever
#: reads them; the bound under test is the loader's, so the engine's cache is capped. A fetch unit
#: is sorted by the engine (ORDER BY) in that memory, two at a time (fetch_threads=2): at 16MB two
#: 2 MiB units sometimes ran DuckDB out of memory. 32MB is still below the smaller table (38 MB), so
#: the cache is full in both runs and the growth measured stays the loader's.
ENGINE_MEMORY = "32MB"

MEASURE = """
    import json, resource, sys
    import duckdb, torch
    sys.path.insert(0, {repo!r})
    from ddbloader import DDBDataLoader

    path, mode = sys.argv[1], sys.argv[2]
    source = lambda: duckdb.connect(path, read_only=True, config={{"memory_limit": {memory!r}}})
    sql = "SELECT * FROM wide ORDER BY gid, part"
    samples = 0
    if mode == "loader":
        with DDBDataLoader(source, sql, "y", batch_size=1024, window_size=4, group_col="gid",
                           repartition_col="part", exclude_col=["gid", "part"], shuffle=True,
                           seed=1, group_pool_size=2, prepartition_num=2, fetch_threads=2,
                           dtype=torch.float32, fetch_bytes=2 * 2**20) as loader:
            for x, y in loader:
                samples += len(x)
    else:  # the control: what holding the whole table costs
        samples = source().sql("SELECT * FROM wide").to_arrow_table().num_rows
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({{"peak_mb": peak, "samples": samples}}))
"""


def _make_table(path: Path, partitions: int) -> None:
    features = ", ".join(f"(i * {k + 1})::DOUBLE AS f{k}" for k in range(FEATURES))
    rows = GROUPS * partitions * ROWS_PER_PARTITION
    with duckdb.connect(str(path)) as writer:
        writer.execute(
            f"CREATE TABLE wide AS SELECT (i // {partitions * ROWS_PER_PARTITION})::INTEGER AS gid, "
            f"((i % {partitions * ROWS_PER_PARTITION}) // {ROWS_PER_PARTITION})::INTEGER AS part, "
            f"{features}, (i + 0.5)::DOUBLE AS y FROM range({rows}) t(i) ORDER BY i"
        )


def _measure(path: Path, mode: str) -> dict[str, Any]:
    script = textwrap.dedent(MEASURE.format(repo=str(REPO), memory=ENGINE_MEMORY))
    # Linux carries ru_maxrss across exec, so a child exec'd straight from pytest would report
    # pytest's own peak. A shell that forks (not execs) the measuring Python gives it a fresh one.
    command = ["sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", script, str(path), mode]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stderr
    figures: dict[str, Any] = json.loads(result.stdout)
    return figures


@pytest.mark.multiprocess
def test_peak_rss_does_not_grow_with_the_table(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    scale = 8 if soak(pytestconfig) else 4
    small, large = tmp_path / "small.duckdb", tmp_path / "large.duckdb"
    _make_table(small, 8)
    _make_table(large, 8 * scale)
    base, grown = _measure(small, "loader"), _measure(large, "loader")
    window_samples = ROWS_PER_PARTITION * 8 - 4  # per group: rows minus the window's last 4
    assert base["samples"] == GROUPS * window_samples
    assert grown["samples"] == GROUPS * (scale * ROWS_PER_PARTITION * 8 - 4)
    growth = grown["peak_mb"] / base["peak_mb"] - 1
    # the control proves the measure can fail: holding the large table costs far more than 10%
    whole = _measure(large, "whole")
    whole_growth = whole["peak_mb"] / base["peak_mb"] - 1
    print(
        f"figure: table x{scale} peak_rss_mb {base['peak_mb']:.0f} -> {grown['peak_mb']:.0f} "
        f"growth={growth:.1%} (whole-table control: {whole_growth:.0%})"
    )
    assert whole_growth > 0.10
    assert growth < 0.10


class RecordingGauge(pool_module.PartitionGauge):
    """The pool's gauge, remembered so the test can read every pool's high-water mark."""

    made: ClassVar[list[RecordingGauge]] = []

    def __init__(self) -> None:
        super().__init__()
        RecordingGauge.made.append(self)


#: (shuffle, group_pool_size, prepartition_num, fetch_threads, prefetch_batch, window_size)
POOLS = [
    (False, 1, 1, 1, 0, 3),
    (True, 1, 3, 2, 1, 4),
    (True, 2, 2, 3, 2, 3),
    (True, 3, 2, 2, 1, 9),
    (False, 3, 3, 4, 3, 2),
    (True, 4, 1, 2, 2, 5),
]


def test_partitions_held_never_exceed_pool_times_prepartition(
    con: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    parts = [[7, 3, 9, 4, 6, 5], [12, 2, 8, 5], [6, 6, 6, 6, 6], [3, 11, 4], [9, 9, 2, 7, 5, 4, 3]]
    make_series(con, parts)
    monkeypatch.setattr(pool_module, "PartitionGauge", RecordingGauge)
    epochs = 10 if soak(pytestconfig) else 2
    reached = 0
    highest = 0
    for shuffle, pool, prepartition, threads, prefetch, window in POOLS:
        backend = FaultyBackend(DuckDBBackend(con), jitter=0.003, seed=pool * 10 + prepartition)
        with DDBDataLoader(
            backend,
            SERIES_SQL,
            "y",
            batch_size=3,
            window_size=[window, 1],
            input_col=["f0"],
            group_col="gid",
            repartition_col="part",
            shuffle=shuffle,
            seed=3,
            group_pool_size=pool,
            prepartition_num=prepartition,
            fetch_threads=threads,
            prefetch_batch=prefetch,
        ) as loader:
            backend.planning = False
            for _ in range(epochs):
                RecordingGauge.made.clear()
                batches = list(loader)
                (gauge,) = RecordingGauge.made
                bound = pool * prepartition
                assert 1 <= gauge.high_water <= bound, (shuffle, pool, prepartition)
                assert gauge.held == 0, "every partition is released by the end of the epoch"
                assert delivered_windows(batches, window) == expected_windows(parts, window + 1, 1)
                reached += gauge.high_water == bound
                highest = max(highest, gauge.high_water)
    # the bound is tight: the pools fill up to it, so a gauge that never counted would fail here
    assert reached >= len(POOLS) * epochs // 2
    print(
        f"figure: high_water_max={highest} (bound checked for {len(POOLS)} pool shapes, {epochs} epochs each)"
    )
