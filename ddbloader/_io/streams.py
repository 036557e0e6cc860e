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

Each stream runs on its own thread (``ddbloader-stream-G-P``) and cursor, so a stream waiting
for the manager never holds up the fetch pool. A piece asked for again, or one behind the
reader (after a fast-forward, a neighbour whose edge rows a window needs), starts a new stream;
the old one delivers what it was asked for, then ends. A transient error is retried on a fresh
cursor from the first piece not yet delivered.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from .._core.engine import Cursor, redact_uri
from .._sql.fingerprint import HashSum, content_mismatch
from .._sql.layout import ColumnLayout
from .._sql.plan import PartitionSpec
from .block import Block
from .convert import check_result_schema, to_block
from .threads import POLL_SECONDS, Pending, Stopped, ThreadFailure, join_all, start_thread

__all__ = ["Reading", "Streams", "read_batches"]

_log = logging.getLogger("ddbloader")

#: A streamed subquery's identity within a plan: (group index, position of its first piece).
StreamKey = tuple[int, int]


class CursorSlot(Protocol):
    """A cursor opened on first use and dropped (closed) after a failure or at the end."""

    def get(self) -> Cursor: ...
    def drop(self) -> None: ...


class Retry(Protocol):
    """How often a failed read is tried again (:class:`~ddbloader._io.retry.RetryPolicy`)."""

    @property
    def retries(self) -> int: ...

    def delay(self, attempt: int) -> float: ...


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
    """What every stream of a fetcher shares: the layout its rows convert to, the stop event,
    the retry policy, the judge of transient errors and the stats callback (see
    :class:`~ddbloader._io.fetch.Fetcher`)."""

    layout: ColumnLayout
    stop: threading.Event
    retry: Retry
    transient: Callable[[BaseException], bool]
    on_fetched: Callable[[int, int, int, float], None]


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


class _Done(Exception):
    """Nothing more is asked of a stream: it ends."""


