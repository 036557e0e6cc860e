"""Background partition fetches: a small pool of threads, each with its own cursor.

Fetches run in any order and in parallel; the assembler waits on the :class:`Pending` of the
partition it needs next, so the emitted order never depends on which fetch finishes first.

A fetch that fails with a transient error (:func:`is_transient`) is tried again, up to
``RetryPolicy.retries`` more times, on a fresh cursor: the old one is closed and
``backend.cursor()`` called again, which is how a backend built from a factory or a URI
reconnects after its connection died. Every wait re-checks the stop event. Any other error
reaches the waiter at once, as the original exception with a note naming the subquery. A retry
never changes what a partition holds, so the emitted sequence is the same with or without one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from .._core.engine import Backend, Cursor, redact_uri
from .._core.errors import add_note
from .._epoch.units import FetchUnit, PartitionKey, UnitPartitions, split_by_key, unit_blocks
from .._sql.fingerprint import content_mismatch, strip_hash
from .._sql.plan import PartitionSpec
from .._sql.source import Block, ColumnLayout, check_result_schema, to_block
from .streams import Reading, Streams
from .threads import POLL_SECONDS, Pending, Stopped, ThreadFailure, join_all, start_thread

__all__ = ["MAX_BACKOFF_SECONDS", "Fetcher", "RetryPolicy", "is_transient"]

#: The longest single wait between two attempts, however many retries were asked for.
MAX_BACKOFF_SECONDS = 30.0

_log = logging.getLogger("ddbloader")


@dataclass(frozen=True)
class RetryPolicy:
    """How often a partition fetch that failed on a transient error is tried again.

    Invariants: ``retries >= 0`` (0 means one attempt only); ``backoff >= 0``; the wait after
    failed attempt ``n`` (1-based) is ``min(backoff * 2**(n-1), MAX_BACKOFF_SECONDS)`` seconds.
    """

    retries: int = 2
    backoff: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not math.isfinite(self.backoff) or self.backoff < 0:
            raise ValueError(f"retry_backoff must be a finite number >= 0, got {self.backoff!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one."""
        return float(min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS))


def is_transient(backend: Backend, error: BaseException) -> bool:
    """True when ``error`` may go away on a fresh cursor: worth another attempt.

    Network-level failures (:class:`ConnectionError`, :class:`TimeoutError`, which includes
    ``socket.timeout``) always are; beyond those the backend decides through
    :meth:`~ddbloader.backends.Backend.is_transient`, which every built-in backend defines (a
    backend object of the user's without it has no opinion). Anything that is not an
    :class:`Exception` (``KeyboardInterrupt``, ``SystemExit``) never is.
    """
    if not isinstance(error, Exception):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    judge = getattr(backend, "is_transient", None)
    return callable(judge) and bool(judge(error))


class _Job(Protocol):
    """One query's work for a fetch thread: run it on a cursor, deliver, or report why not."""

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        """Fetch and deliver; return the partitions and rows delivered, and the queries sent."""
        ...

    def fail(self, failure: ThreadFailure) -> None: ...
    def cancel(self) -> None: ...

    def describe(self) -> str:
        """What the job fetches, with its SQL, for error messages."""
        ...

    def label(self) -> str:
        """What the job fetches, briefly, for log lines."""
        ...


@dataclass(frozen=True)
class _PartitionJob:
    """One partition, fetched by its own subquery."""

    spec: PartitionSpec
    layout: ColumnLayout
    result: Pending[Block]

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        block = _fetch_partition(cursor, self.spec, self.layout)
        self.result.set(block)
        return 1, block.rows, 1

    def fail(self, failure: ThreadFailure) -> None:
        self.result.fail(failure)

    def cancel(self) -> None:
        self.result.cancel()

    def describe(self) -> str:
        return self.spec.describe()

    def label(self) -> str:
        spec = self.spec
        return f"partition {spec.position} of group {spec.group} (parameters {list(spec.params)!r})"


def _fetch_partition(cursor: Cursor, spec: PartitionSpec, layout: ColumnLayout) -> Block:
    fingerprint = spec.fingerprint
    if fingerprint is None:
        table = cursor.fetch(spec.sql, spec.params)
    else:  # verify=True: the hash column goes before anything else sees the rows
        table, content = strip_hash(cursor.fetch(fingerprint.sql, spec.params))
    check_result_schema(table.schema, layout, spec.describe)
    block = _as_planned(spec, to_block(table, layout))
    if fingerprint is not None and content != fingerprint.content:
        raise content_mismatch(spec.describe(), spec.key_params, spec.rows, fingerprint.content, content)
    return block


