"""Throughput and memory benchmark: ddbloader against the pipelines it replaces, on the same data.

Usage::

    python benchmarks/throughput.py                 # throughput table (default shape, < 2 min)
    python benchmarks/throughput.py --memory-check  # peak RSS of ddbloader at --scale K and 4K
    python benchmarks/throughput.py --all           # both, one RESULTS.md

The data is S symbols x D days x R rows/day x F float64 factors plus a float64 ``target`` in an
embedded DuckDB file under ``benchmarks/_work/`` (created once per shape, then reused). Every
contender serves the same samples: per symbol, x = rows ``[s, s+W)`` of ``f0..f{F-1}`` and
y = row ``s+W`` of ``target`` (window W -> 1), for every ``s`` with ``s+W < rows of the symbol``,
windows running across day boundaries; batch 64, shuffled. ``--scale K`` multiplies the days, so
partitions keep their size and only their number grows.

Contenders, each in its own subprocess so that its peak RSS and CPU time are its own:

* ``ddbloader``: ``DDBDataLoader`` with default settings, grouped by symbol, repartitioned by day.
* ``export`` + ``traditional``: export per symbol-day to ``.npy``, a window index, a map-style
  Dataset over ``np.memmap`` (a window gathers from every day file it spans), torch
  ``DataLoader(num_workers=2, shuffle=True, batch_size=64)``.
* ``floor`` / ``floor-serial``: the loader's own subqueries (``plan.groups[*].partitions[*]``)
  run to Arrow and dropped, with ``fetch_threads`` cursors in parallel / with one cursor.
* ``inmemory``: the whole table as one tensor, windows gathered by ``index_select`` over a strided
  window view, 64 at a time in shuffled order: the upper bound.
* ``inmemory-take``: the same, gathered in one thread by ``numpy.take`` of rows, as ddbloader's
  assembler does: the copy alone, without engine, conversion or hand-over.
* ``baseline``: imports only, the RSS every contender starts from.

The consumer does nothing with a batch but count its rows (``n += x.shape[0]``), so the
timings are the pipelines' own. Each contender repeats its measured phase ``--repeat`` times in
one process; the table shows the median repeat, the first-batch times are the first (cold) one.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import functools
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
RESULTS_MD = HERE / "RESULTS.md"
RESULTS_JSON = HERE / "results.json"
MARKER = "RESULT-JSON:"
BATCH = 64
SEED = 0
CHILD_TIMEOUT_S = 900
WORKER_HWM_MB: list[float] = []

# Issue 3's targets.
TARGET_ITERATION = 8.0
TARGET_END_TO_END = 9.0
TARGET_FLOOR = 1.5
TARGET_RSS_GROWTH = 10.0
TARGET_FIRST_BATCH_S = 1.0


@dataclass(frozen=True)
class Shape:
    """The benchmark's data and sample shape."""

    symbols: int
    days: int
    rows: int
    factors: int
    window: int

    @property
    def total_rows(self) -> int:
        return self.symbols * self.days * self.rows

    @property
    def windows(self) -> int:
        """Samples of one epoch: every symbol contributes ``rows - W`` windows W -> 1."""
        return self.symbols * max(self.days * self.rows - self.window, 0)

    @property
    def unique_bytes(self) -> int:
        """Bytes of input the pipelines read once: every row's factors and target as float64."""
        return self.total_rows * (self.factors + 1) * 8

    @property
    def tag(self) -> str:
        return f"S{self.symbols}_D{self.days}_R{self.rows}_F{self.factors}"

    @property
    def db_path(self) -> Path:
        return WORK / f"bench_{self.tag}.duckdb"

    @property
    def export_dir(self) -> Path:
        return WORK / f"export_{self.tag}"

    @property
    def factor_names(self) -> list[str]:
        return [f"f{i}" for i in range(self.factors)]

    @property
    def loader_sql(self) -> str:
        return f"SELECT symbol, ts, {', '.join(self.factor_names)}, target FROM bench ORDER BY ts"

    def scaled(self, k: int) -> Shape:
        return Shape(self.symbols, self.days * k, self.rows, self.factors, self.window)


# ----------------------------------------------------------------------------------------- data


def ensure_data(shape: Shape) -> float:
    """Create the DuckDB file for ``shape`` unless it exists; returns seconds spent creating it."""
    import duckdb

    if shape.db_path.exists():
        return 0.0
    WORK.mkdir(parents=True, exist_ok=True)
    partial = shape.db_path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    factors = ", ".join(f"random() AS f{i}" for i in range(shape.factors))
    with duckdb.connect(str(partial)) as con:
        con.execute("SELECT setseed(0.25)")
        con.execute(
            f"""
            CREATE TABLE bench AS
            SELECT 'S' || lpad(s::VARCHAR, 4, '0') AS symbol,
                   TIMESTAMP '2024-01-01' + to_days(d::INTEGER) + to_microseconds(r * 1000000) AS ts,
                   {factors}, random() AS target
            FROM range({shape.symbols}) a(s), range({shape.days}) b(d), range({shape.rows}) c(r)
            ORDER BY symbol, ts
            """
        )
    partial.rename(shape.db_path)
    return time.perf_counter() - started


