"""The demo: a factor table in embedded DuckDB, a small forecaster trained through DDBDataLoader.

Run ``python -m ddbloader demo``. The table has DolphinDB's tutorial shape (symbols × days × rows ×
factors); the target is a noisy linear function of lagged factors, so the loss visibly falls.
"""

from __future__ import annotations

import argparse
import time

import duckdb
import torch
from tqdm import tqdm

from .loader import DDBDataLoader

__all__ = ["add_arguments", "build_factor_table", "main", "run"]


def build_factor_table(
    con: duckdb.DuckDBPyConnection, symbols: int, days: int, rows: int, factors: int
) -> None:
    """Create ``factors(symbol, ts, f0..f{F-1}, target)``: ``rows`` per symbol-day, 1 s apart.

    ``target`` at row t is ``0.6·f0[t-1] − 0.4·f1[t-2] + 0.2·f2[t-3]`` plus noise, within a symbol.
    The values are the same on every run: they are drawn in one DuckDB thread from a fixed seed.
    """
    columns = ", ".join(f"random() * 2 - 1 AS f{k}" for k in range(factors))
    # random() is reproducible after setseed only in one thread: each thread has its own generator
    (threads,) = con.execute("SELECT current_setting('threads')").fetchone() or (1,)
    con.execute("SET threads = 1")
    con.execute("SELECT setseed(0.42)")
    con.execute(
        f"""
        CREATE OR REPLACE TABLE raw AS
        SELECT 'S' || lpad(s::VARCHAR, 3, '0') AS symbol,
               TIMESTAMP '2024-01-01 09:30:00' + INTERVAL (d) DAY + INTERVAL (r) SECOND AS ts,
               {columns}
        FROM range({symbols}) s(s), range({days}) d(d), range({rows}) r(r)
        """
    )
    lagged = "OVER (PARTITION BY symbol ORDER BY ts)"
    con.execute(
        f"""
        CREATE OR REPLACE TABLE factors AS
        SELECT *, coalesce(0.6 * lag(f0, 1) {lagged} - 0.4 * lag(f1, 2) {lagged}
                           + 0.2 * lag(f2, 3) {lagged}, 0) + 0.05 * (random() - 0.5) AS target
        FROM raw
        """
    )
    con.execute("DROP TABLE raw")
    con.execute(f"SET threads = {int(threads)}")


class _Forecaster(torch.nn.Module):
    def __init__(self, window: int, features: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(window * features, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output: torch.Tensor = self.net(x)
        return output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (``python -m ddbloader --help`` lists them)."""
    parser.add_argument("--symbols", type=int, default=8, help="symbols (groups) in the table (default 8)")
    parser.add_argument("--days", type=int, default=5, help="days (repartitions) per symbol (default 5)")
    parser.add_argument("--rows", type=int, default=240, help="rows per symbol-day (default 240)")
    parser.add_argument("--factors", type=int, default=16, help="factor columns, the features (default 16)")
    parser.add_argument("--window", type=int, default=32, help="rows of x per sample (default 32)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loader and the model (default 0)")


def main(argv: list[str] | None = None) -> None:
    """``ddbloader-demo [options]``: parse the options and :func:`run` the demo."""
    parser = argparse.ArgumentParser(prog="ddbloader-demo", description=__doc__)
    add_arguments(parser)
    run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> float:
    """Build the table, train for ``args.steps`` steps, print windows/s and the loss; return the loss.

    The loss is the same on every run with the same options: the table, the batch order and the
    model's initial weights all follow ``args.seed``.
    """
    torch.manual_seed(args.seed)
    con = duckdb.connect()
    started = time.perf_counter()
    build_factor_table(con, args.symbols, args.days, args.rows, args.factors)
    print(
        f"factor table: {args.symbols} symbols × {args.days} days × {args.rows} rows × "
        f"{args.factors} factors ({time.perf_counter() - started:.2f} s)"
    )
    factor_names = [f"f{k}" for k in range(args.factors)]
    loader = DDBDataLoader(
        con,
        "SELECT * FROM factors ORDER BY symbol, ts",
        "target",
        batch_size=64,
        shuffle=True,
        window_size=args.window,
        input_col=factor_names,
        group_col="symbol",
        repartition_col="CAST(ts AS DATE)",
        seed=args.seed,
        dtype=torch.float32,
    )
    print(loader)
    model = _Forecaster(args.window, args.factors)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    windows = 0
    first_loss = last_loss = float("nan")
    started = time.perf_counter()
    with loader, tqdm(total=args.steps, desc="training", unit="step") as bar:
        while bar.n < args.steps:
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y[:, 0, :])
                optimiser.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimiser.step()
                windows += len(x)
                last_loss = loss.item()
                first_loss = last_loss if bar.n == 0 else first_loss
                bar.update()
                bar.set_postfix(loss=f"{last_loss:.4f}", epoch=loader.epoch - 1)
                if bar.n >= args.steps:
                    break
    elapsed = time.perf_counter() - started
    print(
        f"trained {args.steps} steps on {windows} windows in {elapsed:.2f} s: "
        f"{windows / elapsed:,.0f} windows/s; loss {first_loss:.4f} → {last_loss:.4f}"
    )
    return last_loss
