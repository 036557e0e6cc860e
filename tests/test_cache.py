"""Partitions kept in memory across epochs (``cache_bytes``): the same batches, fewer queries."""

from __future__ import annotations

import threading
import warnings

import duckdb
import pytest
import torch
from conftest import FaultyBackend, series_loader

from ddbloader.backends import DuckDBBackend

Batches = list[tuple[torch.Tensor, torch.Tensor]]

SHUFFLED = {"shuffle": True, "seed": 7, "window_size": [3, 1], "group_pool_size": 2}


def identical(a: Batches, b: Batches) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )


def epochs_and_fetches(
    con: duckdb.DuckDBPyConnection, epochs: int, **kwargs: object
) -> tuple[list[Batches], list[int]]:
    """``epochs`` epochs of a series loader, and the queries each one sent (one per fetch unit)."""
    backend = FaultyBackend(DuckDBBackend(con))
    with series_loader(backend, **SHUFFLED, **kwargs) as loader:
        backend.planning = False
        runs, fetches = [], []
        for _ in range(epochs):
            before = backend.fetches
            runs.append(list(loader))
            fetches.append(backend.fetches - before)
    return runs, fetches


def test_later_epochs_come_from_memory_with_the_same_batches(series: duckdb.DuckDBPyConnection) -> None:
    cached, fetches = epochs_and_fetches(series, 3, cache_bytes=1 << 20)
    reference, reference_fetches = epochs_and_fetches(series, 3)
    assert all(identical(a, b) for a, b in zip(cached, reference, strict=True))
    assert fetches[0] == reference_fetches[0] > 0
    assert fetches[1:] == [0, 0]
    assert reference_fetches[1:] == [reference_fetches[0]] * 2


def test_a_budget_below_the_planned_bytes_warns_and_caches_nothing(series: duckdb.DuckDBPyConnection) -> None:
    # 88 rows of x (f0, f1) and y, float32 (torch's default): 88 * 12 bytes
    with pytest.warns(UserWarning, match=r"cache_bytes=1,055 is less than the 1,056 bytes"):
        _, fetches = epochs_and_fetches(series, 2, cache_bytes=1055)
    assert fetches[1] == fetches[0] > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, fetches = epochs_and_fetches(series, 2, cache_bytes=1056)
    assert fetches[0] > 0 and fetches[1] == 0


def test_resume_from_the_cache_serves_the_rest_of_the_epoch(series: duckdb.DuckDBPyConnection) -> None:
    (reference,), _ = epochs_and_fetches(series, 1)
    backend = FaultyBackend(DuckDBBackend(series))
    with series_loader(backend, **SHUFFLED, cache_bytes=1 << 20) as loader:
        backend.planning = False
        assert identical(list(loader), reference)  # epoch 0 fills the cache
        loader.set_epoch(0)
        iterator = iter(loader)
        head = [next(iterator), next(iterator)]
        state = loader.state_dict()
        iterator.close()
        before = backend.fetches
        loader.load_state_dict(state)
        assert identical(head + list(loader), reference)
        assert backend.fetches == before


def test_an_epoch_from_the_cache_is_assembled_in_the_consumers_thread(
    series: duckdb.DuckDBPyConnection,
) -> None:
    def assembler_threads() -> int:
        return sum(t.name == "ddbloader-assemble" and t.is_alive() for t in threading.enumerate())

    with series_loader(series, **SHUFFLED, cache_bytes=1 << 20) as loader:
        first = iter(loader)
        next(first)
        assert assembler_threads() == 1  # the first epoch fetches: batches are assembled ahead
        rest = list(first)
        second = iter(loader)
        batch = next(second)
        assert assembler_threads() == 0
        assert len(rest) + 1 == len(loader) == len([batch, *second])


@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), (1.5, TypeError), ("1GB", TypeError)])
def test_cache_bytes_must_be_a_count_of_bytes(
    series: duckdb.DuckDBPyConnection, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="cache_bytes"):
        series_loader(series, cache_bytes=value)
