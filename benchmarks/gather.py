"""The gather kernel side by side, and the loader's epoch against the best in-RAM window gather.

Usage::

    python benchmarks/gather.py                      # both sections, 5 interleaved rounds -> RESULTS.md
    python benchmarks/gather.py --section kernel --rounds 3
    python benchmarks/gather.py --section epoch --no-save

``kernel``: in one process, on the same rows and the same shuffled start draws, the candidates for
copying a batch of windows out of a row-major block, interleaved round by round:

* ``row take``: ``ndarray.take`` of ``B × W`` row numbers into a fresh buffer (ddbloader's gather
  before block copies, and still its path for pinned or multi-run batches);
* ``gather()``: ddbloader's own :func:`~ddbloader._pipeline.batch.gather` of one run (one arena);
* ``block copies``: one numpy indexing of a view whose items are whole windows (a ``void`` dtype of
  ``W × F`` elements' bytes): one ``memcpy`` per window, into a fresh array;
* ``slice loop``: a Python loop of ``B`` slice copies into a fresh buffer;
* ``index_select 1 thread``: torch over an ``as_strided`` window view with
  ``torch.set_num_threads(1)`` around the call: a reference only, since that setting is global and
  the loader must not change it;
* ``index_select``: the same with torch's default intra-op threads (it splits a batch across them).

Shapes: the default (100 float64 per row, window 50, batch 64), the same in float32, and the
mixing shape (16 float32, window 32, batch 256). Figures: windows/s (wall) and the calling
thread's CPU µs per window, medians over the rounds, and each against ``row take`` in the same
round.

``epoch``: in their own interpreters, alternating round by round, at the default shape of
``throughput.py`` (10 symbols × 5 days × 2,000 rows × 100 float64, window 50, batch 64,
shuffled): a fresh loader's first epoch (constructor to last batch: cold), three warm epochs
and one more for each thread's CPU seconds; the same with ``cache_bytes`` holding every
partition (epochs after the first served from memory, the like-for-like of a loop that holds every
row in RAM); and the in-RAM contender: the whole table as one
float64 array in RAM, a uniform shuffle of every window, 64 at a time gathered into a fresh
tensor by block copies and by ``index_select`` with one intra-op
thread, epoch after epoch; the faster of the two per round is the contender. Ratios are taken
within a round, then the median over rounds. The machine's load average is printed before and
after: on a shared machine read the ratios, not the digits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# a child for --ddbloader-from imports that version of ddbloader
sys.path.insert(0, os.environ.get(FROM_ENV := "GATHER_BENCH_DDBLOADER_FROM", str(HERE.parent)))

import throughput  # noqa: E402  (benchmarks/throughput.py: the data and the loader's arguments)

from ddbloader._core.window import WindowGeometry, window_view  # noqa: E402
from ddbloader._io.block import Block  # noqa: E402
from ddbloader._pipeline.arena import Piece, Segment  # noqa: E402
from ddbloader._pipeline.batch import gather  # noqa: E402
from ddbloader._sql.layout import ColumnLayout  # noqa: E402

MARKER = "GATHER-JSON:"
CHILD_TIMEOUT_S = 900
WARM_EPOCHS = 3
TARGET_WARM = 0.8
KERNEL_ROWS = 20_000  # an arena of ten 2,000-row regions
KERNEL_BATCHES = 300
KERNEL_SHAPES = {
    "100 float64, window 50, batch 64": (100, np.float64, 50, 64),
    "100 float32, window 50, batch 64": (100, np.float32, 50, 64),
    "16 float32, window 32, batch 256": (16, np.float32, 32, 256),
}
Kernel = Callable[[np.ndarray[Any, Any]], Any]


def load_average() -> float:
    return os.getloadavg()[0]


# -------------------------------------------------------------------------------------- kernels


def kernels(rows: np.ndarray[Any, Any], window: int) -> dict[str, Kernel]:
    """The candidates, each gathering the windows at ``starts`` of ``rows`` into fresh memory."""
    n, features = rows.shape
    steps = np.arange(window)
    batch_layout = ColumnLayout(
        tuple(f"f{j}" for j in range(features)), ("y",), rows.dtype, rows.dtype, frozenset()
    )
    targets = np.ascontiguousarray(rows[:, :1])
    segment = Segment(Block(rows, targets))
    geometry = WindowGeometry(window, 1, 1, window - 1, True)
    windows = window_view(torch.from_numpy(rows), window)

    def row_take(starts: np.ndarray[Any, Any]) -> Any:
        out = np.empty((len(starts), window, features), rows.dtype)
        rows.take((starts[:, None] + steps).reshape(-1), 0, out.reshape(-1, features), "clip")
        return torch.from_numpy(out)

    def ddbloader_gather(starts: np.ndarray[Any, Any]) -> Any:
        return gather([Piece(segment, starts)], geometry, batch_layout, pin=False)

    def block_copies(starts: np.ndarray[Any, Any]) -> Any:
        return torch.from_numpy(
            block_windows(rows, window)[starts].view(rows.dtype).reshape(-1, window, features)
        )

    def slice_loop(starts: np.ndarray[Any, Any]) -> Any:
        out = np.empty((len(starts), window, features), rows.dtype)
        for i, start in enumerate(starts.tolist()):
            out[i] = rows[start : start + window]
        return torch.from_numpy(out)

    def index_select(starts: np.ndarray[Any, Any]) -> Any:
        return windows.index_select(0, torch.from_numpy(starts))

    def index_select_one_thread(starts: np.ndarray[Any, Any]) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return windows.index_select(0, torch.from_numpy(starts))
        finally:
            torch.set_num_threads(threads)

    assert n >= window
    return {
        "row take": row_take,
        "gather()": ddbloader_gather,
        "block copies": block_copies,
        "slice loop": slice_loop,
        "index_select 1 thread": index_select_one_thread,
        "index_select": index_select,
    }


def block_windows(rows: np.ndarray[Any, Any], length: int) -> np.ndarray[Any, Any]:
    """Every window of ``length`` rows of the C-contiguous ``rows`` as one raw item (a view)."""
    row_bytes = rows.shape[1] * rows.itemsize
    windows: np.ndarray[Any, Any] = np.ndarray(
        (rows.shape[0] - length + 1,),
        np.dtype((np.void, length * row_bytes)),
        buffer=rows,
        strides=(row_bytes,),
    )
    return windows


def _check_equal(candidates: dict[str, Kernel], rows: np.ndarray[Any, Any], window: int, batch: int) -> None:
    starts = np.random.default_rng(1).integers(0, rows.shape[0] - window + 1, batch)
    want = np.stack([rows[s : s + window] for s in starts])
    for name, kernel in candidates.items():
        got = kernel(starts)
        x = got[0] if isinstance(got, tuple) else got
        if not np.array_equal(x.numpy(), want):
            raise AssertionError(f"kernel {name!r} gathered other windows than slicing does")


def kernel_section(rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, (features, dtype, window, batch) in KERNEL_SHAPES.items():
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((KERNEL_ROWS, features)).astype(dtype)
        candidates = kernels(rows, window)
        _check_equal(candidates, rows, window, batch)
        per: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
        for _ in range(rounds):
            for name, kernel in candidates.items():
                draws = [rng.integers(0, KERNEL_ROWS - window + 1, batch) for _ in range(KERNEL_BATCHES)]
                cpu, began = time.thread_time(), time.perf_counter()
                for starts in draws:
                    kernel(starts)
                wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
                per[name].append((batch * KERNEL_BATCHES / wall, cpu / (batch * KERNEL_BATCHES) * 1e6))
        base = per["row take"]
        results[label] = {
            name: {
                "windows_per_s": statistics.median(r for r, _ in runs),
                "cpu_us_per_window": statistics.median(c for _, c in runs),
                "vs_row_take": statistics.median(r / b for (r, _), (b, _) in zip(runs, base, strict=True)),
            }
            for name, runs in per.items()
        }
    return results


# ---------------------------------------------------------------------------------------- epochs


class ThreadClock:
    """Samples every thread's CPU seconds (``/proc/self/task``) until stopped, so threads that end
    mid-epoch still count; Python threads by name, the rest (the engine's, torch's) as one."""

    def __init__(self, period_s: float = 0.05) -> None:
        self._tick = os.sysconf("SC_CLK_TCK")
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._period = period_s
        self._thread = threading.Thread(target=self._run, name="bench-thread-clock", daemon=True)

    def _cpu(self, tid: int) -> float | None:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self._tick

    def _sample(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        for entry in os.listdir("/proc/self/task"):
            tid = int(entry)
            cpu = self._cpu(tid)
            if cpu is not None:
                name = names.get(tid, self._seen.get(tid, ("engine and other native threads", 0.0))[0])
                self._seen[tid] = (name, cpu)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self._sample()

    def __enter__(self) -> ThreadClock:
        self._sample()
        self._start = {tid: cpu for tid, (_, cpu) in self._seen.items()}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._sample()

    def seconds(self) -> dict[str, float]:
        """CPU seconds per thread name (the loader's threads carry a number: one row per role)."""
        totals: dict[str, float] = {}
        for tid, (name, cpu) in self._seen.items():
            role = name.rstrip("0123456789-").removeprefix("ddbloader-")
            totals[role] = totals.get(role, 0.0) + cpu - self._start.get(tid, 0.0)
        return {k: v for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v > 0}


def child_loader(cache_bytes: int | None = None) -> dict[str, Any]:
    """A fresh loader's first epoch (from the constructor), warm epochs, then one more warm epoch
    under :class:`ThreadClock` (its sampling costs CPU, so that epoch is not timed). With
    ``cache_bytes``, epochs after the first are served from the partition cache."""
    shape = throughput.Shape(10, 5, 2000, 100, 50)
    walls, windows = [], 0
    began = time.perf_counter()
    loader = throughput._make_loader(shape, cache_bytes=cache_bytes)
    with loader:
        for epoch in range(1 + WARM_EPOCHS):
            start = time.perf_counter()
            windows = sum(x.shape[0] for x, _ in loader)
            walls.append(time.perf_counter() - (began if epoch == 0 else start))
        with ThreadClock() as clock:
            for _ in loader:
                pass
    return {"windows": windows, "cold_s": walls[0], "warm_s": walls[1:], "thread_cpu_s": clock.seconds()}


def _inram_epochs(
    x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], starts: np.ndarray[Any, Any], window: int
) -> Iterator[tuple[str, float]]:
    """Alternating epochs of the two in-RAM kernels: (kernel, seconds) per epoch."""
    x_blocks = block_windows(x, window)
    x_windows, y_rows = window_view(torch.from_numpy(x), window), torch.from_numpy(y)
    for epoch in range(WARM_EPOCHS):
        order = starts[np.random.default_rng(epoch).permutation(len(starts))]
        began = time.perf_counter()
        for b in range(0, len(order), throughput.BATCH):
            index = order[b : b + throughput.BATCH]
            bx = torch.from_numpy(x_blocks[index].view(x.dtype).reshape(-1, window, x.shape[1]))
            torch.from_numpy(y.take(index + window, 0, mode="clip"))
        yield "block copies", time.perf_counter() - began
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            order_t = torch.from_numpy(order)
            began = time.perf_counter()
            for b in range(0, len(order), throughput.BATCH):
                index_t = order_t[b : b + throughput.BATCH]
                bx, _ = x_windows.index_select(0, index_t), y_rows.index_select(0, index_t + window)
            yield "index_select 1 thread", time.perf_counter() - began
        finally:
            torch.set_num_threads(threads)
        assert bx.shape[1:] == (window, x.shape[1])


