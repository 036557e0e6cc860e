"""loader.stats(): the figures of an epoch, who waited for whom, and how they render."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
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
        assert stats.windows == loader.plan.samples
        assert stats.batches == len(loader)
        assert stats.partitions_fetched == loader.plan.partitions
        assert stats.bytes_moved == moved
        assert 0.0 <= stats.starvation <= 1.0
        assert 0.0 <= stats.consumer_wait_seconds <= stats.seconds
        assert stats.windows_per_second == pytest.approx(stats.windows / stats.seconds)
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
        assert first.windows == 8
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
        windows=640,
        seconds=2.0,
        windows_per_second=320.0,
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
    assert re.search(r"^windows/s\s+320$", text, re.MULTILINE)
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
            recorder.delivered(windows=2, nbytes=10, waited=0.001, queue_depth=1)
            recorder.fetched(1, 10, 1, 0.002)

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorder.finish()
    stats = recorder.snapshot()
    assert (stats.batches, stats.windows, stats.bytes_moved, stats.partitions_fetched) == (
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