# ----------------------------------------------------------------------------- measuring helpers


def _cpu_seconds() -> float:
    """User + system CPU of this process and of the children it has reaped (DataLoader workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class Run:
    """One repeat of a contender's measured phase."""

    setup_s: float
    wall_s: float
    first_batch_s: float | None
    cpu_s: float
    windows: int
    loader_stats: dict[str, Any] | None = None


def _timed(body: Callable[[], Iterator[int]]) -> tuple[float, float | None, float, int]:
    """Run ``body``'s batches; returns (wall, first batch, cpu, windows). The consumer only counts."""
    cpu0 = _cpu_seconds()
    started = time.perf_counter()
    first: float | None = None
    windows = 0
    for rows in body():
        if first is None:
            first = time.perf_counter() - started
        windows += rows
    wall = time.perf_counter() - started
    return wall, first, _cpu_seconds() - cpu0, windows


def _peak_rss_mb(who: int) -> float:
    """``ru_maxrss`` in MB. Caveat: Linux carries it over fork and exec, so a child's value is at
    least its parent's peak at spawn time; :func:`_hwm_mb` is the one to trust for a child."""
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(who).ru_maxrss / 1024


def _hwm_mb(pid: int | str = "self") -> float | None:
    """Peak RSS of one process's own address space (VmHWM, reset by exec), in MB."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------- contenders


def _make_loader(shape: Shape, **options: Any) -> Any:
    """The loader every ddbloader measurement uses; ``options`` add arguments (``verify=True``)."""
    from ddbloader import DDBDataLoader

    return DDBDataLoader(
        str(shape.db_path),
        shape.loader_sql,
        "target",
        batch_size=BATCH,
        shuffle=True,
        window_size=shape.window,
        group_col="symbol",
        repartition_col="CAST(ts AS DATE)",
        exclude_col=["symbol", "ts", "target"],
        seed=SEED,
        **options,
    )


def run_ddbloader(shape: Shape, repeat: int) -> list[Run]:
    import ddbloader  # noqa: F401  (import time is not the plan's)

    runs = []
    cpu0 = _cpu_seconds()
    started = time.perf_counter()
    loader = _make_loader(shape)
    plan_s = time.perf_counter() - started
    plan_cpu = _cpu_seconds() - cpu0
    with loader:

        def epoch() -> Iterator[int]:
            for x, y in loader:
                assert x.shape[1:] == (shape.window, shape.factors) and y.shape[1:] == (1, 1)
                yield x.shape[0]

        for i in range(repeat):
            wall, first, cpu, windows = _timed(epoch)
            # The plan/count phase is paid once per loader: it belongs to the first epoch only.
            run = Run(plan_s if i == 0 else 0.0, wall, first, cpu + (plan_cpu if i == 0 else 0), windows)
            run.loader_stats = _loader_stats(loader)
            runs.append(run)
    return runs


def _loader_stats(loader: Any) -> dict[str, Any] | None:
    """The loader's own account of the epoch (``loader.stats()``), where this version has one."""
    import dataclasses

    try:
        stats = loader.stats()
    except (AttributeError, RuntimeError):
        return None
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    return {"text": str(stats)}


def _export_cells(con: Any) -> list[tuple[str, dt.date]]:
    return [
        (s, d)
        for s, d in con.sql(
            "SELECT DISTINCT symbol, CAST(ts AS DATE) AS d FROM bench ORDER BY symbol, d"
        ).fetchall()
    ]


def run_export(shape: Shape, repeat: int) -> list[Run]:
    """The traditional pipeline's first stage: one ``.npy`` per symbol-day, plus a manifest."""
    import duckdb
    import numpy as np

    columns = [*shape.factor_names, "target"]
    sql = f"SELECT {', '.join(columns)} FROM bench WHERE symbol = $1 AND CAST(ts AS DATE) = $2 ORDER BY ts"
    runs = []
    for _ in range(repeat):
        cpu0 = _cpu_seconds()
        started = time.perf_counter()
        shape.export_dir.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, list[list[Any]]] = {}
        with duckdb.connect(str(shape.db_path), read_only=True) as con:
            for symbol, day in _export_cells(con):
                arrays = con.execute(sql, [symbol, day]).fetchnumpy()
                # One row-major [rows, F+1] array per file: x columns then the target.
                block = np.stack([np.asarray(arrays[c], dtype=np.float64) for c in columns], axis=1)
                name = f"{symbol}_{day.isoformat()}.npy"
                np.save(shape.export_dir / name, block)
                manifest.setdefault(symbol, []).append([name, int(block.shape[0])])
        (shape.export_dir / "manifest.json").write_text(json.dumps(manifest))
        wall = time.perf_counter() - started
        rows = sum(r for files in manifest.values() for _, r in files)
        # The export serves no windows; it must hold every row for the iteration to serve them.
        runs.append(
            Run(0.0, wall, None, _cpu_seconds() - cpu0, shape.windows if rows == shape.total_rows else -1)
        )
    return runs


