"""Issue 16: first epoch against warm ones, float32, mixing against speed, partitions cached in memory.

Results go to RESULTS.md (a section of its own, beside throughput.py's) and results.json.

Usage::

    python benchmarks/epochs.py                  # every section, 3 interleaved rounds -> RESULTS.md
    python benchmarks/epochs.py --section mixing --rounds 2
    python benchmarks/epochs.py --ddbloader-from DIR   # another version of ddbloader (e.g. git archive)

Every contender runs in its own interpreter, and the contenders of a section run one after the
other in each round (interleaved), so that the machine's load hits them alike: read the ratios,
which are per round, and their median over rounds.

Sections:

* ``default``: throughput.py's shape (10 symbols x 5 days x 2000 rows x 100 float64 factors,
  window 50 -> 1, batch 64, shuffled). ddbloader with defaults and with ``dtype=torch.float32``:
  the first epoch from the constructor to the last batch, and warm epochs; the in-memory one-thread
  contender (numpy take of rows, everything in RAM) and the export-and-memmap pipeline
  (DataLoader, 2 workers) from throughput.py, on the same file.
* ``mixing``: 200 groups x 5,000 rows (``--mixing-rows``) x 16 float32, window 32, batch 256,
  shuffled; the default ``group_pool_size`` (3) against a pool of all 200 groups.
* ``memory``: 20 groups x 100,000 rows x 32 float64 columns (2M rows, one row per sample, batch
  1024, shuffled), 10 epochs: a hand-written loop that loads the table once and gathers shuffled
  batches in memory, against ddbloader with and without ``cache_bytes``.

Mixing is reported next to every throughput figure: distinct groups per batch (median over an
epoch's batches). For the default shape it is measured on the same plan with x = the group's
number (the sample order is a function of the plan's row counts, seed and epoch alone, so it is the
timed loader's order); in the other sections y carries the group number.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import throughput  # noqa: E402  (the shared data, contenders and measuring helpers)

MARKER = "EPOCHS-JSON:"
DEFAULT = throughput.Shape(10, 5, 2000, 100, 50)
WARM_EPOCHS = 3
MEMORY_EPOCHS = 10
MEMORY_BATCH = 1024

# Issue 16's targets.
TARGET_FIRST_OVER_WARM = 1.15
TARGET_VS_INMEMORY = 0.6
TARGET_VS_TRADITIONAL = 6.0
TARGET_POOL_ALL = 1.5
TARGET_CACHED_VS_INMEMORY = 1.5
TARGET_FIRST_BATCH_S = 1.0


# --------------------------------------------------------------------------------------- data


def _table(path: Path, sql: str) -> Path:
    import duckdb

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        with duckdb.connect(str(partial)) as con:
            con.execute("SELECT setseed(0.5)")
            con.execute(sql)
        partial.rename(path)
    return path


def mixing_data(mixing_rows: int) -> Path:
    factors = ", ".join(f"random()::FLOAT AS f{i}" for i in range(16))
    return _table(
        throughput.WORK / f"mixing_G200_R{mixing_rows}_F16.duckdb",
        f"CREATE TABLE t AS SELECT g::INTEGER AS g, g::FLOAT AS gf, r AS ts, {factors}, "
        f"random()::FLOAT AS target FROM range(200) a(g), range({mixing_rows}) b(r) ORDER BY g, r",
    )


def memory_data() -> Path:
    columns = ", ".join(f"random() AS f{i}" for i in range(31))
    return _table(
        throughput.WORK / "memory_G20_R100000_F32.duckdb",
        f"CREATE TABLE t AS SELECT g::INTEGER AS g, g::DOUBLE AS gf, r AS ts, (r // 10000)::INTEGER AS day, "
        f"{columns}, random() AS target FROM range(20) a(g), range(100000) b(r) ORDER BY g, r",
    )


# ------------------------------------------------------------------------------- child helpers


def _distinct_per_batch(groups: Iterator[Any]) -> float:
    """Median number of distinct values per batch of group numbers."""
    return float(statistics.median(len(set(g.reshape(-1).tolist())) for g in groups))


def _faults() -> int:
    """Minor page faults of this process so far (fresh memory touched for the first time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _epochs(
    make: Callable[[], Any], epochs: int, groups_of: Callable[[Any, Any], Any] | None
) -> dict[str, Any]:
    """Constructor, then ``epochs`` epochs: wall, CPU, page faults and first batch of each (the
    first epoch's counted from the constructor), groups per batch, and the modules the
    constructor and first epoch imported."""
    cpu0, started, faults0, modules = time.process_time(), time.perf_counter(), _faults(), set(sys.modules)
    loader = make()
    setup = time.perf_counter() - started
    setup_cpu, setup_faults = time.process_time() - cpu0, _faults() - faults0
    walls, cpus, faults, firsts, mixing = [], [], [], [], []
    imported: list[str] = []
    with loader:
        for epoch in range(epochs):
            cpu, began, faulted = time.process_time(), time.perf_counter(), _faults()
            groups = []
            first = None
            for x, y in loader:
                if first is None:
                    first = time.perf_counter() - (began if epoch else started)
                if groups_of is not None:
                    groups.append(groups_of(x, y))
            walls.append(time.perf_counter() - began)
            cpus.append(time.process_time() - cpu)
            faults.append(_faults() - faulted)
            firsts.append(first)
            if not epoch:
                imported = sorted({m.split(".")[0] for m in set(sys.modules) - modules})
            if groups:
                mixing.append(_distinct_per_batch(iter(groups)))
    return {
        "setup_s": setup,
        "setup_cpu_s": setup_cpu,
        "setup_faults": setup_faults,
        "walls_s": walls,
        "cpus_s": cpus,
        "faults": faults,
        "first_batches_s": firsts,
        "first_epoch_s": setup + walls[0],
        "first_batch_s": firsts[0],
        "first_epoch_imports": imported,
        "groups_per_batch": mixing[0] if mixing else None,
        "cpu_total_s": time.process_time() - cpu0,
    }


def _default_loader(sql: str | None = None, **kwargs: Any) -> Any:
    """The default shape's shuffled, windowed loader; ``kwargs`` add or replace its arguments."""
    from ddbloader import DDBDataLoader

    shape = DEFAULT
    options: dict[str, Any] = {"exclude_col": ["symbol", "ts", "target"]} if "input_col" not in kwargs else {}
    return DDBDataLoader(
        str(shape.db_path),
        sql or shape.loader_sql,
        "target",
        batch_size=throughput.BATCH,
        shuffle=True,
        window_size=shape.window,
        group_col="symbol",
        repartition_col="CAST(ts AS DATE)",
        seed=throughput.SEED,
        **options,
        **kwargs,
    )


def _default_mixing() -> float:
    """Distinct groups per batch of the default loader's first epoch (x = the symbol's number)."""
    sql = "SELECT symbol, ts, CAST(substr(symbol, 2) AS DOUBLE) AS g, target FROM bench ORDER BY ts"
    with _default_loader(sql, input_col=["g"]) as loader:
        return _distinct_per_batch(x[:, 0, 0] for x, _ in loader)


def child_default(dtype: str | None) -> dict[str, Any]:
    import torch

    import ddbloader  # noqa: F401  (the import is the process's, not the first epoch's)

    kwargs = {} if dtype is None else {"dtype": getattr(torch, dtype)}
    result = _epochs(lambda: _default_loader(**kwargs), 1 + WARM_EPOCHS, None)
    result["groups_per_batch"] = _default_mixing()
    return result


def child_mixing(pool: int, rows: int) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    def make() -> Any:
        return DDBDataLoader(
            str(mixing_data(rows)),
            "SELECT * FROM t ORDER BY ts",
            ["target", "gf"],
            exclude_col=["g", "gf", "ts", "target"],
            group_col="g",
            batch_size=256,
            window_size=32,
            shuffle=True,
            seed=0,
            group_pool_size=pool,
        )

    return _epochs(make, 1 + WARM_EPOCHS, lambda x, y: y[:, 0, 1])


def child_memory(cache: bool) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    def make() -> Any:
        return DDBDataLoader(
            str(memory_data()),
            "SELECT * FROM t ORDER BY ts",
            ["target", "gf"],
            exclude_col=["g", "gf", "ts", "day", "target"],
            group_col="g",
            repartition_col="day",
            batch_size=MEMORY_BATCH,
            shuffle=True,
            seed=0,
            cache_bytes=(1 << 30) if cache else None,
        )

    return _epochs(make, MEMORY_EPOCHS, lambda x, y: y[:, 1])


def child_memory_loop() -> dict[str, Any]:
    """Load the table once, then per epoch a permutation and one take of rows per batch."""
    import duckdb
    import numpy as np
    import torch

    def make() -> Any:
        return _InMemoryLoop()

    class _InMemoryLoop:
        def __init__(self) -> None:
            with duckdb.connect(str(memory_data()), read_only=True) as con:
                table = con.sql("SELECT * EXCLUDE (g, ts, day) FROM t ORDER BY g, ts").to_arrow_table()
            names = [f"f{i}" for i in range(31)]
            self.x = np.stack([table.column(n).to_numpy() for n in names], axis=1)
            self.y = np.stack([table.column(n).to_numpy() for n in ("target", "gf")], axis=1)
            self.epoch = 0

        def __enter__(self) -> _InMemoryLoop:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            order = np.random.default_rng(self.epoch).permutation(len(self.x))
            self.epoch += 1
            for start in range(0, len(order), MEMORY_BATCH):
                rows = order[start : start + MEMORY_BATCH]
                yield torch.from_numpy(self.x.take(rows, 0)), torch.from_numpy(self.y.take(rows, 0))

    return _epochs(make, MEMORY_EPOCHS, lambda x, y: y[:, 1])


#: each child takes the mixing shape's rows per group (``--mixing-rows``), which only the mixing ones read
CHILDREN: dict[str, Callable[[int], dict[str, Any]]] = {
    "ddbloader": lambda rows: child_default(None),
    "ddbloader-float32": lambda rows: child_default("float32"),
    "pool-3": lambda rows: child_mixing(3, rows),
    "pool-200": lambda rows: child_mixing(200, rows),
    "inmemory-loop": lambda rows: child_memory_loop(),
    "ddbloader-cached": lambda rows: child_memory(True),
    "ddbloader-uncached": lambda rows: child_memory(False),
}

SECTIONS = {
    "default": ["ddbloader", "ddbloader-float32", "inmemory-take", "traditional"],
    "mixing": ["pool-3", "pool-200"],
    "memory": ["inmemory-loop", "ddbloader-cached", "ddbloader-uncached"],
}


# -------------------------------------------------------------------------------------- parent


def spawn(name: str, ddbloader_from: str | None, mixing_rows: int) -> dict[str, Any]:
    """One contender in a fresh interpreter (throughput.py's for its own contenders)."""
    if name in ("inmemory-take", "traditional"):
        return throughput.spawn(name, DEFAULT, 2 if name == "inmemory-take" else 1, ddbloader_from)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name]
    command += ["--mixing-rows", str(mixing_rows)]
    if ddbloader_from:
        command += ["--ddbloader-from", ddbloader_from]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=throughput.CHILD_TIMEOUT_S, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"contender {name} failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1][len(MARKER) :])
    print(
        f"  {name:<20} first epoch {result['first_epoch_s']:7.3f} s  warm {_warm(result):7.3f} s", flush=True
    )
    return result


