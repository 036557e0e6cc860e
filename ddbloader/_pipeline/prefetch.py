"""The prefetch stage: one producer thread assembling items ahead of the consumer, bounded hand-over.

A consumer that takes items as fast as they come (an empty loop, a step of a few microseconds)
gains nothing from the thread: it waits for every item anyway, and each hand-over costs it two
thread wake-ups and GIL hand-offs. So the stage watches the consumer's steps (its time between
two items) and, when most of :data:`JUDGED` steps took less than :data:`SHORT_STEP_SECONDS`,
takes the iterator back from the thread and runs it in the consumer's own; when most took
longer, a thread runs it again. The items and their order are the same in both modes: one
iterator, driven by one thread at a time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .._io.threads import POLL_SECONDS, Stopped, ThreadFailure, in_worker_thread, join_all, start_thread

__all__ = ["Prefetcher"]

T = TypeVar("T")


_END = object()

#: A step shorter than this is a consumer that only waits: hand-overs cost it more than they save.
SHORT_STEP_SECONDS = 50e-6

#: Steps judged together before the mode may change (and at least this many items between changes).
JUDGED = 64

#: Items the consumer was handed that stay referenced here: the one it holds and the one before,
#: which it lets go after its next step starts (``x, y = next(it)`` rebinds after the call).
_HANDED = 2


class _Paused:
    """Put by a producer asked to pause, after its last item: the iterator, for the consumer to run."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items = items


def _produce(
    make: Callable[[threading.Event], Iterator[Any]] | Iterator[Any],
    out: _Handover,
    stop: threading.Event,
    pause: threading.Event,
) -> None:
    items: Iterator[Any] | None = None
    handed_back = False
    try:
        items = make if isinstance(make, Iterator) else make(stop)
        for item in items:
            _put(out, item, stop)
            if pause.is_set():
                _put(out, _Paused(items), stop)
                handed_back = True
                return
        _put(out, _END, stop)
    except Stopped:
        pass
    except BaseException as error:  # every failure must reach the consumer, whatever its type
        with contextlib.suppress(Stopped):
            _put(out, ThreadFailure(error, "assembling batches"), stop)
    finally:
        if not handed_back:
            _close(items)


def _close(items: Iterator[Any] | None) -> None:
    close = getattr(items, "close", None)
    if close is not None:
        close()


