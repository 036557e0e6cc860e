"""How much does the data pipeline slow a training loop down, as the loop sees it?

Usage::

    python benchmarks/loop.py                      # 2 step kinds, 3 rounds
    python benchmarks/loop.py --steps 500 --step 2,3
    python benchmarks/loop.py --profile loop_profile.md  # + where the loader holds the GIL
    python benchmarks/loop.py --smoke
    python benchmarks/loop.py --contenders ddbloader,ready --against REV  # this checkout and REV's

A training step is simulated by holding the GIL for ``g`` ms (pure Python, as a model's Python
side does) and then releasing it for ``r`` ms (``time.sleep``, as a GPU kernel or a C++ op
does). The default step kinds: 0.6 + 4.4 ms (a mid-size model) and 0.3 + 0.7 ms (a small
time-series model). Each contender feeds ``--steps`` steps of batches of ``harness.SERIES``
windows (window 50 -> 1, batch 64, shuffled), after 5 warm-up steps, in its own interpreter,
interleaved:

* ``ddbloader``: ``DDBDataLoader`` on the DuckDB file, defaults, warm: one epoch consumed by an
  empty loop before the warm-up steps;
* ``ready``: the same number of batches made beforehand and held in RAM (no pipeline at all);
* ``dataloader``: torch ``DataLoader(num_workers=2, batch_size=64, shuffle=True)`` over a
  map-style dataset of windows of the table held in RAM.

``slowdown`` is the loop's wall time over the steps' own (the same steps run with no data, in
the same process, in turns of ``BLOCK`` steps with the fed ones): 1.0 means the pipeline costs
the loop nothing. Where that cost lies: ``next_ms`` is the median wait of a fed step for its
batch (``next()``, the previous batch released in it, as a loop does), ``in_next`` the share of
the loop's extra time (fed minus alone) spent in those waits (the rest is the steps themselves
slowed: the GIL or the CPUs shared with the pipeline's threads), ``stalls`` the waits over
``STALL_S`` (the pipeline behind: an epoch's start, a fetch not done) and ``stalled_s`` their
sum. ``cpu_s`` is the process's CPU over both (every thread, workers reaped at exit not
included).

``--profile FILE`` first adds one ``ddbloader`` run at the last step kind, sampled by ``py-spy
record --gil --threads`` (``pip install py-spy``) over the measured steps, and writes
``FILE``: per thread, the GIL-holding samples per batch, and the ddbloader functions (innermost
ddbloader frame of each sample, its callees included) and leaf functions that hold it. The raw
stacks are kept beside ``FILE`` (``FILE.gil.txt``). ``--only-profile`` skips the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import os
import re
import signal
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import harness

WARMUP = 5
#: steps fed and the same steps alone, in turns of this many: a load that drifts (a shared
#: machine) weighs on both alike; a pipeline's prefetched batches (1-4) are a small head start
BLOCK = 200
READY = 64
#: a wait for a batch longer than this is a stall (the pipeline fell behind), not a hand-over
STALL_S = 1e-3


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
        harness.epoch(loader)  # warm: the loop's epochs are the loader's second and later
        return itertools.chain.from_iterable(itertools.repeat(loader)), loader
    dataset = Windows(shape, p["window"])
    if p["label"] == "dataloader":
        data: Any = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)  # type: ignore[arg-type]
        return itertools.chain.from_iterable(itertools.repeat(data)), None
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
    ready = []
    # READY distinct batches, served in a cycle: the loop sees ready tensors; RAM stays small
    for at in range(0, 64 * min(READY, len(dataset) // 64), 64):
        index = order[at : at + 64]
        ready.append(
            (
                torch.stack([dataset[int(i)][0] for i in index]),
                torch.stack([dataset[int(i)][1] for i in index]),
            )
        )
    return itertools.cycle(ready), None


#: py-spy's options: only the thread holding the GIL is sampled; ``--nonblocking`` leaves the
#: process running (a blocking sampler pauses it per sample). Sampling threads on a CPU instead
#: (no ``--gil``) was tried and dropped: py-spy counted the loop's sleep as busy and missed most of
#: its busy wait.
SPY = ["--threads", "--gil", "--nonblocking"]


@contextlib.contextmanager
def _sampled(out: str | None, rate: int) -> Iterator[None]:
    """Sample this process with ``py-spy record`` and :data:`SPY` (raw stacks to ``out``) while
    the block runs; nothing when ``out`` is None."""
    if out is None:
        yield
        return
    command = ["py-spy", "record", "--pid", str(os.getpid()), *SPY]
    spy = subprocess.Popen(
        [*command, "--rate", str(rate), "--format", "raw", "-o", out], stderr=subprocess.PIPE, text=True
    )
    time.sleep(1.0)  # py-spy attaches before the first measured step (this second is sampled too)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if not Path(out).exists():
            raise RuntimeError(f"py-spy wrote no profile: {err[-2000:]}")


def feed(p: dict[str, Any]) -> dict[str, Any]:
    hold, release = p["hold_ms"], p["release_ms"]
    source, resource = _batches(p)
    batches: Iterator[Any] = iter(source)
    for _ in range(WARMUP):
        next(batches)
        _step(hold, release)
    wall = own = 0.0
    clock = time.perf_counter
    # each fed step's wait for its batch (the previous batch released in it, as a loop does)
    waits: list[float] = []
    with _sampled(p.get("out"), p.get("rate", 0)):
        cpu0 = harness.cpu_s()
        for turn, done in enumerate(range(0, p["steps"], BLOCK)):
            n = min(BLOCK, p["steps"] - done)
            # fed then alone, then alone then fed: whatever favours the second block cancels
            for fed in (True, False) if turn % 2 == 0 else (False, True):
                started = clock()
                for _ in range(n):
                    if fed:
                        asked = clock()
                        x, _ = next(batches)
                        waits.append(clock() - asked)
                        if x.shape[0] == 0:
                            raise AssertionError("an empty batch")
                    _step(hold, release)
                took = clock() - started
                wall, own = (wall + took, own) if fed else (wall, own + took)
        cpu = harness.cpu_s() - cpu0
    if resource is not None:
        resource.close()
    stalls = [w for w in waits if w > STALL_S]
    return {
        "steps_s": own,
        "loop_s": wall,
        "slowdown": wall / own,
        "next_ms": statistics.median(waits) * 1e3,
        "in_next": sum(waits) / (wall - own) if wall > own else 0.0,
        "stalls": len(stalls),
        "stalled_s": sum(stalls),
        "cpu_s": cpu,
        "peak_rss_mb": harness.peak_rss_mb(),
    }


def _frames(line: str) -> tuple[str, list[str], int]:
    """A raw py-spy line -> (thread name, frames outermost first as ``func (file)``, samples)."""
    stack, _, count = line.rpartition(" ")
    thread, *frames = stack.split(";")
    name = thread.partition(": ")[2] or "?"
    return name.rstrip("0123456789-_ ") or name, [re.sub(r":\d+\)$", ")", f) for f in frames], int(count)


def profile_table(raw: str, batches: int, held_s: float) -> str:
    """Markdown: ms per batch of the samples in ``raw``, by thread, ddbloader function and leaf.

    A sampler starved of CPU (a loaded machine) takes fewer samples than its rate says, so the
    samples are counted against a known time instead: the main thread's ``_step`` held the GIL
    for ``held_s`` seconds of the run.
    """
    threads: Counter[str] = Counter()
    step = 0
    owners: Counter[tuple[str, str]] = Counter()
    leaves: Counter[tuple[str, str]] = Counter()
    for line in Path(raw).read_text().splitlines():
        if not line.strip():
            continue
        thread, frames, count = _frames(line)
        threads[thread] += count
        step += count if thread == "MainThread" and frames and frames[-1].startswith("_step (") else 0
        ours = [f for f in frames if "ddbloader/" in f]
        if thread != "MainThread" or ours:
            owners[thread, ours[-1] if ours else "(no ddbloader frame)"] += count
            leaves[thread, frames[-1] if frames else "?"] += count
    if not step:
        raise RuntimeError(f"no sample of the loop's own step in {raw}: nothing to count against")
    rate = step / held_s
    per = 1e3 / rate / batches  # ms per batch for one sample

    def rows(counter: Counter[tuple[str, str]], top: int) -> list[str]:
        return [f"| {t} | `{f}` | {n * per:.3f} | {n:,} |" for (t, f), n in counter.most_common(top)]

    lines = [
        f"### GIL per batch (`py-spy record {' '.join(SPY)}`)",
        "",
        f"Over {batches:,} fed steps, as many steps alone (the MainThread row counts both) and the"
        " second before them (a sample is taken only from the thread holding the GIL). Samples are"
        f" counted against the loop's own step: it held the GIL {held_s:.2f} s in {step:,} samples,"
        f" {rate:.0f} a second; ms per batch = samples / that rate / batches.",
        "",
        "| thread | GIL ms per batch | samples |",
        "|---|---:|---:|",
        *[f"| {t} | {n * per:.3f} | {n:,} |" for t, n in threads.most_common()],
        "",
        "Innermost ddbloader function on the stack (its callees included; the main thread only"
        " where ddbloader is on its stack):",
        "",
        "| thread | function | GIL ms per batch | samples |",
        "|---|---|---:|---:|",
        *rows(owners, 40),
        "",
        "Leaf frames (the function itself, any library) of those samples:",
        "",
        "| thread | leaf | GIL ms per batch | samples |",
        "|---|---|---:|---:|",
        *rows(leaves, 30),
    ]
    return "\n".join(lines) + "\n"


def _profiles(args: argparse.Namespace, p: dict[str, Any], hold: float, release: float) -> str:
    """The profiles of one warm ``ddbloader`` run each at step ``hold`` + ``release``, Markdown."""
    facts = harness.machine()
    sections = [
        f"## Where ddbloader's threads hold the GIL: step {hold:g} + {release:g} ms, "
        f"{p['shape']} window {p['window']} batch 64, warm",
        "",
        f"`python benchmarks/loop.py --profile FILE`; commit {facts['commit']}, {facts['cpus']} CPUs, "
        f"load {facts['load_1min']:.2f}, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC.",
    ]
    # the raw stacks beside the page, for flame graphs (flamegraph.pl, speedscope)
    raw = str(args.profile.with_suffix(".gil.txt"))
    # at least 300 steps: the loop's own step is the clock the samples are counted against, and a
    # sampler starved of CPU (a loaded machine) may take none of a smoke run's 20
    steps = max(p["steps"], 300)
    params = {**p, "steps": steps, "hold_ms": hold, "release_ms": release, "label": "ddbloader"}
    result = harness.child(args.script, "feed", {**params, "out": raw, "rate": args.rate})
    sections += ["", f"Slowdown of this run under the profiler: {result['slowdown']:.3f}; raw stacks:"]
    sections += [f"`{raw}`.", "", profile_table(raw, steps, 2 * steps * hold / 1e3)]
    return "\n".join(sections)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1000, help="measured steps per contender")
    parser.add_argument("--step", action="append", help="HOLD,RELEASE in ms (default 0.6,4.4 0.3,0.7)")
    parser.add_argument("--profile", type=Path, help="write where the loader holds the GIL (Markdown)")
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second (--profile)")
    parser.add_argument("--only-profile", action="store_true", help="with --profile: no table")
    parser.add_argument(
        "--contenders", default="ddbloader,ready,dataloader", help="which contenders (comma-separated)"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = harness.SERIES_SMOKE if args.smoke else harness.SERIES
    steps = [
        tuple(map(float, s.split(",")))
        for s in args.step or (["0.3,0.7"] if args.smoke else ["0.6,4.4", "0.3,0.7"])
    ]
    p = {"shape": [shape.symbols, shape.days, shape.rows, shape.factors], "window": 8 if args.smoke else 50}
    p["steps"] = 20 if args.smoke else args.steps
    harness.series_db(shape)
    rows, ratios, notes = [], {}, []
    if args.profile:  # first: the profile is wanted before the table
        args.profile.write_text(_profiles(args, p, *steps[-1]))
        notes.append(f"profiles written to {args.profile}")
        if args.only_profile:
            return {"params": {**p, "steps_ms": steps}, "rows": rows, "notes": notes}
    for hold, release in steps:
        todo = [
            ("feed", {**p, "hold_ms": hold, "release_ms": release, "label": label})
            for label in args.contenders.split(",")
        ]
        results = harness.interleaved(args.script, todo, args.rounds)
        by = {r["contender"].removeprefix("feed "): r for r in results}
        for r in results:
            r["contender"] = (
                f"hold {hold:g} ms, release {release:g} ms: {r['contender'].removeprefix('feed ')}"
            )
        rows += results
        if "ready" in by:
            for label, r in by.items():
                if label != "ready":
                    ratios[f"{r['contender']}: slowdown / ready's"] = r["slowdown"] / by["ready"]["slowdown"]
    return {"params": {**p, "steps_ms": steps}, "rows": rows, "ratios": ratios, "notes": notes}


if __name__ == "__main__":
    harness.main(__doc__, {"feed": feed}, run, arguments)
