"""Leaks and shutdown: start/stop cycles, KeyboardInterrupt, interpreter exit, thread names."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import SERIES_SQL, FaultyBackend, series_file
from reliability_support import (
    REPO,
    TESTS,
    BreakingBackend,
    duckdb_connections,
    loader_threads,
    open_files,
    rss_mb,
    settle,
    soak,
)

from ddbloader import DDBDataLoader
from ddbloader.backends import DuckDBBackend

pytestmark = pytest.mark.timeout(120)

THREAD_NAME = re.compile(r"ddbloader-(assemble|fetch-\d+)")
TINY = [[6, 5], [4, 7]]
KWARGS: dict[str, Any] = {
    "batch_size": 2,
    "window_size": 2,
    "input_col": ["f0"],
    "group_col": "gid",
    "repartition_col": "part",
    "shuffle": True,
    "seed": 5,
    "fetch_threads": 2,
    "prefetch_batch": 1,
}


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return series_file(tmp_path / "tiny.duckdb", TINY)


class Consumer(Exception):
    """What a training step raises."""


def _named_daemons() -> bool:
    threads = loader_threads()
    return bool(threads) and all(t.daemon and THREAD_NAME.fullmatch(t.name) for t in threads)


def _cycle(ending: str, loader: DDBDataLoader, path: Path, probe: duckdb.DuckDBPyConnection) -> None:
    """Start an epoch, take one batch, end it as ``ending`` says."""
    if ending == "break":
        for _ in loader:
            assert _named_daemons()
            break
    elif ending == "close":
        iterator = iter(loader)
        next(iterator)
        assert _named_daemons()
        iterator.close()
    elif ending == "loader-close":
        idle = duckdb_connections(probe)
        own = DDBDataLoader(str(path), SERIES_SQL, "y", **KWARGS)
        next(iter(own))
        assert duckdb_connections(probe) > idle, "the probe sees the loader's own connection"
        own.close()
    elif ending == "gc":
        # only the collector can reach an iterator caught in a reference cycle
        cycle: dict[str, Any] = {"iterator": iter(loader)}
        cycle["self"] = cycle
        next(cycle["iterator"])
        alive = weakref.ref(cycle["iterator"])
        del cycle
        gc.collect(1)
        if alive() is not None:  # promoted to the oldest generation meanwhile
            gc.collect()
        assert alive() is None
    elif ending == "exception":
        with pytest.raises(Consumer):
            for _ in loader:
                raise Consumer("training step failed")
    elif ending == "keyboard-interrupt":
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                raise KeyboardInterrupt
    else:
        raise AssertionError(ending)


ENDINGS = ["break", "close", "loader-close", "gc", "exception", "keyboard-interrupt"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_start_stop_cycles_leak_no_thread_connection_or_memory(
    database: Path, pytestconfig: pytest.Config
) -> None:
    cycles = 10_000 if soak(pytestconfig) else 1_000
    loader = DDBDataLoader(str(database), SERIES_SQL, "y", **KWARGS)
    probe = duckdb.connect(str(database), read_only=True)
    warm_up = 10 * len(ENDINGS)
    for n in range(warm_up):
        _cycle(ENDINGS[n % len(ENDINGS)], loader, database, probe)
        assert settle()
    gc.collect()
    threads, files, connections = threading.active_count(), open_files(), duckdb_connections(probe)
    assert connections == 2, "the shared loader's connection and the probe"
    rss_before = rss_mb()
    leaks: Counter[str] = Counter()
    started = time.monotonic()
    for n in range(cycles):
        ending = ENDINGS[n % len(ENDINGS)]
        _cycle(ending, loader, database, probe)
        if not settle():
            leaks[f"threads after {ending}"] += 1
        if threading.active_count() != threads:
            leaks[f"thread count after {ending}"] += 1
        if duckdb_connections(probe) != connections:
            leaks[f"DuckDB connections after {ending}"] += 1
    elapsed = time.monotonic() - started
    gc.collect()
    drift = rss_mb() - rss_before
    assert not leaks, leaks
    assert open_files() == files
    loader.close()
    assert duckdb_connections(probe) == 1
    probe.close()
    # the last connection closed, the database file is released
    assert open_files(str(database)) == 0
    print(
        f"figure: cycles={cycles} leaks=0 threads={threads} duckdb_connections={connections} "
        f"open_files={files} rss_drift_mb={drift:.1f} seconds={elapsed:.1f}"
    )
    assert drift < 32, f"RSS grew {drift:.1f} MiB over {cycles} cycles"
    # every cycle ended its iteration after the first batch (a peek): each gave its epoch back
    assert loader.epoch == 0


@pytest.mark.parametrize("prefetch_batch", [0, 2])
def test_keyboard_interrupt_in_the_loop_body_leaves_no_thread(database: Path, prefetch_batch: int) -> None:
    with DDBDataLoader(
        str(database), SERIES_SQL, "y", **(KWARGS | {"prefetch_batch": prefetch_batch})
    ) as loader:
        seen = 0
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                seen += 1
                if seen == 3:
                    raise KeyboardInterrupt
        assert settle()
        # the interrupted epoch does not poison the next one
        assert len(list(loader)) == len(loader)
    assert settle()


def _run(script: str, tmp_path: Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    prelude = f"import sys\nsys.path[:0] = [{str(REPO)!r}, {str(TESTS)!r}, {str(TESTS / 'reliability')!r}]\n"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    return result, time.monotonic() - started


SIGINT_SCRIPT = """
    import os, signal, threading, time
    import duckdb
    from conftest import SERIES_SQL, make_series
    from reliability_support import BreakingBackend, loader_threads
    from ddbloader import DDBDataLoader
    from ddbloader.backends import DuckDBBackend

    con = duckdb.connect()
    make_series(con, [[6, 5], [4, 7]])
    # the first query (the epoch's one fetch unit) runs endlessly in the engine: the consumer waits
    backend = BreakingBackend(DuckDBBackend(con), stall_on=[1])
    loader = DDBDataLoader(backend, SERIES_SQL, "y", window_size=2, group_col="gid",
                           repartition_col="part", fetch_threads=1, prefetch_batch={prefetch})
    backend.planning = False
    # this process's own disposition, whatever it inherited (an ignored SIGINT under nohup or a
    # CI runner's background shell is inherited, and Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        for batch in loader:
            pass
    except KeyboardInterrupt:
        waited = time.monotonic() - started
        deadline = time.monotonic() + 3
        while loader_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        print("interrupted after", round(waited, 2), "s; threads:", [t.name for t in loader_threads()])
    else:
        print("not interrupted")
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("prefetch", [0, 1])
def test_ctrl_c_while_waiting_for_a_stalled_fetch_leaves_no_thread(tmp_path: Path, prefetch: int) -> None:
    result, _elapsed = _run(SIGINT_SCRIPT.replace("{prefetch}", str(prefetch)), tmp_path)
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"interrupted after ([\d.]+) s; threads: \[\]", result.stdout.strip())
    assert match, result.stdout + result.stderr
    # the fetch stalls forever: any end at all is the interrupt's; the bound only keeps it prompt
    assert 0.4 <= float(match.group(1)) < 20.0


