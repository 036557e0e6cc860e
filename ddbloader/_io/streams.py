"""Streamed reads: a subquery larger than ``fetch_bytes``, read by one query in pieces.

Planning cuts such a subquery into pieces (see :func:`~ddbloader._sql.plan.pieces`): consecutive
partitions of its group, each within the budget, which the manager loads like any others, so
the kept edge rows stitch windows across their boundaries and every sample comes out exactly
once. Its read (planned as :func:`~ddbloader._sql.read.stream_read`, split by rows) is run by the reader
(:class:`~ddbloader._io.reader.ReadJob`) like any other; this module holds what a streamed read
adds: the pieces asked for (a :class:`Stream`, the read's waiters), when its job runs, and one
live stream per subquery (:class:`Streams`). Its rows arrive through the cursor's reader
(:func:`~ddbloader._io.reader.read_batches`: DuckDB's and ADBC's Arrow record batch readers,
DB-API ``fetchmany``), and each piece's :class:`~ddbloader._io.threads.Pending` resolves as
soon as its rows have arrived, so the first samples are served before the last rows leave the
engine.

Backpressure: a stream reads a piece only once the manager has asked for it or for a later one
(whose rows come after it), so at most the pieces the manager holds (``prepartition_num`` per
active group) and one reader batch are in memory. Rows before the first piece asked for are
read and dropped: a resumed epoch starts mid-subquery. A piece asked for again, or one behind
the reader (after a fast-forward, a neighbour whose edge rows a window needs), starts a new
stream; the old one delivers what it was asked for, then ends.

Thread model: a stream's job runs on the fetch pool (:mod:`ddbloader._io.retry`) with a cursor of
its own, whose result stays open between pieces, and only while a piece asked for is not
delivered: it gives the thread back (parks) as soon as none is, and a claim on a parked stream
queues it again, on the thread that opened its cursor. Invariant (no starvation): no pool thread
waits for the manager, so every queued job starts once the jobs ahead of it read what was asked
of them; a stream cannot starve the fetches the manager waits for, nor they it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from .._core.engine import Backend
from .._sql.layout import ColumnLayout
from .._sql.partition import PartitionSpec
from .._sql.plan import GroupPlan
from .block import Block
from .reader import ReadJob, read_batches
from .retry import CursorSlot, Tasks, pool_thread
from .threads import Pending, Stopped, ThreadFailure
from .unit_split import UnitPartitions

__all__ = ["Reading", "Stream", "Streams", "read_batches"]

#: A streamed subquery's identity within a plan: (group index, position of its first piece).
StreamKey = tuple[int, int]


@dataclass(frozen=True)
class Reading:
    """What every stream of a fetcher shares: the plan's groups, the layout rows convert to, the
    backend, the stop event and the pool's queue (see :class:`~ddbloader._io.fetch.Fetcher`)."""

    groups: Sequence[GroupPlan]
    layout: ColumnLayout
    backend: Backend
    stop: threading.Event
    tasks: Tasks


