"""The benchmarks' shared harness: data, child-process timing, machine facts, results files.

A benchmark script imports this module and ddbloader's public API, nothing else of the repository.
It names its contenders (functions ``params -> dict``) and one ``run(args)`` that asks
:func:`interleaved` to run them; :func:`main` does the rest::

    python benchmarks/NAME.py            # full size -> benchmarks/results/NAME.json and .csv
    python benchmarks/NAME.py --smoke    # tiny shape, one round, seconds -> a scratch directory
    python benchmarks/NAME.py --against 95b8d61   # each contender also on that commit's ddbloader

Every contender runs in a fresh interpreter (``NAME.py --child CONTENDER --params JSON``), so its
peak RSS (VmHWM), CPU seconds and imports are its own; the contenders of one round run one after
the other, the order reversed every other round, and a table shows per-contender medians over
the rounds. The data live in DuckDB files under ``benchmarks/_work/`` (git-ignored), made once
per shape. A results file carries the date, the commit, the machine (CPU count, RAM, load,
versions) and whether it was a smoke run; ``render.py`` turns the results files into
``docs/benchmarks.md``.

``--against REV`` runs every contender (or those of ``--against-only``) a second time per round,
in the same interleaved order, with the ddbloader of commit REV (a ``git worktree`` of it under
``benchmarks/_work/``, made once, on the child's ``PYTHONPATH``); the contender code stays this
checkout's. Rows are labelled by commit (``@abc1234``) and the report gains, per contender, the
ratios REV / this checkout of its times.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / "_work"
RESULTS = HERE / "results"
MARKER = "BENCH-JSON:"
CHILD_TIMEOUT_S = 1800

#: the environment variable naming the directory whose ddbloader a benchmark process imports
PACKAGE_ROOT = "BENCH_DDBLOADER_ROOT"
# A benchmark measures the checkout it lives in (or the commit --against names), not whichever
# ddbloader is installed.
sys.path.insert(0, os.environ.get(PACKAGE_ROOT, str(REPO)))

Contender = Callable[[dict[str, Any]], dict[str, Any]]
#: the contenders :func:`interleaved` calls in this process (a smoke run), else empty
_IN_PROCESS: dict[str, Contender] = {}
#: with ``--against``: the commit's label, its worktree and the contenders run on it (None: all)
_AGAINST: dict[str, Any] = {}
#: with ``--against``: (this checkout's row, the commit's row) per contender run on both
_PAIRS: list[tuple[dict[str, Any], dict[str, Any]]] = []
#: the times whose ratio (commit / this checkout) the report gives per pair
TIMES = ("setup_s", "first_epoch_s", "warm_s", "warm_cpu_s", "end_to_end_s", "loop_s")


# ------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Series:
    """The standard windows shape: ``symbols`` series of ``days`` x ``rows`` rows of float64
    ``factors`` and a ``target`` (table ``bench(symbol, ts, f0.., target)``, stored in order)."""

    symbols: int
    days: int
    rows: int
    factors: int

    @property
    def total_rows(self) -> int:
        return self.symbols * self.days * self.rows

    def windows(self, window: int) -> int:
        """Samples of one epoch with windows ``window -> 1`` running across days."""
        return self.symbols * max(self.days * self.rows - window, 0)

    @property
    def factor_names(self) -> list[str]:
        return [f"f{i}" for i in range(self.factors)]

    @property
    def sql(self) -> str:
        return f"SELECT symbol, ts, {', '.join(self.factor_names)}, target FROM bench ORDER BY ts"

    def loader_args(self, window: int, batch: int = 64) -> dict[str, Any]:
        """The standard loader's arguments after the source: by symbol, repartitioned by day."""
        return {
            "sql": self.sql,
            "target_col": "target",
            "batch_size": batch,
            "shuffle": True,
            "window_size": window,
            "group_col": "symbol",
            "repartition_col": "CAST(ts AS DATE)",
            "exclude_col": ["symbol", "ts", "target"],
            "seed": 0,
        }


#: issue 3's default shape: 10 symbols x 5 days x 2,000 rows x 100 factors (100,000 rows)
SERIES = Series(10, 5, 2000, 100)
SERIES_SMOKE = Series(2, 2, 200, 4)


def duckdb_file(name: str, create: str) -> Path:
    """A DuckDB file under ``WORK`` made once by the statements ``create``; its path."""
    import duckdb

    path = WORK / f"{name}.duckdb"
    if path.exists():
        return path
    WORK.mkdir(parents=True, exist_ok=True)
    # A unique partial name: two smoke runs at once must not write one file.
    partial = Path(tempfile.mkstemp(dir=WORK, suffix=".partial")[1])
    partial.unlink()
    with duckdb.connect(str(partial)) as con:
        con.execute("SELECT setseed(0.25)")
        con.execute(create)
    with contextlib.suppress(FileExistsError):
        os.link(partial, path)
    partial.unlink()
    return path