def _put(out: _Handover, item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise Stopped
        try:
            # the token's item, if any, is released here, in this thread (see _Handover)
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

    A token carries back the item the consumer took :data:`_HANDED` takes before (None at first),
    so that the producer drops the last reference to it, if the consumer let it go: a batch's
    tensors freed in the consumer's thread give the GIL to the producer, which the consumer's
    return of the token has just woken, and the consumer waits for its turn back (0.09-0.13 ms a
    batch, against 0.006-0.02 ms with no thread waiting for the GIL).
    """

    def __init__(self, depth: int) -> None:
        self.items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(depth):
            self.room.put(None)

    def drain(self) -> None:
        """Drop the items not taken (closing an iterator handed back), and those the tokens carry."""
        for waiting in (self.items, self.room):
            while True:
                try:
                    item = waiting.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Paused):
                    _close(item.items)


class Prefetcher(Generic[T]):
    """Runs ``make(stop)``'s iterator ``depth`` items ahead in a background thread, or in the
    consumer's own thread while the consumer's steps are too short to gain from one (see the
    module docstring); with ``depth == 0``, always in the consumer's thread.

    Single-consumer: ``__next__`` must be called from one thread at a time. ``close()`` is
    idempotent and may be called from another thread: a consumer waiting in ``__next__`` then
    gets StopIteration.

    Memory: besides ``depth`` items ahead, it keeps the consumer's last :data:`_HANDED` items
    referenced until its next take (they are released in the producer's thread, see
    :class:`_Handover`), one item more than a consumer that rebinds its batch holds.
    """

    def __init__(
        self, make: Callable[[threading.Event], Iterator[T]], depth: int, name: str, timeout: float
    ) -> None:
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._timeout = timeout
        self._depth = depth
        self._name = name
        self._closed = False
        self._thread: threading.Thread | None = None
        #: the iterator while the consumer's thread runs it
        self._inline: Iterator[T] | None = None
        self._handover = _Handover(depth)
        #: the items handed to the consumer and not yet given back with a token, oldest first
        self._handed: deque[Any] = deque()
        #: when the consumer's last step began (its previous item returned), and the steps judged
        self._left = 0.0
        self._steps = 0
        self._short = 0
        if depth == 0:
            self._inline = make(self._stop)
        else:
            self._start(make)

    def _start(self, make: Callable[[threading.Event], Iterator[Any]] | Iterator[Any]) -> None:
        self._pause.clear()
        self._handover = _Handover(self._depth)
        self._thread = start_thread(_produce, make, self._handover, self._stop, self._pause, name=self._name)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if self._depth:
            self._judge()
        while True:
            if self._inline is not None:
                try:
                    item = next(self._inline)
                except Stopped:
                    self.close()
                    raise StopIteration from None
                break
            item = self._take()
            if item is _END:
                self.close()
                raise StopIteration
            if isinstance(item, ThreadFailure):
                self.close()
                item.reraise()
            if not isinstance(item, _Paused):
                break
            self._resume_inline(item)
        self._left = time.perf_counter()
        return item

    def _judge(self) -> None:
        """Count the step that just ended; every :data:`JUDGED` steps, move the iterator to the
        consumer's thread if most were short, or to a thread of its own if most were not."""
        if self._left:
            self._steps += 1
            self._short += time.perf_counter() - self._left < SHORT_STEP_SECONDS
        if self._steps < JUDGED:
            return
        mostly_short = 4 * self._short >= 3 * JUDGED
        mostly_long = 4 * self._short <= JUDGED
        self._steps = self._short = 0
        if self._inline is None and mostly_short:
            self._pause.set()  # the producer hands the iterator back after its next item
        elif self._inline is not None and mostly_long and not self._closed:
            items, self._inline = self._inline, None
            self._start(items)

    def _resume_inline(self, paused: _Paused) -> None:
        """The producer handed its iterator back (it ends now): run it in this thread."""
        if self._thread is not None and not in_worker_thread():
            join_all([self._thread])
        self._thread = None
        self._handed.clear()
        self._handover.drain()
        self._inline = paused.items
        if self._closed:  # by another thread, between the hand-back and here
            _close(self._inline)
            raise StopIteration

    def ready(self) -> int:
        """Items assembled and waiting for the consumer (0 when running inline)."""
        return 0 if self._inline is not None else self._handover.items.qsize()

    def _take(self) -> Any:
        deadline = time.monotonic() + self._timeout
        thread = self._thread
        if thread is None:  # closed by another thread as this one moved the iterator
            raise StopIteration
        while True:
            try:
                item = self._handover.items.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self._closed:  # by another thread, while this one waited
                    raise StopIteration from None
                if not thread.is_alive() and self._handover.items.empty():
                    raise RuntimeError(f"background thread {thread.name!r} ended without a result") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no batch from thread {thread.name!r} within {self._timeout:g} s"
                    ) from None
            else:
                self._handover.room.put(self._given_back(item))
                return item

    def _given_back(self, item: Any) -> Any:
        """What goes back with the token for ``item``: the item handed out :data:`_HANDED` takes
        before it, or None."""
        if item is _END or isinstance(item, (ThreadFailure, _Paused)):
            return None
        handed = self._handed
        handed.append(item)
        return handed.popleft() if len(handed) > _HANDED else None

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
            # from another thread while the consumer runs it, the stop ends it instead
            with contextlib.suppress(ValueError):
                _close(self._inline)
        self._handed.clear()
        self._handover.drain()
        self._handover.room.put(None)  # a producer waiting for room wakes now, and stops
        if self._thread is not None and not in_worker_thread():
            join_all([self._thread])
            self._handover.drain()  # what it put before it saw the stop
