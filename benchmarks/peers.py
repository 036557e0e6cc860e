"""Against the peers (issue 27): iteration alone and end to end, tabular rows and windows.

Usage::

    python benchmarks/peers.py                        # both workloads, 2 rounds; table to stdout
    python benchmarks/peers.py --rounds 3 --write     # and keep it in benchmarks/RESULTS_peers.md

Workloads (DuckDB files under ``benchmarks/_work/``, created once, git-ignored):

* ``tabular``: 2,000,000 rows x 32 float32 (``f0`` the target, ``f1..f31`` x), ``SELECT * FROM
  tab ORDER BY id``, batch 1024, shuffled (the table of ``shuffle.py``).
* ``windows``: 200 groups x 5,000 rows x 16 float32 and a target, ``ORDER BY g, t``, window 32
  (x rows ``[s, s + 32)``, y the row after), batch 256, shuffled.

Contenders, each in a fresh interpreter per round, interleaved round by round:

* ``in-memory loop``: the hand-written loop a user writes when the table fits in RAM: the whole
  table read once into numpy (setup), then per epoch a uniform permutation and, per batch, one
  gather into fresh tensors (rows by ``take``; windows by block copies, one ``memcpy`` a window).
* ``TensorDataset + DataLoader`` (tabular only): the same arrays as tensors behind torch's
  ``DataLoader(batch_size=1024, shuffle=True)``.
* ddbloader: defaults; ``fetch_bytes=0`` (each partition read whole: a uniform shuffle of the
  tabular table); ``group_pool_size=200`` (every group in the pool: a shuffle as uniform as the
  loop's); each also with ``cache_bytes`` holding every partition (epochs after the first from
  memory: the like-for-like of a loop that holds every row in RAM).

Figures per contender (medians over rounds): setup (loading, or the constructor; imports of
torch, DuckDB and ddbloader come before the clock), the first
epoch, a warm epoch (the median of two: "iteration alone"), end to end (setup + first epoch),
the process's CPU seconds in a warm epoch (every thread, the engine's too) and its peak RSS.
Ratios are taken within a round against the in-memory loop. The machine is shared and noisy:
read the ratios, not the digits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import throughput  # noqa: E402  (benchmarks/throughput.py, beside this one)
from shuffle import WORK, ensure_data  # noqa: E402  (benchmarks/shuffle.py, beside this one)

RESULTS = HERE / "RESULTS_peers.md"
MARKER = "RESULT-JSON:"
WARM_EPOCHS = 2
CHILD_TIMEOUT_S = 1200
#: a cache for every partition of either workload (~270 and ~70 MB planned)
CACHE_BYTES = 1 << 30
WINDOW, GROUPS, GROUP_ROWS, WINDOW_FEATURES = 32, 200, 5000, 16
BATCH = {"tabular": 1024, "windows": 256}
LOOP = "in-memory loop"
CONTENDERS: dict[str, tuple[str, ...]] = {
    "tabular": (
        LOOP,
        "TensorDataset + DataLoader",
        "ddbloader defaults",
        "ddbloader defaults + cache",
        "ddbloader fetch_bytes=0",
        "ddbloader fetch_bytes=0 + cache",
    ),
    "windows": (
        LOOP,
        "ddbloader defaults",
        "ddbloader defaults + cache",
        "ddbloader group_pool_size=200",
        "ddbloader group_pool_size=200 + cache",
    ),
}
#: targets of issue 27 on iteration alone (a warm epoch), against the in-memory loop's time
TARGETS = {
    ("tabular", "ddbloader fetch_bytes=0"): 2.0,
    ("tabular", "ddbloader fetch_bytes=0 + cache"): 2.0,
    ("windows", "ddbloader group_pool_size=200"): 1.0,
    ("windows", "ddbloader group_pool_size=200 + cache"): 1.0,
}


def windows_data() -> Path:
    """The windows workload's DuckDB file, created once."""
    import duckdb

    path = WORK / f"peers_windows_{GROUPS}x{GROUP_ROWS}.duckdb"
    if path.exists():
        return path
    WORK.mkdir(exist_ok=True)
    values = ", ".join(f"random()::FLOAT AS f{j}" for j in range(WINDOW_FEATURES))
    with duckdb.connect(str(path)) as con:
        con.execute("SELECT setseed(0.25)")
        con.execute(
            f"CREATE TABLE win AS SELECT i // {GROUP_ROWS} AS g, i % {GROUP_ROWS} AS t, {values}, "
            f"random()::FLOAT AS y FROM range({GROUPS * GROUP_ROWS}) r(i) ORDER BY random()"
        )
    return path


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