class MemmapWindows:
    """Map-style dataset over per-day memmaps; a window gathers rows from each day file it spans.

    Sample ``i`` is (symbol ``sym[i]``, start row ``start[i]`` within the symbol's concatenated
    days). Files are memory-mapped lazily in whichever process (DataLoader worker) reads them.
    """

    def __init__(
        self, directory: Path, manifest: dict[str, list[list[Any]]], window: int, factors: int
    ) -> None:
        import numpy as np

        self.directory = directory
        self.window = window
        self.factors = factors
        self.files = [[name for name, _ in files] for files in manifest.values()]
        self.bounds = [
            np.concatenate([[0], np.cumsum([r for _, r in files])]).tolist() for files in manifest.values()
        ]
        counts = [max(b[-1] - window, 0) for b in self.bounds]
        self.sym = np.repeat(np.arange(len(counts)), counts)
        self.start = np.concatenate([np.arange(c) for c in counts])
        self._maps: dict[tuple[int, int], Any] = {}

    def __len__(self) -> int:
        return len(self.start)

    def _map(self, sym: int, k: int) -> Any:
        import numpy as np

        key = (sym, k)
        if key not in self._maps:
            self._maps[key] = np.load(self.directory / self.files[sym][k], mmap_mode="r")
        return self._maps[key]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import numpy as np
        import torch

        sym, row = int(self.sym[i]), int(self.start[i])
        bounds = self.bounds[sym]
        stop = row + self.window + 1
        k = bisect.bisect_right(bounds, row) - 1
        pieces = []
        while row < stop:
            end = min(stop, bounds[k + 1])
            pieces.append(self._map(sym, k)[row - bounds[k] : end - bounds[k]])
            row = end
            k += 1
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        x = torch.from_numpy(np.array(rows[: self.window, : self.factors]))
        y = torch.from_numpy(np.array(rows[self.window :, self.factors :]))
        return x, y


def run_traditional(shape: Shape, repeat: int) -> list[Run]:
    import torch
    from torch.utils.data import DataLoader

    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        manifest = json.loads((shape.export_dir / "manifest.json").read_text())
        dataset = MemmapWindows(shape.export_dir, manifest, shape.window, shape.factors)
        index_s = time.perf_counter() - started
        # A map-style dataset needs only __len__ and __getitem__; torch's stubs want its base class.
        loader: DataLoader[Any] = DataLoader(
            cast(Any, dataset),
            batch_size=BATCH,
            shuffle=True,
            num_workers=2,
            generator=torch.Generator().manual_seed(SEED),
        )

        def epoch(loader: DataLoader[Any] = loader) -> Iterator[int]:
            batches = iter(loader)
            for i, (x, y) in enumerate(batches):
                assert x.shape[1:] == (shape.window, shape.factors) and y.shape[1:] == (1, 1)
                if i == len(loader) - 1:
                    # The workers' peaks, read while they still run (they exit with the epoch).
                    WORKER_HWM_MB.extend(
                        h for w in getattr(batches, "_workers", []) if (h := _hwm_mb(w.pid)) is not None
                    )
                yield x.shape[0]

        # The workers exit (and are reaped, so their CPU is counted) when the epoch ends.
        wall, first, cpu, windows = _timed(epoch)
        runs.append(Run(index_s, wall, first, cpu, windows))
    return runs


def _floor(shape: Shape, repeat: int, threads: int | None) -> list[Run]:
    import duckdb

    loader = _make_loader(shape)
    specs = [(p.sql, p.params) for g in loader.plan.groups for p in g.partitions]
    threads = threads or loader.config.fetch_threads
    loader.close()
    runs = []
    with duckdb.connect(str(shape.db_path), read_only=True) as con:
        for _ in range(repeat):
            # A fresh cursor per thread, as the loader's fetch threads have.
            cursors = [con.cursor() for _ in range(threads)]

            def fetch_all(cursors: list[Any] = cursors) -> Iterator[int]:
                todo = iter(specs)
                lock = threading.Lock()
                done: list[int] = []

                def work(cursor: Any) -> None:
                    while True:
                        with lock:
                            spec = next(todo, None)
                        if spec is None:
                            return
                        rows = cursor.sql(spec[0], params=list(spec[1])).to_arrow_table().num_rows
                        with lock:
                            done.append(rows)

                if len(cursors) == 1:
                    work(cursors[0])
                else:
                    pool = [threading.Thread(target=work, args=(c,)) for c in cursors]
                    for t in pool:
                        t.start()
                    for t in pool:
                        t.join()
                # Rows, not windows, come out of the engine; report its windows for comparability.
                yield shape.windows if sum(done) == shape.total_rows else -1

            wall, _, cpu, windows = _timed(fetch_all)
            for c in cursors:
                c.close()
            runs.append(Run(0.0, wall, None, cpu, windows))
    return runs


