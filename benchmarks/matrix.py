"""Issue 27: float32 and float64, with and without ``key_col``, this checkout against another.

The default shape (10 symbols x 5 days x 2,000 rows x 100 factors, window 50, batch 64, shuffled;
``epochs.py``'s loader) in four configurations: ``dtype`` float64 (the columns' own) or float32,
and no ``key_col`` or ``key_col=["symbol", "ts"]``. Each configuration runs in a fresh interpreter,
once with this checkout and once with ``--before DIR`` (e.g. a ``git worktree`` of an older commit),
interleaved per round; the table gives per-round ratios' medians: a fresh loader's first epoch
(constructor to last batch), the warm epochs, and the process's peak RSS.

Usage::

    python benchmarks/matrix.py --before /tmp/base27 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MARKER = "MATRIX-JSON:"
CONFIGS = {
    "float64": {},
    "float32": {"dtype": "float32"},
    "float64 + key_col": {"key_col": ["symbol", "ts"]},
    "float32 + key_col": {"dtype": "float32", "key_col": ["symbol", "ts"]},
}
CHILD_TIMEOUT_S = 600


def child(config: str) -> dict[str, Any]:
    import epochs
    import torch

    import ddbloader  # noqa: F401  (the import is the process's, not the first epoch's)

    options: dict[str, Any] = dict(CONFIGS[config])
    if "dtype" in options:
        options["dtype"] = getattr(torch, options["dtype"])
    result = epochs._epochs(lambda: _XY(epochs._default_loader(**options)), 1 + epochs.WARM_EPOCHS, None)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


class _XY:
    """A loader whose batches are cut to ``(x, y)`` (``epochs._epochs`` unpacks two; ``key_col``
    adds a third element)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __enter__(self) -> _XY:
        self._loader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loader.__exit__(*exc)

    def __iter__(self) -> Any:
        return (batch[:2] for batch in self._loader)


def spawn(config: str, source: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--source", source]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"{config} from {source} failed (rc {done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    result: dict[str, Any] = json.loads(lines[-1][len(MARKER) :])
    return result


def _warm(result: dict[str, Any]) -> float:
    return float(statistics.median(result["walls_s"][1:]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--before", required=False, help="a checkout of the code to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, args.source)
        print(MARKER + json.dumps(child(args.child)), flush=True)
        return
    if not args.before:
        parser.error("--before DIR is required")
    import throughput

    throughput.ensure_data(throughput.Shape(10, 5, 2000, 100, 50))
    sources = {"this": str(HERE.parent), "before": args.before}
    ratios: dict[str, list[dict[str, float]]] = {config: [] for config in CONFIGS}
    warm: dict[str, list[float]] = {config: [] for config in CONFIGS}
    for r in range(args.rounds):
        for config in CONFIGS:
            order = list(sources) if r % 2 == 0 else list(reversed(sources))
            got = {name: spawn(config, sources[name]) for name in order}
            this, before = got["this"], got["before"]
            warm[config].append(_warm(this))
            ratios[config].append(
                {
                    "warm": _warm(this) / _warm(before),
                    "first": this["first_epoch_s"] / before["first_epoch_s"],
                    "first_over_warm": this["first_epoch_s"] / _warm(this),
                    "rss": this["peak_rss_mb"] / before["peak_rss_mb"],
                    "rss_mb": this["peak_rss_mb"],
                }
            )
            print(f"round {r + 1} {config}: {json.dumps(ratios[config][-1])}", file=sys.stderr, flush=True)
    print(f"## dtype and key_col against {args.before} (`benchmarks/matrix.py`, {args.rounds} rounds)\n")
    print(
        "| configuration | warm epoch s | warm ÷ before | first epoch ÷ before | first ÷ warm "
        "| peak RSS MB | RSS ÷ before |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for config, rows in ratios.items():

        def median(key: str, rows: list[dict[str, float]] = rows) -> float:
            return float(statistics.median(row[key] for row in rows))

        print(
            f"| {config} | {statistics.median(warm[config]):.3f} | {median('warm'):.2f}× "
            f"| {median('first'):.2f}× | {median('first_over_warm'):.2f}× | {median('rss_mb'):.0f} "
            f"| {median('rss'):.2f}× |"
        )


if __name__ == "__main__":
    main()
