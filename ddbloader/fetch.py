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
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .backends import Backend, Cursor, redact_uri
from .errors import add_note
from .plan import PartitionSpec
from .prefetch import POLL_SECONDS, Pending, Stopped, ThreadFailure, join_all, start_thread
from .source import Block, ColumnLayout, check_result_schema, to_block

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


@dataclass(frozen=True)
class _Task:
    spec: PartitionSpec
    result: Pending[Block]


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
    layout: ColumnLayout,
    tasks: queue.Queue[_Task | None],
    cursors: _Cursors,
    retry: RetryPolicy,
    on_fetched: Callable[[float], None],
) -> None:
    stop = cursors.stop
    slot = _CursorSlot(backend, cursors)
    try:
        while not stop.is_set():
            try:
                task = tasks.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if task is None or stop.is_set():
                # close() may already have interrupted the idle cursors; a query started now
                # would run to completion and hold up the join.
                if task is not None:
                    task.result.cancel()
                break
            spec = task.spec
            started = time.perf_counter()
            attempt = 0
            while True:
                attempt += 1
                opening = slot.cursor is None
                try:
                    cursor = slot.get()
                    opening = False
                    table = cursor.fetch(spec.sql, spec.params)
                    check_result_schema(table.schema, layout, spec.describe())
                    block = _as_planned(spec, to_block(table, layout))
                except Stopped:
                    task.result.cancel()
                    break
                except BaseException as error:  # every failure must reach the consumer, whatever its type
                    transient = is_transient(backend, error)
                    if attempt <= retry.retries and not stop.is_set() and transient:
                        delay = retry.delay(attempt)
                        _log.warning(
                            "fetching partition %d of group %d (parameters %r) failed on attempt %d of "
                            "%d with %s: %s; retrying on a fresh cursor in %.3g s",
                            spec.position,
                            spec.group,
                            list(spec.params),
                            attempt,
                            retry.retries + 1,
                            type(error).__name__,
                            redact_uri(str(error)),
                            delay,
                        )
                        slot.drop()
                        if stop.wait(delay):
                            task.result.cancel()
                            break
                        continue
                    if attempt > 1 and transient:
                        add_note(error, f"ddbloader gave up after {attempt} attempts (transient errors)")
                    elif attempt > 1:
                        add_note(
                            error, f"ddbloader gave up on attempt {attempt}: this error is not transient"
                        )
                    where = (
                        f"opening a cursor to fetch {spec.describe()}"
                        if opening
                        else f"fetching {spec.describe()}"
                    )
                    task.result.fail(ThreadFailure(error, where))
                    break
                seconds = time.perf_counter() - started
                _log.debug(
                    "fetched partition %d of group %d (parameters %r): %d rows in %.3f s",
                    spec.position,
                    spec.group,
                    list(spec.params),
                    block.rows,
                    seconds,
                )
                on_fetched(seconds)
                task.result.set(block)
                break
    finally:
        slot.drop()


class Fetcher:
    """A pool of ``threads`` fetch threads named ``ddbloader-fetch-N``.

    Each thread opens its cursor on its first fetch and keeps it until a transient error (then a
    fresh one is opened) or ``close``. ``submit`` is called from one thread (the assembler);
    ``close`` from any, once or more.
    """

    def __init__(
        self,
        backend: Backend,
        layout: ColumnLayout,
        threads: int,
        on_fetched: Callable[[float], None] = lambda seconds: None,
        *,
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        # None is close()'s wake-up call: one per thread, so none waits out its poll.
        self._tasks: queue.Queue[_Task | None] = queue.Queue()
        self._cursors = _Cursors(threading.Event())
        self._threads = [
            start_thread(
                _fetch_worker,
                backend,
                layout,
                self._tasks,
                self._cursors,
                retry,
                on_fetched,
                name=f"ddbloader-fetch-{n}",
            )
            for n in range(threads)
        ]

    def submit(self, spec: PartitionSpec) -> Pending[Block]:
        """Queue a fetch of ``spec``; the result arrives as a :class:`~ddbloader.source.Block`."""
        task = _Task(spec, Pending(f"fetching {spec.describe()}"))
        self._tasks.put(task)
        return task.result

    def close(self) -> None:
        """Stop the threads, interrupt running queries, join, and cancel the fetches never started.

        A cancelled fetch (or one waiting out a retry backoff) makes its waiter raise
        :class:`~ddbloader.prefetch.Stopped` at once.
        """
        self._cursors.stop.set()
        self._cursors.interrupt_all()
        for _ in self._threads:
            self._tasks.put(None)
        join_all(self._threads)
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task.result.cancel()