def series_db(shape: Series) -> Path:
    """The DuckDB file of ``shape`` (table ``bench``), made on first use."""
    factors = ", ".join(f"random() AS f{i}" for i in range(shape.factors))
    return duckdb_file(
        f"series_S{shape.symbols}_D{shape.days}_R{shape.rows}_F{shape.factors}",
        f"""CREATE TABLE bench AS
            SELECT 'S' || lpad(s::VARCHAR, 4, '0') AS symbol,
                   TIMESTAMP '2024-01-01' + to_days(d::INTEGER) + to_microseconds(r * 1000000) AS ts,
                   {factors}, random() AS target
            FROM range({shape.symbols}) a(s), range({shape.days}) b(d), range({shape.rows}) c(r)
            ORDER BY symbol, ts""",
    )


def tabular_db(rows: int, columns: int) -> Path:
    """``rows`` x ``columns`` float32 ``f0..`` and an ``id`` in table ``tab``, stored by ``id``."""
    values = ", ".join(f"random()::FLOAT AS f{i}" for i in range(columns))
    return duckdb_file(
        f"tabular_{rows}x{columns}", f"CREATE TABLE tab AS SELECT range AS id, {values} FROM range({rows})"
    )


def groups_db(groups: int, rows: int, factors: int = 8, dtype: str = "DOUBLE") -> Path:
    """``groups`` series of ``rows`` rows in table ``t(g, pos, f0.., target)`` of ``dtype``, stored
    in random order with no index: the scale shapes (few big groups against many small ones)."""
    values = ", ".join(f"random()::{dtype} AS f{i}" for i in range(factors))
    return duckdb_file(
        f"groups_{groups}x{rows}x{factors}_{dtype}",
        f"""CREATE TABLE t AS
            SELECT (range // {rows})::INTEGER AS g, (range % {rows})::INTEGER AS pos, {values},
                   random()::{dtype} AS target
            FROM range({groups * rows}) ORDER BY random()""",
    )


# ------------------------------------------------------------------------------------- measuring


def cpu_s() -> float:
    """CPU seconds of this process (every thread) and of the children it has reaped."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """Peak RSS of one process's own address space (VmHWM, reset by exec), in MB."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def epoch(batches: Iterable[Any]) -> dict[str, Any]:
    """Consume ``batches`` (each ``x``, ``(x, ...)`` or a count of samples), counting samples
    only: wall, first batch, CPU seconds and samples of the pass."""
    cpu0, started = cpu_s(), time.perf_counter()
    first: float | None = None
    samples = 0
    for batch in batches:
        if first is None:
            first = time.perf_counter() - started
        if isinstance(batch, int):
            samples += batch
        else:
            samples += int((batch[0] if isinstance(batch, tuple | list) else batch).shape[0])
    wall = time.perf_counter() - started
    return {"wall_s": wall, "first_batch_s": first, "cpu_s": cpu_s() - cpu0, "samples": samples}


