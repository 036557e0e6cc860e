"""Batch digests: one SHA-256 per loader configuration, over every batch of two epochs.

Usage::

    python benchmarks/digests.py            # "name digest" lines, one per configuration
    python benchmarks/digests.py | diff benchmarks/digests.txt -   # no output: identical

``digests.txt`` holds the digests of the current code. They last changed, all of them, when
floating columns came out in ``torch.get_default_dtype()`` (float32) instead of float64: every
batch's bytes, and the fetch units and pieces cut from ``fetch_bytes`` by the halved row width
(before, when the windowed range pieces of a group of one subquery with a distinct order key were
combed: the five ``shuf-win*-streamed*``/``smallunits`` configurations).

The shuffled configurations of the default pool changed when ``group_pool_size=None`` came to
size the pool from the batch (``shuf-win5-pool3`` keeps the batches of DolphinDB's pool of 3,
the default before).

A refactoring of the epoch machinery must leave every digest as it was (the batches
bit-identical for a given seed): shuffle on and off, windows, repartitions, small and large
group pools, streamed partitions (a small ``fetch_bytes``), one query per partition
(``fetch_bytes=0``), the cache, DDP ranks with both ``even_batches``, DataLoader workers,
``drop_last``, ``key_col``, and a resume in the middle of an epoch (the batches after it).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from collections.abc import Iterable
from typing import Any

import duckdb
import numpy as np
import torch

from ddbloader import DDBDataLoader

SQL = "SELECT g, d, t, a, b, y FROM series ORDER BY g, d, t"


def make_table(con: duckdb.DuckDBPyConnection) -> None:
    """Groups of 1 to 4 days of 0 to 90 rows (many with one day, some shorter than a window)."""
    rng = np.random.default_rng(20261201)
    g, d, t = [], [], []
    for group in range(37):
        days = int(rng.integers(1, 5)) if group % 3 else 1
        for day in range(days):
            rows = int(rng.choice([0, 2, 7, 30, 90]))
            g += [group] * rows
            d += [day] * rows
            t += list(range(rows))
    n = len(g)
    data = {  # noqa: F841 -- read by name by DuckDB's replacement scan below
        "g": np.array(g, np.int32),
        "d": np.array(d, np.int32),
        "t": np.array(t, np.int64),
        "a": np.arange(n, dtype=np.float64),
        "b": rng.standard_normal(n).astype(np.float32),
        "y": np.arange(n, dtype=np.float64) * 0.5,
    }
    con.execute("CREATE TABLE series AS SELECT * FROM data")


BASE: dict[str, Any] = {
    "batch_size": 16,
    "input_col": ["a", "b"],
    "group_col": "g",
    "repartition_col": "d",
    "seed": 11,
    "timeout": 60.0,
}

#: name -> (loader arguments over BASE, how to run: plain / resume / workers)
CONFIGS: dict[str, tuple[dict[str, Any], str]] = {}


def _add(name: str, run: str = "plain", **kwargs: Any) -> None:
    CONFIGS[name] = (kwargs, run)


for _shuffle in (False, True):
    _s = "shuf" if _shuffle else "seq"
    _add(f"{_s}-rows", shuffle=_shuffle)
    _add(f"{_s}-rows-nogroup", shuffle=_shuffle, group_col=None, repartition_col=None)
    _add(f"{_s}-rows-norepart", shuffle=_shuffle, repartition_col=None)
    _add(f"{_s}-win5", shuffle=_shuffle, window_size=5)
    _add(f"{_s}-win4x2-stride3", shuffle=_shuffle, window_size=[4, 2], window_stride=3)
    _add(f"{_s}-win5-offset1", shuffle=_shuffle, window_size=[5, 1], offset=1)
    _add(f"{_s}-win5-norepart", shuffle=_shuffle, window_size=5, repartition_col=None)
    _add(f"{_s}-win12-prep1", shuffle=_shuffle, window_size=12, prepartition_num=1)
    _add(f"{_s}-win5-pool1", shuffle=_shuffle, window_size=5, group_pool_size=1)
    _add(f"{_s}-win5-pool3", shuffle=_shuffle, window_size=5, group_pool_size=3)
    _add(f"{_s}-win5-pool8", shuffle=_shuffle, window_size=5, group_pool_size=8)
    _add(f"{_s}-rows-pool12", shuffle=_shuffle, group_pool_size=12, batch_size=64)
    _add(f"{_s}-win3-streamed", shuffle=_shuffle, window_size=3, fetch_bytes=40 * 20)
    _add(f"{_s}-win3-streamed-pool8", shuffle=_shuffle, window_size=3, fetch_bytes=40 * 20, group_pool_size=8)
    _add(f"{_s}-win5-perpartition", shuffle=_shuffle, window_size=5, fetch_bytes=0)
    _add(f"{_s}-win5-smallunits", shuffle=_shuffle, window_size=5, fetch_bytes=2_000)
    _add(f"{_s}-win5-cache", shuffle=_shuffle, window_size=5, cache_bytes=1 << 26)
    _add(f"{_s}-win5-droplast", shuffle=_shuffle, window_size=5, drop_last=True, batch_size=24)
    _add(f"{_s}-win5-keys", shuffle=_shuffle, window_size=5, key_col=["g", "d", "t"])
    for _world in (2, 3):
        for _even in ("pad", "drop"):
            for _rank in range(_world):
                _add(
                    f"{_s}-win5-rank{_rank}of{_world}-{_even}",
                    shuffle=_shuffle,
                    window_size=5,
                    rank=_rank,
                    world_size=_world,
                    even_batches=_even,
                )
    _add(f"{_s}-win5-workers3", "workers", shuffle=_shuffle, window_size=5)
    for _at in (1, 7, 23):
        _add(f"{_s}-win5-resume{_at}", f"resume:{_at}", shuffle=_shuffle, window_size=5)
        _add(
            f"{_s}-win3-streamed-resume{_at}",
            f"resume:{_at}",
            shuffle=_shuffle,
            window_size=3,
            fetch_bytes=800,
        )
    _add(f"{_s}-rows-pool12-resume5", "resume:5", shuffle=_shuffle, group_pool_size=12, batch_size=64)
    _add(f"{_s}-win5-rank1of3-resume4", "resume:4", shuffle=_shuffle, window_size=5, rank=1, world_size=3)


def _digest(batches: Iterable[tuple[Any, ...]], into: Any) -> int:
    count = 0
    for batch in batches:
        count += 1
        for part in batch:
            if isinstance(part, torch.Tensor):
                into.update(str(tuple(part.shape)).encode() + str(part.dtype).encode())
                into.update(part.contiguous().numpy().tobytes())
            else:  # keys: a dict of column -> values
                for column, values in part.items():
                    into.update(
                        column.encode()
                        + repr(values.tolist() if hasattr(values, "tolist") else values).encode()
                    )
    return count


def digest(con: duckdb.DuckDBPyConnection, name: str) -> str:
    kwargs, run = CONFIGS[name]
    options = {**BASE, **kwargs}
    into = hashlib.sha256()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with DDBDataLoader(con, SQL, "y", **options) as loader:
            for epoch in range(2):
                if run == "workers":
                    for worker in range(3):
                        loader.set_epoch(epoch)
                        _digest(loader.iterate(worker, 3), into)
                    continue
                if run.startswith("resume:"):
                    at = int(run.split(":")[1])
                    loader.set_epoch(epoch)
                    iterator = iter(loader)
                    for _ in range(at):
                        next(iterator, None)
                    state = json.loads(json.dumps(loader.state_dict()))
                    with DDBDataLoader(con, SQL, "y", **options) as resumed:
                        resumed.load_state_dict(state)
                        _digest(resumed, into)
                    continue
                _digest(loader, into)
    return into.hexdigest()[:16]


def main(argv: list[str]) -> None:
    names = argv or list(CONFIGS)
    con = duckdb.connect()
    make_table(con)
    for name in names:
        print(name, digest(con, name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