EXIT_SCRIPT = """
    import sys, time
    import duckdb
    from conftest import SERIES_SQL, FaultyBackend, make_series
    from reliability_support import BreakingBackend
    from ddbloader import DDBDataLoader
    from ddbloader.backends import DuckDBBackend

    con = duckdb.connect()
    make_series(con, [[40, 40], [40, 40]])
    kwargs = dict(batch_size=2, window_size=3, group_col="gid", repartition_col="part",
                  fetch_threads=1, prefetch_batch=1)
    held = []

    def started(backend, **extra):
        loader = DDBDataLoader(backend, SERIES_SQL, "y", **(kwargs | extra))
        backend.planning = False
        iterator = iter(loader)
        next(iterator)
        held.append(iterator)

    # a fetch stalled in the engine, a fetch waiting out a 120 s retry backoff, a fetch asleep
    # in Python for 120 s, and an assembler blocked on its full queue: none is closed
    started(BreakingBackend(DuckDBBackend(con), stall_on=[3]))
    started(FaultyBackend(DuckDBBackend(con), fail_on=[3], error=lambda: ConnectionResetError("x")),
            retry_backoff=120.0)
    started(FaultyBackend(DuckDBBackend(con), hang_on=[3], hang_seconds=120.0), timeout=600.0)
    started(FaultyBackend(DuckDBBackend(con)))
    # and an iterator abandoned in a reference cycle: only the garbage collector could close it
    cycle = {"it": iter(DDBDataLoader(con, SERIES_SQL, "y", shuffle=True, **kwargs))}
    cycle["self"] = cycle
    next(cycle["it"])
    del cycle
    time.sleep(0.3)
    print("exiting", flush=True)
    {ending}
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("ending", "returncode"), [("pass", 0), ("raise KeyboardInterrupt", 1), ("sys.exit(3)", 3)]
)
def test_interpreter_exit_never_hangs_whatever_the_threads_are_doing(
    tmp_path: Path, ending: str, returncode: int
) -> None:
    result, elapsed = _run(EXIT_SCRIPT.replace("{ending}", ending), tmp_path, timeout=80)
    assert result.stdout.strip() == "exiting", result.stderr
    # an uncaught KeyboardInterrupt exits with SIGINT's status
    assert result.returncode in {returncode, -signal.SIGINT, 128 + signal.SIGINT}, result.stderr
    print(f"figure: exit ending={ending!r} seconds={elapsed:.1f}")
    assert elapsed < 40


def test_every_thread_the_loader_starts_is_a_named_daemon_in_every_state(
    database: Path, faulty: Callable[..., FaultyBackend]
) -> None:
    before = set(threading.enumerate())
    con = duckdb.connect(str(database), read_only=True)
    states = {
        "retry backoff": FaultyBackend(
            DuckDBBackend(con), fail_on=[2, 3], error=lambda: ConnectionResetError("reset")
        ),
        "stalled in the engine": BreakingBackend(DuckDBBackend(con), stall_on=[2, 3]),
        "asleep in a fetch": FaultyBackend(DuckDBBackend(con), hang_on=[2, 3], hang_seconds=0.5),
    }
    observed: set[str] = set()
    for state, backend in states.items():
        loader = DDBDataLoader(backend, SERIES_SQL, "y", **(KWARGS | {"fetch_threads": 3}), retry_backoff=5.0)
        backend.planning = False
        iterator = iter(loader)
        iterator.start()  # the epoch's threads start with its claim, not with iter()
        time.sleep(0.2)
        new = set(threading.enumerate()) - before
        assert new, state
        for thread in new:
            assert thread.daemon, (state, thread.name)
            assert THREAD_NAME.fullmatch(thread.name), (state, thread.name)
        observed |= {t.name for t in new}
        iterator.close()
        loader.close()
        assert settle(), state
    assert observed == {"ddbloader-assemble", "ddbloader-fetch-0", "ddbloader-fetch-1", "ddbloader-fetch-2"}
    con.close()
    assert os.getpid() > 0