def _warm(result: dict[str, Any]) -> float:
    """Median wall of the epochs after the first."""
    return float(statistics.median(result["walls_s"][1:]))


def _ratios(section: str, r: dict[str, Any]) -> dict[str, float]:
    """Per-round ratios of one section's contenders."""
    if section == "default":
        windows = DEFAULT.windows
        ddb, f32 = r["ddbloader"], r["ddbloader-float32"]
        return {
            "first_over_warm": ddb["first_epoch_s"] / _warm(ddb),
            "first_over_warm_float32": f32["first_epoch_s"] / _warm(f32),
            "warm_vs_inmemory_take": (windows / _warm(ddb)) / r["inmemory-take"]["windows_per_s"],
            "warm_vs_traditional": (windows / _warm(ddb)) / r["traditional"]["windows_per_s"],
            "float32_speedup": _warm(ddb) / _warm(f32),
            "float32_vs_inmemory_take": (windows / _warm(f32)) / r["inmemory-take"]["windows_per_s"],
            "first_batch_s": ddb["first_batch_s"],
            "warm_windows_per_s": windows / _warm(ddb),
            "inmemory_take_windows_per_s": r["inmemory-take"]["windows_per_s"],
            "traditional_windows_per_s": r["traditional"]["windows_per_s"],
            "groups_per_batch": ddb["groups_per_batch"],
            # the first epoch's profile against the warm epochs' (see render)
            "setup_s": ddb["setup_s"],
            "warm_first_batch_s": statistics.median(ddb["first_batches_s"][1:]),
            "first_rest_s": ddb["first_epoch_s"] - ddb["first_batch_s"],
            "warm_rest_s": statistics.median(
                w - f for w, f in zip(ddb["walls_s"][1:], ddb["first_batches_s"][1:], strict=True)
            ),
            "first_epoch_cpu_s": ddb["setup_cpu_s"] + ddb["cpus_s"][0],
            "warm_cpu_s": statistics.median(ddb["cpus_s"][1:]),
            "first_epoch_faults": ddb["setup_faults"] + ddb["faults"][0],
            "warm_faults": statistics.median(ddb["faults"][1:]),
        }
    if section == "mixing":
        small, whole = r["pool-3"], r["pool-200"]
        return {
            "pool_200_over_pool_3_warm": _warm(whole) / _warm(small),
            "pool_200_over_pool_3_first": whole["first_epoch_s"] / small["first_epoch_s"],
            "pool_3_warm_s": _warm(small),
            "pool_200_warm_s": _warm(whole),
            "pool_3_groups_per_batch": small["groups_per_batch"],
            "pool_200_groups_per_batch": whole["groups_per_batch"],
            "pool_3_first_batch_s": small["first_batch_s"],
            "pool_200_first_batch_s": whole["first_batch_s"],
        }
    loop, cached, uncached = r["inmemory-loop"], r["ddbloader-cached"], r["ddbloader-uncached"]
    later = {name: statistics.mean(c["walls_s"][1:]) for name, c in r.items()}
    later_cpu = {name: statistics.mean(c["cpus_s"][1:]) for name, c in r.items()}
    return {
        "cached_later_over_inmemory_loop": later["ddbloader-cached"] / later["inmemory-loop"],
        "cached_later_cpu_over_inmemory_loop": later_cpu["ddbloader-cached"] / later_cpu["inmemory-loop"],
        "uncached_later_over_inmemory_loop": later["ddbloader-uncached"] / later["inmemory-loop"],
        "cached_total_over_inmemory_loop_total": (cached["setup_s"] + sum(cached["walls_s"]))
        / (loop["setup_s"] + sum(loop["walls_s"])),
        "uncached_total_s": uncached["setup_s"] + sum(uncached["walls_s"]),
        "cached_total_s": cached["setup_s"] + sum(cached["walls_s"]),
        "inmemory_loop_total_s": loop["setup_s"] + sum(loop["walls_s"]),
        "inmemory_loop_later_epoch_s": later["inmemory-loop"],
        "cached_later_epoch_s": later["ddbloader-cached"],
        "uncached_later_epoch_s": later["ddbloader-uncached"],
        "cached_groups_per_batch": cached["groups_per_batch"],
        "inmemory_loop_groups_per_batch": loop["groups_per_batch"],
    }


