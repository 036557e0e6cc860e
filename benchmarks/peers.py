"""How does ddbloader compare with what a user writes by hand when the table fits in RAM?

Usage::

    python benchmarks/peers.py                # both workloads, 3 rounds
    python benchmarks/peers.py --workloads tabular --rounds 5
    python benchmarks/peers.py --workloads windows --against f7fbf13 --against-only "ddbloader default"
    python benchmarks/peers.py --smoke

Workloads (DuckDB files under ``benchmarks/_work/``):

* ``tabular``: 2,000,000 rows x 32 float32 (``f0`` the target, ``f1..f31`` x), ``SELECT * FROM
  tab ORDER BY id``, batch 1024, shuffled.
* ``windows``: 200 groups x 5,000 rows x 16 float32 and a target (stored in random order),
  ``ORDER BY g, pos``, window 32 (y the row after), batch 256, shuffled.

Contenders (each in its own interpreter; imports before the clock):

* ``loop``: the whole table read once into numpy (setup), then per epoch a uniform permutation
  and per batch one gather into fresh tensors (rows by ``take``, windows by one block copy each).
* ``duckdb_torch``: DuckDB's own ``con.sql(q).torch()`` (a dict of column tensors) and the ~20-line loop
  a user writes on it: stack the columns, an ``as_strided`` view of every window, per batch an
  ``index_select`` of uniformly shuffled starts (rows).
* ``tensordataset`` (tabular): the same arrays behind ``DataLoader(TensorDataset, shuffle=True)``.
* ``ddbloader``: defaults; ``uniform`` (tabular: ``fetch_bytes=0``, the table read whole;
  windows: every group in the pool), as uniform a shuffle as the loop's; ``cache`` (``cache_bytes``
  holding every partition: epochs after the first from memory, the like-for-like of the loop).
  ``--against REV --against-only "ddbloader default"`` (the harness's) also times the defaults on
  commit REV's package, for regressions.

Figures: setup (load or constructor), first epoch, warm epoch (``samples_per_s``), a warm epoch's
CPU seconds (every thread, the engine's too), peak RSS; on ``windows``, ``series_per_batch``: the
median number of distinct groups in a batch of a (separate, untimed) epoch. Ratios: warm epoch
and end to end (setup + first epoch) against ``duckdb_torch``.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import harness

WORKLOADS = ("tabular", "windows")


def _path(p: dict[str, Any]) -> str:
    if p["workload"] == "tabular":
        return str(harness.tabular_db(p["rows"], 32))
    return str(harness.groups_db(p["groups"], p["rows"], 16, "FLOAT"))


def _arrays(p: dict[str, Any]) -> tuple[Any, Any, Any]:
    """x, y and the sample starts of the workload, read whole into numpy."""
    import duckdb
    import numpy as np

    tabular = p["workload"] == "tabular"
    with duckdb.connect(_path(p), read_only=True) as con:
        table = con.sql("SELECT * FROM tab ORDER BY id" if tabular else "SELECT * FROM t ORDER BY g, pos")
        table = table.to_arrow_table()
    names = [f"f{j}" for j in range(1, 32)] if tabular else [f"f{j}" for j in range(16)]
    x = np.stack([table.column(c).to_numpy() for c in names], axis=1)
    y = table.column("f0" if tabular else "target").to_numpy()
    if tabular:
        return x, y, np.arange(len(x))
    w, rows = p["window"], p["rows"]
    return x, y, (np.arange(p["groups"])[:, None] * rows + np.arange(rows - w)[None, :]).ravel()


def loop(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    def load() -> Callable[[], Iterator[Any]]:
        x, y, starts = _arrays(p)
        batch, w, seeds = p["batch"], p["window"], iter(range(1 << 30))
        row_bytes = x.shape[1] * x.itemsize
        # One void item per window start: a window is one memcpy.
        blocks = np.ndarray(
            (len(x) - w + 1,), np.dtype((np.void, w * row_bytes)), buffer=x, strides=(row_bytes,)
        )

        def batches() -> Iterator[Any]:
            order = starts[np.random.default_rng(next(seeds)).permutation(len(starts))]
            for at in range(0, len(order), batch):
                index = order[at : at + batch]
                if p["workload"] == "tabular":
                    yield torch.from_numpy(x.take(index, 0)), torch.from_numpy(y.take(index))
                else:
                    bx = blocks[index].view(x.dtype).reshape(-1, w, x.shape[1])
                    yield torch.from_numpy(bx), torch.from_numpy(y.take(index + w))

        return batches

    row = harness.passes(load, p["epochs"])
    if p["workload"] == "windows":  # the first epoch's permutation of starts, grouped
        order = np.random.default_rng(0).permutation(p["groups"] * (p["rows"] - p["window"]))
        row["series_per_batch"] = _series_per_batch(
            np.split(order // (p["rows"] - p["window"]), range(p["batch"], len(order), p["batch"]))
        )
    return row


def _series_per_batch(groups: Any) -> float:
    """Median distinct groups per batch; ``groups`` is a list of per-batch group ids."""
    import numpy as np

    return float(np.median([len(np.unique(np.asarray(g))) for g in groups]))


def duckdb_torch(p: dict[str, Any]) -> dict[str, Any]:
    import duckdb
    import torch as pt

    tabular, batch, w = p["workload"] == "tabular", p["batch"], p["window"]
    names = [f"f{j}" for j in range(1, 32)] if tabular else [f"f{j}" for j in range(16)]

    def load() -> Callable[[], Iterator[Any]]:
        sql = "SELECT * FROM tab ORDER BY id" if tabular else "SELECT * FROM t ORDER BY g, pos"
        with duckdb.connect(_path(p), read_only=True) as con:
            columns = con.sql(sql).torch()
        x = pt.stack([columns[c] for c in names], dim=1)
        y = columns["f0" if tabular else "target"]
        if tabular:
            starts, view = pt.arange(len(x)), x
        else:
            # every window a view; a window never crosses a group (starts stop w rows before its end)
            view = x.as_strided((len(x) - w + 1, w, x.shape[1]), (x.shape[1], x.shape[1], 1))
            rows = p["rows"]
            starts = (pt.arange(p["groups"])[:, None] * rows + pt.arange(rows - w)[None, :]).reshape(-1)
        seeds = iter(range(1 << 30))

        def batches() -> Iterator[Any]:
            order = starts[pt.randperm(len(starts), generator=pt.Generator().manual_seed(next(seeds)))]
            for at in range(0, len(order), batch):
                index = order[at : at + batch]
                yield view.index_select(0, index), y.index_select(0, index if tabular else index + w)

        return batches

    row = harness.passes(load, p["epochs"])
    if not tabular:  # the same permutation of starts, grouped: what a batch mixes
        rows = p["rows"] - w
        order = pt.randperm(p["groups"] * rows, generator=pt.Generator().manual_seed(0)) // rows
        row["series_per_batch"] = _series_per_batch(order.split(batch))
    return row


def tensordataset(p: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def load() -> DataLoader[Any]:
        x, y, _ = _arrays(p)
        return DataLoader(
            TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=p["batch"], shuffle=True
        )

    return harness.passes(load, p["epochs"])


def ddbloader(p: dict[str, Any]) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    warnings.simplefilter("ignore")
    options: dict[str, Any] = {"batch_size": p["batch"], "shuffle": True, "seed": 0}
    tabular = p["workload"] == "tabular"
    if p.get("label") == "uniform":
        options |= {"fetch_bytes": 0} if tabular else {"group_pool_size": p["groups"]}
    if p.get("label") == "cache":
        options["cache_bytes"] = 4 * 2**30
    path = _path(p)
    if tabular:
        return harness.passes(
            lambda: DDBDataLoader(
                path, "SELECT * FROM tab ORDER BY id", "f0", exclude_col=["id", "f0"], **options
            ),
            p["epochs"],
        )
    sql = "SELECT * FROM t ORDER BY g, pos"
    options |= {"group_col": "g", "window_size": p["window"], "exclude_col": ["g", "pos", "target"]}
    row = harness.passes(lambda: DDBDataLoader(path, sql, "target", **options), p["epochs"])
    with DDBDataLoader(path, sql, "target", key_col=["g"], **options) as keyed:
        row["series_per_batch"] = _series_per_batch([batch[2]["g"] for batch in keyed])
    return row


def _end_to_end(row: dict[str, Any]) -> float:
    return float(row["setup_s"] + row["first_epoch_s"])


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: tabular, windows")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per contender (the first is cold)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    shapes = {
        "tabular": {"rows": 2_000 if args.smoke else 2_000_000, "batch": 1024},
        "windows": {"groups": 4 if args.smoke else 200, "rows": 200 if args.smoke else 5_000, "batch": 256},
    }
    rows, ratios, params = [], {}, {}
    for workload in args.workloads.split(","):
        p = {"workload": workload, "window": 8 if args.smoke else 32, **shapes[workload]}
        p["epochs"] = 2 if args.smoke else args.epochs
        params[workload] = p
        _path(p)
        todo = [("loop", {**p, "label": workload}), ("duckdb_torch", {**p, "label": workload})]
        if workload == "tabular":
            todo.append(("tensordataset", {**p, "label": workload}))
        todo += [("ddbloader", {**p, "label": label}) for label in ("default", "uniform", "cache")]
        results = harness.interleaved(args.script, todo, args.rounds)
        for row in results:
            row["contender"] = f"{workload}: {row['contender'].replace(f' {workload}', '')}"
        rows += results
        peer = results[1]  # DuckDB's .torch() + loop: what a user picks when the table fits in RAM
        for row in [results[0], *results[2:]]:
            ratios[f"{row['contender']} warm epoch / duckdb_torch's"] = row["warm_s"] / peer["warm_s"]
            ratios[f"{row['contender']} end to end / duckdb_torch's"] = _end_to_end(row) / _end_to_end(peer)
    return {"params": params, "rows": rows, "ratios": ratios}


if __name__ == "__main__":
    harness.main(
        __doc__,
        {"loop": loop, "duckdb_torch": duckdb_torch, "tensordataset": tensordataset, "ddbloader": ddbloader},
        run,
        arguments,
    )