def _in_memory(workload: str, path: str) -> tuple[Callable[[int], int], Any]:
    """The loop's epoch (a function of the epoch number returning samples served) after reading
    the whole table; also the arrays, kept alive with it."""
    import duckdb
    import torch

    with duckdb.connect(path, read_only=True) as con:
        if workload == "tabular":
            table = con.sql("SELECT * FROM tab ORDER BY id").to_arrow_table()
            x = np.stack([table.column(f"f{j}").to_numpy() for j in range(1, 32)], axis=1)
            y = table.column("f0").to_numpy()
            starts = np.arange(len(x))
        else:
            table = con.sql("SELECT * FROM win ORDER BY g, t").to_arrow_table()
            x = np.stack([table.column(f"f{j}").to_numpy() for j in range(WINDOW_FEATURES)], axis=1)
            y = table.column("y").to_numpy()
            group_starts = np.arange(GROUPS) * GROUP_ROWS
            starts = (group_starts[:, None] + np.arange(GROUP_ROWS - WINDOW)[None, :]).ravel()
    batch = BATCH[workload]
    if workload == "tabular":

        def epoch(number: int) -> int:
            order = np.random.default_rng(number).permutation(len(starts))
            for at in range(0, len(order), batch):
                index = order[at : at + batch]
                torch.from_numpy(x.take(index, 0)), torch.from_numpy(y.take(index))
            return len(order)

        return epoch, (x, y)
    row_bytes = x.shape[1] * x.itemsize
    blocks = np.ndarray(
        (len(x) - WINDOW + 1,), np.dtype((np.void, WINDOW * row_bytes)), buffer=x, strides=(row_bytes,)
    )

    def window_epoch(number: int) -> int:
        order = starts[np.random.default_rng(number).permutation(len(starts))]
        for at in range(0, len(order), batch):
            index = order[at : at + batch]
            torch.from_numpy(blocks[index].view(x.dtype).reshape(-1, WINDOW, x.shape[1]))
            torch.from_numpy(y.take(index + WINDOW))
        return len(order)

    return window_epoch, (x, y, blocks)