def child_inram() -> dict[str, Any]:
    import duckdb

    shape = throughput.Shape(10, 5, 2000, 100, 50)
    with duckdb.connect(str(shape.db_path), read_only=True) as con:
        columns = ", ".join([*shape.factor_names, "target"])
        table = con.sql(f"SELECT {columns} FROM bench ORDER BY symbol, ts").to_arrow_table()
        counts = con.sql("SELECT count(*) FROM bench GROUP BY symbol ORDER BY symbol").fetchnumpy()
    x = np.ascontiguousarray(np.stack([table.column(c).to_numpy() for c in shape.factor_names], axis=1))
    y = np.ascontiguousarray(table.column("target").to_numpy().reshape(-1, 1))
    per_symbol = next(iter(counts.values())).astype(np.int64)
    firsts = np.concatenate([[0], np.cumsum(per_symbol)[:-1]])
    w = shape.window
    starts = np.concatenate([f + np.arange(c - w) for f, c in zip(firsts, per_symbol, strict=True)])
    epochs: dict[str, list[float]] = {}
    for kernel, seconds in _inram_epochs(x, y, starts, w):
        epochs.setdefault(kernel, []).append(seconds)
    return {"windows": len(starts), "epochs_s": epochs}


#: a cache for every partition of the default shape (81 MB planned), as the in-RAM gather holds every row
CACHE_BYTES = 1 << 30

