"""One assembler against two, at the default shape: what a second assembler could buy here.

Usage::

    python benchmarks/assemblers.py [--rounds 3] [--epochs 3]

A loader assembles its batches in one thread. A second assembler is bounded above by two loaders
that each serve half of the epoch's groups (ranks 0 and 1 of ``world_size=2``) in one process,
read by one consumer that takes a batch of each in turn: two assembler threads and their own
fetch threads, sharing one GIL and nothing else, so no coordination to pay. Beside them,
``DDBIterableDataset`` under a ``DataLoader`` with ``num_workers`` processes (persistent), where
each worker has its own assembler and GIL and hands its batches over through shared memory;
and, for reference, the same DataLoader whose two workers only clone a ready batch of the same
size: what torch's hand-over from worker processes costs by itself.

Every contender runs the same warm epochs (after one epoch not timed) of the shape of
``benchmarks/gather.py`` (10 × 5 × 2,000 rows × 100 float64, window 50, batch 64, shuffled);
rounds interleave the contenders, and each round's figure is the median of its epochs' windows/s.
Printed: the medians over rounds, and each contender ÷ one loader in the same round.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import throughput
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SHAPE = throughput.Shape(10, 5, 2000, 100, 50)
Epoch = Callable[[], int]


def _options(**extra: Any) -> dict[str, Any]:
    return {
        "batch_size": throughput.BATCH,
        "shuffle": True,
        "window_size": SHAPE.window,
        "group_col": "symbol",
        "repartition_col": "CAST(ts AS DATE)",
        "exclude_col": ["symbol", "ts", "target"],
        "seed": throughput.SEED,
        **extra,
    }


def _count(batches: Iterable[Any]) -> int:
    return sum(batch[0].shape[0] for batch in batches if batch is not None)


def _loaders(count: int, fetch_threads: int) -> tuple[Epoch, Callable[[], None]]:
    from ddbloader import DDBDataLoader

    def shard(rank: int) -> dict[str, int]:
        return {} if count == 1 else {"rank": rank, "world_size": count}

    path, sql = str(SHAPE.db_path), SHAPE.loader_sql
    loaders = [
        DDBDataLoader(path, sql, "target", **_options(fetch_threads=fetch_threads, **shard(r)))
        for r in range(count)
    ]

    def epoch() -> int:
        # one consumer takes a batch of each loader in turn
        return sum(_count(batches) for batches in itertools.zip_longest(*map(iter, loaders)))

    def close() -> None:
        for loader in loaders:
            loader.close()

    return epoch, close


def _workers(num_workers: int) -> tuple[Epoch, Callable[[], None]]:
    from ddbloader import DDBIterableDataset

    dataset = DDBIterableDataset(
        str(SHAPE.db_path), SHAPE.loader_sql, "target", num_workers=num_workers, **_options()
    )
    return _persistent(dataset, num_workers)


def _persistent(dataset: IterableDataset[Any], num_workers: int) -> tuple[Epoch, Callable[[], None]]:
    """A DataLoader of ``dataset`` with persistent workers: its epoch, and what stops the workers."""
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, persistent_workers=True)

    def close() -> None:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()

    return lambda: _count(loader), close


class _ReadyBatches(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fresh batches of the shape's size, made without a database: torch's hand-over alone."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        x = torch.randn(throughput.BATCH, SHAPE.window, SHAPE.factors, dtype=torch.float64)
        y = torch.zeros(throughput.BATCH, 1, dtype=torch.float64)
        batches = -(-SHAPE.windows // throughput.BATCH)
        worker = get_worker_info()
        share = range(0 if worker is None else worker.id, batches, self.num_workers)
        return ((x.clone()[: min(throughput.BATCH, SHAPE.windows - b * throughput.BATCH)], y) for b in share)


CONTENDERS: dict[str, Callable[[], tuple[Epoch, Callable[[], None]]]] = {
    "one loader (1 assembler, 2 fetch threads)": lambda: _loaders(1, 2),
    "two half loaders, one consumer (2 assemblers, 2 fetch threads each)": lambda: _loaders(2, 2),
    "two half loaders, one consumer (2 assemblers, 1 fetch thread each)": lambda: _loaders(2, 1),
    "DataLoader, 1 worker process": lambda: _workers(1),
    "DataLoader, 2 worker processes": lambda: _workers(2),
    "reference: DataLoader, 2 workers yielding ready batches (torch's hand-over alone)": lambda: _persistent(
        _ReadyBatches(2), 2
    ),
}


def _measure(make: Callable[[], tuple[Epoch, Callable[[], None]]], epochs: int) -> float:
    epoch, close = make()
    try:
        epoch()  # the first epoch: not timed
        rates = []
        for _ in range(epochs):
            began = time.perf_counter()
            windows = epoch()
            rates.append(windows / (time.perf_counter() - began))
        assert windows == SHAPE.windows, (windows, SHAPE.windows)
        return statistics.median(rates)
    finally:
        close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="warm epochs timed per contender and round")
    args = parser.parse_args()
    throughput.ensure_data(SHAPE)
    load_before = os.getloadavg()[0]
    rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for round_number in range(args.rounds):
        for name, make in CONTENDERS.items():
            rates[name].append(_measure(make, args.epochs))
        print(f"round {round_number + 1}: " + ", ".join(f"{r[-1]:,.0f}" for r in rates.values()), flush=True)
    first = next(iter(rates.values()))
    print(
        f"\n{os.cpu_count()} CPUs; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
        f"({args.rounds} interleaved rounds of {args.epochs} warm epochs, medians)\n"
    )
    print("| contender | warm windows/s | ÷ one loader, same round |")
    print("|---|---:|---:|")
    for name, values in rates.items():
        ratios = [v / f for v, f in zip(values, first, strict=True)]
        spread = f"{statistics.median(ratios):.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"
        print(f"| {name} | {statistics.median(values):,.0f} | {spread} |")


if __name__ == "__main__":
    main()
