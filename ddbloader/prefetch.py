"""The one background-thread driver: named daemon threads, bounded hand-over, error transport.

Rules every stage follows: a blocking call waits in short slices and re-checks a stop event; an
exception in a thread travels to the consumer as a :class:`ThreadFailure` and is re-raised there
with its original type, the thread's frames and a note saying where it happened; shutdown sets
the stop event, wakes waiters and joins with a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, NoReturn, TypeVar

from .errors import add_note

__all__ = [
    "POLL_SECONDS",
    "Pending",
    "Prefetcher",
    "Stopped",
    "ThreadFailure",
    "in_worker_thread",
    "join_all",
    "start_thread",
]

T = TypeVar("T")
POLL_SECONDS = 0.05
JOIN_SECONDS = 5.0
_log = logging.getLogger("ddbloader")


class Stopped(Exception):
    """Unwinds a worker whose stop event was set. Never reaches the user."""


class ThreadFailure:
    """An exception caught in a worker thread, carried to the consumer.

    Captures the exception (with its traceback), the thread's name and what it was doing.
    """

    def __init__(self, error: BaseException, where: str) -> None:
        self.error = error
        self.thread = threading.current_thread().name
        self.where = where

    def reraise(self) -> NoReturn:
        """Raise the original exception in the calling thread, with a note naming the thread."""
        add_note(self.error, f"raised in thread {self.thread!r} while {self.where}")
        raise self.error


_worker = threading.local()


def _as_worker(body: Callable[..., None], *args: Any) -> None:
    _worker.active = True
    body(*args)


def in_worker_thread() -> bool:
    """True in a thread started by :func:`start_thread`."""
    return bool(getattr(_worker, "active", False))


def start_thread(body: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    """Start ``body(*args)`` in a named daemon thread, so a stuck thread never blocks exit."""
    thread = threading.Thread(target=_as_worker, args=(body, *args), name=name, daemon=True)
    thread.start()
    return thread


def join_all(threads: list[threading.Thread], timeout: float = JOIN_SECONDS) -> None:
    """Join ``threads`` within ``timeout`` seconds in total; log the ones still running."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive() and t is not threading.current_thread()]
    if stuck:
        _log.warning(
            "threads %s did not stop within %.1f s; they are daemons and will not block exit",
            stuck,
            timeout,
        )


#: The event of every result that was there when asked for (never cleared).
_ALREADY_SET = threading.Event()
_ALREADY_SET.set()


class Pending(Generic[T]):
    """A result that one thread sets once and another waits for. Thread-safe."""

    def __init__(self, what: str, *, done: threading.Event | None = None) -> None:
        self.what = what
        self._done = threading.Event() if done is None else done
        self._value: T | None = None
        self._failure: ThreadFailure | None = None
        self._cancelled = False

    @classmethod
    def of(cls, value: T) -> Pending[T]:
        """A result that is there already: no event of its own (a small group's partition is
        usually delivered before it is asked for, and an event costs microseconds)."""
        done: Pending[T] = cls("reading a delivered result", done=_ALREADY_SET)
        done._value = value
        return done

    def set(self, value: T) -> None:
        self._value = value
        self._done.set()

    def fail(self, failure: ThreadFailure) -> None:
        self._failure = failure
        self._done.set()

    def cancel(self) -> None:
        """Give up on the result: waiters raise :class:`Stopped` instead of waiting out their timeout."""
        self._cancelled = True
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, stop: threading.Event, timeout: float) -> T:
        """Wait for the result; re-raise a worker's failure in this thread.

        Raises:
            Stopped: ``stop`` was set while waiting, or the result was cancelled.
            TimeoutError: no result within ``timeout`` seconds; the message names what was awaited.
        """
        deadline = time.monotonic() + timeout
        while not (self._done.is_set() or self._done.wait(POLL_SECONDS)):
            if stop.is_set():
                raise Stopped
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result within {timeout:g} s (timeout={timeout:g}) while {self.what}")
        if self._cancelled:
            raise Stopped
        if self._failure is not None:
            self._failure.reraise()
        return self._value  # type: ignore[return-value]


