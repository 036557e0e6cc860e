"""The fetch pool: its threads' worker loop and the one retry loop of every read. Which errors are
transient (:func:`is_transient`), how often and how long to wait (:class:`RetryPolicy`), the work
waiting for a thread (:class:`Tasks`) and the loop that runs each :class:`Job`.

A job runs on its thread's cursor, or on its own (:attr:`Job.own_slot`: a streamed read, whose
result stays open while it waits for the manager's next claim). Such a job is resumed on the
thread that opened its cursor (a DB-API connection may refuse any other, as ``sqlite3`` does).
No job waits for the consumer on a pool thread: each run reads what was asked for and returns,
so every queued job starts once the jobs ahead of it have read what was asked of them.

A job that fails with a transient error is tried again, up to ``RetryPolicy.retries`` more times,
on a fresh cursor: the old one is closed and ``backend.cursor()`` called again. Every wait
re-checks the stop event. Any other error reaches the job's waiters at once, as the original
exception with a note naming the query. Every open cursor is registered, so a stop interrupts the
queries in flight.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .._core.engine import Backend, Cursor, redact_uri
from .._core.errors import add_note
from .threads import POLL_SECONDS, Stopped, ThreadFailure

__all__ = [
    "MAX_BACKOFF_SECONDS",
    "CursorSlot",
    "Cursors",
    "Job",
    "RetryPolicy",
    "Tasks",
    "fetch_worker",
    "is_transient",
]


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


class Job(Protocol):
    """One query's work for a fetch thread: run it on a cursor, deliver, or report why not."""

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        """Fetch and deliver; return the partitions and rows delivered, and the queries sent."""
        ...

    def fail(self, failure: ThreadFailure) -> None: ...
    def cancel(self) -> None: ...

    @property
    def own_slot(self) -> CursorSlot | None:
        """The cursor the job reads on, if not its thread's (the retry loop replaces that one)."""
        ...

    def describe(self) -> str:
        """What the job fetches, with its SQL, for error messages."""
        ...

    def label(self) -> str:
        """What the job fetches, briefly, for log lines."""
        ...


class Cursors:
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


class CursorSlot:
    """The one cursor of a fetch thread: opened on first use, replaced after a transient error."""

    def __init__(self, backend: Backend, cursors: Cursors) -> None:
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


class Tasks:
    """The jobs waiting for a fetch thread: any thread's, and each thread's own. Thread-safe.

    ``put`` and ``close`` from any thread; ``get`` from pool thread ``thread`` only.
    """

    def __init__(self, threads: int) -> None:
        self._cond = threading.Condition()
        self._any: deque[Job] = deque()
        self._own: list[deque[Job]] = [deque() for _ in range(threads)]

    def put(self, job: Job, thread: int | None = None) -> None:
        """Queue ``job`` for any thread, or for thread ``thread`` (a job resumed where it began)."""
        with self._cond:
            (self._any if thread is None else self._own[thread]).append(job)
            self._cond.notify_all()

    def get(self, thread: int, timeout: float) -> Job | None:
        """Thread ``thread``'s own next job, else the next of any thread's; None within ``timeout``
        when there is none."""
        with self._cond:
            if not (self._own[thread] or self._any):
                self._cond.wait(timeout)
            for jobs in (self._own[thread], self._any):
                if jobs:
                    return jobs.popleft()
            return None

    def wake(self) -> None:
        """Wake every thread waiting in ``get`` (the stop event was set)."""
        with self._cond:
            self._cond.notify_all()

    def drain(self) -> list[Job]:
        """Take every job still queued (the threads are joined: they are to be cancelled)."""
        with self._cond:
            left = [*self._any, *(job for jobs in self._own for job in jobs)]
            self._any.clear()
            for jobs in self._own:
                jobs.clear()
            return left


_pool = threading.local()


def pool_thread() -> int:
    """The index of the fetch thread running the caller (only called from a job's ``run``)."""
    index: int = _pool.index
    return index


def fetch_worker(
    thread: int,
    backend: Backend,
    tasks: Tasks,
    cursors: Cursors,
    retry: RetryPolicy,
    on_fetched: Callable[[int, int, int, float], None],
) -> None:
    """Fetch thread ``thread``: run jobs until the stop event is set, then cancel the ones left in
    its reach (a stream's own cursor is closed on the thread that opened it)."""
    _pool.index = thread
    stop = cursors.stop
    slot = CursorSlot(backend, cursors)
    try:
        while True:
            job = tasks.get(thread, POLL_SECONDS)
            if job is None:
                if stop.is_set():
                    break
                continue
            if stop.is_set():
                # close() may already have interrupted the idle cursors; a query started now
                # would run to completion and hold up the join.
                job.cancel()
                continue
            _run_job(backend, job, slot if job.own_slot is None else job.own_slot, stop, retry, on_fetched)
    finally:
        slot.drop()


def _run_job(
    backend: Backend,
    job: Job,
    slot: CursorSlot,
    stop: threading.Event,
    retry: RetryPolicy,
    on_fetched: Callable[[int, int, int, float], None],
) -> None:
    """Run ``job`` on ``slot``'s cursor, trying again on a fresh one after a transient error: the
    one place that judges an error transient, backs off and reports a failure (see the module)."""
    started = time.perf_counter()
    attempt = 0
    while True:
        attempt += 1
        opening = slot.cursor is None
        try:
            cursor = slot.get()
            opening = False
            partitions, rows, queries = job.run(cursor)
            if not partitions and not queries:  # a stream that ended or waits for the manager
                return
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
