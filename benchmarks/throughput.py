"""How fast does ddbloader serve windows against export-and-memmap, the engine alone and RAM?

Usage::

    python benchmarks/throughput.py                  # issue 3's shape, 3 rounds
    python benchmarks/throughput.py --days 20        # 4x the days: peak RSS should not follow
    python benchmarks/throughput.py --smoke

The data: ``harness.SERIES`` (10 symbols x 5 days x 2,000 rows x 100 float64 factors and a
target, in a DuckDB file); every contender serves the same samples, per symbol x = rows
``[s, s+W)`` of the factors and y = row ``s+W`` of the target, windows across days, batch 64,
shuffled. Contenders (each in its own interpreter):

* ``ddbloader``: ``DDBDataLoader`` with default settings (and ``dtype=torch.float32``): the
  constructor, the first epoch, then warm epochs.
* ``traditional``: export per symbol-day to ``.npy``, a window index, a map-style Dataset over
  ``np.memmap`` (a window gathers from each day file it spans), ``DataLoader(num_workers=2)``.
* ``floor``: the loader's own subqueries (``loader.plan``) run to Arrow with ``fetch_threads``
  cursors and dropped: what the engine alone costs.
* ``inmemory``: the whole table as one tensor, windows by ``index_select`` over a strided view.
* ``gather``: the whole table in numpy, per batch one block copy per window on one core (numpy
  copies in the calling thread): the in-RAM floor the loader's warm epoch is held to.

``warm_s``, ``warm_cpu_s`` and ``samples_per_s`` (windows) are a warm epoch's; ``setup_s`` is the
constructor, the export and index, or the load; ``end_to_end_s`` is setup plus the first epoch.
Issue 3's targets: iteration >= 8x and end to end >= 9x the traditional pipeline, a warm epoch
<= 1.5x the floor, first batch from the constructor < 1 s; issue 43's: a warm epoch >= 0.8x the
one-core in-RAM block gather.
"""

from __future__ import annotations

import argparse
import bisect
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import harness


def _shape(p: dict[str, Any]) -> harness.Series:
    return harness.Series(*p["shape"])


