"""What does the content fingerprint (``verify=True``) cost, per engine?

Usage::

    python benchmarks/fingerprint.py                          # DuckDB, PostgreSQL, chDB; 5 rounds
    python benchmarks/fingerprint.py --engines duckdb --rounds 7
    python benchmarks/fingerprint.py --smoke

A fingerprint per partition is its row count plus the sum (mod 2**64) of an engine hash of every
row: planning computes it in the grouped count query, each fetch adds one hashed column that the
client sums and drops. On ``harness.SERIES`` (window 50, batch 64, shuffled; DuckDB reads its
file, PostgreSQL a throwaway server from ``tests/pgserver.py``, chDB a temporary directory, both
loaded with the same rows), each contender builds the loader and runs ``--epochs`` epochs in
its own interpreter, with and without ``verify=True``, interleaved. ``build`` is the
constructor; ``epoch`` a warm epoch; CPU seconds are the client process's (PostgreSQL hashes in
its own process, so there the walls carry the cost; chDB hashes in the client's).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any

import harness

ENGINES = ("duckdb", "postgresql", "chdb")


def loader(p: dict[str, Any]) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    shape = harness.Series(*p["shape"])
    warnings.simplefilter("ignore")  # chDB and ADBC warn about their own settings
    cpu0, started = harness.cpu_s(), time.perf_counter()
    built = DDBDataLoader(p["source"], **shape.loader_args(p["window"]), verify=p["verify"])
    build_s, build_cpu = time.perf_counter() - started, harness.cpu_s() - cpu0
    with built:
        epochs = [harness.epoch(built) for _ in range(p["epochs"])]
    warm = sorted(epochs[1:] or epochs, key=lambda e: e["wall_s"])[len(epochs[1:] or epochs) // 2]
    if warm["samples"] != shape.windows(p["window"]):
        raise AssertionError(f"{warm['samples']} windows, not {shape.windows(p['window'])}")
    return {
        "build_s": build_s,
        "build_cpu_s": build_cpu,
        "epoch_s": warm["wall_s"],
        "epoch_cpu_s": warm["cpu_s"],
    }


@contextlib.contextmanager
def _source(engine: str, shape: harness.Series) -> Iterator[str | None]:
    """The engine's source URI holding ``shape``'s table ``bench``, or None where it is missing."""
    path = harness.series_db(shape)
    if engine == "duckdb":
        yield str(path)
        return
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        table = con.sql("SELECT * FROM bench").to_arrow_table()
    with harness.loaded(engine, "bench", table) as uri:
        yield uri


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES)
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs per loader (the first is cold)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = harness.SERIES_SMOKE if args.smoke else harness.SERIES
    params: dict[str, Any] = {"shape": [shape.symbols, shape.days, shape.rows, shape.factors]}
    params |= {"window": 8 if args.smoke else 50, "epochs": 2 if args.smoke else args.epochs}
    rows, ratios, skipped = [], {}, []
    for engine in args.engines.split(","):
        with _source(engine, shape) as source:
            if source is None:
                skipped.append(engine)
                continue
            todo = [
                ("loader", {**params, "source": source, "verify": v, "label": f"{engine} verify={v}"})
                for v in (False, True)
            ]
            off, on = harness.interleaved(args.script, todo, args.rounds)
        rows += [off, on]
        for key in ("build_s", "build_cpu_s", "epoch_s", "epoch_cpu_s"):
            ratios[f"{engine} {key[:-2]} on / off"] = on[key] / off[key] if off[key] else None
    return {"params": params, "rows": rows, "ratios": ratios, "skipped": skipped}


if __name__ == "__main__":
    harness.main(__doc__, {"loader": loader}, run, arguments)