def run_floor(shape: Shape, repeat: int) -> list[Run]:
    return _floor(shape, repeat, None)


def run_floor_serial(shape: Shape, repeat: int) -> list[Run]:
    return _floor(shape, repeat, 1)


def run_inmemory(shape: Shape, repeat: int, *, one_thread: bool = False) -> list[Run]:
    import duckdb
    import numpy as np
    import torch

    started = time.perf_counter()
    with duckdb.connect(str(shape.db_path), read_only=True) as con:
        columns = ", ".join([*shape.factor_names, "target"])
        table = con.sql(f"SELECT {columns} FROM bench ORDER BY symbol, ts").to_arrow_table()
        per_symbol = con.sql("SELECT count(*) FROM bench GROUP BY symbol ORDER BY symbol").fetchnumpy()
    x = torch.from_numpy(np.stack([table.column(c).to_numpy() for c in shape.factor_names], axis=1))
    y = torch.from_numpy(table.column("target").to_numpy().reshape(-1, 1).copy())
    del table
    n, w, f = x.shape[0], shape.window, shape.factors
    x_windows = x.as_strided((n - w + 1, w, f), (f, f, 1))
    y_windows = y.as_strided((n, 1, 1), (1, 1, 1))
    counts = next(iter(per_symbol.values())).astype(np.int64)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    starts = torch.from_numpy(
        np.concatenate([f0 + np.arange(c - w) for f0, c in zip(firsts, counts, strict=True)])
    )
    x_rows, y_rows, steps = x.numpy(), y.numpy(), np.arange(w)
    load_s = time.perf_counter() - started
    runs = []
    for i in range(repeat):
        order = starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(SEED + i))]

        def epoch(order: torch.Tensor = order) -> Iterator[int]:
            for b in range(0, len(order), BATCH):
                index = order[b : b + BATCH]
                if one_thread:
                    rows = (index.numpy()[:, None] + steps).reshape(-1)
                    bx = torch.from_numpy(x_rows.take(rows, 0, mode="clip").reshape(-1, w, f))
                    by = torch.from_numpy(y_rows.take(index.numpy() + w, 0, mode="clip").reshape(-1, 1, 1))
                else:
                    bx = x_windows.index_select(0, index)
                    by = y_windows.index_select(0, index + w)
                assert bx.shape[1:] == (w, f) and by.shape[1:] == (1, 1)
                yield bx.shape[0]

        wall, first, cpu, windows = _timed(epoch)
        runs.append(Run(load_s if i == 0 else 0.0, wall, first, cpu, windows))
    return runs


def run_baseline(shape: Shape, repeat: int) -> list[Run]:
    import duckdb  # noqa: F401
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401
    import torch  # noqa: F401

    import ddbloader  # noqa: F401

    return [Run(0.0, 0.0, None, 0.0, 0)]


CONTENDERS: dict[str, Callable[[Shape, int], list[Run]]] = {
    "baseline": run_baseline,
    "ddbloader": run_ddbloader,
    "export": run_export,
    "traditional": run_traditional,
    "floor": run_floor,
    "floor-serial": run_floor_serial,
    "inmemory": run_inmemory,
    "inmemory-take": functools.partial(run_inmemory, one_thread=True),
}