_END = object()


def _produce(make: Callable[[threading.Event], Iterator[Any]], out: _Handover, stop: threading.Event) -> None:
    items: Iterator[Any] | None = None
    try:
        items = make(stop)
        for item in items:
            _put(out, item, stop)
        _put(out, _END, stop)
    except Stopped:
        pass
    except BaseException as error:  # every failure must reach the consumer, whatever its type
        with contextlib.suppress(Stopped):
            _put(out, ThreadFailure(error, "assembling batches"), stop)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _put(out: _Handover, item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise Stopped
        try:
            out.room.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue
        out.items.put(item)
        return


class _Handover:
    """At most ``depth`` items in flight from one producer thread to one consumer: ``items``
    holds them, ``room`` one token per free place (the producer takes one before each item,
    the consumer gives one back per item taken).

    Two ``queue.SimpleQueue`` objects rather than a bounded ``queue.Queue``: their ``put`` and
    ``get`` are C calls that take the GIL once, where ``Queue``'s condition variables run Python
    on both sides of every item and make a woken thread take the GIL again and again; on a busy
    GIL (an assembler serving thousands of small groups) each of those waits out another
    thread's turn.
    """

    def __init__(self, depth: int) -> None:
        self.items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(depth):
            self.room.put(None)

    def drain(self) -> None:
        """Drop the items not taken."""
        while True:
            try:
                self.items.get_nowait()
            except queue.Empty:
                return


class Prefetcher(Generic[T]):
    """Runs ``make(stop)``'s iterator in a background thread, ``depth`` items ahead.

    With ``depth == 0`` the iterator runs in the consumer's thread instead. Single-consumer:
    ``__next__`` must be called from one thread at a time. ``close()`` is idempotent and may be
    called from another thread: a consumer waiting in ``__next__`` then gets StopIteration.
    """

    def __init__(
        self, make: Callable[[threading.Event], Iterator[T]], depth: int, name: str, timeout: float
    ) -> None:
        self._stop = threading.Event()
        self._timeout = timeout
        self._closed = False
        self._thread: threading.Thread | None = None
        self._inline: Iterator[T] | None = None
        self._handover = _Handover(depth)
        if depth == 0:
            self._inline = make(self._stop)
        else:
            self._thread = start_thread(_produce, make, self._handover, self._stop, name=name)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if self._inline is not None:
            try:
                return next(self._inline)
            except Stopped:
                raise StopIteration from None
        item = self._take()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, ThreadFailure):
            self.close()
            item.reraise()
        return item  # type: ignore[no-any-return]

    def ready(self) -> int:
        """Items assembled and waiting for the consumer (0 when running inline)."""
        return self._handover.items.qsize()

    def _take(self) -> Any:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                item = self._handover.items.get(timeout=POLL_SECONDS)
            except queue.Empty:
                assert self._thread is not None
                if self._closed:  # by another thread, while this one waited
                    raise StopIteration from None
                if not self._thread.is_alive() and self._handover.items.empty():
                    raise RuntimeError(
                        f"background thread {self._thread.name!r} ended without a result"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no batch from thread {self._thread.name!r} within {self._timeout:g} s"
                    ) from None
            else:
                self._handover.room.put(None)
                return item

    def close(self) -> None:
        """Stop the producer, wake it if it is blocked on a full queue, and join it.

        From a worker thread it does not join: a worker gets here only when the garbage
        collector runs a consumer's finalizer there, and the producer it would wait for may be
        joining that very thread. The producer still stops; it just ends on its own.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._inline is not None:
            close = getattr(self._inline, "close", None)
            if close is not None:
                close()
        self._handover.drain()
        self._handover.room.put(None)  # a producer waiting for room wakes now, and stops
        if self._thread is not None and not in_worker_thread():
            join_all([self._thread])
            self._handover.drain()  # what it put before it saw the stop