def ddbloader(p: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ddbloader import DDBDataLoader

    shape = _shape(p)
    options: dict[str, Any] = {"dtype": torch.float32} if p.get("label") == "float32" else {}
    path = str(harness.series_db(shape))
    return _checked(
        harness.passes(lambda: DDBDataLoader(path, **shape.loader_args(p["window"]), **options), p["epochs"]),
        p,
    )


def _checked(row: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """``row`` with end to end (setup + first epoch), once its epochs served every window."""
    windows = _shape(p).windows(p["window"])
    if row["samples"] != windows:
        raise AssertionError(f"served {row['samples']} windows, not {windows}")
    return {**row, "end_to_end_s": row["setup_s"] + row["first_epoch_s"]}


class MemmapWindows:
    """Map-style dataset over per-day memmaps; a window gathers rows from each day file it spans.

    Files are memory-mapped lazily in whichever process (DataLoader worker) reads them.
    """

    def __init__(
        self, directory: Path, manifest: list[list[tuple[str, int]]], window: int, factors: int
    ) -> None:
        import numpy as np

        self.directory, self.window, self.factors = directory, window, factors
        self.files = [[name for name, _ in days] for days in manifest]
        self.bounds = [np.concatenate([[0], np.cumsum([r for _, r in days])]).tolist() for days in manifest]
        counts = [max(b[-1] - window, 0) for b in self.bounds]
        self.sym = np.repeat(np.arange(len(counts)), counts)
        self.start = np.concatenate([np.arange(c) for c in counts])
        self._maps: dict[tuple[int, int], Any] = {}

    def __len__(self) -> int:
        return len(self.start)

    def _map(self, sym: int, k: int) -> Any:
        import numpy as np

        if (sym, k) not in self._maps:
            self._maps[sym, k] = np.load(self.directory / self.files[sym][k], mmap_mode="r")
        return self._maps[sym, k]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import numpy as np
        import torch

        sym, row = int(self.sym[i]), int(self.start[i])
        bounds, stop = self.bounds[sym], row + self.window + 1
        k = bisect.bisect_right(bounds, row) - 1
        pieces = []
        while row < stop:
            end = min(stop, bounds[k + 1])
            pieces.append(self._map(sym, k)[row - bounds[k] : end - bounds[k]])
            row, k = end, k + 1
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return torch.from_numpy(np.array(rows[: self.window, : self.factors])), torch.from_numpy(
            np.array(rows[self.window :, self.factors :])
        )


def traditional(p: dict[str, Any]) -> dict[str, Any]:
    import duckdb
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    shape = _shape(p)
    path = harness.series_db(shape)
    columns = [*shape.factor_names, "target"]
    sql = f"SELECT {', '.join(columns)} FROM bench WHERE symbol = $1 AND CAST(ts AS DATE) = $2 ORDER BY ts"
    harness.WORK.mkdir(exist_ok=True)

    def export_and_index(directory: Path) -> DataLoader[Any]:
        manifest: dict[str, list[tuple[str, int]]] = {}
        with duckdb.connect(str(path), read_only=True) as con:
            cells = con.sql("SELECT DISTINCT symbol, CAST(ts AS DATE) d FROM bench ORDER BY ALL").fetchall()
            for symbol, day in cells:
                arrays = con.execute(sql, [symbol, day]).fetchnumpy()
                block = np.stack([np.asarray(arrays[c], dtype=np.float64) for c in columns], axis=1)
                name = f"{symbol}_{day.isoformat()}.npy"
                np.save(directory / name, block)
                manifest.setdefault(symbol, []).append((name, int(block.shape[0])))
        dataset = MemmapWindows(directory, list(manifest.values()), p["window"], shape.factors)
        # A map-style dataset needs only __len__ and __getitem__; torch's stubs want its base class.
        return DataLoader(
            cast(Any, dataset),
            batch_size=64,
            shuffle=True,
            num_workers=2,
            generator=torch.Generator().manual_seed(0),
        )

    with tempfile.TemporaryDirectory(dir=harness.WORK) as tmp:
        return _checked(harness.passes(lambda: export_and_index(Path(tmp)), p["epochs"]), p)


def floor(p: dict[str, Any]) -> dict[str, Any]:
    import duckdb

    from ddbloader import DDBDataLoader

    shape = _shape(p)
    path = str(harness.series_db(shape))
    with DDBDataLoader(path, **shape.loader_args(p["window"])) as loader:
        specs = [(q.sql, list(q.params)) for g in loader.plan.groups for q in g.partitions]
        threads = loader.config.fetch_threads

    def fetch_all(con: Any) -> Iterator[int]:
        todo, lock, rows = iter(specs), threading.Lock(), []

        def work(cursor: Any) -> None:
            while (spec := next(todo, None)) is not None:
                n = cursor.sql(spec[0], params=spec[1]).to_arrow_table().num_rows
                with lock:
                    rows.append(n)

        pool = [threading.Thread(target=work, args=(con.cursor(),)) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        # Rows, not windows, come out of the engine; count the windows they make for comparability.
        yield shape.windows(p["window"]) if sum(rows) == shape.total_rows else 0

    with duckdb.connect(path, read_only=True) as con:
        return _checked(harness.passes(lambda: lambda: fetch_all(con), p["epochs"]), p)


def _in_ram(shape: harness.Series, w: int) -> tuple[Any, Any, Any]:
    """The table read whole: x (rows x factors), y (rows) and every window's first row."""
    import duckdb
    import numpy as np

    with duckdb.connect(str(harness.series_db(shape)), read_only=True) as con:
        sql = f"SELECT {', '.join(shape.factor_names)}, target FROM bench ORDER BY symbol, ts"
        table = con.sql(sql).to_arrow_table()
    x = np.stack([table.column(c).to_numpy() for c in shape.factor_names], axis=1)
    per = shape.days * shape.rows
    starts = np.concatenate([s * per + np.arange(per - w) for s in range(shape.symbols)])
    return x, np.ascontiguousarray(table.column("target").to_numpy()), starts


def inmemory(p: dict[str, Any]) -> dict[str, Any]:
    import torch

    shape, w = _shape(p), p["window"]

    def load() -> Callable[[], Iterator[tuple[Any, Any]]]:
        x_rows, y_rows, first_rows = _in_ram(shape, w)
        x, y, starts = (
            torch.from_numpy(x_rows),
            torch.from_numpy(y_rows[:, None]),
            torch.from_numpy(first_rows),
        )
        n, f = x.shape[0], shape.factors
        x_windows = x.as_strided((n - w + 1, w, f), (f, f, 1))
        seeds = iter(range(1 << 30))

        def batches() -> Iterator[tuple[Any, Any]]:
            order = starts[torch.randperm(len(starts), generator=torch.Generator().manual_seed(next(seeds)))]
            for b in range(0, len(order), 64):
                index = order[b : b + 64]
                yield x_windows.index_select(0, index), y.index_select(0, index + w)

        return batches

    return _checked(harness.passes(load, p["epochs"]), p)


def gather(p: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    shape, w = _shape(p), p["window"]

    def load() -> Callable[[], Iterator[tuple[Any, Any]]]:
        x, y, starts = _in_ram(shape, w)
        row_bytes = x.shape[1] * x.itemsize
        # one void item per window start: a window is one memcpy
        blocks = np.ndarray(
            (len(x) - w + 1,), np.dtype((np.void, w * row_bytes)), buffer=x, strides=(row_bytes,)
        )
        seeds = iter(range(1 << 30))

        def batches() -> Iterator[tuple[Any, Any]]:
            order = starts[np.random.default_rng(next(seeds)).permutation(len(starts))]
            for b in range(0, len(order), 64):
                index = order[b : b + 64]
                bx = blocks[index].view(x.dtype).reshape(-1, w, x.shape[1])
                yield torch.from_numpy(bx), torch.from_numpy(y.take(index + w)[:, None])

        return batches

    return _checked(harness.passes(load, p["epochs"]), p)


CONTENDERS = {
    "ddbloader": ddbloader,
    "traditional": traditional,
    "floor": floor,
    "inmemory": inmemory,
    "gather": gather,
}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--days", type=int, default=harness.SERIES.days, help="days per symbol (default 5)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per contender (the first is cold)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = harness.SERIES_SMOKE if args.smoke else harness.Series(10, args.days, 2000, 100)
    params: dict[str, Any] = {
        "shape": [s.symbols, s.days, s.rows, s.factors],
        "window": 8 if args.smoke else 50,
    }
    params["epochs"] = 2 if args.smoke else args.epochs
    harness.series_db(s)
    todo = [
        ("ddbloader", params),
        ("ddbloader", {**params, "label": "float32"}),
        ("traditional", params),
        ("floor", params),
        ("inmemory", params),
        ("gather", params),
    ]
    rows = harness.interleaved(args.script, todo, args.rounds)
    by = {r["contender"]: r for r in rows}
    ddb, trad = by["ddbloader"], by["traditional"]
    ratios = {
        "iteration vs traditional (x, target >= 8)": ddb["samples_per_s"] / trad["samples_per_s"],
        "end to end vs traditional (x, target >= 9)": trad["end_to_end_s"] / ddb["end_to_end_s"],
        "warm epoch vs engine floor (x, target <= 1.5)": ddb["warm_s"] / by["floor"]["warm_s"],
        "in RAM vs ddbloader (x)": by["inmemory"]["samples_per_s"] / ddb["samples_per_s"],
        "warm epoch vs one-core in-RAM block gather (x, target >= 0.8)": ddb["samples_per_s"]
        / by["gather"]["samples_per_s"],
        "first batch from the constructor (s, target < 1)": ddb["first_batch_s"],
    }
    return {"params": params, "rows": rows, "ratios": ratios}


if __name__ == "__main__":
    harness.main(__doc__, CONTENDERS, run, arguments)