def _unit_contents(table: pa.Table, unit: FetchUnit) -> tuple[pa.Table, list[int] | None]:
    """A verified unit's result without its hash column (before its key columns), and each cell's
    hash sum; None when the result does not split into the planned cells (then neither does the
    data, and the unit falls back to its partitions' own subqueries)."""
    keys = len(unit.cells[0].params)
    at = table.num_columns - keys - 1
    parts = split_by_key(table.select([at, *range(at + 1, table.num_columns)]), unit.cells)
    sums = None if parts is None else [strip_hash(part, 0)[1] for part in parts]
    return table.remove_column(at), sums


def _check_unit_contents(unit: FetchUnit, sums: list[int]) -> None:
    """Refuse a unit whose cells hash otherwise than planned (the unit falls back to fetching
    them one by one: a cell split wrongly by the client is then told from changed data)."""
    for spec, content in zip(unit.cells, sums, strict=True):
        assert spec.fingerprint is not None
        if content != spec.fingerprint.content:
            raise content_mismatch(
                f"{spec.describe()} in {unit.describe()}",
                spec.key_params,
                spec.rows,
                spec.fingerprint.content,
                content,
            )


class _Cursors:
    """The cursors open in a fetcher's threads, so ``close()`` can interrupt running queries."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.lock = threading.Lock()
        self.active: list[Cursor] = []

    def register(self, cursor: Cursor) -> None:
        """Record ``cursor``; raise :class:`Stopped` if ``close()`` has begun.

        ``close()`` sets the stop event before it takes the lock, so a cursor registered after
        its interrupts sees the event here instead of starting a query nobody interrupts.
        """
        with self.lock:
            self.active.append(cursor)
            if self.stop.is_set():
                raise Stopped

    def discard(self, cursor: Cursor) -> None:
        with self.lock:
            self.active.remove(cursor)
        # The cursor is dropped because it failed or the thread ends: a second failure while
        # closing it says nothing new, and the fetch error (if any) is the one to report.
        with contextlib.suppress(Exception):
            cursor.close()

    def interrupt_all(self) -> None:
        with self.lock:
            for cursor in self.active:
                cursor.interrupt()


class _CursorSlot:
    """The one cursor of a fetch thread: opened on first use, replaced after a transient error."""

    def __init__(self, backend: Backend, cursors: _Cursors) -> None:
        self._backend = backend
        self._cursors = cursors
        self.cursor: Cursor | None = None

    def get(self) -> Cursor:
        if self.cursor is None:
            cursor = self._backend.cursor()
            self.cursor = cursor
            self._cursors.register(cursor)
        return self.cursor

    def drop(self) -> None:
        cursor, self.cursor = self.cursor, None
        if cursor is not None:
            self._cursors.discard(cursor)


def _as_planned(spec: PartitionSpec, block: Block) -> Block:
    """``block``, if it has the rows planning counted for ``spec``: ``len()``, the windows and the
    sample order all rest on those counts, and the gather does not check its rows."""
    if block.rows != spec.rows:
        raise ValueError(
            f"{spec.describe()} returned {block.rows} rows, but planning counted {spec.rows}: the data "
            f"changed after the loader was built (len(), the windows and the sample order all rest on "
            f"those counts); build the loader again"
        )
    return block


def _fetch_worker(
    backend: Backend,
    jobs: queue.Queue[_Job | None],
    cursors: _Cursors,
    retry: RetryPolicy,
    on_fetched: Callable[[int, int, int, float], None],
) -> None:
    stop = cursors.stop
    slot = _CursorSlot(backend, cursors)
    try:
        while not stop.is_set():
            try:
                job = jobs.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if job is None or stop.is_set():
                # close() may already have interrupted the idle cursors; a query started now
                # would run to completion and hold up the join.
                if job is not None:
                    job.cancel()
                break
            _run_job(backend, job, slot, stop, retry, on_fetched)
    finally:
        slot.drop()


def _run_job(
    backend: Backend,
    job: _Job,
    slot: _CursorSlot,
    stop: threading.Event,
    retry: RetryPolicy,
    on_fetched: Callable[[int, int, int, float], None],
) -> None:
    """Run ``job``, trying again on a fresh cursor after a transient error (see the module)."""
    started = time.perf_counter()
    attempt = 0
    while True:
        attempt += 1
        opening = slot.cursor is None
        try:
            cursor = slot.get()
            opening = False
            partitions, rows, queries = job.run(cursor)
        except Stopped:
            job.cancel()
            return
        except BaseException as error:  # every failure must reach the consumer, whatever its type
            transient = is_transient(backend, error)
            if attempt <= retry.retries and not stop.is_set() and transient:
                delay = retry.delay(attempt)
                _log.warning(
                    "fetching %s failed on attempt %d of %d with %s: %s; "
                    "retrying on a fresh cursor in %.3g s",
                    job.label(),
                    attempt,
                    retry.retries + 1,
                    type(error).__name__,
                    redact_uri(str(error)),
                    delay,
                )
                slot.drop()
                if stop.wait(delay):
                    job.cancel()
                    return
                continue
            if attempt > 1 and transient:
                add_note(error, f"ddbloader gave up after {attempt} attempts (transient errors)")
            elif attempt > 1:
                add_note(error, f"ddbloader gave up on attempt {attempt}: this error is not transient")
            where = f"opening a cursor to fetch {job.describe()}" if opening else f"fetching {job.describe()}"
            job.fail(ThreadFailure(error, where))
            return
        seconds = time.perf_counter() - started
        _log.debug("fetched %s: %d rows in %.3f s", job.label(), rows, seconds)
        on_fetched(partitions, rows, queries, seconds)
        return


@dataclass
class _UnitState:
    """Where one fetch unit stands: asked for or not, its waiting and its delivered partitions."""

    requested: bool = False
    waiters: dict[PartitionKey, Pending[Block]] = field(default_factory=dict)
    #: the delivered partitions, and where each delivered and unclaimed one is among them
    delivered: UnitPartitions | None = None
    ready: dict[PartitionKey, int] = field(default_factory=dict)
    claimed: set[PartitionKey] = field(default_factory=set)
    failure: ThreadFailure | None = None
    cancelled: bool = False

    def drop_if_claimed(self) -> None:
        """Let the unit's rows go once no delivered partition waits to be claimed."""
        if not self.ready:
            self.delivered = None


