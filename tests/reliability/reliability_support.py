"""What the reliability suite shares: process gauges, sample identities, backends that break.

Not a ``conftest.py``: test directories here have no ``__init__.py``, so a second module named
``conftest`` would replace ``tests/conftest.py`` in ``sys.modules`` and break the imports of every
other test module. The ``--soak`` option is registered in ``tests/conftest.py`` for the same
reason (pytest reads ``pytest_addoption`` only from initial conftests).

Tables come from ``make_series``: ``f0 = rid = gid * 1_000_000 + pos`` and ``y = rid + 0.5``, so
a sample's first x value names it: the window id is the rid of the sample's first row.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import torch
from conftest import wait_until

from ddbloader.backends import Backend, Cursor

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

Batch = tuple[torch.Tensor, torch.Tensor]


def soak(config: pytest.Config) -> bool:
    """True when the run asked for the long variants (``pytest --soak``)."""
    return bool(config.getoption("--soak"))


# --- process gauges ------------------------------------------------------------------------------


def rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_files(prefix: str | None = None) -> int:
    """File descriptors this process holds; with ``prefix``, only those whose target starts with it.

    A DuckDB database file holds one descriptor per open database instance, so counting the
    descriptors on a file counts the connections opened on it that are still alive.
    """
    count = 0
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used is gone by now
            target = os.readlink(f"/proc/self/fd/{entry}")
            if prefix is None or target.startswith(prefix):
                count += 1
    return count


def duckdb_connections(probe: duckdb.DuckDBPyConnection) -> int:
    """Connections (cursors included) open on ``probe``'s database instance, the probe counted.

    DuckDB shares one instance per database file within a process, so a probe opened on the
    same file with the same configuration sees every loader's connections and cursors on it.
    """
    ((count,),) = probe.sql("SELECT * FROM duckdb_connection_count()").fetchall()
    return int(count)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ddbloader")]


def settle(grace: float = 3.0) -> bool:
    """True once no ddbloader thread is alive, allowing ``grace`` seconds for joins to end."""
    return wait_until(lambda: not loader_threads(), grace, poll=0.002)


# --- sample identities ---------------------------------------------------------------------------


def rid(group: int, position: int) -> float:
    return float(group * 1_000_000 + position)


def expected_windows(parts: Sequence[Sequence[int]], span: int, stride: int) -> Counter[float]:
    """The multiset of window ids one epoch must deliver: every start ``s`` with ``s + span <= n``."""
    return Counter(
        rid(group, start)
        for group, sizes in enumerate(parts)
        for start in range(0, sum(sizes) - span + 1, stride)
    )


def delivered_windows(batches: Sequence[Batch], offset: int) -> Counter[float]:
    """The multiset of window ids in ``batches`` (f0 first in x, y = rid + 0.5, windowed).

    Also checks every sample whole: x holds consecutive rows of one group from its id on, and y
    the rows ``offset`` further, so a sample stitched from the wrong rows cannot pass as a right one.
    """
    ids: Counter[float] = Counter()
    for x, y in batches:
        first = x[:, 0, 0]
        steps = torch.arange(x.shape[1], dtype=x.dtype)
        assert torch.equal(x[:, :, 0], first[:, None] + steps), "x rows are not consecutive"
        y_steps = torch.arange(y.shape[1], dtype=y.dtype) + offset + 0.5
        assert torch.equal(y[:, :, 0], first[:, None] + y_steps), "y does not follow its x"
        ids.update(first.tolist())
    return ids


def as_bytes(
    batches: Sequence[Batch],
) -> list[tuple[str, tuple[int, ...], bytes, str, tuple[int, ...], bytes]]:
    """Batches as dtype, shape and raw bytes, so equality means bitwise equality."""
    return [
        (str(x.dtype), tuple(x.shape), x.numpy().tobytes(), str(y.dtype), tuple(y.shape), y.numpy().tobytes())
        for x, y in batches
    ]


# --- backends that break -------------------------------------------------------------------------


ENDLESS_SQL = "SELECT sum(a.range) FROM range(1000000000000) a"


class _BreakingCursor:
    def __init__(self, inner: Cursor, backend: BreakingBackend) -> None:
        self._inner = inner
        self._backend = backend

    def fetch(self, sql: str, params: Sequence[Any]) -> pa.Table:
        fault = self._backend.fault_now()
        if fault == "die":
            # Really close the engine connection under the query: the error that follows is the
            # engine's own, raised by the real fetch.
            self._inner.close()
        elif fault == "stall":
            # A query that runs for hours in the engine on this very cursor: only the engine's
            # interrupt (what close() of the loader sends) ends it.
            self._inner.fetch(ENDLESS_SQL, ())
        return self._inner.fetch(sql, params)

    def interrupt(self) -> None:
        self._inner.interrupt()

    def close(self) -> None:
        with self._backend.lock:
            self._backend.cursors_closed += 1
        self._inner.close()


class BreakingBackend:
    """A real backend whose connection dies, or whose engine stalls, on chosen partition fetches.

    ``die_on``: partition-fetch numbers (1-based, across threads) before which the cursor's own
    engine connection is closed, so the real fetch fails with the engine's error.
    ``stall_on``: partition-fetch numbers that first run an endless query in the engine.
    ``transient``: the error types this backend declares transient (its ``is_transient``).
    Fetches made while ``planning`` is True pass untouched; flip it after building the loader.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        die_on: Sequence[int] = (),
        stall_on: Sequence[int] = (),
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._inner = inner
        self.dialect = inner.dialect
        self.engine = inner.engine
        self.die_on = set(die_on)
        self.stall_on = set(stall_on)
        self.transient = transient
        self.planning = True
        self.fetches = 0
        self.deaths = 0
        self.cursors_opened = 0
        self.cursors_closed = 0
        self.lock = threading.Lock()

    def fault_now(self) -> str | None:
        if self.planning:
            return None
        with self.lock:
            self.fetches += 1
            if self.fetches in self.die_on:
                self.deaths += 1
                return "die"
            return "stall" if self.fetches in self.stall_on else None

    def is_transient(self, error: BaseException) -> bool:
        return isinstance(error, self.transient)

    def cursor(self) -> _BreakingCursor:
        cursor = _BreakingCursor(self._inner.cursor(), self)
        with self.lock:
            self.cursors_opened += 1
        return cursor

    def close(self) -> None:
        self._inner.close()
