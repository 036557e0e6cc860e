"""GPU check of the device path (issue 8): one self-contained script, under 5 minutes on one GPU.

    python benchmarks/gpu_check.py [--groups 8] [--days 4] [--rows 5000] [--features 32]
                                   [--window 64] [--batch 256] [--step-ms 5] [--json out.json]

It builds an in-memory DuckDB table (groups × days × rows, float32 features), then reports:

1. **pinned**: host batches with ``pin_memory=True`` are pinned, and how many pinned host blocks
   torch's caching host allocator made over an epoch (a constant, not one per batch);
2. **correctness**: the batches delivered on the GPU (side stream + event + ``record_stream``, with
   and without ``window_on_device``) equal the host batches, under a consumer that queues a long
   kernel before reading each batch and drops it at once;
3. **host → device bytes per epoch**: batches copied vs rows shipped once (``window_on_device``);
4. **overlap**: the share of wall time the training loop waits in ``next()`` while a synthetic
   model step of ``--step-ms`` runs on the GPU (the step reads the batch and ends in a sync, like
   ``loss.item()``), in all and after the first batch (a fresh loader's first batch waits for its
   first fetches), for: a host loader with the copy in the loop (the usual pattern), the
   device path, and the device path with ``window_on_device``;
5. **windows/s** of each, with no model step;
6. **host → device bandwidth** of a plain copy of 256 MB from pinned and from pageable memory, the
   ceiling the host path's copies meet.

Without a CUDA device it says so, exits with status 2 and runs nothing, unless ``--smoke``: then
it runs the same code on ``cpu`` and ``meta`` at a tiny size, to show that the script works
(those figures are not GPU figures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import duckdb
import torch

from ddbloader import DDBDataLoader

Step = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass
class Run:
    mode: str
    batches: int
    windows: int
    wall_s: float
    wait_s: float
    first_batch_s: float
    bytes_to_device: int

    @property
    def wait_percent(self) -> float:
        return 100 * self.wait_s / self.wall_s if self.wall_s else 0.0

    @property
    def later_wait_percent(self) -> float:
        """The share of wall time spent waiting after the first batch arrived."""
        later = self.wall_s - self.first_batch_s
        return 100 * (self.wait_s - self.first_batch_s) / later if later > 0 else 0.0

    @property
    def windows_per_s(self) -> float:
        return self.windows / self.wall_s if self.wall_s else 0.0


def build_table(groups: int, days: int, rows: int, features: int) -> duckdb.DuckDBPyConnection:
    """``series(g, d, pos, f0 .. f{F-1})``: deterministic float32 features from a hash."""
    connection = duckdb.connect()
    columns = ", ".join(
        f"((hash(g, d, pos, {j}) % 2000)::FLOAT / 1000 - 1)::FLOAT AS f{j}" for j in range(features)
    )
    connection.execute(
        f"""
        CREATE TABLE series AS
        SELECT g, d, pos, {columns}
        FROM range({groups}) a(g), range({days}) b(d), range({rows}) c(pos)
        """
    )
    return connection


def make_loader(
    connection: duckdb.DuckDBPyConnection, args: argparse.Namespace, **kwargs: Any
) -> DDBDataLoader:
    return DDBDataLoader(
        connection,
        "SELECT * FROM series ORDER BY g, d, pos",
        target_col="f0",
        batch_size=args.batch,
        shuffle=True,
        window_size=[args.window, 1],
        input_col=[f"f{j}" for j in range(args.features)],
        group_col="g",
        repartition_col="d",
        seed=0,
        dtype=torch.float32,
        prefetch_batch=4,
        fetch_threads=4,
        **kwargs,
    )


def run_epoch(loader: DDBDataLoader, mode: str, step: Step | None, move: str | None = None) -> Run:
    """One epoch; ``move`` copies each batch to that device in the loop (the usual pattern)."""
    with loader:
        iterator = iter(loader)
        waited = first = 0.0
        batches = windows = 0
        started = time.perf_counter()
        while True:
            asked = time.perf_counter()
            try:
                x, y = next(iterator)
            except StopIteration:
                break
            if move is not None:
                x, y = x.to(move), y.to(move)
            waited += time.perf_counter() - asked
            if not batches:
                first = waited
            batches += 1
            windows += len(x)
            if step is not None:
                step(x, y)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
        return Run(mode, batches, windows, wall, waited, first, iterator.host_to_device_bytes)


def gpu_step(milliseconds: float) -> Step:
    """A model step: a kernel of about ``milliseconds`` that reads the batch, then a host sync."""
    probe_start, probe_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    probe_start.record()
    torch.cuda._sleep(cycles)
    probe_end.record()
    torch.cuda.synchronize()
    per_ms = cycles / probe_start.elapsed_time(probe_end)
    count = int(per_ms * milliseconds)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        torch.cuda._sleep(count)
        (x.sum() + y.sum()).item()

    return step


def cpu_step(milliseconds: float) -> Step:
    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        time.sleep(milliseconds / 1000)

    return step


def check_pinned(connection: duckdb.DuckDBPyConnection, args: argparse.Namespace) -> dict[str, Any]:
    stats = getattr(torch.cuda, "host_memory_stats", None)
    before = stats() if callable(stats) else {}
    with make_loader(connection, args, pin_memory=True) as loader:
        flags = [x.is_pinned() and y.is_pinned() for x, y in loader]
    after = stats() if callable(stats) else {}
    allocations = after.get("num_host_alloc", 0) - before.get("num_host_alloc", 0) if after else None
    return {"batches": len(flags), "all_pinned": all(flags), "host_allocations": allocations}


def host_to_device_bandwidth(megabytes: int = 256, repeats: int = 5) -> dict[str, float]:
    """GB/s of the best of ``repeats`` copies of ``megabytes`` to the GPU, pinned and pageable."""
    results: dict[str, float] = {}
    for pinned in (True, False):
        source = torch.ones(megabytes * 2**20, dtype=torch.uint8, pin_memory=pinned)
        target = torch.empty_like(source, device="cuda")
        best = float("inf")
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source, non_blocking=pinned)
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1000)
        results["pinned" if pinned else "pageable"] = source.numel() / best / 1e9
    return results


def first_sums(loader: DDBDataLoader, limit: int, before_read: Callable[[], Any]) -> torch.Tensor:
    """``[limit, 2]``: the float64 sums of x and y of the first ``limit`` batches, on the host."""
    sums = []
    with loader:
        for x, y in loader:
            before_read()
            sums.append(torch.stack([x.sum(dtype=torch.float64), y.sum(dtype=torch.float64)]))
            if len(sums) == limit:
                break
    stacked = torch.stack(sums)
    return stacked if stacked.is_meta else stacked.cpu()


def check_equal(
    connection: duckdb.DuckDBPyConnection, args: argparse.Namespace, limit: int
) -> dict[str, bool]:
    """Device batches (each read behind a long kernel, then dropped) against the host batches."""
    host = first_sums(make_loader(connection, args), limit, lambda: None)
    results: dict[str, bool] = {}
    for window_on_device in (False, True):
        loader = make_loader(connection, args, device="cuda", window_on_device=window_on_device)
        device = first_sums(loader, limit, lambda: torch.cuda._sleep(2_000_000))
        results[f"window_on_device={window_on_device}"] = device.shape == host.shape and bool(
            torch.allclose(device, host)
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows", type=int, default=5000, help="rows per group and day")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--smoke", action="store_true", help="no GPU: run on cpu/meta at a tiny size")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("NO CUDA DEVICE: the GPU checks were not run (use --smoke to exercise the script on CPU)")
        return 2
    if args.smoke:
        args.groups, args.days, args.rows, args.features, args.window, args.batch = 2, 2, 300, 8, 16, 32
    device = "cuda" if cuda else "meta"
    header = torch.cuda.get_device_name() if cuda else "NO CUDA DEVICE: cpu/meta smoke run, not GPU figures"
    print(f"# gpu_check: {header}; torch {torch.__version__}")
    started = time.perf_counter()
    connection = build_table(args.groups, args.days, args.rows, args.features)
    megabytes = args.groups * args.days * args.rows * (args.features + 3) * 4 / 1e6
    print(
        f"table: {args.groups} groups × {args.days} days × {args.rows} rows × {args.features} float32 "
        f"features ({megabytes:.1f} MB); window {args.window}→1, batch {args.batch}, shuffled"
    )
    report: dict[str, Any] = {"device": header, "args": vars(args)}
    if cuda:
        report["pinned"] = check_pinned(connection, args)
        print(f"pinned: {report['pinned']}")
        report["equal"] = check_equal(connection, args, limit=60)
        print(f"device batches equal host batches: {report['equal']}")
        report["h2d_gb_per_s"] = host_to_device_bandwidth()
        print(f"host → device GB/s (256 MB copy, best of 5): {report['h2d_gb_per_s']}")
    step = gpu_step(args.step_ms) if cuda else cpu_step(args.step_ms)
    modes: list[tuple[str, dict[str, Any], str | None]] = [
        ("host loader, copy in the loop", {"device": "cpu"}, device),
        ("device path (side stream)", {"device": device}, None),
        ("device path + window_on_device", {"device": device, "window_on_device": True}, None),
    ]
    for _, kwargs, _ in modes:  # warm-up: first-use costs (streams, kernels) stay out of the figures
        first_sums(make_loader(connection, args, **kwargs), 3, lambda: None)
    runs: list[Run] = []
    for label, kwargs, move in modes:
        for with_step in (True, False):
            mode = f"{label}, {'model step' if with_step else 'no step'}"
            run = run_epoch(make_loader(connection, args, **kwargs), mode, step if with_step else None, move)
            if move is not None:
                # The copy in the loop is the user's, not the loader's: count it the same way.
                run.bytes_to_device = run.windows * (args.window * args.features + 1) * 4
            runs.append(run)
    step_ms = f"{args.step_ms:g}"
    print(
        f"\n| mode | batches | windows/s | wall s | first batch s | loader wait % (step {step_ms} ms) "
        "| … after the first batch | H→D MB/epoch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        stepped = "model step" in run.mode
        wait = f"{run.wait_percent:.1f}" if stepped else "—"
        later = f"{run.later_wait_percent:.1f}" if stepped else "—"
        print(
            f"| {run.mode} | {run.batches} | {run.windows_per_s:,.0f} | {run.wall_s:.2f} | "
            f"{run.first_batch_s:.3f} | {wait} | {later} | {run.bytes_to_device / 1e6:,.1f} |"
        )
    copied = next(r.bytes_to_device for r in runs if r.mode.startswith("device path (side"))
    shipped = next(r.bytes_to_device for r in runs if "window_on_device" in r.mode)
    ratio = copied / shipped if shipped else float("nan")
    print(f"\nhost → device bytes: {ratio:.1f}× fewer with window_on_device (window {args.window})")
    print(f"total {time.perf_counter() - started:.1f} s")
    report["runs"] = [
        {
            **asdict(r),
            "wait_percent": r.wait_percent,
            "later_wait_percent": r.later_wait_percent,
            "windows_per_s": r.windows_per_s,
        }
        for r in runs
    ]
    report["bytes_ratio"] = ratio
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
