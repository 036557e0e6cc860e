"""What does a time split read and cost, against the whole query?

Usage::

    python benchmarks/splits.py                  # harness.SERIES on DuckDB; 3 rounds
    python benchmarks/splits.py --smoke

On ``harness.SERIES`` (window 50, batch 64, shuffled, by symbol, repartitioned by day), each
contender builds a loader and runs ``--epochs`` epochs in its own interpreter, interleaved: the
whole query, and its training, validation and test splits cut at 60% and 80% of each series
(``DDBDataLoader.split``'s ranges). ``rows`` is what the plan reads per epoch (every fetch is
checked against it), ``samples`` what an epoch serves; ``build`` the constructor (planning: a
split adds one query checking that ``ts`` never decreases along a series, one finding the
look-back, and counts of the narrowed query), ``epoch`` a warm epoch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
import warnings
from typing import Any

import harness

SPLITS = ("whole", "train", "validation", "test")


def loader(p: dict[str, Any]) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    shape = harness.Series(*p["shape"])
    warnings.simplefilter("ignore")
    cut = [dt.datetime.fromisoformat(c) for c in p["at"]]
    bounds = {"train": (None, cut[0]), "validation": (cut[0], cut[1]), "test": (cut[1], None)}
    split = {} if p["split"] == "whole" else {"split_col": "ts", "split_range": bounds[p["split"]]}
    cpu0, started = harness.cpu_s(), time.perf_counter()
    built = DDBDataLoader(p["source"], **shape.loader_args(p["window"]), **split)
    build_s, build_cpu = time.perf_counter() - started, harness.cpu_s() - cpu0
    with built:
        rows = built.plan.rows
        epochs = [harness.epoch(built) for _ in range(p["epochs"])]
    warm = sorted(epochs[1:] or epochs, key=lambda e: e["wall_s"])[len(epochs[1:] or epochs) // 2]
    return {
        "rows": rows,
        "samples": warm["samples"],
        "build_s": build_s,
        "build_cpu_s": build_cpu,
        "epoch_s": warm["wall_s"],
        "epoch_cpu_s": warm["cpu_s"],
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, default=3, help="epochs per loader (the first is cold)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = harness.SERIES_SMOKE if args.smoke else harness.SERIES
    # the ts of the series' rows at 60% and 80% (harness.series_db: one day per `rows` seconds)
    rows = [int(shape.days * shape.rows * share) for share in (0.6, 0.8)]
    first = dt.datetime(2024, 1, 1)
    at = [(first + dt.timedelta(days=n // shape.rows, seconds=n % shape.rows)).isoformat() for n in rows]
    params: dict[str, Any] = {"shape": [shape.symbols, shape.days, shape.rows, shape.factors], "at": at}
    params |= {"window": 8 if args.smoke else 50, "epochs": 2 if args.smoke else args.epochs}
    source = str(harness.series_db(shape))
    todo = [("loader", {**params, "source": source, "split": s, "label": s}) for s in SPLITS]
    results = harness.interleaved(args.script, todo, args.rounds)
    whole, parts = results[0], results[1:]
    if sum(r["samples"] for r in parts) > whole["samples"]:
        raise AssertionError("the splits served more samples than the whole query")
    ratios: dict[str, Any] = {}
    for row, name in zip(parts, SPLITS[1:], strict=True):
        ratios[f"{name} rows / whole"] = row["rows"] / whole["rows"]
        ratios[f"{name} epoch / whole"] = row["epoch_s"] / whole["epoch_s"] if whole["epoch_s"] else None
        ratios[f"{name} build / whole"] = row["build_s"] / whole["build_s"] if whole["build_s"] else None
    return {"params": params, "rows": results, "ratios": ratios}


if __name__ == "__main__":
    harness.main(__doc__, {"loader": loader}, run, arguments)
