"""The cost of handing items from a busy producer thread to a consumer, as the assembler does.

Usage::

    python benchmarks/handover.py [--items 2000] [--repeat 7]

The producer runs pure-Python work (the GIL held) for each item, then hands it over; the consumer
only takes items. Printed per item: the time beyond the producer's own work, for a bounded
``queue.Queue`` (ddbloader before) and for the two ``queue.SimpleQueue``\\ s of
``ddbloader._pipeline.prefetch`` (items, and one token per free place), at several depths (the assembler's
is ``prefetch_batch``). The consumer wakes up for an item while the producer holds the GIL, so
each hand-over waits for the other thread's turn; a deeper queue lets the consumer take several
items per wake-up.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from collections.abc import Callable

Run = Callable[[int, float, int], float]


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _bounded_queue(items: int, work: float, depth: int) -> float:
    handover: queue.Queue[int | None] = queue.Queue(maxsize=depth)

    def produce() -> None:
        for item in range(items):
            _busy(work)
            handover.put(item, timeout=10)
        handover.put(None, timeout=10)

    thread = threading.Thread(target=produce)
    started = time.perf_counter()
    thread.start()
    while handover.get(timeout=10) is not None:
        pass
    thread.join()
    return time.perf_counter() - started


def _two_simple_queues(items: int, work: float, depth: int) -> float:
    taken: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    room: queue.SimpleQueue[None] = queue.SimpleQueue()
    for _ in range(depth):
        room.put(None)

    def produce() -> None:
        for item in [*range(items), None]:
            if item is not None:
                _busy(work)
            room.get(timeout=10)
            taken.put(item)

    thread = threading.Thread(target=produce)
    started = time.perf_counter()
    thread.start()
    while True:
        item = taken.get(timeout=10)
        room.put(None)
        if item is None:
            break
    thread.join()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    contenders: list[tuple[str, Run]] = [
        ("queue.Queue", _bounded_queue),
        ("two SimpleQueues", _two_simple_queues),
    ]
    names = " | ".join(f"{name} µs/item" for name, _ in contenders)
    print(f"| producer work per item | depth | {names} |")
    print("|---:|---:|" + "---:|" * len(contenders))
    for work_us, depth in [(20, 1), (100, 1), (250, 1), (100, 2), (100, 4), (100, 16)]:
        work = work_us * 1e-6
        costs = []
        for _, run in contenders:
            walls = [run(args.items, work, depth) for _ in range(args.repeat)]
            costs.append((statistics.median(walls) - args.items * work) / args.items * 1e6)
        print(f"| {work_us} µs | {depth} | " + " | ".join(f"{cost:.1f}" for cost in costs) + " |")


if __name__ == "__main__":
    main()
