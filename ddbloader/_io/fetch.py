"""Background partition fetches: a small pool of threads, each with its own cursor.

Fetches run in any order and in parallel; the assembler waits on the :class:`Pending` of the
partition it needs next, so the emitted order never depends on which fetch finishes first.

A fetch that fails with a transient error (:func:`~ddbloader._io.retry.is_transient`) is tried again, up to
``RetryPolicy.retries`` more times, on a fresh cursor: the old one is closed and
``backend.cursor()`` called again, which is how a backend built from a factory or a URI
reconnects after its connection died. Every wait re-checks the stop event. Any other error
reaches the waiter at once, as the original exception with a note naming the subquery. A retry
never changes what a partition holds, so the emitted sequence is the same with or without one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from .._core.engine import Backend
from .._epoch.visits import PartitionKey
from .._sql.partition import PartitionSpec, Read, whole_read
from .._sql.plan import QueryPlan
from .block import Block
from .reader import Alone, ReadJob, Waiters
from .retry import Cursors, CursorSlot, RetryPolicy, Tasks, fetch_worker
from .streams import Reading, Streams
from .threads import Pending, join_all, start_thread
from .unit_fetch import Coalescer

__all__ = ["Fetcher"]


class Fetcher:
    """A pool of ``threads`` fetch threads named ``ddbloader-fetch-N``, reading ``plan``'s partitions.

    Each thread opens its cursor on its first fetch and keeps it until a transient error (then a
    fresh one is opened) or ``close``. ``submit`` and ``release`` are called from one thread (the
    assembler); ``close`` from any, once or more.
    """

    def __init__(
        self,
        backend: Backend,
        plan: QueryPlan,
        threads: int,
        on_fetched: Callable[[int, int, int, float], None] = lambda partitions, rows, queries, seconds: None,
        *,
        retry: RetryPolicy = RetryPolicy(),
        units: Iterable[Read] = (),
    ) -> None:
        self._backend = backend
        self._layout = plan.layout
        self._groups = plan.groups
        self._units = Coalescer(units)
        self._tasks = Tasks(threads)
        self._cursors = Cursors(threading.Event())
        self._streams = Streams(
            lambda: CursorSlot(backend, self._cursors),
            Reading(plan.groups, plan.layout, backend, self._cursors.stop, self._tasks),
        )
        self._threads = [
            start_thread(
                fetch_worker,
                n,
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
        """Queue a fetch of ``spec``; the result arrives as a :class:`~ddbloader._io.block.Block`.

        A partition of a fetch unit comes from its unit's query the first time it is asked for
        (starting that unit and the next if they have not started), else from its own subquery;
        a partition no key-list query reads (a piece of a streamed subquery, a range piece no
        unit serves) comes from its subquery's streaming query.
        """
        group = self._groups[spec.group]
        keyed = group.keyed[spec.position]
        if not keyed and group.read_runs[spec.position] is None:  # no unit holds it: do not look
            return self._streams.claim(spec)
        pending, start = self._units.claim(spec)
        for index in start:
            read = self._units.units[index]
            self._read(read, self._units.waiters(index), f"fetch unit {index} ({len(read.cells)} partitions)")
        if pending is not None:
            return pending
        if not keyed:
            return self._streams.claim(spec)
        alone = Alone(spec)
        self._read(
            whole_read(spec),
            alone,
            f"partition {spec.position} of group {spec.group} (parameters {list(spec.params)!r})",
        )
        return alone.result

    def _read(self, read: Read, waiters: Waiters, name: str) -> None:
        self._tasks.put(ReadJob(read, waiters, name, self._layout, self._backend, self._cursors.stop))

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
        self._streams.stop()  # downstream first: each parked stream is cancelled on its own thread
        self._tasks.wake()
        join_all(self._threads)
        for task in self._tasks.drain():
            task.cancel()
        self._streams.close()
        for index in range(len(self._units.units)):
            self._units.cancel(index)
