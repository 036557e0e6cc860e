"""Streamed partitions: a subquery larger than ``fetch_bytes``, read by one query in pieces.

Planning cuts such a subquery into pieces (see :func:`~ddbloader._sql.plan.pieces`): consecutive
partitions of its group, each within the budget, which the manager loads like any others, so
the kept edge rows stitch windows across their boundaries and every sample comes out exactly
once. This module reads them: one query per subquery, whose rows arrive through the cursor's
reader (``cursor.batches``: DuckDB's and ADBC's Arrow record batch readers, DB-API
``fetchmany``), and each piece's :class:`~ddbloader._io.threads.Pending` resolves as soon as its
rows have arrived, so the first samples are served before the last rows leave the engine.

Backpressure: a stream reads a piece only once the manager has asked for it or for a later one
(whose rows come after it), so at most the pieces the manager holds (``prepartition_num`` per
active group) and one reader batch are in memory. Rows before the first piece asked for are
read and dropped: a resumed epoch starts mid-subquery. The rows of a piece are those of the
subquery's result in the engine's order, as for a partition fetched alone: with a total
``ORDER BY`` they are the same rows run after run; without one, the engine's order decides.

A range piece (see :mod:`ddbloader._sql.pieces`) is read here too, as a subquery of one piece:
its own query, outside fetch units, its rows checked against the planned count.

Thread model: a stream is a job of the fetch pool (:mod:`ddbloader._io.retry`) with a cursor of
its own, whose result stays open between pieces. It runs on a pool thread only while a piece
asked for is not delivered, and gives the thread back (parks) as soon as none is: no pool thread
ever waits for the manager, so a stream cannot starve the fetches the manager waits for, nor
they it. A claim on a parked stream queues it again, on the thread that opened its cursor. A
piece asked for again, or one behind the reader (after a fast-forward, a neighbour whose edge
rows a window needs), starts a new stream; the old one delivers what it was asked for, then
ends. A transient error is retried by the pool's retry loop on a fresh cursor: the stream reads
again from the first row and skips to the first piece not delivered, so each row is served once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .._core.engine import Cursor
from .._sql.fingerprint import HashSum, content_mismatch
from .._sql.layout import ColumnLayout
from .._sql.plan import PartitionSpec
from .._sql.read import whole_read
from .block import Block
from .convert import check_result_schema, to_block
from .retry import CursorSlot, Tasks, pool_thread
from .threads import Pending, Stopped, ThreadFailure

__all__ = ["Reading", "Streams", "read_batches"]

#: A streamed subquery's identity within a plan: (group index, position of its first piece).
StreamKey = tuple[int, int]


def read_batches(cursor: Cursor, sql: str, params: Sequence[Any], rows: int) -> Iterator[pa.Table]:
    """``sql``'s rows in order, about ``rows`` at a time, read as the iterator advances.

    Through the cursor's ``batches`` when it has one; else the whole result at once (an engine
    without a streaming reader: the pieces still bound what the manager holds).
    """
    batches = getattr(cursor, "batches", None)
    if callable(batches):
        read: Iterator[pa.Table] = batches(sql, params, rows)
        return read
    return iter([cursor.fetch(sql, params)])


@dataclass(frozen=True)
class Reading:
    """What every stream of a fetcher shares: the layout its rows convert to, the stop event and
    the pool's queue (see :class:`~ddbloader._io.fetch.Fetcher`)."""

    layout: ColumnLayout
    stop: threading.Event
    tasks: Tasks


