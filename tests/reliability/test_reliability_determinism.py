"""Determinism under jitter: random fetch delays and retried faults never change a single bit."""

from __future__ import annotations

import hashlib
import random

import duckdb
import pytest
import torch
from conftest import SERIES_SQL, FaultyBackend, make_series
from reliability_support import as_bytes, delivered_windows, expected_windows, settle, soak

from ddbloader import DDBDataLoader
from ddbloader.backends import DuckDBBackend

pytestmark = pytest.mark.timeout(120)

PARTS = [[10, 7, 12, 5], [15, 6, 9], [8, 9, 11, 10, 4], [5, 4, 6], [13, 3, 7]]
SPAN, STRIDE, OFFSET = 5, 2, 3


def _run(con: duckdb.DuckDBPyConnection, jitter_seed: int, epochs: int) -> list[bytes]:
    """One fresh loader, ``epochs`` epochs; per epoch the digest of its batches' bytes."""
    chaos = random.Random(jitter_seed)
    partitions = sum(len(p) for p in PARTS)
    # a different timing every run: random sleeps, and transient faults at random fetches
    faults = chaos.sample(range(1, partitions * epochs), 3)
    backend = FaultyBackend(
        DuckDBBackend(con),
        jitter=0.004,
        seed=jitter_seed,
        fail_on=faults,
        error=lambda: ConnectionResetError("jitter run fault"),
    )
    digests = []
    with DDBDataLoader(
        backend,
        SERIES_SQL,
        "y",
        batch_size=5,
        shuffle=True,
        window_size=[3, 2],
        window_stride=STRIDE,
        input_col=["f0", "f1"],
        group_col="gid",
        repartition_col="part",
        seed=2024,
        group_pool_size=3,
        prepartition_num=2,
        fetch_threads=chaos.choice([2, 3, 4]),
        prefetch_batch=chaos.choice([0, 1, 3]),
        dtype=torch.float32,
        retries=3,
        retry_backoff=0.0,
        fetch_bytes=0,  # one query per partition: the faults hit numbered partition fetches
    ) as loader:
        backend.planning = False
        for _ in range(epochs):
            batches = list(loader)
            assert delivered_windows(batches, OFFSET) == expected_windows(PARTS, SPAN, STRIDE)
            digest = hashlib.sha256()
            for fields in as_bytes(batches):
                digest.update(repr(fields).encode())
            digests.append(digest.digest())
    assert backend.fetches == partitions * epochs + len(faults)
    return digests


def test_same_seed_gives_bitwise_identical_batches_whatever_the_timing(
    con: duckdb.DuckDBPyConnection, pytestconfig: pytest.Config
) -> None:
    make_series(con, PARTS)
    runs = 100 if soak(pytestconfig) else 20
    epochs = 2
    reference = _run(con, 0, epochs)
    assert reference[0] != reference[1], "the second epoch is shuffled differently"
    for run in range(1, runs):
        assert _run(con, run, epochs) == reference, f"run {run} differs"
    assert settle()
    print(f"figure: runs={runs} epochs={epochs} identical=all faults={3 * runs}")
