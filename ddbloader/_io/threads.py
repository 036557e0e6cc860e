"""The one background-thread driver: named daemon threads, bounded hand-over, error transport.

Rules every stage follows: a blocking call waits in short slices and re-checks a stop event; an
exception in a thread travels to the consumer as a :class:`ThreadFailure` and is re-raised there
with its original type, the thread's frames and a note saying where it happened; shutdown sets
the stop event, wakes waiters and joins with a timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, NoReturn, TypeVar

from .._core.errors import add_note

__all__ = [
    "POLL_SECONDS",
    "Pending",
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
        done = self._done
        if not done.is_set():  # most small groups' results are delivered before they are asked for
            deadline = time.monotonic() + timeout
            while not done.wait(POLL_SECONDS):
                if stop.is_set():
                    raise Stopped
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no result within {timeout:g} s (timeout={timeout:g}) while {self.what}"
                    )
        if self._cancelled:
            raise Stopped
        if self._failure is not None:
            self._failure.reraise()
        return self._value  # type: ignore[return-value]
