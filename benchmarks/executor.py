"""The assembler's own cost per epoch, without the engine: the schedule alone, the pool executing
it from partitions at hand, and the pool with each batch gathered (issue 27).

Usage::

    python benchmarks/executor.py [--groups 4000 --rows 100] [--pool N] [--repeat 5] [--compare DIR]

The plan is the ``groups`` shape of ``benchmarks/scale.py`` (window 20, batch 256, shuffled, 8
float64 factors and a target; 4,000 groups x 100 rows by default; ``--pool`` a group_pool_size other
than the default, e.g. every group); each partition's block is
read once from DuckDB before the clock, and an in-memory source hands it over when claimed
(a delivered result, as a fetch unit's partition usually is when a small group asks for it).
Thread CPU seconds of the best of ``--repeat`` epochs, so a shared machine's load moves the
figures little. ``--compare DIR`` runs the same measurement with the ddbloader in DIR (another
checkout) in a child process after each of this checkout's, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MARKER = "RESULT-JSON:"


class _AtHand:
    """A PartitionSource over blocks read before the clock: each claim is a delivered result."""

    def __init__(self, blocks: dict[Any, Any]) -> None:
        from ddbloader._io.threads import Pending

        self._pending = Pending
        self._blocks = blocks

    def submit(self, spec: Any) -> Any:
        return self._pending.of(self._blocks[spec.key])

    def release(self, keys: Sequence[Any]) -> None:
        pass


def measure(groups: int, rows: int, repeat: int, pool: int | None = None) -> dict[str, float]:
    import threading

    import scale

    path = scale._duckdb_file(f"groups_{groups}x{rows}", lambda: scale._groups_table(groups, rows))
    from ddbloader._epoch.schedule import BatchSchedule
    from ddbloader._pipeline.arena import arena_for
    from ddbloader._pipeline.batch import gather
    from ddbloader._pipeline.pool import GroupPool

    loader = scale._groups_loader(str(path), "t", **({} if pool is None else {"group_pool_size": pool}))
    with loader:
        plan, config = loader.plan, loader.config
        units = loader._units(0, (), loader.sharding, 0, 1)
        samples = sum(u.samples for u in units)
        batches = -(-samples // config.batch_size)
        blocks: dict[Any, Any] = {}
        for _batch in loader:  # warms the engine; the blocks themselves are read below
            pass
        fetcher = loader._backend_here()
        from ddbloader._io.fetch import Fetcher

        reader = Fetcher(fetcher, plan.layout, 1, lambda *a: None)
        try:
            for group in plan.groups:
                for spec in group.partitions:
                    blocks[spec.key] = reader.submit(spec).wait(threading.Event(), 600)
        finally:
            reader.close()
    source = _AtHand(blocks)
    best: dict[str, float] = {}

    def clock(name: str, run: Any) -> None:
        for _ in range(repeat):
            started = time.thread_time()
            run()
            best[name] = min(best.get(name, float("inf")), time.thread_time() - started)

    def schedule() -> None:
        for _ in BatchSchedule(units, plan.geometry, config, 0, batches):
            pass

    arena = arena_for(plan, config, None)

    def pool() -> None:
        stop = threading.Event()
        for _ in GroupPool(
            BatchSchedule(units, plan.geometry, config, 0, batches), source, stop, arena=arena
        ).batches():
            pass

    def gathered() -> None:
        stop = threading.Event()
        executor = GroupPool(
            BatchSchedule(units, plan.geometry, config, 0, batches), source, stop, arena=arena
        )
        for pieces in executor.batches():
            gather(pieces, plan.geometry, plan.layout, False)

    for name, run in (("schedule", schedule), ("pool", pool), ("pool + gather", gathered)):
        clock(name, run)
    best["batches"] = batches
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=4000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--pool", type=int, help="group_pool_size (default: the loader's)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="with --compare: interleaved rounds")
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(MARKER + json.dumps(measure(args.groups, args.rows, args.repeat, args.pool)), flush=True)
        return
    trees = [("this checkout", HERE.parent)] + ([(str(args.compare), args.compare)] if args.compare else [])
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for _ in range(args.rounds if args.compare else 1):
        for label, tree in trees:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            command = [
                sys.executable,
                __file__,
                "--child",
                "--groups",
                str(args.groups),
                "--rows",
                str(args.rows),
            ]
            command += ["--repeat", str(args.repeat)] + (
                [] if args.pool is None else ["--pool", str(args.pool)]
            )
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=1800)
            line = next(li for li in done.stdout.splitlines() if li.startswith(MARKER))
            results[label].append(json.loads(line[len(MARKER) :]))
    print(
        f"{args.groups:,} groups x {args.rows} rows, group_pool_size {args.pool or 'default'}, "
        f"thread CPU ms per epoch (best of {args.repeat}; "
        f"best round), load {os.getloadavg()[0]:.1f}\n"
    )
    stages = ("schedule", "pool", "pool + gather")
    print("| ddbloader | " + " | ".join(stages) + " | µs per batch (pool + gather) |")
    print("|---|" + "---:|" * (len(stages) + 1))
    for label, runs in results.items():
        cells = [f"{min(r[s] for r in runs) * 1e3:.1f}" for s in stages]
        per_batch = min(r["pool + gather"] for r in runs) / runs[0]["batches"] * 1e6
        print(f"| {label} | " + " | ".join(cells) + f" | {per_batch:.1f} |")


if __name__ == "__main__":
    main()
