"""Shuffle benchmark (issue 26): how well a shuffled epoch mixes one big table, and what it costs.

Usage::

    python benchmarks/shuffle.py                 # both workloads, 2 rounds; table to stdout
    python benchmarks/shuffle.py --rounds 3 --write   # and keep it in benchmarks/RESULTS_shuffle.md

Workloads (DuckDB files under ``benchmarks/_work/``, created once, git-ignored):

* ``tabular``: the peers' workload, 2,000,000 rows x 32 float32 columns (and ``id``), ``SELECT *
  FROM tab ORDER BY id``, batch 1024, ``shuffle=True``, every other argument default.
* ``series``: one group of ``--series-rows`` rows x 8 float32 columns, ``ORDER BY id``, window 16,
  batch 1024, shuffled: a long series read in contiguous range pieces.

Configurations, each in a fresh interpreter per round, interleaved round by round:

* ``range pieces``: this checkout, defaults (a partition above ``fetch_bytes`` is cut into range
  pieces at planning).
* ``uniform``: this checkout, ``fetch_bytes=0`` (the table read whole: a uniform shuffle, at the
  memory it takes).
* ``main``: the code in ``--main`` (default ``/work/main``, imported through PYTHONPATH), defaults:
  the big partition streamed front to back in pieces.

Mixing, from the ids of the first epoch (``key_col=["id"]``): the median number of distinct
blocks of 100,000 consecutive ids per batch (20 blocks in the tabular table; a uniform shuffle
puts nearly all 20 in each batch), the rank correlation between a batch's position in the epoch
and its mean id (the issue's figure: +0.99 front to back, 0 for no trace of order), and the rank
correlation between a sample's position and its id. Time: the constructor plus the first epoch
(cold: a fresh loader in a fresh process) and the second epoch (warm), in wall and in CPU
seconds of the process (all threads, DuckDB's included: steadier than wall time when other jobs
compete for the cores); warm is the median of ``--warm-epochs`` epochs after the first. The
machine is shared and noisy: the table gives the median and the range over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
RESULTS = HERE / "RESULTS_shuffle.md"
MARKER = "RESULT-JSON:"
BLOCK = 100_000
WORKLOADS = ("tabular", "series")
CONFIGS = ("range pieces", "uniform", "main")


def _table_path(workload: str, rows: int) -> Path:
    return WORK / f"shuffle_{workload}_{rows}.duckdb"


def ensure_data(workload: str, rows: int) -> Path:
    """The workload's DuckDB file, created once."""
    import duckdb

    path = _table_path(workload, rows)
    if path.exists():
        return path
    WORK.mkdir(exist_ok=True)
    columns = 32 if workload == "tabular" else 8
    values = ", ".join(f"random()::FLOAT AS f{j}" for j in range(columns))
    with duckdb.connect(str(path)) as con:
        con.execute("SELECT setseed(0.5)")
        con.execute(f"CREATE TABLE tab AS SELECT i AS id, {values} FROM range({rows}) r(i)")
    return path


