"""Scale benchmark (issue 13): an epoch costs what its rows cost, however many groups, however big one.

Usage::

    python benchmarks/scale.py groups      # 10 x 40,000 vs 4,000 x 100 rows, DuckDB and PostgreSQL
    python benchmarks/scale.py big-group   # 2M rows x 32 float32 as one group, with/without repartitions
    python benchmarks/scale.py memory      # whole-process peak RSS at 1x and 4x the table
    python benchmarks/scale.py planning    # constructor -> first batch at 10,000 groups x 50 rows
    python benchmarks/scale.py all         # everything; tables to stdout, kept in RESULTS_scale.md

Every measurement runs in its own interpreter, so its peak RSS (VmHWM: engine, Arrow and torch
included) is its own; the ratios of a table come from one run of this script, side by side.

* ``groups``: the same 400,000 rows (8 float64 factors and a target, stored in random order, no
  index) as 10 groups of 40,000 rows and as 4,000 groups of 100; window 20, batch 256, shuffled.
  Windows/s of the median of five epochs of one loader after its first (which pays for cold
  caches); ``--groups-rounds`` rounds of the two shapes one after the other, the ratio the median
  of the rounds' ratios (a shared machine's load moves single runs by 20 %). ``fetch_bytes=0``
  (one query per partition, the code before fetch units) is run on the small shape too, unless
  ``--skip-before``.
* ``big-group``: 2,000,000 rows x 32 float32 columns as one group, without a repartition column
  and with a 20-value one, each streamed (default ``fetch_bytes``) and fetched whole
  (``fetch_bytes=0``, the code before streaming); median wall time of one epoch and peak RSS over
  ``--big-group-rounds`` rounds.
* ``memory``: the default throughput shape (``benchmarks/throughput.py``: symbols x days x 2,000
  rows x 100 factors, grouped by symbol, repartitioned by day) at ``--days`` and 4x the days, the
  loader opening the DuckDB file itself; peak RSS of the whole process.
* ``planning``: 10,000 groups x 50 rows (the ``groups`` table's columns, random order, no index),
  grouped by ``g`` with the values discovered and with all 10,000 listed in ``group_scheme``;
  seconds from the constructor's call to its return (the plan) and on to the first batch, window
  20, batch 256, shuffled. Each child times ``--rounds`` loaders one after another, ddbloader
  imported before the first (which still pays the process's first queries, cold caches and lazy
  imports); the table gives the medians and the first loader's total, and the client's CPU
  seconds (all its threads, DuckDB's included), steadier than walls on a shared machine.
  ``--compare DIR`` measures the ddbloader in DIR (another checkout) right after each row.
  ``groups --compare DIR``: DuckDB only, both shapes with this checkout and DIR interleaved, and
  the process CPU seconds per epoch beside the windows/s.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / "_work"
MARKER = "RESULT-JSON:"
SECTION = "## Scale (issue 13)"
FACTORS = 8
WINDOW = 20
BATCH = 256
TOTAL_ROWS = 400_000
SHAPES = ((10, 40_000), (4_000, 100))
PLANNING_SHAPE = (10_000, 50)
#: Epochs measured after the first (cold) one; windows/s is of the median one.
GROUPS_EPOCHS = 5


def _hwm_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# ----------------------------------------------------------------------------------------- data


def _groups_table(groups: int, rows: int) -> Any:
    """``groups`` x ``rows`` rows in random order: g, pos (row within the group), f0..f7, target."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    order = rng.permutation(groups * rows)
    columns: dict[str, Any] = {
        "g": pa.array((np.arange(groups * rows) // rows)[order].astype(np.int32)),
        "pos": pa.array((np.arange(groups * rows) % rows)[order].astype(np.int32)),
    }
    for i in range(FACTORS):
        columns[f"f{i}"] = pa.array(rng.random(groups * rows))
    columns["target"] = pa.array(rng.random(groups * rows))
    return pa.table(columns)


def _duckdb_file(name: str, make: Callable[[], Any]) -> Path:
    import duckdb

    path = WORK / f"{name}.duckdb"
    if path.exists():
        return path
    WORK.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    data = make()  # noqa: F841 -- read by DuckDB's replacement scan
    with duckdb.connect(str(partial)) as con:
        con.execute("CREATE TABLE t AS SELECT * FROM data")
    partial.rename(path)
    return path


# --------------------------------------------------------------------------------- measurements


def _epoch(loader: Any) -> tuple[float, int]:
    started = time.perf_counter()
    windows = 0
    for x, _ in loader:
        windows += x.shape[0]
    return time.perf_counter() - started, windows


def _groups_loader(source: str, table: str, **options: Any) -> Any:
    """The loader of the ``groups`` and ``planning`` measurements: windows of every group of g."""
    from ddbloader import DDBDataLoader

    columns = ", ".join(f"f{i}" for i in range(FACTORS))
    return DDBDataLoader(
        source,
        # pos is selected: an engine that keeps a result's order only under an ORDER BY of it
        # (PostgreSQL) is split by result columns, and the loader refuses to order by others
        f"SELECT g, pos, {columns}, target FROM {table} ORDER BY pos",
        "target",
        batch_size=BATCH,
        shuffle=True,
        window_size=WINDOW,
        input_col=[f"f{i}" for i in range(FACTORS)],
        group_col="g",
        seed=0,
        **options,
    )


def measure_groups(
    source: str, table: str, groups: int, rows: int, fetch_bytes: int | None
) -> dict[str, Any]:
    options: dict[str, Any] = {} if fetch_bytes is None else {"fetch_bytes": fetch_bytes}
    importlib.import_module("ddbloader")  # before the clock: plan s is planning, not torch's import
    started = time.perf_counter()
    loader = _groups_loader(source, table, **options)
    plan_s = time.perf_counter() - started
    with loader:
        first_s, _ = _epoch(loader)
        walls, cpus = [], []
        for _ in range(GROUPS_EPOCHS):
            cpu = time.process_time()  # every thread's, in ns (os.times counts 10 ms ticks)
            wall_s, windows = _epoch(loader)
            walls.append(wall_s)
            cpus.append(time.process_time() - cpu)
        stats = loader.stats()
    assert windows == groups * (rows - WINDOW), windows
    wall_s = statistics.median(walls)
    return {
        "plan_s": plan_s,
        "first_epoch_s": first_s,
        "wall_s": wall_s,
        "cpu_s": statistics.median(cpus),
        "windows": windows,
        "windows_per_s": windows / wall_s,
        "queries": stats.queries,
        "rows_per_query": stats.rows_per_query,
    }


def measure_planning(source: str, table: str, groups: int, explicit: bool, rounds: int) -> dict[str, Any]:
    """``rounds`` loaders one after another: seconds to plan and on to the first batch, each."""
    import ddbloader  # noqa: F401 -- imported before the clock starts, as a training script has

    def cpu() -> float:
        times = os.times()
        return times.user + times.system

    options: dict[str, Any] = {"group_scheme": list(range(groups))} if explicit else {}
    plans, firsts, cpus = [], [], []
    for _ in range(rounds):
        started, cpu_started = time.perf_counter(), cpu()
        loader = _groups_loader(source, table, **options)
        planned = time.perf_counter()
        with loader:
            x, _ = next(iter(loader))
            plans.append(planned - started)
            firsts.append(time.perf_counter() - planned)
            cpus.append(cpu() - cpu_started)
            assert x.shape[0] == BATCH, x.shape
            assert len(loader.plan.groups) == groups, len(loader.plan.groups)
    totals = [p + f for p, f in zip(plans, firsts, strict=True)]
    return {
        "plan_s": plans,
        "first_batch_s": firsts,
        "cpu_s": cpus,
        "first_total_s": totals[0],
        "median_total_s": statistics.median(totals),
        "median_plan_s": statistics.median(plans),
        "median_first_batch_s": statistics.median(firsts),
        "median_cpu_s": statistics.median(cpus),
    }


def measure_big_group(path: str, repartitioned: bool, fetch_bytes: int | None) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    options: dict[str, Any] = {} if fetch_bytes is None else {"fetch_bytes": fetch_bytes}
    started = time.perf_counter()
    loader = DDBDataLoader(
        path,
        "SELECT * FROM t ORDER BY pos",
        "c0",
        batch_size=256,
        shuffle=True,
        exclude_col=["pos", "part"],
        repartition_col="part" if repartitioned else None,
        seed=0,
        **options,
    )
    plan_s = time.perf_counter() - started
    with loader:
        wall_s, windows = _epoch(loader)
        stats = loader.stats()
    return {
        "plan_s": plan_s,
        "wall_s": wall_s,
        "windows": windows,
        "queries": stats.queries,
        "partitions": loader.plan.partitions,
        "peak_rss_mb": _hwm_mb(),
    }


def measure_memory(path: str, options: dict[str, Any], memory_limit: str | None) -> dict[str, Any]:
    """One epoch over the DuckDB file at ``path`` opened by the loader; ``memory_limit`` "default"
    is the loader's own cap, anything else is given to ``DuckDBBackend``."""
    from ddbloader import DDBDataLoader
    from ddbloader.backends import DuckDBBackend

    factors = [f"f{i}" for i in range(100)]
    started = time.perf_counter()
    source = path if memory_limit == "default" else DuckDBBackend(path, memory_limit=memory_limit)
    loader = DDBDataLoader(
        source,
        f"SELECT symbol, ts, {', '.join(factors)}, target FROM bench ORDER BY ts",
        "target",
        batch_size=64,
        shuffle=True,
        window_size=50,
        group_col="symbol",
        repartition_col="CAST(ts AS DATE)",
        exclude_col=["symbol", "ts", "target"],
        seed=0,
        **options,
    )
    plan_s = time.perf_counter() - started
    cpu = os.times()
    with loader:
        wall_s, windows = _epoch(loader)
        stats = loader.stats()
    after = os.times()
    return {
        "plan_s": plan_s,
        "wall_s": wall_s,
        "cpu_s": after.user + after.system - cpu.user - cpu.system,
        "windows": windows,
        "queries": stats.queries,
        "peak_rss_mb": _hwm_mb(),
    }


MEASUREMENTS: dict[str, Callable[..., dict[str, Any]]] = {
    "groups": measure_groups,
    "big-group": measure_big_group,
    "memory": measure_memory,
    "planning": measure_planning,
}


def spawn(kind: str, *args: Any, tree: Path = REPO) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter, importing ddbloader from ``tree``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([kind, *args])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} {args} failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1][len(MARKER) :])
    print(f"  {kind} {args[1:]} ({tree}): {result}", file=sys.stderr, flush=True)
    return result