class _Coalescer:
    """An epoch's fetch units, and the partitions they delivered before the manager asked. Thread-safe.

    A partition of a unit is served from its unit once (its first ``claim``); asked for again, or
    after ``release``, it is fetched alone. A unit starts when one of its partitions is first
    claimed, and the next unit with it, so the next unit's rows travel while this one's are
    served. Memory: the partitions delivered and not yet claimed, at most two units' worth.

    Units are taken from ``units`` as claims reach them (a key in none takes them all): ``claim``
    and ``release`` are called from one thread (the assembler), which alone advances ``units``
    and appends to ``self.units``; other threads read the units that exist.
    """

    def __init__(self, units: Iterable[FetchUnit]) -> None:
        self._cutting = iter(units)
        self.units: list[FetchUnit] = []
        self._unit_of: dict[PartitionKey, int] = {}
        self._states: list[_UnitState] = []
        self._lock = threading.Lock()
        self._splitting = True

    def _cut_next(self) -> bool:
        """Take the next unit; False when there is none."""
        unit = next(self._cutting, None)
        if unit is None:
            return False
        index = len(self.units)
        with self._lock:
            self.units.append(unit)
            self._states.append(_UnitState())
            self._unit_of.update(dict.fromkeys(unit.wanted, index))
        return True

    def _unit_index(self, key: PartitionKey) -> int | None:
        """The index of ``key``'s unit, with the unit after it taken too; None if in none."""
        while (index := self._unit_of.get(key)) is None:
            if not self._cut_next():
                return None
        if index + 1 == len(self.units):
            self._cut_next()
        return index

    def claim(self, spec: PartitionSpec) -> tuple[Pending[Block] | None, Sequence[int]]:
        """``spec``'s result through its unit and the units to start now; ``(None, ())`` when
        ``spec`` is to be fetched alone."""
        key = spec.key
        index = self._unit_index(key)
        if index is None:
            return None, ()
        with self._lock:
            state = self._states[index]
            if key in state.claimed or not (state.requested or self._splitting):
                return None, ()
            state.claimed.add(key)
            ready = state.ready.pop(key, None)
            if ready is not None:
                assert state.delivered is not None
                pending: Pending[Block] = Pending.of(state.delivered.block(ready))
                state.drop_if_claimed()
            else:
                pending = Pending(f"fetching {spec.describe()}, in a fetch unit")
                if state.failure is not None:
                    pending.fail(state.failure)
                elif state.cancelled:
                    pending.cancel()
                else:
                    state.waiters[key] = pending
            states = self._states
            # most claims: both units started already
            if not self._splitting or (
                state.requested and (index + 1 == len(states) or states[index + 1].requested)
            ):
                return pending, ()
            start = [i for i in (index, index + 1) if i < len(states) and not states[i].requested]
            for i in start:
                states[i].requested = True
        return pending, start

    def deliver(self, index: int, partitions: UnitPartitions) -> None:
        # built whole, not cell by cell: a unit has thousands of cells, and this holds the GIL
        where = dict(zip([spec.key for spec in partitions.specs], itertools.count()))
        with self._lock:
            state = self._states[index]
            state.delivered = partitions
            for key, waiter in state.waiters.items():
                waiter.set(partitions.block(where[key]))
            state.waiters.clear()
            for key in state.claimed:  # the waiters' keys too
                where.pop(key, None)
            state.ready = where
            state.drop_if_claimed()

    def fail(self, index: int, failure: ThreadFailure) -> None:
        with self._lock:
            state = self._states[index]
            state.failure = failure
            for waiter in state.waiters.values():
                waiter.fail(failure)
            state.waiters.clear()

    def cancel(self, index: int) -> None:
        with self._lock:
            state = self._states[index]
            state.cancelled = True
            for waiter in state.waiters.values():
                waiter.cancel()
            state.waiters.clear()
            state.ready.clear()
            state.delivered = None

    def release(self, keys: Sequence[PartitionKey]) -> None:
        """No more claims of ``keys`` through their units: drop what arrived for them (and what
        will: a key released before its unit is taken, as after a fast-forward, takes it now)."""
        indexes = [self._unit_index(key) for key in keys]
        with self._lock:
            for key, index in zip(keys, indexes, strict=True):
                if index is not None:
                    state = self._states[index]
                    state.claimed.add(key)
                    if state.ready.pop(key, None) is not None:
                        state.drop_if_claimed()

    def stop_splitting(self) -> None:
        """A unit's result did not split exactly: fetch the partitions of units not started alone."""
        with self._lock:
            self._splitting = False