class _Rows:
    """Consecutive rows cut from a stream of tables, reading no table before it is needed."""

    def __init__(self, tables: Iterator[pa.Table]) -> None:
        self._tables = tables
        self._held: list[pa.Table] = []
        self._rows = 0

    def take(self, count: int) -> pa.Table | None:
        """The next ``count`` rows (fewer when the result ends first; None when no row is left)."""
        while self._rows < count:
            table = next(self._tables, None)
            if table is None:
                break
            self._held.append(table)
            self._rows += table.num_rows
        if not self._held:
            return None
        # DB-API tables infer their types per batch (a batch of NULLs has none): promote them
        held = pa.concat_tables(self._held, promote_options="permissive")
        taken = held.slice(0, count)
        rest = held.slice(count)
        self._held = [rest] if rest.num_rows else []
        self._rows = rest.num_rows
        return taken

    def close(self) -> None:
        """End the reader (the engine's cursor stays open: close this before dropping it, whose
        connection the reader's own cleanup may still use). A failure while closing is not
        raised: the rows were delivered, or the error that ended the read is the one to report."""
        close = getattr(self._tables, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()


class _Stream:
    """One query reading the pieces of one subquery that are asked for, in order: a fetch-pool
    job (see :class:`~ddbloader._io.retry.Job`). Thread-safe.

    ``claim`` and ``close_after_claims`` (the assembler) and ``run`` (a pool thread) meet under
    one condition: pieces asked for wait in ``_claims``, in piece order, until their rows arrive.
    Invariant: the job is queued or running (``_queued``) while a claim waits or it is closing,
    and never twice at once (it is queued again only after it parked, on its cursor's thread);
    its reader and cursor are closed once it ended and no thread runs it.
    """

    def __init__(self, spec: PartitionSpec, slot: CursorSlot, reading: Reading) -> None:
        self._head = spec
        self._spec = spec
        self._slot = slot
        self._reading = reading
        self._cond = threading.Condition()
        self._claims: dict[int, tuple[PartitionSpec, Pending[Block]]] = {}
        self._last_claimed = -1
        self._closing = False
        self._ended = False
        self._queued = False
        self._running = False
        #: the pool thread that opened the cursor (None before): the stream resumes there
        self._home: int | None = None
        self._rows: _Rows | None = None
        self._at = 0
        self._digest = HashSum()
        #: pieces and rows delivered and queries sent, not yet reported to the pool
        self._counts = [0, 0, 0]

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def own_slot(self) -> CursorSlot:
        return self._slot

    def describe(self) -> str:
        return self._spec.describe()

    def label(self) -> str:
        spec = self._spec
        return f"piece {spec.piece + 1} of {spec.pieces} of group {spec.group}'s partition {spec.head}"

    def claim(self, spec: PartitionSpec) -> Pending[Block] | None:
        """A waiter for piece ``spec``, or None when this stream will not read it (it ended, is
        closing, or its reader may be past that piece)."""
        with self._cond:
            if self._ended or self._closing or spec.piece <= self._last_claimed:
                return None
            pending: Pending[Block] = Pending(f"fetching {spec.describe()}, streamed")
            self._claims[spec.piece] = (spec, pending)
            self._last_claimed = spec.piece
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
            self._reading.tasks.put(self, self._home)

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
            rows, self._rows = self._rows, None
            if rows is not None:  # before the cursor its reader may still use
                rows.close()
            self._slot.drop()

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        """Deliver the pieces asked for, then park; the pieces and rows delivered, the queries
        sent. An error leaves the stream to read again from the first row (see the module)."""
        with self._cond:
            self._running = True
        try:
            return self._read(cursor)
        except BaseException:
            rows, self._rows = self._rows, None
            if rows is not None:  # before the retry loop drops the cursor its reader may still use
                rows.close()
            raise
        finally:
            with self._cond:
                self._running = False
                ended = self._ended
            if ended:
                self._close()

    def _read(self, cursor: Cursor) -> tuple[int, int, int]:
        while (spec := self._next_claim()) is not None:
            if self._rows is None:
                self._counts[2] += 1
                self._open(cursor)
            block = self._read_piece(spec)
            with self._cond:
                claim = self._claims.pop(spec.piece, None)  # None: cancelled while it was read
                self._ended = self._ended or spec.piece == spec.pieces - 1
            if claim is not None:
                claim[1].set(block)
            self._counts[0] += 1
            self._counts[1] += block.rows
        # what a run that failed before a retry delivered is reported with the run after it
        delivered, rows, queries = self._counts
        self._counts = [0, 0, 0]
        return delivered, rows, queries

    def _open(self, cursor: Cursor) -> None:
        """Start the query on ``cursor``, a fresh one opened on this thread."""
        spec = self._head
        with self._cond:
            self._home = pool_thread()
        # verify=True: every row read (skipped or delivered) is hashed, so the last piece checks all
        self._digest = HashSum()
        read = whole_read(spec)
        tables = read_batches(cursor, read.sql, read.params, spec.rows)
        self._rows = _Rows(self._digest.stripping(tables) if read.hashed else tables)
        self._at = 0

    def _next_claim(self) -> PartitionSpec | None:
        """The first piece asked for and not delivered; None when there is none (the stream
        parks, or ends if it is closing).

        Raises:
            Stopped: the fetcher is closing.
        """
        with self._cond:
            if self._reading.stop.is_set():
                raise Stopped
            if self._ended:
                return None
            if self._claims:
                self._spec = self._claims[min(self._claims)][0]
                return self._spec
            if self._closing:
                self._ended = True
            self._queued = False
            return None

    def _read_piece(self, spec: PartitionSpec) -> Block:
        """Piece ``spec``'s rows, checked against planning (skipping the rows before it)."""
        rows = self._rows
        assert rows is not None
        while self._at < spec.first_row:
            skipped = rows.take(min(spec.first_row - self._at, spec.rows))
            if skipped is None:
                raise _changed(spec, self._at)
            self._at += skipped.num_rows
        table = rows.take(spec.rows)
        self._at += 0 if table is None else table.num_rows
        if table is None or table.num_rows != spec.rows:
            raise _changed(spec, self._at)
        check_result_schema(table.schema, self._reading.layout, spec.describe)
        block = to_block(spec.in_order(table), self._reading.layout)
        if spec.piece == spec.pieces - 1:
            if (extra := rows.take(1)) is not None and extra.num_rows:
                raise _changed(spec, self._at + extra.num_rows)
            fingerprint = self._head.fingerprint
            if fingerprint is not None and self._digest.total != fingerprint.content:
                whole = f"{spec.describe()}, read in {spec.pieces} pieces"
                raise content_mismatch(
                    whole if spec.pieces > 1 else spec.describe(),
                    spec.key_params,
                    self._at,
                    fingerprint.content,
                    self._digest.total,
                )
        return block


def _changed(spec: PartitionSpec, rows: int) -> ValueError:
    planned = spec.first_row + spec.rows
    found = f"ended after {rows} rows" if rows < planned else f"returned {rows} rows"
    return ValueError(
        f"{spec.describe()} {found}, but planning counted {planned} up to the end of this piece: "
        f"the data changed after the loader was built (len(), the windows and the sample order "
        f"all rest on those counts); build the loader again"
    )


class Streams:
    """The streamed subqueries of one epoch's fetcher: one live stream per subquery. Thread-safe.

    ``claim`` and ``release`` are called from the assembler; ``stop`` once the stop event is set,
    ``close`` once the pool's threads are joined (the fetcher's ``close``).
    """

    def __init__(self, slot: Callable[[], CursorSlot], reading: Reading) -> None:
        self._slot = slot
        self._reading = reading
        self._lock = threading.Lock()
        self._current: dict[StreamKey, _Stream] = {}
        self._heads: dict[tuple[int, int], int] = {}
        self._streams: list[_Stream] = []

    def claim(self, spec: PartitionSpec) -> Pending[Block]:
        """Piece ``spec`` from its subquery's live stream if that has not passed it, else from a
        new stream."""
        key = (spec.group, spec.head)
        with self._lock:
            self._heads[spec.group, spec.position] = spec.head
            stream = self._current.get(key)
            pending = stream.claim(spec) if stream is not None else None
            if pending is not None:
                return pending
            if stream is not None:
                stream.close_after_claims()
            stream = _Stream(spec, self._slot(), self._reading)
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