def run(sections: list[str], rounds: int, ddbloader_from: str | None, mixing_rows: int) -> dict[str, Any]:
    throughput.ensure_data(DEFAULT)
    mixing_data(mixing_rows)
    memory_data()
    if "default" in sections:
        throughput.spawn("export", DEFAULT, 1, ddbloader_from)
    out: dict[str, Any] = {
        "rounds": rounds,
        "machine": throughput.machine(ddbloader_from),
        "mixing_rows": mixing_rows,
        "sections": {},
    }
    per_round: dict[str, list[dict[str, float]]] = {s: [] for s in sections}
    for number in range(rounds):
        for section in sections:
            print(f"round {number + 1}/{rounds}: {section}", flush=True)
            results = {name: spawn(name, ddbloader_from, mixing_rows) for name in SECTIONS[section]}
            per_round[section].append(_ratios(section, results))
            if section == "default":
                out["first_epoch_imports"] = results["ddbloader"]["first_epoch_imports"]
    for section, rows in per_round.items():
        out["sections"][section] = {
            "rounds": rows,
            "median": {key: statistics.median(row[key] for row in rows) for key in rows[0]},
        }
    return out


def _row(label: str, value: float, unit: str, target: str, ok: bool | None) -> str:
    """A table row; a missed target says by how much (the value's distance from the bound)."""
    verdict = "" if ok is None else "met"
    if ok is False:
        bound = float(target.split()[1].rstrip("×"))
        verdict = f"**not met** (by {abs(value / bound - 1):.0%})"
    return f"| {label} | {value:.2f}{unit} | {target} | {verdict} |"