CHILDREN: dict[str, Callable[[], dict[str, Any]]] = {
    "loader": child_loader,
    "cached": lambda: child_loader(CACHE_BYTES),
    "inram": child_inram,
}


def spawn(name: str, ddbloader_from: str | None = None) -> dict[str, Any]:
    env = dict(os.environ) if ddbloader_from is None else {**os.environ, FROM_ENV: ddbloader_from}
    command = [sys.executable, __file__, "--child", name]
    return throughput.child_result(command, f"child {name}", MARKER, env, CHILD_TIMEOUT_S)


def epoch_section(rounds: int, ddbloader_from: str | None) -> dict[str, Any]:
    throughput.ensure_data(throughput.Shape(10, 5, 2000, 100, 50))
    per_round = []
    for r in range(rounds):
        order = ["loader", "cached", "inram"] if r % 2 == 0 else ["inram", "cached", "loader"]
        if ddbloader_from is not None:
            order.insert(r % 3, "before")
        got = {
            name: spawn("loader" if name == "before" else name, ddbloader_from if name == "before" else None)
            for name in order
        }
        loader, inram = got["loader"], got["inram"]
        best_kernel = min(inram["epochs_s"], key=lambda k: statistics.median(inram["epochs_s"][k]))
        inram_rate = inram["windows"] / statistics.median(inram["epochs_s"][best_kernel])
        warm_rate = loader["windows"] / statistics.median(loader["warm_s"])
        cached_rate = got["cached"]["windows"] / statistics.median(got["cached"]["warm_s"])
        cold_rate = loader["windows"] / loader["cold_s"]
        before = got.get("before")
        before_rate = None if before is None else before["windows"] / statistics.median(before["warm_s"])
        per_round.append(
            {
                "load_avg": load_average(),
                "before_warm_windows_per_s": before_rate,
                "loader_warm_windows_per_s": warm_rate,
                "loader_cold_windows_per_s": cold_rate,
                "cached_warm_windows_per_s": cached_rate,
                "cached_ratio": cached_rate / inram_rate,
                "inram_windows_per_s": inram_rate,
                "inram_kernel": best_kernel,
                "inram_by_kernel": {
                    k: inram["windows"] / statistics.median(v) for k, v in inram["epochs_s"].items()
                },
                "warm_ratio": warm_rate / inram_rate,
                "warm_over_before": None if before_rate is None else warm_rate / before_rate,
                "cold_ratio": cold_rate / inram_rate,
                "cold_over_warm": loader["cold_s"] / statistics.median(loader["warm_s"]),
                "thread_cpu_us_per_window": {
                    k: v / loader["windows"] * 1e6 for k, v in loader["thread_cpu_s"].items()
                },
            }
        )
        print(f"round {r + 1}: {json.dumps(per_round[-1], default=str)}", file=sys.stderr, flush=True)
    return {"rounds": per_round}