class _UnitJob:
    """Fetch unit ``index`` of ``coalescer`` with one query and split it into partitions.

    If the query fails on a non-transient error, or its result does not split into exactly the
    planned partitions (see :func:`~ddbloader._epoch.units.split_by_key`), the unit's partitions are
    fetched one by one with their own subqueries, whose rows and errors are the reference: an
    error then names the partition's subquery, as if it had been fetched alone.
    """

    def __init__(
        self,
        index: int,
        coalescer: _Coalescer,
        layout: ColumnLayout,
        backend: Backend,
        stop: threading.Event,
    ) -> None:
        self.index = index
        self.coalescer = coalescer
        self.layout = layout
        self.backend = backend
        self.stop = stop
        self._alone: PartitionSpec | None = None

    @property
    def unit(self) -> FetchUnit:
        return self.coalescer.units[self.index]

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        unit = self.unit
        partitions = None
        try:
            table = cursor.fetch(unit.sql, unit.params)
            sums = None
            if unit.cells[0].fingerprint is not None:
                table, sums = _unit_contents(table, unit)
            data = table.select(range(table.num_columns - len(unit.cells[0].params)))
            check_result_schema(data.schema, self.layout, unit.describe)
            blocks = unit_blocks(table, unit, self.layout)
            if blocks is not None and sums is not None:
                _check_unit_contents(unit, sums)
            partitions = blocks
        except Exception as error:
            if self.stop.is_set() or is_transient(self.backend, error):
                raise
            _log.warning(
                "fetching %s failed with %s: %s; fetching its partitions one by one",
                self.label(),
                type(error).__name__,
                redact_uri(str(error)),
            )
        split = partitions is not None
        if partitions is None:
            self.coalescer.stop_splitting()
            alone = []
            for spec in unit.cells:
                if spec.key in unit.wanted:
                    self._alone = spec
                    alone.append((spec, _fetch_partition(cursor, spec, self.layout)))
            self._alone = None
            partitions = UnitPartitions([s for s, _ in alone], blocks=[b for _, b in alone])
        self.coalescer.deliver(self.index, partitions)
        count = len(partitions.specs)
        return count, partitions.rows, 1 if split else 1 + count

    def fail(self, failure: ThreadFailure) -> None:
        self.coalescer.fail(self.index, failure)

    def cancel(self) -> None:
        self.coalescer.cancel(self.index)

    def describe(self) -> str:
        return self.unit.describe() if self._alone is None else self._alone.describe()

    def label(self) -> str:
        return f"fetch unit {self.index} ({len(self.unit.cells)} partitions)"


