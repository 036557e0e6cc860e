"""The prefetch stage: one producer thread assembling items ahead of the consumer, bounded hand-over."""

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

#: Items the consumer was handed that stay referenced here: the one it holds and the one before,
#: which it lets go after its next step starts (``x, y = next(it)`` rebinds after the call).
_HANDED = 2


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
        """Drop the items not taken, and those the tokens carry."""
        for waiting in (self.items, self.room):
            while True:
                try:
                    waiting.get_nowait()
                except queue.Empty:
                    break


class Prefetcher(Generic[T]):
    """Runs ``make(stop)``'s iterator in a background thread, ``depth`` items ahead.

    With ``depth == 0`` the iterator runs in the consumer's thread instead. Single-consumer:
    ``__next__`` must be called from one thread at a time. ``close()`` is idempotent and may be
    called from another thread: a consumer waiting in ``__next__`` then gets StopIteration.

    Memory: besides ``depth`` items ahead, it keeps the consumer's last :data:`_HANDED` items
    referenced until its next take (they are released in the producer's thread, see
    :class:`_Handover`), one item more than a consumer that rebinds its batch holds.
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
        #: the items handed to the consumer and not yet given back with a token, oldest first
        self._handed: deque[Any] = deque()
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
                self._handover.room.put(self._given_back(item))
                return item

    def _given_back(self, item: Any) -> Any:
        """What goes back with the token for ``item``: the item handed out :data:`_HANDED` takes
        before it, or None."""
        if item is _END or isinstance(item, ThreadFailure):
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
            close = getattr(self._inline, "close", None)
            if close is not None:
                close()
        self._handed.clear()
        self._handover.drain()
        self._handover.room.put(None)  # a producer waiting for room wakes now, and stops
        if self._thread is not None and not in_worker_thread():
            join_all([self._thread])
            self._handover.drain()  # what it put before it saw the stop
