"""loader.stats(): the figures of an epoch, who waited for whom, and how they render."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
import pytest
from conftest import FaultyBackend, series_loader

import ddbloader
from ddbloader import DDBDataLoader, LoaderStats
from ddbloader.stats import LOADER_BOUND, MODEL_BOUND, StatsRecorder

pytestmark = pytest.mark.timeout(60)


def loader_over(source: Any, **kwargs: Any) -> DDBDataLoader:
    return series_loader(source, **{"window_size": 3, "seed": 1, **kwargs})


def test_stats_before_the_first_epoch_is_an_error(series: duckdb.DuckDBPyConnection) -> None:
    with loader_over(series) as loader, pytest.raises(RuntimeError, match="iterate the loader first"):
        loader.stats()


@pytest.mark.parametrize("shuffle", [False, True])
def test_figures_after_an_epoch_add_up(series: duckdb.DuckDBPyConnection, shuffle: bool) -> None:
    with loader_over(series, shuffle=shuffle) as loader:
        moved = 0
        for x, y in loader:
            moved += x.nbytes + y.nbytes
        stats = loader.stats()
        assert stats.epoch == 0
        assert stats.samples == loader.plan.samples
        assert stats.batches == len(loader)
        assert stats.partitions_fetched == loader.plan.partitions
        assert stats.bytes_moved == moved
        assert 0.0 <= stats.starvation <= 1.0
        assert 0.0 <= stats.consumer_wait_seconds <= stats.seconds
        assert stats.samples_per_second == pytest.approx(stats.samples / stats.seconds)
        assert stats.fetch_seconds_per_partition > 0
        assert 0.0 <= stats.mean_queue_depth <= loader.config.prefetch_batch
        # the epoch is over: its wall time is frozen
        assert loader.stats().seconds == stats.seconds
        list(loader)
        assert loader.stats().epoch == 1


def test_stats_during_an_epoch_count_what_was_delivered(series: duckdb.DuckDBPyConnection) -> None:
    with loader_over(series) as loader:
        iterator = iter(loader)
        next(iterator)
        first = loader.stats()
        assert first.batches == 1
        assert first.samples == 8
        time.sleep(0.05)
        assert loader.stats().seconds > first.seconds  # still running
        iterator.close()


def test_a_slow_fetch_shows_as_consumer_wait_and_a_loader_bound_verdict(
    series: duckdb.DuckDBPyConnection, faulty: Callable[..., FaultyBackend]
) -> None:
    backend = faulty(series, hang_on=range(1, 100), hang_seconds=0.15)
    loader = loader_over(backend, fetch_threads=1, fetch_bytes=0)
    backend.planning = False
    for _ in loader:
        pass
    stats = loader.stats()
    fetches = loader.plan.partitions
    # one thread, every fetch 0.15 s: the loop waited for most of them
    assert stats.fetch_seconds_per_partition >= 0.15
    assert stats.consumer_wait_seconds >= 0.5 * fetches * 0.15
    assert stats.starvation >= LOADER_BOUND
    assert stats.verdict.startswith("loader-bound")
    loader.close()


def test_a_slow_consumer_is_not_starved(series: duckdb.DuckDBPyConnection) -> None:
    with loader_over(series, batch_size=4, prefetch_batch=4) as loader:
        for _ in loader:
            time.sleep(0.05)  # the "model"
        stats = loader.stats()
    assert stats.starvation < LOADER_BOUND
    assert not stats.verdict.startswith("loader-bound")


def _stats(**changes: Any) -> LoaderStats:
    base = LoaderStats(
        epoch=2,
        batches=10,
        samples=640,
        seconds=2.0,
        samples_per_second=320.0,
        consumer_wait_seconds=0.5,
        starvation=0.25,
        partitions_fetched=4,
        fetch_seconds_per_partition=0.0123,
        mean_queue_depth=1.5,
        bytes_moved=2_500_000,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("starvation", "batches", "verdict"),
    [
        (0.0, 10, "model-bound"),
        (MODEL_BOUND, 10, "model-bound"),
        (0.3, 10, "balanced"),
        (LOADER_BOUND, 10, "loader-bound"),
        (1.0, 10, "loader-bound"),
        (0.0, 0, "no batch delivered yet"),
    ],
)
def test_verdict(starvation: float, batches: int, verdict: str) -> None:
    assert _stats(starvation=starvation, batches=batches).verdict.startswith(verdict)


def test_text_and_html_rendering() -> None:
    stats = _stats()
    text = str(stats)
    assert re.search(r"^samples/s\s+320$", text, re.MULTILINE)
    assert re.search(r"^consumer waited\s+0\.50 s \(25% starvation\)$", text, re.MULTILINE)
    assert re.search(r"^fetch time / partition\s+12\.3 ms$", text, re.MULTILINE)
    assert re.search(r"^mean queue depth\s+1\.50$", text, re.MULTILINE)
    assert re.search(r"^bytes moved\s+2\.50 MB \(1\.25 MB/s\)$", text, re.MULTILINE)
    assert repr(stats) == "LoaderStats:\n" + text
    page = stats._repr_html_()
    assert "ddbloader stats, epoch 2" in page
    assert "<td style='padding:2px 12px 2px 0;text-align:left;vertical-align:top'>320</td>" in page
    assert "width:25.0%" in page  # the starvation bar
    assert stats.as_dict()["bytes_moved"] == 2_500_000


def test_recorder_is_thread_safe() -> None:
    recorder = StatsRecorder(0)

    def deliver() -> None:
        for _ in range(1000):
            recorder.delivered(samples=2, nbytes=10, waited=0.001, queue_depth=1)
            recorder.fetched(1, 10, 1, 0.002)

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorder.finish()
    stats = recorder.snapshot()
    assert (stats.batches, stats.samples, stats.bytes_moved, stats.partitions_fetched) == (
        4000,
        8000,
        40_000,
        4000,
    )
    assert stats.consumer_wait_seconds == pytest.approx(4.0)
    assert stats.fetch_seconds_per_partition == pytest.approx(0.002)
    assert stats.mean_queue_depth == 1.0
    assert stats.starvation == 1.0  # waits longer than the wall time are capped


def test_loader_stats_is_exported() -> None:
    assert ddbloader.LoaderStats is LoaderStats


# --- mixing (ddbloader/_epoch/mixing.py) ---------------------------------------------------------------


def _table(con: duckdb.DuckDBPyConnection, rows: int) -> None:
    con.execute(f"CREATE TABLE big AS SELECT i AS id, i * 0.5 AS f, i * 1.0 AS y FROM range({rows}) r(i)")


def test_mixing_is_reported_for_shuffled_epochs_only(con: duckdb.DuckDBPyConnection) -> None:
    _table(con, 20_000)
    options: dict[str, Any] = {"input_col": ["f"], "batch_size": 256, "fetch_bytes": 50_000, "seed": 3}
    with DDBDataLoader(con, "SELECT * FROM big ORDER BY id", "y", shuffle=True, **options) as loader:
        list(loader)
        stats = loader.stats()
    assert abs(stats.rank_correlation) < 0.2  # range pieces: no trace of row order
    assert stats.partitions_per_batch >= 1
    assert "rank correlation" in str(stats)
    with DDBDataLoader(con, "SELECT * FROM big ORDER BY id", "y", shuffle=False, **options) as loader:
        list(loader)
        stats = loader.stats()
    assert stats.rank_correlation != stats.rank_correlation  # NaN: not measured without shuffle
    assert "rank correlation" not in str(stats)


def test_an_epoch_close_to_row_order_warns_once_naming_the_fixes(con: duckdb.DuckDBPyConnection) -> None:
    _table(con, 20_000)
    # no ORDER BY: the big partition is read front to back (planning warns about that as well)
    with pytest.warns(UserWarning) as planning:
        loader = DDBDataLoader(
            con,
            "SELECT * FROM big",
            "y",
            input_col=["f"],
            batch_size=256,
            fetch_bytes=50_000,
            shuffle=True,
            seed=3,
        )
    planned = [str(w.message) for w in planning]
    assert any("cannot be cut into pieces" in m for m in planned), planned
    assert any("read in pieces" in m and "no ORDER BY" in m for m in planned), planned
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
        list(loader)
    close = [str(w.message) for w in caught if "came close to row order" in str(w.message)]
    assert len(close) == 1
    assert "fetch_bytes=0" in close[0] and "ORDER BY" not in close[0].split("to mix better")[0]
    assert loader.stats().rank_correlation > 0.9
    loader.close()


def test_mixing_of_a_uniform_shuffle_is_near_zero(con: duckdb.DuckDBPyConnection) -> None:
    _table(con, 20_000)
    with DDBDataLoader(
        con,
        "SELECT * FROM big ORDER BY id",
        "y",
        input_col=["f"],
        batch_size=256,
        fetch_bytes=0,
        shuffle=True,
    ) as loader:
        list(loader)
        assert abs(loader.stats().rank_correlation) < 0.05
        assert loader.stats().partitions_per_batch == 1


def _served_correlation(positions: list[int]) -> float:
    """Spearman's correlation between each sample's place in the epoch and its row's position."""
    ranks = np.argsort(np.argsort(np.array(positions), kind="stable"))
    return float(np.corrcoef(np.arange(len(positions)), ranks)[0, 1])