def child(workload: str, config: str, path: str, warm_epochs: int) -> dict[str, Any]:
    """One loader in this process: the first (cold) epoch, the median of ``warm_epochs`` later
    (warm) ones, and the mixing."""
    import warnings

    import numpy as np
    from scipy.stats import spearmanr

    warnings.simplefilter("ignore")
    started, cpu = time.perf_counter(), _cpu()
    from ddbloader import DDBDataLoader

    options: dict[str, Any] = {
        "batch_size": 1024,
        "shuffle": True,
        "seed": 0,
        "key_col": ["id"],
        "exclude_col": ["id"],
    }
    if workload == "series":
        options["window_size"] = 16
    if config == "uniform":
        options["fetch_bytes"] = 0
    loader = DDBDataLoader(path, "SELECT * FROM tab ORDER BY id", "f0", **options)
    ids: list[Any] = []
    for batch in loader:
        ids.append(np.asarray(batch[2]["id"]))
    cold, cold_cpu = time.perf_counter() - started, _cpu() - cpu
    walls, cpus = [], []
    for _ in range(warm_epochs):
        started, cpu = time.perf_counter(), _cpu()
        for _ in loader:
            pass
        walls.append(time.perf_counter() - started)
        cpus.append(_cpu() - cpu)
    warm, warm_cpu = statistics.median(walls), statistics.median(cpus)
    ranged = (
        sum(p.ranges is not None for g in loader.plan.groups for p in g.partitions) if config != "main" else 0
    )
    loader.close()
    blocks = [len(np.unique(b // BLOCK)) for b in ids]
    means = [float(b.mean()) for b in ids]
    every = np.concatenate(ids)
    step = max(len(every) // 200_000, 1)
    with open("/proc/self/status") as status:
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return {
        "cold_s": cold,
        "warm_s": warm,
        "cold_cpu_s": cold_cpu,
        "warm_cpu_s": warm_cpu,
        "blocks": float(np.median(blocks)),
        "batch_rho": float(spearmanr(np.arange(len(means)), means)[0]),
        "sample_rho": float(spearmanr(np.arange(0, len(every), step), every[::step])[0]),
        "pieces": ranged,
        "rss_mb": hwm / 1024,
    }


def _cpu() -> float:
    """CPU seconds of this process, all its threads (the engine's too): steadier than wall time
    on a shared machine."""
    times = os.times()
    return times.user + times.system


def run_child(workload: str, config: str, path: Path, main: str, warm_epochs: int) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = main if config == "main" else str(HERE.parent)
    command = [sys.executable, __file__, "--child", workload, config, str(path), str(warm_epochs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False, env=env)
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            result: dict[str, Any] = json.loads(line[len(MARKER) :])
            return result
    raise RuntimeError(f"{workload}/{config} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def _span(values: list[float], fmt: str) -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return format(median, fmt)
    return f"{format(median, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def render(results: dict[tuple[str, str], list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [
        "# Shuffle benchmark (issue 26)",
        "",
        f"Produced by `python benchmarks/shuffle.py --rounds {args.rounds} --warm-epochs {args.warm_epochs} "
        "--write`. Machine: 2 cores shared "
        "with other jobs and noisy: each figure is the median of the rounds, the range in parentheses; the "
        "configurations run interleaved, one fresh process each. `main` is the code before range pieces "
        f"({args.main}).",
        "",
    ]
    for workload in WORKLOADS:
        rows = 2_000_000 if workload == "tabular" else args.series_rows
        shape = (
            f"{rows:,} rows x 32 float32, `SELECT * FROM tab ORDER BY id`, batch 1024, shuffle=True, defaults"
            if workload == "tabular"
            else f"one group of {rows:,} rows x 8 float32, `ORDER BY id`, window 16, batch 1024, shuffle=True"
        )
        lines += [
            f"## {workload}: {shape}",
            "",
            "| configuration | range pieces | 100k-id blocks per batch (median) "
            "| rank corr. batch position vs mean id | rank corr. sample position vs id "
            "| cold s (constructor + epoch 1) | warm s (later epochs, median) | cold CPU s | warm CPU s "
            "| peak RSS MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for config in CONFIGS:
            runs = results.get((workload, config), [])
            if not runs:
                continue
            lines.append(
                f"| {config} | {runs[0]['pieces']} | {_span([r['blocks'] for r in runs], '.0f')} "
                f"| {_span([r['batch_rho'] for r in runs], '+.2f')} "
                f"| {_span([r['sample_rho'] for r in runs], '+.3f')} "
                f"| {_span([r['cold_s'] for r in runs], '.2f')} "
                f"| {_span([r['warm_s'] for r in runs], '.2f')} "
                f"| {_span([r['cold_cpu_s'] for r in runs], '.2f')} "
                f"| {_span([r['warm_cpu_s'] for r in runs], '.2f')} "
                f"| {_span([r['rss_mb'] for r in runs], '.0f')} |"
            )
        ours = results.get((workload, "range pieces"), [])
        uniform = results.get((workload, "uniform"), [])
        main = results.get((workload, "main"), [])
        if ours and main:
            ratios = {
                key: _span([o[key] / m[key] for o, m in zip(ours, main, strict=False)], ".2f")
                for key in ("cold_s", "warm_s", "cold_cpu_s", "warm_cpu_s")
            }
            lines += [
                "",
                f"Range pieces ÷ main, per round: wall cold {ratios['cold_s']}x, warm {ratios['warm_s']}x; "
                f"CPU cold {ratios['cold_cpu_s']}x, warm {ratios['warm_cpu_s']}x (target ≤ 1.3x).",
            ]
        if ours and uniform:
            share = [o["blocks"] / u["blocks"] for o, u in zip(ours, uniform, strict=False)]
            lines.append(f"Blocks per batch, range pieces ÷ uniform: {_span(share, '.2f')} (target ≥ 0.9).")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--child", nargs=4, metavar=("WORKLOAD", "CONFIG", "PATH", "WARM"), help=argparse.SUPPRESS
    )
    parser.add_argument("--warm-epochs", type=int, default=3, help="warm epochs per process (their median)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--series-rows", type=int, default=2_000_000)
    parser.add_argument("--workload", choices=WORKLOADS, action="append")
    parser.add_argument("--main", default="/work/main", help="the checkout the 'main' configuration imports")
    parser.add_argument("--write", action="store_true", help=f"write the table to {RESULTS.name}")
    args = parser.parse_args()
    if args.child:
        workload, config, path, warm_epochs = args.child
        print(MARKER + json.dumps(child(workload, config, path, int(warm_epochs))), flush=True)
        return
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for workload in args.workload or WORKLOADS:
        rows = 2_000_000 if workload == "tabular" else args.series_rows
        path = ensure_data(workload, rows)
        for round_ in range(args.rounds):
            for config in CONFIGS:
                result = run_child(workload, config, path, args.main, args.warm_epochs)
                results.setdefault((workload, config), []).append(result)
                print(f"round {round_ + 1} {workload} {config}: {result}", file=sys.stderr, flush=True)
    table = render(results, args)
    print(table)
    if args.write:
        RESULTS.write_text(table)


if __name__ == "__main__":
    main()