def render(data: dict[str, Any]) -> str:
    m = data["machine"]
    out = [
        "## First epoch, float32, mixing, cache (`benchmarks/epochs.py`)",
        "",
        f"Produced by `python benchmarks/epochs.py` ({data['rounds']} interleaved rounds; medians of the "
        "per-round ratios). Machine: 2 shared cores, other jobs running: read ratios, not digits.",
        "",
        *(
            [
                f"**Warning:** the 1-minute load average was {m['load_avg'][0]:.1f} on {m['cpus']} CPUs "
                "when this run started: other jobs competed for the cores, and latencies (first batch, "
                "first epoch) suffer most.",
                "",
            ]
            if m["load_avg"][0] > 1.0
            else []
        ),
        "| figure | median | target | |",
        "|---|---:|---|---|",
    ]
    sections = data["sections"]
    if "default" in sections:
        d = sections["default"]["median"]
        out += [
            _row(
                "first epoch (constructor → last batch) ÷ warm epoch",
                d["first_over_warm"],
                "×",
                "≤ 1.15×",
                d["first_over_warm"] <= TARGET_FIRST_OVER_WARM,
            ),
            _row("… with dtype=float32", d["first_over_warm_float32"], "×", "", None),
            _row(
                "warm windows/s ÷ in-memory one-thread take",
                d["warm_vs_inmemory_take"],
                "×",
                "≥ 0.6×",
                d["warm_vs_inmemory_take"] >= TARGET_VS_INMEMORY,
            ),
            _row(
                "… with dtype=float32 (the contender gathers float64)",
                d["float32_vs_inmemory_take"],
                "×",
                "",
                None,
            ),
            _row(
                "warm windows/s ÷ export-and-memmap pipeline",
                d["warm_vs_traditional"],
                "×",
                "≥ 6×",
                d["warm_vs_traditional"] >= TARGET_VS_TRADITIONAL,
            ),
            _row("warm epoch float64 ÷ float32", d["float32_speedup"], "×", "", None),
            _row(
                "first batch from the constructor",
                d["first_batch_s"],
                " s",
                "< 1 s",
                d["first_batch_s"] < TARGET_FIRST_BATCH_S,
            ),
        ]
    if "mixing" in sections:
        x = sections["mixing"]["median"]
        out += [
            _row(
                "mixing: pool of 200 ÷ pool of 3, warm epoch",
                x["pool_200_over_pool_3_warm"],
                "×",
                "≤ 1.5×",
                x["pool_200_over_pool_3_warm"] <= TARGET_POOL_ALL,
            ),
            _row(
                "mixing: pool of 200 ÷ pool of 3, first epoch", x["pool_200_over_pool_3_first"], "×", "", None
            ),
        ]
    if "memory" in sections:
        c = sections["memory"]["median"]
        out += [
            _row(
                "cache_bytes: epochs 2-10 ÷ in-memory gather loop's",
                c["cached_later_over_inmemory_loop"],
                "×",
                "≤ 1.5×",
                c["cached_later_over_inmemory_loop"] <= TARGET_CACHED_VS_INMEMORY,
            ),
            _row(
                "… CPU seconds (every thread of the process)",
                c["cached_later_cpu_over_inmemory_loop"],
                "×",
                "",
                None,
            ),
            _row(
                "no cache: epochs 2-10 ÷ in-memory gather loop's",
                c["uncached_later_over_inmemory_loop"],
                "×",
                "",
                None,
            ),
            _row(
                "cache_bytes: 10 epochs with load ÷ the loop's",
                c["cached_total_over_inmemory_loop_total"],
                "×",
                "",
                None,
            ),
        ]
    out.append("")
    if "default" in sections:
        d = sections["default"]["median"]
        rates = [f"{d[k]:,.0f}" for k in ("warm_windows_per_s", "inmemory_take_windows_per_s")]
        out += [
            f"Default shape (10 × 5 × 2000 × 100 float64, window 50, batch 64, shuffled): ddbloader "
            f"warm {rates[0]} windows/s with {d['groups_per_batch']:.0f} distinct groups per batch "
            f"(median); in-memory one-thread take {rates[1]} windows/s and export-and-memmap "
            f"{d['traditional_windows_per_s']:,.0f} windows/s, both shuffled uniformly (up to all 10 "
            "groups per batch).",
            "",
        ]
    if "default" in sections:
        d = sections["default"]["median"]
        imports = data.get("first_epoch_imports")
        out += [
            "Where the first epoch's extra time goes (ddbloader defaults, medians; first epoch "
            f"against the warm ones): constructor (planning: a schema and a count query) "
            f"{d['setup_s']:.3f} s; first batch {d['first_batch_s']:.3f} s from the constructor "
            f"against {d['warm_first_batch_s']:.3f} s from a warm epoch's start (both wait for "
            "three groups' first fetch units; the first epoch's engine reads the table cold); the "
            f"rest of the epoch {d['first_rest_s']:.3f} s against {d['warm_rest_s']:.3f} s. "
            f"Process CPU {d['first_epoch_cpu_s']:.2f} s against {d['warm_cpu_s']:.2f} s; minor page "
            f"faults {d['first_epoch_faults']:,.0f} against {d['warm_faults']:,.0f} (fresh memory: "
            "the engine's buffer pool, the arena, the first batch buffers)."
            + (
                ""
                if imports is None
                else " Modules imported during the constructor and first epoch: "
                f"{', '.join(imports) if imports else 'none'}."
            ),
            "",
        ]
    if "mixing" in sections:
        x = sections["mixing"]["median"]
        out += [
            f"Mixing shape (200 groups × {data.get('mixing_rows', 5000):,} rows × 16 float32, window 32, "
            "batch 256): pool of 3 "
            f"{x['pool_3_warm_s']:.2f} s per warm epoch, {x['pool_3_groups_per_batch']:.0f} distinct "
            f"groups per batch; pool of 200 {x['pool_200_warm_s']:.2f} s, "
            f"{x['pool_200_groups_per_batch']:.0f} groups per batch. First batch "
            f"{x['pool_3_first_batch_s']:.2f} s and {x['pool_200_first_batch_s']:.2f} s.",
            "",
        ]
    if "memory" in sections:
        c = sections["memory"]["median"]
        groups = [f"{c[k]:.0f}" for k in ("inmemory_loop_groups_per_batch", "cached_groups_per_batch")]
        out += [
            "Memory shape (20 groups × 100,000 rows × 32 float64, one row per sample, batch 1024, "
            f"10 epochs): in-memory loop {c['inmemory_loop_total_s']:.2f} s in all "
            f"({c['inmemory_loop_later_epoch_s']:.3f} s per later epoch, {groups[0]} groups per "
            f"batch); ddbloader with cache_bytes {c['cached_total_s']:.2f} s "
            f"({c['cached_later_epoch_s']:.3f} s per later epoch, {groups[1]} groups per batch); "
            f"without {c['uncached_total_s']:.2f} s ({c['uncached_later_epoch_s']:.3f} s).",
            "",
        ]
    out.append(
        f"_{m['when']}, {m['cpus']} CPUs (load {m['load_avg'][0]:.2f}), torch {m['torch']}, DuckDB "
        f"{m['duckdb']}, numpy {m['numpy']}; ddbloader {m['ddbloader']}._"
    )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--ddbloader-from", help="directory to import ddbloader from (default: this checkout)"
    )
    parser.add_argument("--mixing-rows", type=int, default=5000, help="rows per group of the mixing shape")
    parser.add_argument(
        "--no-save", action="store_true", help="print the tables only (RESULTS.md and results.json untouched)"
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, args.ddbloader_from or str(HERE.parent))
        print(MARKER + json.dumps(CHILDREN[args.child](args.mixing_rows)), flush=True)
        return
    sections = list(SECTIONS) if args.section == "all" else [args.section]
    data = run(sections, args.rounds, args.ddbloader_from, args.mixing_rows)
    if not args.no_save:
        # a section of RESULTS.md, kept in results.json beside throughput.py's (which renders it)
        throughput.save("epochs", data)
    print(render(data))


if __name__ == "__main__":
    main()