def _tensor_dataset(path: str) -> tuple[Callable[[int], int], Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _in_memory("tabular", path)[1]
    loader = DataLoader(
        TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=BATCH["tabular"], shuffle=True
    )

    def epoch(number: int) -> int:
        return sum(len(batch_x) for batch_x, _ in loader)

    return epoch, loader


def _ddbloader(workload: str, contender: str, path: str) -> tuple[Callable[[int], int], Any]:
    from ddbloader import DDBDataLoader

    options: dict[str, Any] = {"batch_size": BATCH[workload], "shuffle": True, "seed": 0}
    if "fetch_bytes=0" in contender:
        options["fetch_bytes"] = 0
    if "group_pool_size=200" in contender:
        options["group_pool_size"] = GROUPS
    if contender.endswith("+ cache"):
        options["cache_bytes"] = CACHE_BYTES
    if workload == "tabular":
        loader = DDBDataLoader(
            path, "SELECT * FROM tab ORDER BY id", "f0", exclude_col=["id", "f0"], **options
        )
    else:
        loader = DDBDataLoader(
            path,
            "SELECT * FROM win ORDER BY g, t",
            "y",
            group_col="g",
            window_size=WINDOW,
            exclude_col=["g", "t", "y"],
            **options,
        )

    def epoch(number: int) -> int:
        return sum(len(batch[0]) for batch in loader)

    return epoch, loader


def child(workload: str, contender: str) -> dict[str, Any]:
    """One contender in this process: setup, the first epoch, then the warm ones."""
    import warnings

    import duckdb  # noqa: F401  (imports are not setup: every contender pays them alike)
    import torch  # noqa: F401

    import ddbloader  # noqa: F401

    warnings.simplefilter("ignore")
    path = str(ensure_data("tabular", 2_000_000) if workload == "tabular" else windows_data())
    started, cpu = time.perf_counter(), _cpu()
    if contender == LOOP:
        epoch, keep = _in_memory(workload, path)
    elif contender.startswith("TensorDataset"):
        epoch, keep = _tensor_dataset(path)
    else:
        epoch, keep = _ddbloader(workload, contender, path)
    setup = time.perf_counter() - started
    started = time.perf_counter()
    samples = epoch(0)
    first = time.perf_counter() - started
    warm, warm_cpu = [], []
    for number in range(1, 1 + WARM_EPOCHS):
        started, cpu = time.perf_counter(), _cpu()
        assert epoch(number) == samples
        warm.append(time.perf_counter() - started)
        warm_cpu.append(_cpu() - cpu)
    if hasattr(keep, "close"):
        keep.close()
    return {
        "samples": samples,
        "setup_s": setup,
        "first_s": first,
        "warm_s": statistics.median(warm),
        "warm_cpu_s": statistics.median(warm_cpu),
        "rss_mb": _peak_rss_mb(),
    }


def run_child(workload: str, contender: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", workload, contender]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    return throughput.child_result(command, f"{workload} / {contender}", MARKER, env, CHILD_TIMEOUT_S)


def rounds_of(workload: str, rounds: int) -> Iterator[dict[str, dict[str, Any]]]:
    contenders = list(CONTENDERS[workload])
    for number in range(rounds):
        order = contenders if number % 2 == 0 else contenders[::-1]
        got = {contender: run_child(workload, contender) for contender in order}
        print(f"{workload} round {number + 1}: {json.dumps(got)}", file=sys.stderr, flush=True)
        yield got


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def render(results: dict[str, list[dict[str, dict[str, Any]]]], load: tuple[float, float]) -> str:
    out = [
        "# Against the peers (issue 27)",
        "",
        f"Produced by `python benchmarks/peers.py` (see its docstring). Machine: {os.cpu_count()} "
        f"cores shared with other jobs, load average {load[0]:.1f} before and {load[1]:.1f} after; "
        "medians over the rounds, ratios taken within a round against the in-memory loop "
        "(contenders interleaved, a fresh process each).",
        "",
    ]
    for workload, rounds in results.items():
        shape = (
            "2,000,000 rows x 32 float32, batch 1024"
            if workload == "tabular"
            else f"{GROUPS} groups x {GROUP_ROWS:,} rows x {WINDOW_FEATURES} float32, "
            f"window {WINDOW}, batch 256"
        )
        out += [
            f"## {workload}: {shape}, shuffled ({len(rounds)} rounds)",
            "",
            "| contender | setup s | first epoch s | warm epoch s | warm CPU s | end to end s | "
            "warm ÷ loop | end to end ÷ loop | peak RSS MB | target (warm ÷ loop) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for contender in CONTENDERS[workload]:

            def figure(
                key: str, contender: str = contender, rounds: list[dict[str, dict[str, Any]]] = rounds
            ) -> float:
                return _median([r[contender][key] for r in rounds])

            warm_ratio = _median([r[contender]["warm_s"] / r[LOOP]["warm_s"] for r in rounds])
            end = _median([r[contender]["setup_s"] + r[contender]["first_s"] for r in rounds])
            end_ratio = _median(
                [
                    (r[contender]["setup_s"] + r[contender]["first_s"])
                    / (r[LOOP]["setup_s"] + r[LOOP]["first_s"])
                    for r in rounds
                ]
            )
            target = TARGETS.get((workload, contender))
            verdict = (
                ""
                if target is None
                else f"≤ {target:g}×: " + ("met" if warm_ratio <= target else "**not met**")
            )
            out.append(
                f"| {contender} | {figure('setup_s'):.2f} | {figure('first_s'):.2f} | "
                f"{figure('warm_s'):.2f} | "
                f"{figure('warm_cpu_s'):.2f} | {end:.2f} | {warm_ratio:.2f}× | {end_ratio:.2f}× | "
                f"{figure('rss_mb'):,.0f} | {verdict} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workload", choices=sorted(CONTENDERS), action="append")
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    args = parser.parse_args()
    if args.child:
        print(MARKER + json.dumps(child(*args.child)), flush=True)
        return
    before = os.getloadavg()[0]
    results = {workload: list(rounds_of(workload, args.rounds)) for workload in args.workload or CONTENDERS}
    text = render(results, (before, os.getloadavg()[0]))
    print(text)
    if args.write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