class _Stream:
    """One query reading the pieces of one subquery that are asked for, in order. Thread-safe.

    ``claim`` (the assembler) and ``read`` (the stream's thread) meet under one condition:
    pieces asked for wait in ``_claims``, in piece order, until their rows arrive.
    """

    def __init__(self, spec: PartitionSpec, slot: CursorSlot, reading: Reading) -> None:
        self._spec = spec
        self._slot = slot
        self._reading = reading
        self._stop = reading.stop
        self._cond = threading.Condition()
        self._claims: dict[int, tuple[PartitionSpec, Pending[Block]]] = {}
        self._last_claimed = -1
        self._closing = False
        self._ended = False

    def claim(self, spec: PartitionSpec) -> Pending[Block] | None:
        """A waiter for piece ``spec``, or None when this stream will not read it (it ended, is
        closing, or its reader may be past that piece)."""
        with self._cond:
            if self._ended or self._closing or spec.piece <= self._last_claimed:
                return None
            pending: Pending[Block] = Pending(f"fetching {spec.describe()}, streamed")
            self._claims[spec.piece] = (spec, pending)
            self._last_claimed = spec.piece
            self._cond.notify_all()
            return pending

    def close_after_claims(self) -> None:
        """Deliver what was asked for, then end."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def cancel(self) -> None:
        """Give up on every piece asked for and not delivered (the fetcher is closing)."""
        self._end(lambda pending: pending.cancel())

    def _end(self, settle: Callable[[Pending[Block]], None]) -> None:
        with self._cond:
            self._ended = True
            for _, pending in self._claims.values():
                settle(pending)
            self._claims.clear()

    def _next_claim(self) -> tuple[PartitionSpec, Pending[Block]]:
        """The first piece asked for and not delivered, once there is one.

        Raises:
            _Done: the stream is closing and nothing more is asked for.
            Stopped: the fetcher is closing.
        """
        with self._cond:
            while True:
                if self._stop.is_set():
                    raise Stopped
                if self._claims:
                    return self._claims[min(self._claims)]
                if self._closing:
                    self._ended = True
                    raise _Done
                self._cond.wait(POLL_SECONDS)

    def _delivered(self, spec: PartitionSpec, block: Block) -> None:
        with self._cond:
            _, pending = self._claims.pop(spec.piece)
            if spec.piece == spec.pieces - 1:
                self._ended = True
        pending.set(block)

    def read(self) -> None:
        """The stream's thread: read, deliver, retry on a transient error (see the module)."""
        attempt = 0
        try:
            while not self._read_once(attempt := attempt + 1):
                pass
        finally:
            self._slot.drop()

    def _read_once(self, attempt: int) -> bool:
        """One query: deliver the pieces asked for; False to try again on a fresh cursor."""
        spec = self._spec
        rows: _Rows | None = None
        started = time.perf_counter()
        # verify=True: every row read (skipped or delivered) is hashed, so the last piece checks all
        fingerprint = spec.fingerprint
        digest = HashSum()
        try:
            sql = spec.sql if fingerprint is None else fingerprint.sql
            tables = read_batches(self._slot.get(), sql, spec.params, spec.rows)
            rows = _Rows(tables if fingerprint is None else digest.stripping(tables))
            at, queries = 0, 1
            while True:
                spec, _ = self._next_claim()
                while at < spec.first_row:
                    skipped = rows.take(min(spec.first_row - at, spec.rows))
                    if skipped is None:
                        raise self._changed(spec, at)
                    at += skipped.num_rows
                table = rows.take(spec.rows)
                at += 0 if table is None else table.num_rows
                if table is None or table.num_rows != spec.rows:
                    raise self._changed(spec, at)
                check_result_schema(table.schema, self._reading.layout, spec.describe)
                if spec.ranges is not None:  # a combed piece's query may leave its order to us
                    table = spec.ranges.in_order(table)
                block = to_block(table, self._reading.layout)
                if spec.piece == spec.pieces - 1 and (extra := rows.take(1)) is not None and extra.num_rows:
                    raise self._changed(spec, at + extra.num_rows)
                last = spec.piece == spec.pieces - 1
                if last and fingerprint is not None and digest.total != fingerprint.content:
                    raise content_mismatch(
                        f"{spec.describe()}, read in {spec.pieces} pieces"
                        if spec.pieces > 1
                        else spec.describe(),
                        spec.key_params,
                        at,
                        fingerprint.content,
                        digest.total,
                    )
                self._delivered(spec, block)
                self._reading.on_fetched(1, block.rows, queries, time.perf_counter() - started)
                queries, started = 0, time.perf_counter()
                if spec.piece == spec.pieces - 1:
                    return True
        except (_Done, Stopped):
            self.cancel()
            return True
        except BaseException as error:  # every failure must reach the consumer, whatever its type
            if rows is not None:  # before the retry drops the cursor its reader may still use
                rows.close()
            if self._retry_after(error, attempt, spec):
                return False
            failure = ThreadFailure(error, f"streaming {spec.describe()}")
            self._end(lambda pending: pending.fail(failure))
            return True
        finally:
            if rows is not None:
                rows.close()

    def _retry_after(self, error: BaseException, attempt: int, spec: PartitionSpec) -> bool:
        """Whether to read again from the first piece not delivered, on a fresh cursor."""
        self._slot.drop()
        retry = self._reading.retry
        if attempt > retry.retries or self._stop.is_set() or not self._reading.transient(error):
            return False
        delay = retry.delay(attempt)
        _log.warning(
            "streaming %s failed on attempt %d of %d with %s: %s; reading again from that piece on a "
            "fresh cursor in %.3g s",
            spec.describe(),
            attempt,
            retry.retries + 1,
            type(error).__name__,
            redact_uri(str(error)),
            delay,
        )
        return not self._stop.wait(delay)

    @staticmethod
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

    ``claim`` and ``release`` are called from the assembler; ``close`` once, after the stop
    event is set and the cursors interrupted (the fetcher's ``close``).
    """

    def __init__(self, slot: Callable[[], CursorSlot], reading: Reading) -> None:
        self._slot = slot
        self._reading = reading
        self._stop = reading.stop
        self._lock = threading.Lock()
        self._current: dict[StreamKey, _Stream] = {}
        self._heads: dict[tuple[int, int], int] = {}
        self._streams: list[tuple[_Stream, threading.Thread]] = []

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
            self._streams = [(s, t) for s, t in self._streams if t.is_alive()]
            if self._stop.is_set():
                stream.cancel()
                return pending
            thread = start_thread(stream.read, name=f"ddbloader-stream-{spec.group}-{spec.head}")
            self._streams.append((stream, thread))
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

    def close(self) -> None:
        """Join the streams' threads and cancel what they did not deliver."""
        with self._lock:
            streams = list(self._streams)
        join_all([thread for _, thread in streams])
        for stream, _ in streams:
            stream.cancel()