def child_main(name: str, shape: Shape, repeat: int, ddbloader_from: str | None) -> None:
    """Run one contender in this process and print its result as one JSON line."""
    sys.path.insert(0, ddbloader_from or str(HERE.parent))
    runs = CONTENDERS[name](shape, repeat)
    result = {
        "runs": [asdict(r) for r in runs],
        "peak_rss_mb": _hwm_mb(),
        "ru_maxrss_mb": _peak_rss_mb(resource.RUSAGE_SELF),
        "children_peak_rss_mb": max(WORKER_HWM_MB, default=None),
        "children_ru_maxrss_mb": _peak_rss_mb(resource.RUSAGE_CHILDREN),
    }
    print(MARKER + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------- parent


def child_result(
    command: list[str],
    what: str,
    marker: str,
    env: dict[str, str] | None = None,
    timeout: float = CHILD_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``command`` (a benchmark's child) in a fresh interpreter; the JSON it printed after
    ``marker`` on its last such line. Raises naming ``what`` with the child's stderr if it failed."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(marker)]
    if done.returncode or not lines:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(marker) :])
    return result


def spawn(name: str, shape: Shape, repeat: int, ddbloader_from: str | None) -> dict[str, Any]:
    """Run contender ``name`` in a fresh interpreter; returns its summarised result."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--contender",
        name,
        "--repeat",
        str(repeat),
        *_shape_args(shape),
        *(["--ddbloader-from", ddbloader_from] if ddbloader_from else []),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"contender {name} failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")
    raw = json.loads(lines[-1][len(MARKER) :])
    runs = [Run(**r) for r in raw["runs"]]
    median = sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]
    best = min(runs, key=lambda r: r.wall_s)
    if name != "baseline" and any(r.windows != shape.windows for r in runs):
        raise RuntimeError(
            f"contender {name} served {[r.windows for r in runs]} windows, not {shape.windows}"
        )
    summary = {
        "setup_s": runs[0].setup_s,
        "wall_s": median.wall_s,
        "walls_s": [r.wall_s for r in runs],
        "best_wall_s": best.wall_s,
        "best_windows_per_s": best.windows / best.wall_s if best.wall_s else None,
        "first_batch_s": runs[0].first_batch_s,
        "cpu_s": median.cpu_s,
        "windows": median.windows,
        "windows_per_s": median.windows / median.wall_s if median.wall_s else None,
        "unique_mb_per_s": shape.unique_bytes / 1e6 / median.wall_s if median.wall_s else None,
        "cpu_s_per_1000_windows": 1000 * median.cpu_s / median.windows if median.windows else None,
        "peak_rss_mb": raw["peak_rss_mb"],
        "children_peak_rss_mb": raw["children_peak_rss_mb"],
        "ru_maxrss_mb": raw["ru_maxrss_mb"],
        "process_s": time.perf_counter() - started,
        "loader_stats": [r.loader_stats for r in runs if r.loader_stats is not None],
    }
    print(
        f"  {name:<13} wall {summary['wall_s']:7.3f} s  setup {summary['setup_s']:6.3f} s  "
        f"rss {summary['peak_rss_mb']:7.1f} MB",
        flush=True,
    )
    return summary


def _shape_args(shape: Shape) -> list[str]:
    return [
        "--symbols",
        str(shape.symbols),
        "--days",
        str(shape.days),
        "--rows",
        str(shape.rows),
        "--factors",
        str(shape.factors),
        "--window",
        str(shape.window),
    ]


def throughput(shape: Shape, repeat: int, ddbloader_from: str | None) -> dict[str, Any]:
    print(f"data {shape.tag} W={shape.window}: {shape.total_rows} rows, {shape.windows} windows", flush=True)
    created = ensure_data(shape)
    load_before = os.getloadavg()[0]
    results = {name: spawn(name, shape, repeat, ddbloader_from) for name in CONTENDERS}
    ddb, trad, export = results["ddbloader"], results["traditional"], results["export"]
    floor = min(results["floor"]["wall_s"], results["floor-serial"]["wall_s"])
    ddb_total = ddb["setup_s"] + ddb["wall_s"]
    trad_total = export["wall_s"] + trad["setup_s"] + trad["wall_s"]
    ratios = {
        "iteration_vs_traditional": ddb["windows_per_s"] / trad["windows_per_s"],
        "end_to_end_vs_traditional": trad_total / ddb_total,
        "loader_wall_vs_engine_floor": ddb["wall_s"] / floor,
        "loader_wall_vs_parallel_floor": ddb["wall_s"] / results["floor"]["wall_s"],
        "loader_wall_vs_serial_floor": ddb["wall_s"] / results["floor-serial"]["wall_s"],
        "inmemory_vs_loader_iteration": results["inmemory"]["windows_per_s"] / ddb["windows_per_s"],
        "inmemory_one_thread_vs_loader_iteration": results["inmemory-take"]["windows_per_s"]
        / ddb["windows_per_s"],
        "ddbloader_first_batch_s": ddb["first_batch_s"],
        "ddbloader_first_batch_from_constructor_s": ddb["setup_s"] + ddb["first_batch_s"],
        "ddbloader_total_s": ddb_total,
        "traditional_total_s": trad_total,
    }
    # The same ratios from each contender's fastest repeat: the least disturbed by other load.
    best_floor = min(results["floor"]["best_wall_s"], results["floor-serial"]["best_wall_s"])
    best = {
        "iteration_vs_traditional": ddb["best_windows_per_s"] / trad["best_windows_per_s"],
        "end_to_end_vs_traditional": (export["best_wall_s"] + trad["setup_s"] + trad["best_wall_s"])
        / (ddb["setup_s"] + ddb["best_wall_s"]),
        "loader_wall_vs_engine_floor": ddb["best_wall_s"] / best_floor,
    }
    return {
        "shape": asdict(shape),
        "scale_days_multiplier": None,
        "windows": shape.windows,
        "unique_mb": shape.unique_bytes / 1e6,
        "data_created_s": created,
        "repeat": repeat,
        "contenders": results,
        "ratios": ratios,
        "ratios_best": best,
        "load_avg_1min_before": load_before,
        "harness_parent_peak_rss_mb": _hwm_mb(),
        "machine": machine(ddbloader_from),
    }


def memory_check(shape: Shape, repeat: int, ddbloader_from: str | None) -> dict[str, Any]:
    """Peak RSS of ddbloader (and, for attribution, of the engine floor) at 1x and 4x the data."""
    rows: dict[str, Any] = {}
    for k in (1, 4):
        scaled = shape.scaled(k)
        print(f"memory check x{k}: data {scaled.tag}, {scaled.total_rows} rows", flush=True)
        ensure_data(scaled)
        rows[f"x{k}"] = {
            "shape": asdict(scaled),
            "unique_mb": scaled.unique_bytes / 1e6,
            **{
                name: spawn(name, scaled, repeat, ddbloader_from)
                for name in ("baseline", "ddbloader", "floor")
            },
        }
    one, four = rows["x1"], rows["x4"]
    base = one["baseline"]["peak_rss_mb"]

    def growth(name: str) -> dict[str, float]:
        a, b = one[name]["peak_rss_mb"], four[name]["peak_rss_mb"]
        return {
            "rss_x1_mb": a,
            "rss_x4_mb": b,
            "growth_pct": 100 * (b - a) / a,
            "growth_above_baseline_pct": 100 * (b - a) / max(a - base, 1e-9),
        }

    return {
        "base_shape": asdict(shape),
        "runs": rows,
        "ddbloader": growth("ddbloader"),
        "floor": growth("floor"),
        "ddbloader_above_floor_mb": {
            k: v["ddbloader"]["peak_rss_mb"] - v["floor"]["peak_rss_mb"] for k, v in rows.items()
        },
        "ddbloader_first_batch_s": {
            k: v["ddbloader"]["setup_s"] + v["ddbloader"]["first_batch_s"] for k, v in rows.items()
        },
        "machine": machine(ddbloader_from),
    }


def _ddbloader_version(ddbloader_from: str | None) -> str:
    """Which ddbloader ran: a directory given by --ddbloader-from, or this checkout's commit."""
    if ddbloader_from:
        return f"from {ddbloader_from}"

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(HERE.parent), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "ddbloader")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"checkout {head}{' + uncommitted changes' if dirty else ''}"