class Fetcher:
    """A pool of ``threads`` fetch threads named ``ddbloader-fetch-N``.

    Each thread opens its cursor on its first fetch and keeps it until a transient error (then a
    fresh one is opened) or ``close``. ``submit`` and ``release`` are called from one thread (the
    assembler); ``close`` from any, once or more.
    """

    def __init__(
        self,
        backend: Backend,
        layout: ColumnLayout,
        threads: int,
        on_fetched: Callable[[int, int, int, float], None] = lambda partitions, rows, queries, seconds: None,
        *,
        retry: RetryPolicy = RetryPolicy(),
        units: Iterable[FetchUnit] = (),
    ) -> None:
        self._backend = backend
        self._layout = layout
        self._units = _Coalescer(units)
        # None is close()'s wake-up call: one per thread, so none waits out its poll.
        self._tasks: queue.Queue[_Job | None] = queue.Queue()
        self._cursors = _Cursors(threading.Event())
        self._streams = Streams(
            lambda: _CursorSlot(backend, self._cursors),
            Reading(layout, self._cursors.stop, retry, functools.partial(is_transient, backend), on_fetched),
        )
        self._threads = [
            start_thread(
                _fetch_worker,
                backend,
                self._tasks,
                self._cursors,
                retry,
                on_fetched,
                name=f"ddbloader-fetch-{n}",
            )
            for n in range(threads)
        ]

    def submit(self, spec: PartitionSpec) -> Pending[Block]:
        """Queue a fetch of ``spec``; the result arrives as a :class:`~ddbloader._sql.source.Block`.

        A partition of a fetch unit comes from its unit's query the first time it is asked for
        (starting that unit and the next if they have not started), else from its own subquery;
        a piece of a streamed subquery comes from that subquery's streaming query.
        """
        if spec.streamed:
            return self._streams.claim(spec)
        pending, start = self._units.claim(spec)
        for index in start:
            self._tasks.put(_UnitJob(index, self._units, self._layout, self._backend, self._cursors.stop))
        if pending is not None:
            return pending
        job = _PartitionJob(spec, self._layout, Pending(f"fetching {spec.describe()}"))
        self._tasks.put(job)
        return job.result

    def release(self, keys: Sequence[PartitionKey]) -> None:
        """The manager will not ask for ``keys`` again: drop their rows if a unit brought them,
        and end their streams once these delivered what was asked for.

        A key submitted once and not streamed needs no release: its submission took its rows
        (from its unit, or from its own query), and a unit's rows for a key already claimed are
        not kept. The keys never submitted are the ones to release (a fetch unit brings them
        all the same), and streamed pieces (their streaming query must end)."""
        self._units.release(keys)
        self._streams.release(keys)

    def close(self) -> None:
        """Stop the threads, interrupt running queries, join, and cancel the fetches never started.

        A cancelled fetch (or one waiting out a retry backoff) makes its waiter raise
        :class:`~ddbloader._io.threads.Stopped` at once.
        """
        self._cursors.stop.set()
        self._cursors.interrupt_all()
        for _ in self._threads:
            self._tasks.put(None)
        join_all(self._threads)
        self._streams.close()
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task.cancel()
        for index in range(len(self._units.units)):
            self._units.cancel(index)