# ---------------------------------------------------------------------------------------- render


def render(data: dict[str, Any]) -> str:
    out = ["## Gather kernel and warm epoch against the in-RAM gather (`benchmarks/gather.py`)", ""]
    out.append(
        f"Machine: {os.cpu_count()} shared CPUs; load average {data['load_before']:.2f} before, "
        f"{data['load_after']:.2f} after ({data['rounds']} interleaved rounds, medians). On a loaded "
        "machine memory bandwidth is shared too: read the ratios, not the digits."
    )
    out.append("")
    for label, by_kernel in data.get("kernel", {}).items():
        out += [
            f"Kernel, {label}:",
            "",
            "| kernel | windows/s | CPU µs/window | ÷ row take |",
            "|---|---:|---:|---:|",
        ]
        for name, r in by_kernel.items():
            rate, cpu_us, ratio = r["windows_per_s"], r["cpu_us_per_window"], r["vs_row_take"]
            out.append(f"| {name} | {rate:,.0f} | {cpu_us:.2f} | {ratio:.2f}× |")
        out.append("")
    rounds = data.get("epoch", {}).get("rounds", [])
    if rounds:

        def median(key: str) -> float:
            return float(statistics.median(r[key] for r in rounds))

        warm = median("warm_ratio")
        verdict = (
            "met" if warm >= TARGET_WARM else f"**not met** (by {(TARGET_WARM - warm) / TARGET_WARM:.0%})"
        )
        kernels_used = sorted({r["inram_kernel"] for r in rounds})
        out += [
            "Epoch at the default shape (10 × 5 × 2,000 × 100 float64, window 50, batch 64, shuffled):",
            "",
            "| figure | median | target | |",
            "|---|---:|---|---|",
            f"| ddbloader warm windows/s | {median('loader_warm_windows_per_s'):,.0f} |  |  |",
            f"| ddbloader cold windows/s (constructor → last batch) "
            f"| {median('loader_cold_windows_per_s'):,.0f} |  |  |",
            f"| in-RAM gather windows/s ({', '.join(kernels_used)}) "
            f"| {median('inram_windows_per_s'):,.0f} |  |  |",
            f"| warm ÷ in-RAM | {warm:.2f}× | ≥ {TARGET_WARM}× | {verdict} |",
            *(
                [
                    f"| ddbloader warm windows/s with cache_bytes (every row in RAM, as the in-RAM "
                    f"gather) | {median('cached_warm_windows_per_s'):,.0f} |  |  |",
                    f"| warm with cache_bytes ÷ in-RAM | {median('cached_ratio'):.2f}× | ≥ {TARGET_WARM}× | "
                    f"{'met' if median('cached_ratio') >= TARGET_WARM else '**not met**'} |",
                ]
                if all("cached_ratio" in r for r in rounds)  # runs before the cached loader lack it
                else []
            ),
            *(
                [f"| warm ÷ warm of {data['ddbloader_from']} | {median('warm_over_before'):.2f}× |  |  |"]
                if data.get("ddbloader_from")
                else []
            ),
            f"| cold ÷ in-RAM | {median('cold_ratio'):.2f}× |  |  |",
            f"| cold epoch ÷ warm epoch (seconds) | {median('cold_over_warm'):.2f}× |  |  |",
            "",
            "ddbloader's CPU per window by thread, warm epochs (median over rounds):",
            "",
            "| thread | CPU µs/window |",
            "|---|---:|",
        ]
        roles = sorted({k for r in rounds for k in r["thread_cpu_us_per_window"]})
        cpu = {k: statistics.median(r["thread_cpu_us_per_window"].get(k, 0.0) for r in rounds) for k in roles}
        for role, value in sorted(cpu.items(), key=lambda kv: -kv[1]):
            out.append(f"| {role} | {value:.2f} |")
        out.append(f"| all | {sum(cpu.values()):.2f} |")
        by_kernel = {
            k: statistics.median(r["inram_by_kernel"][k] for r in rounds)
            for k in rounds[0]["inram_by_kernel"]
        }
        out += [
            "",
            "In-RAM kernels: " + ", ".join(f"{k} {v:,.0f} windows/s" for k, v in by_kernel.items()) + ".",
        ]
    out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--section", choices=["all", "kernel", "epoch"], default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--ddbloader-from", help="also time the loader of another checkout (e.g. `git archive main`)"
    )
    parser.add_argument("--no-save", action="store_true", help="print only; leave RESULTS.md as it is")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(MARKER + json.dumps(CHILDREN[args.child]()), flush=True)
        return
    data: dict[str, Any] = {
        "load_before": load_average(),
        "rounds": args.rounds,
        "ddbloader_from": args.ddbloader_from,
    }
    if args.section in ("all", "kernel"):
        data["kernel"] = kernel_section(args.rounds)
    if args.section in ("all", "epoch"):
        data["epoch"] = epoch_section(args.rounds, args.ddbloader_from)
    data["load_after"] = load_average()
    data["machine"] = throughput.machine(None)
    if not args.no_save:
        throughput.save("gather", data)
    print(render(data))


if __name__ == "__main__":
    main()