@pytest.mark.parametrize(
    ("order", "fetch_bytes"),
    [
        ("day, ts", 16 * 2000),  # combed range pieces, cut by the whole tuple
        ("day DESC, ts", 16 * 2000),
        ("ts", 16 * 20_000),  # combed pieces read in parts
        ("ts", 16 * 500),  # several bands
    ],
)
def test_the_rank_correlation_is_the_served_orders(
    con: duckdb.DuckDBPyConnection, order: str, fetch_bytes: int
) -> None:
    """``stats()`` places each sample at the row the pieces as read serve it from: its figure is
    the one computed from the ids the epoch served, not a model of where a piece's rows lie."""
    rows = 40_000
    con.execute(
        f"CREATE TABLE days AS SELECT i AS id, i // 4000 AS day, i AS ts, i * 1.0 AS x, i * 1.0 AS y "
        f"FROM range({rows}) r(i)"
    )
    sql = f"SELECT id, day, ts, x, y FROM days ORDER BY {order}"
    whole = [int(v) for (v,) in con.execute(f"SELECT id FROM ({sql}) AS q").fetchall()]
    position = {row: n for n, row in enumerate(whole)}
    options: dict[str, Any] = {"input_col": ["x"], "batch_size": 128, "shuffle": True, "seed": 5}
    with DDBDataLoader(con, sql, "y", fetch_bytes=fetch_bytes, **options) as loader:
        served = [position[int(v)] for x, _ in loader for v in x[:, 0].tolist()]
        mixing = loader.stats().rank_correlation
    assert sorted(served) == list(range(rows))
    assert mixing == pytest.approx(_served_correlation(served), abs=1e-6)