# ---------------------------------------------------------------------------------------- runs


def run_groups(skip_before: bool, rounds: int) -> str:
    """Each engine: ``rounds`` rounds of the two shapes one after the other (each in its own
    interpreter); per shape the median round, and the median (and range) of the rounds' ratios."""
    sys.path.insert(0, str(REPO / "tests"))
    import pgserver

    sources: dict[str, str] = {}
    for groups, rows in SHAPES:
        sources[f"duckdb {groups}"] = str(
            _duckdb_file(f"groups_{groups}x{rows}", lambda g=groups, r=rows: _groups_table(g, r))
        )
    server = pgserver.start()
    try:
        from adbc_driver_postgresql import dbapi

        with dbapi.connect(server.uri, autocommit=True) as admin, admin.cursor() as cursor:
            for groups, rows in SHAPES:
                cursor.adbc_ingest(f"t_{groups}", _groups_table(groups, rows), mode="replace")
                cursor.execute(f"ANALYZE t_{groups}")
        lines = [
            "| engine | shape | fetch_bytes | plan s | windows/s | queries/epoch | rows/query | "
            f"ratio to 10 groups, median of {rounds} rounds [range] |",
            "|---|---|---|---:|---:|---:|---:|---|",
        ]
        for engine in ("duckdb", "postgres"):
            variants = [(groups, rows, None) for groups, rows in SHAPES]
            if not skip_before:
                variants += [(groups, rows, 0) for groups, rows in SHAPES if groups > 10]
            results: dict[tuple[int, int | None], list[dict[str, Any]]] = {}
            for _ in range(rounds):
                for groups, rows, fetch_bytes in variants:
                    source = sources[f"duckdb {groups}"] if engine == "duckdb" else server.uri
                    table = "t" if engine == "duckdb" else f"t_{groups}"
                    result = spawn("groups", source, table, groups, rows, fetch_bytes)
                    results.setdefault((groups, fetch_bytes), []).append(result)
            references = [r["windows_per_s"] for r in results[(10, None)]]
            for (groups, fetch_bytes), runs in results.items():
                ratios = sorted(r["windows_per_s"] / ref for r, ref in zip(runs, references, strict=True))
                r = sorted(runs, key=lambda run: run["windows_per_s"])[len(runs) // 2]
                budget = "default" if fetch_bytes is None else fetch_bytes
                lines.append(
                    f"| {engine} | {groups:,} x {TOTAL_ROWS // groups:,} | {budget} "
                    f"| {r['plan_s']:.2f} | {r['windows_per_s']:,.0f} | {r['queries']} | "
                    f"{r['rows_per_query']:,.0f} | {statistics.median(ratios):.2f}x "
                    f"[{ratios[0]:.2f}-{ratios[-1]:.2f}] |"
                )
    finally:
        server.stop()
    return "\n".join(lines)


def run_groups_compare(rounds: int, compare: list[Path]) -> str:
    """DuckDB only: both shapes with this checkout and with each of ``compare`` (other
    checkouts), interleaved in each of ``rounds`` rounds; medians, and the median of the rounds'
    ratios of each to the last of ``compare`` (windows/s, and process CPU s per epoch)."""
    trees = [("this checkout", REPO)] + [(f"`{c}`", c) for c in compare]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for groups, rows in SHAPES:
            path = str(_duckdb_file(f"groups_{groups}x{rows}", lambda g=groups, r=rows: _groups_table(g, r)))
            for label, tree in trees:
                result = spawn("groups", path, "t", groups, rows, None, tree=tree)
                results.setdefault((groups, label), []).append(result)
    lines = [
        f"| shape | ddbloader | windows/s (median of {rounds}) | process CPU s per epoch | "
        f"windows/s ratio to `{compare[-1]}` [range] | CPU ratio [range] |",
        "|---|---|---:|---:|---|---|",
    ]
    for groups, rows in SHAPES:
        for label, _ in trees:
            runs = results[groups, label]
            others = results[groups, trees[-1][0]]
            speed = sorted(r["windows_per_s"] / o["windows_per_s"] for r, o in zip(runs, others, strict=True))
            cpu = sorted(r["cpu_s"] / o["cpu_s"] for r, o in zip(runs, others, strict=True))
            lines.append(
                f"| {groups:,} x {rows:,} | {label} "
                f"| {statistics.median(r['windows_per_s'] for r in runs):,.0f} "
                f"| {statistics.median(r['cpu_s'] for r in runs):.3f} "
                f"| {statistics.median(speed):.2f}x [{speed[0]:.2f}-{speed[-1]:.2f}] "
                f"| {statistics.median(cpu):.2f}x [{cpu[0]:.2f}-{cpu[-1]:.2f}] |"
            )
    return "\n".join(lines)


def run_planning(rounds: int, compare: Path | None) -> str:
    """The planning table; with ``compare``, each row measured for that tree too, right after."""
    sys.path.insert(0, str(REPO / "tests"))
    import pgserver

    groups, rows = PLANNING_SHAPE
    path = str(_duckdb_file(f"groups_{groups}x{rows}", lambda: _groups_table(groups, rows)))
    trees = [("this checkout", REPO)] + ([(f"`{compare}`", compare)] if compare is not None else [])
    server = pgserver.start()
    try:
        from adbc_driver_postgresql import dbapi

        with dbapi.connect(server.uri, autocommit=True) as admin, admin.cursor() as cursor:
            cursor.adbc_ingest("t_planning", _groups_table(groups, rows), mode="replace")
            cursor.execute("ANALYZE t_planning")
        lines = [
            f"| engine | group values | ddbloader | plan s | first batch s | total s (median of {rounds}) "
            f"| total s (first loader) | client CPU s |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for engine, source, table in (("duckdb", path, "t"), ("postgres", server.uri, "t_planning")):
            for explicit in (False, True):
                values = f"{groups:,} listed (group_scheme)" if explicit else "discovered"
                for label, tree in trees:
                    r = spawn("planning", source, table, groups, explicit, rounds, tree=tree)
                    lines.append(
                        f"| {engine} | {values} | {label} | {r['median_plan_s']:.3f} | "
                        f"{r['median_first_batch_s']:.3f} | {r['median_total_s']:.3f} | "
                        f"{r['first_total_s']:.3f} | {r['median_cpu_s']:.3f} |"
                    )
    finally:
        server.stop()
    return "\n".join(lines)


def run_big_group(rounds: int) -> str:
    def table() -> Any:
        import numpy as np
        import pyarrow as pa

        rows = 2_000_000
        rng = np.random.default_rng(1)
        columns: dict[str, Any] = {
            "pos": pa.array(np.arange(rows, dtype=np.int64)),
            "part": pa.array((np.arange(rows) * 20 // rows).astype(np.int32)),
        }
        for i in range(32):
            columns[f"c{i}"] = pa.array(rng.random(rows, dtype=np.float32))
        return pa.table(columns)

    path = str(_duckdb_file("big_group_2m_x32", table))
    # fetch_bytes=0 is the code before streaming: a partition fetched and held whole (with a
    # repartition column too: its 12.8 MB partitions were each over the 8 MiB budget, so each
    # was one query then). Contenders alternate, so load drifts hit them alike.
    contenders = [
        (label, repartitioned, fetch_bytes)
        for label, fetch_bytes in (("before (fetch_bytes=0)", 0), ("streamed (fetch_bytes 8 MiB)", None))
        for repartitioned in (False, True)
    ]
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {(c[0], c[1]): [] for c in contenders}
    for _ in range(rounds):
        for label, repartitioned, fetch_bytes in contenders:
            runs[label, repartitioned].append(spawn("big-group", path, repartitioned, fetch_bytes))

    def median(label: str, repartitioned: bool, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[label, repartitioned]))

    lines = [
        "| 2M rows x 32 float32, one group | repartition column | median wall s | median peak RSS MB | "
        "partitions | queries |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, repartitioned, _ in contenders:
        last = runs[label, repartitioned][-1]
        lines.append(
            f"| {label} | {'20 values' if repartitioned else 'none'} | "
            f"{median(label, repartitioned, 'wall_s'):.2f} | "
            f"{median(label, repartitioned, 'peak_rss_mb'):.0f} | "
            f"{last['partitions']} | {last['queries']} |"
        )
    for label, _, _ in contenders[::2]:
        lines.append(
            f"| {label}: ratio none / 20 values | | "
            f"{median(label, False, 'wall_s') / median(label, True, 'wall_s'):.2f}x | "
            f"{median(label, False, 'peak_rss_mb') / median(label, True, 'peak_rss_mb'):.2f}x | | |"
        )
    return "\n".join(lines)


def run_memory(symbols: int, days: int, variants: list[tuple[str, dict[str, Any], str | None]]) -> str:
    sys.path.insert(0, str(HERE))
    import throughput

    lines = [
        "| settings | rows x1 | peak RSS x1 MB | peak RSS x4 MB | growth | wall x1 s | wall x4 s | "
        "CPU x4 s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    shapes = [throughput.Shape(symbols, days * k, 2000, 100, 50) for k in (1, 4)]
    for shape in shapes:
        throughput.ensure_data(shape)
    for label, options, memory_limit in variants:
        one, four = (spawn("memory", str(s.db_path), options, memory_limit) for s in shapes)
        growth = 100 * (four["peak_rss_mb"] - one["peak_rss_mb"]) / one["peak_rss_mb"]
        lines.append(
            f"| {label} | {shapes[0].total_rows:,} | {one['peak_rss_mb']:.0f} | {four['peak_rss_mb']:.0f} | "
            f"{growth:+.0f} % | {one['wall_s']:.2f} | {four['wall_s']:.2f} | {four['cpu_s']:.1f} |"
        )
    return "\n".join(lines)


def _child(raw: str) -> None:
    kind, *args = json.loads(raw)
    print(MARKER + json.dumps(MEASUREMENTS[kind](*args)), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "what", nargs="?", choices=["groups", "big-group", "memory", "planning", "all"], default="all"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--skip-before", action="store_true", help="skip fetch_bytes=0 at 4,000 groups")
    parser.add_argument(
        "--groups-rounds", type=int, default=5, help="groups: rounds of the two shapes, one after the other"
    )
    parser.add_argument(
        "--big-group-rounds", type=int, default=3, help="big-group: rounds of the four contenders"
    )
    parser.add_argument("--symbols", type=int, default=10)
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5, help="loaders per planning measurement")
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        help="planning: also measure the ddbloader in this directory (a checkout); groups: each "
        "of these (repeat the option), ratios to the last",
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return
    sections = []
    if args.what == "groups" and args.compare:
        title = "Groups, DuckDB: this checkout against " + ", ".join(f"`{c}`" for c in args.compare)
        sections.append((title, run_groups_compare(args.groups_rounds, args.compare)))
    elif args.what in ("groups", "all"):
        sections.append(
            (
                "Groups: the same 400,000 rows, few big groups vs many small",
                run_groups(args.skip_before, args.groups_rounds),
            )
        )
    if args.what in ("big-group", "all"):
        sections.append(("One big group", run_big_group(args.big_group_rounds)))
    if args.what in ("memory", "all"):
        variants: list[tuple[str, dict[str, Any], str | None]] = [
            ("defaults (fetch_bytes 8 MiB, DuckDB memory_limit 256MB)", {}, "default"),
            ("fetch_bytes 8 MiB, no DuckDB cap", {}, None),
            ("fetch_bytes 64 MiB, memory_limit 256MB", {"fetch_bytes": 64 * 2**20}, "default"),
            ("fetch_bytes 0 (a query per partition), no cap: as before", {"fetch_bytes": 0}, None),
        ]
        sections.append(("Peak RSS as the table grows 4x", run_memory(args.symbols, args.days, variants)))
    if args.what in ("planning", "all"):
        groups, rows = PLANNING_SHAPE
        title = f"Planning + first batch at {groups:,} groups x {rows} rows"
        sections.append((title, run_planning(args.rounds, args.compare[0] if args.compare else None)))
    header = (
        f"{SECTION}\n\n`python benchmarks/scale.py {args.what}` on {platform.node()} "
        f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} before the last section), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
    )
    text = header + "\n".join(f"\n### {title}\n\n{table}\n" for title, table in sections)
    print(text)


if __name__ == "__main__":
    main()
