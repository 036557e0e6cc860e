"""How much does the data pipeline slow a training loop down, as the loop sees it?

Usage::

    python benchmarks/loop.py                      # 3 step kinds, 3 rounds
    python benchmarks/loop.py --steps 500 --step 2,3
    python benchmarks/loop.py --smoke

A training step is simulated by holding the GIL for ``g`` ms (pure Python, as a model's Python
side does) and then releasing it for ``r`` ms (``time.sleep``, as a GPU kernel or a C++ op
does). Each contender feeds ``--steps`` steps of batches of ``harness.SERIES`` windows (window
50 -> 1, batch 64, shuffled), after 5 warm-up steps, in its own interpreter, interleaved:

* ``ddbloader``: ``DDBDataLoader`` on the DuckDB file, defaults;
* ``ready``: the same number of batches made beforehand and held in RAM (no pipeline at all);
* ``dataloader``: torch ``DataLoader(num_workers=2, batch_size=64, shuffle=True)`` over a
  map-style dataset of windows of the table held in RAM.

``slowdown`` is the loop's wall time over the steps' own (the same steps run with no data,
measured in the same process): 1.0 means the pipeline costs the loop nothing.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

import harness

WARMUP = 5


def _step(hold_ms: float, release_ms: float) -> None:
    until = time.perf_counter() + hold_ms / 1e3
    while time.perf_counter() < until:  # pure Python: the GIL stays held
        pass
    if release_ms:
        time.sleep(release_ms / 1e3)


def _table(shape: harness.Series) -> tuple[Any, Any, Any]:
    """x and y of every row, and the sample starts (windows within a symbol)."""
    import duckdb
    import numpy as np

    with duckdb.connect(str(harness.series_db(shape)), read_only=True) as con:
        sql = f"SELECT {', '.join(shape.factor_names)}, target FROM bench ORDER BY symbol, ts"
        table = con.sql(sql).to_arrow_table()
    x = np.stack([table.column(c).to_numpy() for c in shape.factor_names], axis=1)
    per = shape.days * shape.rows
    return x, np.array(table.column("target").to_numpy()), np.arange(per)


class Windows:
    """Map-style windows over rows in RAM: sample i is (x rows [s, s+w), y row s+w)."""

    def __init__(self, shape: harness.Series, window: int) -> None:
        import numpy as np

        self.x, self.y, _ = _table(shape)
        per = shape.days * shape.rows
        self.window = window
        self.starts = np.concatenate([s * per + np.arange(per - window) for s in range(shape.symbols)])

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import torch

        s = int(self.starts[i])
        return torch.from_numpy(self.x[s : s + self.window]), torch.from_numpy(
            self.y[s + self.window : s + self.window + 1]
        )


def _batches(p: dict[str, Any]) -> tuple[Iterable[Any], Any]:
    """The contender's batches, endless (epochs repeat) where the loop needs more than one epoch,
    and what to close (or None)."""
    import torch
    from torch.utils.data import DataLoader

    from ddbloader import DDBDataLoader

    shape = harness.Series(*p["shape"])
    if p["label"] == "ddbloader":
        loader = DDBDataLoader(str(harness.series_db(shape)), **shape.loader_args(p["window"]))
        return itertools.chain.from_iterable(itertools.repeat(loader)), loader
    dataset = Windows(shape, p["window"])
    if p["label"] == "dataloader":
        data: Any = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)  # type: ignore[arg-type]
        return itertools.chain.from_iterable(itertools.repeat(data)), None
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
    ready = []
    for at in range(0, 64 * (p["steps"] + WARMUP), 64):
        index = order[at % len(order) : at % len(order) + 64]
        ready.append(
            (
                torch.stack([dataset[int(i)][0] for i in index]),
                torch.stack([dataset[int(i)][1] for i in index]),
            )
        )
    return ready, None


def feed(p: dict[str, Any]) -> dict[str, Any]:
    hold, release = p["hold_ms"], p["release_ms"]

    def alone() -> float:
        started = time.perf_counter()
        for _ in range(p["steps"]):
            _step(hold, release)
        return time.perf_counter() - started

    source, resource = _batches(p)
    batches: Iterator[Any] = iter(source)
    for _ in range(WARMUP):
        next(batches)
        _step(hold, release)
    cpu0, started = harness.cpu_s(), time.perf_counter()
    for _ in range(p["steps"]):
        x, _ = next(batches)
        if x.shape[0] == 0:
            raise AssertionError("an empty batch")
        _step(hold, release)
    wall = time.perf_counter() - started
    if resource is not None:
        resource.close()
    del batches
    # The steps' own time after the loop, in the same process state: the fastest of two runs.
    own = min(alone(), alone())
    return {
        "steps_s": own,
        "loop_s": wall,
        "slowdown": wall / own,
        "cpu_s": harness.cpu_s() - cpu0,
        "peak_rss_mb": harness.peak_rss_mb(),
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="measured steps per contender")
    parser.add_argument("--step", action="append", help="HOLD,RELEASE in ms (default 0,5 2,3 5,0)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = harness.SERIES_SMOKE if args.smoke else harness.SERIES
    steps = [
        tuple(map(float, s.split(",")))
        for s in args.step or (["1,1"] if args.smoke else ["0,5", "2,3", "5,0"])
    ]
    p = {"shape": [shape.symbols, shape.days, shape.rows, shape.factors], "window": 8 if args.smoke else 50}
    p["steps"] = 20 if args.smoke else args.steps
    harness.series_db(shape)
    rows, ratios = [], {}
    for hold, release in steps:
        todo = [
            ("feed", {**p, "hold_ms": hold, "release_ms": release, "label": label})
            for label in ("ddbloader", "ready", "dataloader")
        ]
        results = harness.interleaved(args.script, todo, args.rounds)
        for r in results:
            r["contender"] = (
                f"hold {hold:g} ms, release {release:g} ms: {r['contender'].removeprefix('feed ')}"
            )
        rows += results
        ratios[f"hold {hold:g} release {release:g}: ddbloader slowdown / ready's"] = (
            results[0]["slowdown"] / results[1]["slowdown"]
        )
    return {"params": {**p, "steps_ms": steps}, "rows": rows, "ratios": ratios}


if __name__ == "__main__":
    harness.main(__doc__, {"feed": feed}, run, arguments)
