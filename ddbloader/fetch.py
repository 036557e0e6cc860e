"""Background partition fetches: a small pool of threads, each with its own cursor.

Fetches run in any order and in parallel; the assembler waits on the :class:`Pending` of the
partition it needs next, so the emitted order never depends on which fetch finishes first.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .backends import Backend, Cursor
from .plan import PartitionSpec
from .prefetch import POLL_SECONDS, Pending, ThreadFailure, join_all, start_thread
from .source import Block, ColumnLayout, to_block

__all__ = ["Fetcher"]


@dataclass(frozen=True)
class _Task:
    spec: PartitionSpec
    result: Pending[Block]


def _fetch_worker(
    backend: Backend,
    layout: ColumnLayout,
    tasks: queue.Queue[_Task | None],
    stop: threading.Event,
    cursors: list[Cursor],
    cursors_lock: threading.Lock,
    on_fetched: Callable[[float], None],
) -> None:
    try:
        cursor = backend.cursor()
    except BaseException as error:  # a connection failure must reach whoever waits for a fetch
        failure = ThreadFailure(error, "opening a cursor")
        while not stop.is_set():
            try:
                task = tasks.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if task is not None:
                task.result.fail(failure)
        return
    with cursors_lock:
        cursors.append(cursor)
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
            try:
                started = time.perf_counter()
                table = cursor.fetch(task.spec.sql, task.spec.params)
                block = to_block(table, layout)
                on_fetched(time.perf_counter() - started)
                task.result.set(block)
            except BaseException as error:  # every failure must reach the consumer, whatever its type
                task.result.fail(ThreadFailure(error, f"fetching {task.spec.describe()}"))
    finally:
        cursor.close()


class Fetcher:
    """A pool of ``threads`` fetch threads named ``ddbloader-fetch-N``.

    ``submit`` is called from one thread (the assembler); ``close`` from any, once or more.
    """

    def __init__(
        self,
        backend: Backend,
        layout: ColumnLayout,
        threads: int,
        on_fetched: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        # None is close()'s wake-up call: one per thread, so none waits out its poll.
        self._tasks: queue.Queue[_Task | None] = queue.Queue()
        self._stop = threading.Event()
        self._cursors: list[Cursor] = []
        self._cursors_lock = threading.Lock()
        self._threads = [
            start_thread(
                _fetch_worker,
                backend,
                layout,
                self._tasks,
                self._stop,
                self._cursors,
                self._cursors_lock,
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

        A cancelled fetch makes its waiter raise :class:`~ddbloader.prefetch.Stopped` at once.
        """
        self._stop.set()
        with self._cursors_lock:
            for cursor in self._cursors:
                cursor.interrupt()
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