class Stream:
    """The pieces of one streamed read asked for, in order, and when its job runs: the read's
    waiters (see :class:`~ddbloader._io.reader.Claims`). Thread-safe. ``key`` is the
    ``(group, position)`` of the read's first piece.

    ``claim`` and ``close_after_claims`` (the assembler) and the job (a pool thread) meet under
    one condition: pieces asked for wait in ``_claims``, by position, until their rows arrive.
    Invariant: the job is queued or running (``_queued``) while a claim waits or it is closing,
    and never twice at once (it is queued again only after it parked, on its cursor's thread);
    its result and cursor are closed once it ended and no thread runs it.
    """

    def __init__(self, key: tuple[int, int], slot: CursorSlot, reading: Reading) -> None:
        group, head = key
        read = reading.groups[group].reads[head]
        assert read is not None, "a partition read by its own subquery is not streamed"
        name = f"group {group}'s partition {head}, streamed in {len(read.cells)} pieces"
        self.job = ReadJob(read, self, name, reading.layout, reading.backend, reading.stop, slot=slot)
        self._last = read.cells[-1].position
        self._tasks = reading.tasks
        self._stop = reading.stop
        self._cond = threading.Condition()
        self._claims: dict[int, tuple[PartitionSpec, Pending[Block]]] = {}
        self._last_claimed = -1
        self._closing = False
        self._ended = False
        self._queued = False
        self._running = False
        #: the pool thread that opened the cursor (None before): the job resumes there
        self._home: int | None = None

    @property
    def ended(self) -> bool:
        return self._ended

    def claim(self, spec: PartitionSpec) -> Pending[Block] | None:
        """A waiter for piece ``spec``, or None when this stream will not read it (it ended, is
        closing, or its reader may be past that piece)."""
        with self._cond:
            if self._ended or self._closing or spec.position <= self._last_claimed:
                return None
            pending: Pending[Block] = Pending(f"fetching {spec.describe(self.job.read)}, streamed")
            self._claims[spec.position] = (spec, pending)
            self._last_claimed = spec.position
            self._schedule()
            return pending

    def close_after_claims(self) -> None:
        """Deliver what was asked for, then end."""
        with self._cond:
            self._closing = True
            self._schedule()

    def wake(self) -> None:
        """Queue a parked stream on its thread, which cancels it there (the stop event is set)."""
        with self._cond:
            self._schedule()

    def _schedule(self) -> None:
        """Queue the job unless it is queued, running or ended (call under ``_cond``)."""
        if not self._queued and not self._ended:
            self._queued = True
            self._tasks.put(self.job, self._home)

    def opened(self) -> None:
        """The job opened its cursor on the calling pool thread: it resumes there."""
        with self._cond:
            self._home = pool_thread()

    def next_claim(self) -> PartitionSpec | None:
        """The first piece asked for and not delivered; None when there is none (the job parks,
        or the stream ends if it is closing).

        Raises:
            Stopped: the fetcher is closing.
        """
        with self._cond:
            if self._stop.is_set():
                raise Stopped
            if self._ended:
                return None
            if self._claims:
                return self._claims[min(self._claims)][0]
            if self._closing:
                self._ended = True
            self._queued = False
            return None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """While the job runs on a pool thread (it closes its result if the stream ended then)."""
        with self._cond:
            self._running = True
        try:
            yield
        finally:
            with self._cond:
                self._running = False
                ended = self._ended
            if ended:
                self._close()

    def deliver(self, partitions: UnitPartitions) -> None:
        """One piece read (None to set when it was cancelled while it was read)."""
        spec = partitions.specs[0]
        with self._cond:
            claim = self._claims.pop(spec.position, None)
            self._ended = self._ended or spec.position == self._last
        if claim is not None:
            claim[1].set(partitions.block(0))

    def split_failed(self) -> None:
        """A streamed read is split by rows, never by keys: never called."""

    def fail(self, failure: ThreadFailure) -> None:
        self._end(lambda pending: pending.fail(failure))

    def cancel(self) -> None:
        """Give up on every piece asked for and not delivered (the fetcher is closing)."""
        self._end(lambda pending: pending.cancel())

    def _end(self, settle: Callable[[Pending[Block]], None]) -> None:
        with self._cond:
            self._ended = True
            for _, pending in self._claims.values():
                settle(pending)
            self._claims.clear()
            running = self._running
        if not running:
            self._close()

    def _close(self) -> None:
        with self._cond:  # the thread that ran it last and the one that ended it may both get here
            self.job.close()


class Streams:
    """The streamed subqueries of one epoch's fetcher: one live stream per subquery. Thread-safe.

    ``claim`` and ``release`` are called from the assembler; ``stop`` once the stop event is set,
    ``close`` once the pool's threads are joined (the fetcher's ``close``).
    """

    def __init__(self, slot: Callable[[], CursorSlot], reading: Reading) -> None:
        self._slot = slot
        self._reading = reading
        self._lock = threading.Lock()
        self._current: dict[StreamKey, Stream] = {}
        self._heads: dict[tuple[int, int], int] = {}
        self._streams: list[Stream] = []

    def claim(self, spec: PartitionSpec) -> Pending[Block]:
        """Piece ``spec`` from its subquery's live stream if that has not passed it, else from a
        new stream."""
        head = self._reading.groups[spec.group].heads[spec.position]
        key = (spec.group, head)
        with self._lock:
            self._heads[spec.group, spec.position] = head
            stream = self._current.get(key)
            pending = stream.claim(spec) if stream is not None else None
            if pending is not None:
                return pending
            if stream is not None:
                stream.close_after_claims()
            stream = Stream(key, self._slot(), self._reading)
            pending = stream.claim(spec)
            assert pending is not None
            self._current[key] = stream
            self._streams = [s for s in self._streams if not s.ended] + [stream]
            if self._reading.stop.is_set():  # the fetcher closed: no thread will run it
                stream.cancel()
            return pending

    def release(self, keys: Iterable[tuple[int, int]]) -> None:
        """The manager will not ask for ``keys`` (``(group, position)``) again: their streams
        deliver what was asked for, then end."""
        if not self._heads:  # no piece claimed (only the assembler adds them): nothing to end
            return
        with self._lock:
            for group, position in keys:
                head = self._heads.pop((group, position), None)
                stream = self._current.pop((group, head), None) if head is not None else None
                if stream is not None:
                    stream.close_after_claims()

    def stop(self) -> None:
        """Queue every parked stream on its thread, which cancels it there."""
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.wake()

    def close(self) -> None:
        """Cancel what the streams did not deliver and close their cursors."""
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            stream.cancel()
