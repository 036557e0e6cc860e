"""Where a ddbloader epoch spends its time, stage by stage, on the throughput benchmark's data.

Usage::

    python benchmarks/profile_stages.py [--epochs 3] [--noop-gather] [--ddbloader-from DIR]

The first epoch is reported with its constructor (planning), so it reads against the warm ones
as ``benchmarks/epochs.py`` times it: per epoch the wall and CPU seconds of the process, the
time to the first batch, the minor page faults (fresh memory: a cold engine's buffer pool, the
arena, first-touch batch buffers) and the modules imported while it ran (an import in a fetch
thread delays the first batch by its whole duration).

Wraps the loader's internal stages (engine fetch, Arrow -> block conversion, the assembler's
waits for a partition, the pool's sample draw, the batch gather) with timers, and prints for each
epoch their call count, summed wall time and summed CPU time of the calling thread. Stages that a
version of ddbloader does not have are skipped. ``--noop-gather`` replaces the gather by an empty
batch, which shows how fast the fetch side alone can feed the assembler.

The wrappers cost a few microseconds per call; compare epochs and stages, not absolute speed.
For a sampling profile of the same run without wrappers::

    py-spy record --format raw --threads -r 200 -o ddb.txt -- \\
        python benchmarks/throughput.py --contender ddbloader --repeat 2
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# (module, attribute path, label): the hot path of one epoch.
_STAGES = [
    ("ddbloader.backends.duckdb", "_DuckDBCursor.fetch", "engine fetch (SQL -> Arrow)"),
    # cut as the pool's claims reach them: inside "pool executes a batch of the schedule" too
    ("ddbloader._io.unit_fetch", "Coalescer._cut_next", "cut the epoch's fetch units"),
    ("ddbloader._io.unit_fetch", "unit_blocks", "split a unit's result (all of the below)"),
    ("ddbloader._io.unit_split", "take_rows", "  rows grouped by partition (Arrow take)"),
    ("ddbloader._io.unit_split", "to_block", "  Arrow -> row-major block"),
    ("ddbloader._pipeline.pool", "Pending.wait", "assembler waits for a partition"),
    ("ddbloader._pipeline.pool", "GroupPool.take", "pool executes a batch of the schedule"),
    ("ddbloader._pipeline.device", "gather", "gather a batch (row take)"),
    ("ddbloader._pipeline.prefetch", "Prefetcher._take", "consumer waits for a batch"),
    ("ddbloader._io.block", "Block.concatenate", "segment = edges + partition (copy)"),
]


def _wrap(module: str, path: str, label: str, totals: dict[str, list[float]], lock: threading.Lock) -> bool:
    owner: Any = importlib.import_module(module)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent, None)
        if owner is None:
            return False
    function = getattr(owner, name, None)
    if function is None:
        return False

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            with lock:
                entry = totals[label]
                entry[0] += 1
                entry[1] += time.perf_counter() - wall
                entry[2] += time.thread_time() - cpu

    setattr(owner, name, timed)
    return True


def _faults() -> int:
    """Minor page faults of this process so far (a fresh page touched for the first time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--noop-gather", action="store_true")
    parser.add_argument("--ddbloader-from", help="directory to import ddbloader from")
    args = parser.parse_args()
    sys.path.insert(0, args.ddbloader_from or str(HERE.parent))
    sys.path.insert(0, str(HERE))
    import throughput
    import torch

    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    lock = threading.Lock()
    for module, path, label in _STAGES:
        if args.noop_gather and path == "gather":
            loader_module: Any = importlib.import_module(module)
            loader_module.gather = lambda *a, **k: (torch.empty(0), torch.empty(0))
        elif not _wrap(module, path, label, totals, lock):
            print(f"(this ddbloader has no {module}.{path}; not timed)")
    shape = throughput.Shape(10, 5, 2000, 100, 50)
    throughput.ensure_data(shape)
    started, cpu, faults, modules = time.perf_counter(), time.process_time(), _faults(), set(sys.modules)
    loader = throughput._make_loader(shape)
    print(
        f"constructor: wall {time.perf_counter() - started:.3f} s, CPU {time.process_time() - cpu:.3f} s, "
        f"{_faults() - faults} page faults"
    )
    with loader:
        for epoch in range(args.epochs):
            if epoch:
                totals.clear()
                started, cpu, faults = time.perf_counter(), time.process_time(), _faults()
                modules = set(sys.modules)
            windows, first = 0, None
            for x, _ in loader:
                first = time.perf_counter() - started if first is None else first
                windows += len(x)
            wall = time.perf_counter() - started
            imported = sorted({m.split(".")[0] for m in set(sys.modules) - modules})
            print(
                f"epoch {epoch}{' (with the constructor)' if epoch == 0 else ''}: wall {wall:.3f} s, "
                f"first batch {first:.3f} s, process CPU {time.process_time() - cpu:.2f} s, "
                f"{_faults() - faults} page faults"
                + ("" if args.noop_gather else f", {windows / wall:,.0f} windows/s")
                + (f"; imported {', '.join(imported)}" if imported else "")
            )
            for label, (calls, stage_wall, stage_cpu) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
                print(
                    f"    {label:<34} calls {calls:5.0f}  wall {stage_wall:7.3f} s  "
                    f"thread CPU {stage_cpu:7.3f} s"
                )


if __name__ == "__main__":
    main()