def machine(ddbloader_from: str | None) -> dict[str, Any]:
    import duckdb
    import numpy
    import pyarrow
    import torch

    return {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "duckdb": duckdb.__version__,
        "pyarrow": pyarrow.__version__,
        "numpy": numpy.__version__,
        "torch_threads": torch.get_num_threads(),
        "ddbloader": _ddbloader_version(ddbloader_from),
    }


# ------------------------------------------------------------------------------------ reports


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


_LABELS = {
    "ddbloader": "ddbloader (defaults)",
    "export": "traditional: export to .npy",
    "traditional": "traditional: memmap Dataset + DataLoader(num_workers=2)",
    "floor": "engine floor (fetch_threads cursors in parallel)",
    "floor-serial": "engine floor (one cursor)",
    "inmemory": "in-memory upper bound",
    "inmemory-take": "in-memory, one thread (numpy take of rows, as ddbloader gathers)",
}


def _check(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(data: dict[str, Any]) -> str:
    out = ["# Throughput benchmark", ""]
    out.append(
        "Produced by `python benchmarks/throughput.py --all` (see the module docstring for the "
        "contenders and options). Machine: 2 cores, shared with other jobs and noisy; a repeat can "
        "run several times slower than its neighbour when other processes compete for the cores, "
        "so read ratios, not digits, and compare the median with the best repeat."
    )
    out.append("")
    tp = data.get("throughput")
    if tp:
        s = tp["shape"]
        if tp.get("load_avg_1min_before", 0) > 1.0:
            out += [
                f"**Warning:** the 1-minute load average was {tp['load_avg_1min_before']:.1f} on "
                f"{tp['machine']['cpus']} CPUs when this run started: other jobs were competing.",
                "",
            ]
        out += [
            f"## Throughput ({s['symbols']} symbols × {s['days']} days × {s['rows']} rows/day × "
            f"{s['factors']} float64 factors, window {s['window']}→1, batch {BATCH}, shuffled)",
            "",
            f"{tp['windows']:,} windows per epoch; {tp['unique_mb']:.1f} MB unique input (factors + "
            f"target, float64). Consumer: counts rows of each batch, nothing else. Median of "
            f"{tp['repeat']} repeat(s); first batch is the first (cold) repeat's. CPU s includes "
            "every thread of the process and, for the traditional pipeline, its reaped workers.",
            "",
            "| contender | setup s | wall s (median) | wall s (best) | windows/s | unique MB/s | "
            "first batch s | peak RSS MB | CPU s / 1000 windows |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base = tp["contenders"]["baseline"]["peak_rss_mb"]
        for name, label in _LABELS.items():
            c = tp["contenders"][name]
            rss = _fmt(c["peak_rss_mb"], 0)
            if name == "traditional":
                rss += f" (+ workers {_fmt(c['children_peak_rss_mb'], 0)} each)"
            rate = "—" if name == "export" else _fmt(c["windows_per_s"], 0)
            out.append(
                f"| {label} | {_fmt(c['setup_s'])} | {_fmt(c['wall_s'])} | {_fmt(c['best_wall_s'])} | "
                f"{rate} | "
                f"{_fmt(c['unique_mb_per_s'], 0)} | {_fmt(c['first_batch_s'], 3)} | {rss} | "
                f"{_fmt(c['cpu_s_per_1000_windows'], 3)} |"
            )
        out += [
            "",
            f"Setup: ddbloader = constructor (plan + counts); traditional = reading the manifest and "
            f"building the window index; in-memory = loading the table. Baseline RSS (imports only): "
            f"{base:.0f} MB; the harness parent's own peak: {_fmt(tp['harness_parent_peak_rss_mb'], 0)} MB. "
            "Peak RSS is the process's VmHWM (ru_maxrss is inherited across fork/exec on Linux, so "
            "a child's ru_maxrss is at least its parent's). Export's unique MB/s is its write rate of "
            "the same bytes. windows/s and MB/s are from the median repeat.",
            "",
        ]
        r, b = tp["ratios"], tp["ratios_best"]
        out += [
            "| ratio | median repeats | best repeats | target | (median) |",
            "|---|---:|---:|---:|---|",
            f"| iteration windows/s, ddbloader ÷ traditional | {r['iteration_vs_traditional']:.2f}× | "
            f"{b['iteration_vs_traditional']:.2f}× | ≥ {TARGET_ITERATION:g}× | "
            f"{_check(r['iteration_vs_traditional'] >= TARGET_ITERATION)} |",
            f"| end to end, traditional (export + index + iteration) ÷ ddbloader (plan + iteration) | "
            f"{r['end_to_end_vs_traditional']:.2f}× | {b['end_to_end_vs_traditional']:.2f}× | "
            f"≥ {TARGET_END_TO_END:g}× | {_check(r['end_to_end_vs_traditional'] >= TARGET_END_TO_END)} |",
            f"| ddbloader iteration wall ÷ engine floor (the faster floor) | "
            f"{r['loader_wall_vs_engine_floor']:.2f}× | {b['loader_wall_vs_engine_floor']:.2f}× | "
            f"≤ {TARGET_FLOOR:g}× | {_check(r['loader_wall_vs_engine_floor'] <= TARGET_FLOOR)} |",
            f"| ddbloader first batch (constructor → first batch) | "
            f"{r['ddbloader_first_batch_from_constructor_s']:.3f} s | | < {TARGET_FIRST_BATCH_S:g} s | "
            f"{_check(r['ddbloader_first_batch_from_constructor_s'] < TARGET_FIRST_BATCH_S)} |",
            f"| in-memory upper bound ÷ ddbloader, windows/s (headroom) | "
            f"{r['inmemory_vs_loader_iteration']:.2f}× | | | |",
            f"| in-memory one-thread gather ÷ ddbloader, windows/s | "
            f"{r['inmemory_one_thread_vs_loader_iteration']:.2f}× | | | |",
            "",
        ]
    mc = data.get("memory_check")
    if mc:
        d, f = mc["ddbloader"], mc["floor"]
        s = mc["base_shape"]
        first = mc["ddbloader_first_batch_s"]
        out += [
            "## Memory (`--memory-check`: ddbloader at 1× and 4× the days)",
            "",
            f"Base shape {s['symbols']} symbols × {s['days']} days × {s['rows']} rows × {s['factors']} "
            "factors; 4× has 4× the days (same partition size, 4× the partitions). Peak RSS is the "
            "VmHWM of the contender's own process; growth above baseline discounts the imports "
            f"({mc['runs']['x1']['baseline']['peak_rss_mb']:.0f} MB).",
            "",
            "| process | peak RSS 1× MB | peak RSS 4× MB | growth | growth above baseline | target |",
            "|---|---:|---:|---:|---:|---|",
            f"| ddbloader | {d['rss_x1_mb']:.0f} | {d['rss_x4_mb']:.0f} | {d['growth_pct']:.1f} % | "
            f"{d['growth_above_baseline_pct']:.1f} % | < {TARGET_RSS_GROWTH:g} %: "
            f"{_check(d['growth_pct'] < TARGET_RSS_GROWTH)} |",
            f"| engine floor (parallel) | {f['rss_x1_mb']:.0f} | {f['rss_x4_mb']:.0f} | "
            f"{f['growth_pct']:.1f} % | {f['growth_above_baseline_pct']:.1f} % | (attribution) |",
            "",
            "ddbloader above the engine floor (its own buffers, not DuckDB's): "
            + ", ".join(f"{k}: {v:.0f} MB" for k, v in mc.get("ddbloader_above_floor_mb", {}).items())
            + ".",
            "",
            "ddbloader first batch (constructor → first batch): "
            + ", ".join(f"{k}: {v:.3f} s" for k, v in first.items())
            + f" (target < {TARGET_FIRST_BATCH_S:g} s at every scale).",
            "",
        ]
    if "epochs" in data:
        from epochs import render as render_epochs  # benchmarks/epochs.py, which imports this module

        out.append(render_epochs(data["epochs"]))
    if "gather" in data:
        from gather import render as render_gather  # benchmarks/gather.py, which imports this module

        out.append(render_gather(data["gather"]))
    if "fingerprint" in data:
        from fingerprint_cost import render as render_fingerprint  # imports this module too

        out.append(render_fingerprint(data["fingerprint"]))
    for key in ("throughput", "memory_check", "gather", "fingerprint"):
        if key in data:
            m = data[key]["machine"]
            out.append(
                f"_{key}: {m['when']}, {m['cpus']} CPUs (load {m['load_avg'][0]:.2f}), "
                f"Python {m['python']}, torch {m['torch']}, DuckDB {m['duckdb']}, "
                f"pyarrow {m['pyarrow']}, numpy {m['numpy']}; ddbloader {m['ddbloader']}._"
            )
            out.append("")
    return "\n".join(out)


#: RESULTS.md from this line on is written by hand (analyses, other scripts' runs): kept by :func:`save`
HAND_WRITTEN = "<!-- Below: sections written by hand; benchmarks/throughput.py's save() keeps them. -->"


def save(key: str, value: dict[str, Any]) -> None:
    """Merge ``value`` into results.json under ``key`` and re-render RESULTS.md from the whole file,
    keeping what follows :data:`HAND_WRITTEN` as it is."""
    data: dict[str, Any] = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    data[key] = value
    RESULTS_JSON.write_text(json.dumps(data, indent=2, default=str) + "\n")
    old = RESULTS_MD.read_text() if RESULTS_MD.exists() else ""
    kept = old[old.index(HAND_WRITTEN) :] if HAND_WRITTEN in old else ""
    RESULTS_MD.write_text(render(data) + ("\n" + kept if kept else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=int, default=1, help="multiply the days by K")
    parser.add_argument("--symbols", type=int, default=10)
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2000, help="rows per symbol-day")
    parser.add_argument("--factors", type=int, default=100)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5, help="repeats of each measured phase")
    parser.add_argument("--memory-check", action="store_true", help="ddbloader peak RSS at 1x and 4x")
    parser.add_argument("--all", action="store_true", help="throughput table and memory check")
    parser.add_argument(
        "--ddbloader-from", help="directory to import ddbloader from (default: this checkout)"
    )
    parser.add_argument("--contender", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = Shape(args.symbols, args.days, args.rows, args.factors, args.window).scaled(args.scale)
    if args.contender:
        child_main(args.contender, shape, args.repeat, args.ddbloader_from)
        return
    started = time.perf_counter()
    if args.all:
        # One command, one coherent report: nothing from earlier runs is kept.
        RESULTS_JSON.unlink(missing_ok=True)
    if not args.memory_check or args.all:
        result = throughput(shape, args.repeat, args.ddbloader_from)
        result["scale_days_multiplier"] = args.scale
        save("throughput", result)
        print(json.dumps(result["ratios"], indent=2))
    if args.memory_check or args.all:
        # The memory check needs only the peak, not medians: one repeat keeps 4x affordable.
        result = memory_check(shape, 1, args.ddbloader_from)
        save("memory_check", result)
        print(json.dumps({"ddbloader": result["ddbloader"], "floor": result["floor"]}, indent=2))
    print(
        f"wrote {RESULTS_MD.relative_to(HERE.parent)} and {RESULTS_JSON.relative_to(HERE.parent)} "
        f"in {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