def passes(
    setup: Callable[[], Any], epochs: int, extra: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Time ``setup()`` (returning something iterable: a loader, a DataLoader, a generator
    factory), then ``epochs`` passes over it: setup, the first pass (cold) and the median of the
    later ones (warm), CPU seconds of a warm pass, samples per pass, peak RSS, and ``extra(made)``
    taken after the last pass. Closes what it made."""
    cpu0, started = cpu_s(), time.perf_counter()
    made = setup()
    setup_s, setup_cpu = time.perf_counter() - started, cpu_s() - cpu0
    try:
        runs = [epoch(made() if callable(made) else made) for _ in range(epochs)]
        more = extra(made) if extra is not None else {}
    finally:
        if hasattr(made, "close"):
            made.close()
    warm = sorted(runs[1:] or runs, key=lambda e: e["wall_s"])[len(runs[1:] or runs) // 2]
    if len({e["samples"] for e in runs}) != 1:
        raise AssertionError(f"epochs served {[e['samples'] for e in runs]} samples")
    return {
        "setup_s": setup_s,
        "setup_cpu_s": setup_cpu,
        "first_batch_s": setup_s + (runs[0]["first_batch_s"] or 0.0),
        "first_epoch_s": runs[0]["wall_s"],
        "warm_s": warm["wall_s"],
        "warm_cpu_s": warm["cpu_s"],
        "samples": warm["samples"],
        "samples_per_s": warm["samples"] / warm["wall_s"] if warm["wall_s"] else None,
        "peak_rss_mb": peak_rss_mb(),
        **more,
    }


def child(
    script: str, name: str, params: dict[str, Any], timeout: float = CHILD_TIMEOUT_S, root: Path = REPO
) -> dict[str, Any]:
    """Run contender ``name`` of ``script`` in a fresh interpreter importing the ddbloader under
    ``root`` (this checkout, or a commit's worktree); the dict it returned.

    Raises:
        RuntimeError: the child failed or printed no result (its stderr's end in the message).
    """
    command = [sys.executable, script, "--child", name, "--params", json.dumps(params)]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, PACKAGE_ROOT: str(root)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode or not lines:
        raise RuntimeError(f"{Path(script).stem} {name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(MARKER) :])
    return result


def interleaved(
    script: str, contenders: Iterable[tuple[str, dict[str, Any]]], rounds: int
) -> list[dict[str, Any]]:
    """Run every (contender, params) once per round, each in its own interpreter, the order
    reversed every other round; one row per contender: the medians of its numeric results over
    the rounds and ``rounds``. A smoke run without ``--fresh`` calls the contenders in this
    process (its figures mean nothing; the code paths are the same).

    With ``--against`` the contenders it names run on the commit too, each right after its run
    on this checkout; the rows returned are this checkout's only (a script's own ratios stay
    what they were), the commit's are added to the report by :func:`main`."""
    against: Path | None = _AGAINST.get("root")
    only = _AGAINST.get("only")
    todo = [(n, p, REPO) for n, p in contenders]
    todo = [t for n, p, root in todo for t in [(n, p, root)] + [(n, p, against)] * _on_both(n, p, only)]
    runs: dict[tuple[str, Path], list[dict[str, Any]]] = {(label(n, p), root): [] for n, p, root in todo}
    for r in range(rounds):
        for name, params, root in todo if r % 2 == 0 else todo[::-1]:
            result = _IN_PROCESS[name](params) if _IN_PROCESS else child(script, name, params, root=root)
            runs[label(name, params), root].append(result)
            where = label(name, params) + ("" if root == REPO else f" @{_AGAINST['rev']}")
            print(f"  round {r + 1} {where}: {_brief(result)}", file=sys.stderr, flush=True)
    rows = {key: {"contender": key[0], **medians(results)} for key, results in runs.items()}
    mine = [row for (_, root), row in rows.items() if root == REPO]
    _PAIRS.extend((row, rows[key]) for row in mine if (key := (row["contender"], against)) in rows)
    return mine


def _on_both(name: str, params: dict[str, Any], only: set[str] | None) -> bool:
    return bool(_AGAINST) and (only is None or bool({name, label(name, params)} & only))


def worktree(rev: str) -> tuple[str, Path]:
    """The short hash of commit ``rev`` and a worktree of it under ``WORK`` (made once)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    short = git("rev-parse", "--short", f"{rev}^{{commit}}")
    root = WORK / f"rev-{short}"
    if not (root / "ddbloader").is_dir():
        WORK.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--force", "--detach", str(root), short)
    return short, root


def _against(report: dict[str, Any]) -> None:
    """Add the commit's rows (after this checkout's, each labelled by commit) and their ratios."""
    here = machine()["commit"]
    if here == _AGAINST["rev"]:  # against its own commit: the labels must still differ
        here += " (this checkout)"
    ratios = report.setdefault("ratios", {})
    for mine, theirs in _PAIRS:
        theirs["contender"] = f"{mine['contender']} @{_AGAINST['rev']}"
        mine["contender"] = f"{mine['contender']} @{here}"
        for key in TIMES:
            if all(isinstance(row.get(key), int | float) for row in (mine, theirs)) and mine[key]:
                ratios[f"{theirs['contender']} / {mine['contender']}: {key}"] = theirs[key] / mine[key]
    report["rows"] = report.get("rows", []) + [theirs for _, theirs in _PAIRS]
    report["against"] = _AGAINST["rev"]


def label(name: str, params: dict[str, Any]) -> str:
    """A contender's name in a table: its name, then its ``label`` parameter if it has one."""
    return f"{name} {params['label']}" if "label" in params else name


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key: the median of numbers over ``results``, else the first value (equal by design)."""
    row: dict[str, Any] = {}
    for key in results[0]:
        values = [r.get(key) for r in results]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        row[key] = statistics.median(numbers) if len(numbers) == len(values) else values[0]
    row["rounds"] = len(results)
    return row


def _brief(result: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in result.items() if isinstance(v, float))


@contextlib.contextmanager
def server(kind: str) -> Iterator[str | None]:
    """A ``"postgresql"`` or ``"spark"`` server's URI: the one named by ``BENCH_POSTGRESQL_URI`` /
    ``BENCH_SPARK_URI`` (the test suite's), else a throwaway one from the test suite's helpers, or
    None (after saying why on stderr) where the server is not installed here. PostgreSQL yields a
    fresh database of its own, dropped afterwards."""
    given = os.environ.get(f"BENCH_{kind.upper()}_URI")
    if given:
        running = None
    else:
        sys.path.insert(0, str(REPO / "tests"))
        import pgserver
        import pytest
        import sparkserver

        try:
            running = pgserver.start() if kind == "postgresql" else sparkserver.start()
        except pytest.skip.Exception as missing:
            print(f"{kind} skipped: {missing}", file=sys.stderr)
            yield None
            return
    uri: str = given or running.uri
    try:
        if kind != "postgresql":
            yield uri
            return
        from adbc_driver_postgresql import dbapi

        database = f"ddb_bench_{os.getpid()}"
        with dbapi.connect(uri, autocommit=True) as admin, admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {database}")
        try:
            yield uri.rsplit("/", 1)[0] + "/" + database
        finally:
            with dbapi.connect(uri, autocommit=True) as admin, admin.cursor() as cursor:
                cursor.execute(f"DROP DATABASE {database} WITH (FORCE)")
    finally:
        if running is not None:
            running.stop()


@contextlib.contextmanager
def loaded(engine: str, name: str, table: Any) -> Iterator[str | None]:
    """A source URI of ``engine`` (``"postgresql"`` or ``"chdb"``) holding the Arrow ``table`` as
    ``name`` (analysed), dropped afterwards; None where PostgreSQL is not installed (see
    :func:`server`)."""
    if engine == "postgresql":
        from adbc_driver_postgresql import dbapi

        with server("postgresql") as uri:
            if uri is not None:
                with dbapi.connect(uri, autocommit=True) as admin, admin.cursor() as cursor:
                    cursor.adbc_ingest(name, table, mode="create")
                    cursor.execute(f"ANALYZE {name}")
            yield uri
        return
    from adbc_driver_chdb import dbapi as chdb

    directory = tempfile.mkdtemp(prefix="ddbloader-chdb-")
    try:
        with chdb.connect(f"chdb://{directory}") as admin, admin.cursor() as cursor:
            cursor.adbc_ingest(name, table, mode="create")
        yield f"chdb://{directory}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -------------------------------------------------------------------------------------- results


def machine() -> dict[str, Any]:
    """CPU count, RAM, load, versions and the commit: what a figure needs beside it."""
    import duckdb
    import pyarrow
    import torch

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "cpus": os.cpu_count(),
        "ram_gb": round(pages / 2**30, 1),
        "load_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "duckdb": duckdb.__version__,
        "pyarrow": pyarrow.__version__,
        "commit": git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain") else ""),
    }


def write(name: str, question: str, report: dict[str, Any], out: Path, smoke: bool) -> Path:
    """Write ``out/NAME.json`` (the report with date, machine, smoke) and ``out/NAME.csv`` (its
    rows); returns the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "question": question,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "smoke": smoke,
        "machine": machine(),
        **report,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    rows = report.get("rows", [])
    with open(out / f"{name}.csv", "w", newline="") as f:
        keys = list(dict.fromkeys(k for row in rows for k in row))
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)
    return path


def main(
    doc: str,
    contenders: Mapping[str, Contender],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """A benchmark script's entry point.

    ``doc`` is the script's docstring (its first line is the question it answers); ``run(args)``
    returns ``{"params": ..., "rows": [...]}`` plus anything else worth keeping (``ratios``,
    ``notes``); ``args.smoke`` and ``args.rounds`` say how big, ``args.script`` is the script's
    path (for :func:`interleaved`); ``arguments`` adds the script's own options. ``--child`` runs
    one contender and prints its result.
    """
    caller = sys.argv[0]
    name = Path(caller).stem
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shape, one round: seconds (CI runs it)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; smoke 1)")
    parser.add_argument(
        "--out", type=Path, default=None, help="results directory (default benchmarks/results)"
    )
    parser.add_argument("--fresh", action="store_true", help="with --smoke: contenders in child processes")
    parser.add_argument("--against", metavar="REV", help="run the contenders on commit REV too, interleaved")
    parser.add_argument(
        "--against-only",
        metavar="NAMES",
        help="with --against: only these contenders (names or labels, comma-separated)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args()
    args.script = caller
    if args.child:
        print(MARKER + json.dumps(contenders[args.child](json.loads(args.params)), default=str), flush=True)
        return
    args.rounds = args.rounds or (1 if args.smoke else 3)
    if args.against:
        rev, root = worktree(args.against)
        only = set(args.against_only.split(",")) if args.against_only else None
        _AGAINST.update(rev=rev, root=root, only=only)
    elif args.smoke and not args.fresh:  # two commits need two interpreters
        _IN_PROCESS.update(contenders)
    out = args.out or (WORK / "smoke" if args.smoke else RESULTS)
    report = run(args)
    if args.against:
        _against(report)
    path = write(name, doc.strip().splitlines()[0], report, out, args.smoke)
    print(f"{name}: {len(report.get('rows', []))} rows -> {path}", flush=True)
