"""The reader: one fetch-pool job runs one :class:`~ddbloader._sql.partition.Read` and hands each
wanted partition's block to its waiters.

A whole read (a partition's own subquery, :func:`~ddbloader._sql.partition.whole_read`) is the
reference: its block is delivered only if it holds the rows planning counted (and, with
``verify=True``, the planned content hash), else the read is refused (see
:func:`fetch_partition`). A read of many partitions is split among
them (:func:`~ddbloader._io.unit_split.unit_blocks`); if its query fails on a non-transient
error, or its result does not split into exactly the planned partitions (or, with
``verify=True``, a cell hashes otherwise than planned), the wanted partitions are read one by one
by their whole reads, whose rows and errors are the reference.

A read split by rows (a streamed subquery, :func:`~ddbloader._sql.read.stream_read`) is read as a
stream: its waiters (:class:`Claims`, see :mod:`ddbloader._io.streams`) say which piece is asked
for next, and its result stays open between runs on a cursor of its own. Each piece is delivered
once its rows have arrived and are checked against its planned count (the last piece also against
the end of the result and, with ``verify=True``, the hash of every row read). After a transient
error the retry loop runs it again on a fresh cursor: it reads again from the first row and skips
to the first piece not delivered, so each row is served once.

Thread model: a :class:`ReadJob` runs on one pool thread at a time (the retry loop of
:mod:`ddbloader._io.retry` runs it again on a transient error); its :class:`Waiters` are called
from that thread, or from the thread that closes the fetcher.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from .._core.engine import Backend, Cursor, redact_uri
from .._sql.fingerprint import HashSum, content_mismatch, strip_hash
from .._sql.layout import ColumnLayout
from .._sql.partition import PartitionSpec, Read
from .block import Block
from .convert import check_result_schema, to_block
from .retry import CursorSlot, is_transient
from .threads import Pending, ThreadFailure
from .unit_split import UnitPartitions, check_unit_contents, unit_blocks, unit_contents

__all__ = ["Alone", "Claims", "ReadJob", "Waiters", "fetch_partition", "read_batches"]

_log = logging.getLogger("ddbloader")


class Waiters(Protocol):
    """Where a read's partitions go: the claims waiting for them."""

    def deliver(self, partitions: UnitPartitions) -> None:
        """The wanted partitions, in cell order."""
        ...

    def fail(self, failure: ThreadFailure) -> None: ...
    def cancel(self) -> None: ...

    def split_failed(self) -> None:
        """The read's result did not split exactly: its partitions are read one by one."""
        ...


@runtime_checkable
class Claims(Waiters, Protocol):
    """The waiters of a read split by rows: the pieces asked for, delivered one at a time."""

    def next_claim(self) -> PartitionSpec | None:
        """The first piece asked for and not delivered; None when there is none (the job returns)."""
        ...

    def opened(self) -> None:
        """The job opened its query on the calling pool thread."""
        ...

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Held while the job runs on a pool thread."""
        ...


class Alone:
    """The waiter of a whole read: one partition's :class:`Pending` block."""

    def __init__(self, spec: PartitionSpec) -> None:
        self.result: Pending[Block] = Pending(f"fetching {spec.describe()}")

    def deliver(self, partitions: UnitPartitions) -> None:
        self.result.set(partitions.block(0))

    def fail(self, failure: ThreadFailure) -> None:
        self.result.fail(failure)

    def cancel(self) -> None:
        self.result.cancel()

    def split_failed(self) -> None:
        """A whole read is not split: never called."""


def fetch_partition(cursor: Cursor, read: Read, layout: ColumnLayout) -> Block:
    """The rows of ``read``'s one cell, read whole (:func:`~ddbloader._sql.partition.whole_read`,
    or a range piece's own read); refused (ValueError) when they are not the rows (and content)
    planned: ``len()``, the windows and the sample order all rest on those counts, and the
    gather does not check its rows."""
    (spec,) = read.cells
    table = cursor.fetch(read.sql, read.params)
    fingerprint = spec.fingerprint
    if fingerprint is not None:  # verify=True: the hash column goes before anything else sees the rows
        table, content = strip_hash(table)
    streamed = None if read.split == "whole" else read

    def named() -> str:
        return spec.describe(streamed)

    check_result_schema(table.schema, layout, named)
    block = to_block(read.in_order(spec, table), layout)
    if block.rows != spec.rows:
        raise ValueError(
            f"{named()} returned {block.rows} rows, but planning counted {spec.rows}: the data "
            f"changed after the loader was built (len(), the windows and the sample order all rest on "
            f"those counts); build the loader again"
        )
    if fingerprint is not None and content != fingerprint.content:
        raise content_mismatch(named(), spec.params, spec.rows, fingerprint.content, content)
    return block


class ReadJob:
    """Run ``read`` on a pool thread's cursor and deliver its wanted partitions to ``waiters``
    (see the module); ``name`` names it in log lines.

    A read split by rows runs on ``slot``, a cursor of its own whose result stays open between
    runs, its waiters :class:`Claims`; each run returns once no piece asked for is unread, so it
    never holds a pool thread while it waits for the consumer. Runs on one pool thread at a time;
    :meth:`close` once its claims ended and no thread runs it.
    """

    def __init__(
        self,
        read: Read,
        waiters: Waiters,
        name: str,
        layout: ColumnLayout,
        backend: Backend,
        stop: threading.Event,
        *,
        slot: CursorSlot | None = None,
    ) -> None:
        self.read = read
        self.waiters = waiters
        self.name = name
        self.layout = layout
        self.backend = backend
        self.stop = stop
        self._slot = slot
        #: the partition being read on its own, or the piece being read (for messages)
        self._alone: PartitionSpec | None = None
        #: a read split by rows: its open result, the rows read from it, their hash
        self._rows: _Rows | None = None
        self._at = 0
        self._digest = HashSum()
        #: pieces and rows delivered and queries sent, not yet reported to the pool
        self._counts = [0, 0, 0]

    @property
    def own_slot(self) -> CursorSlot | None:
        """A read split by rows keeps its result open between runs, on a cursor of its own."""
        return self._slot

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        read = self.read
        if read.split == "rows":
            return self._stream(cursor)
        if read.split == "whole":
            block = fetch_partition(cursor, read, self.layout)
            self.waiters.deliver(UnitPartitions(read.cells, blocks=[block]))
            return 1, block.rows, 1
        partitions = self._split(cursor)
        split = partitions is not None
        if partitions is None:
            self.waiters.split_failed()
            alone = []
            for spec in read.cells:
                if spec.key in read.wanted:
                    self._alone = spec
                    alone.append((spec, fetch_partition(cursor, read.read_alone(spec), self.layout)))
            self._alone = None
            partitions = UnitPartitions([s for s, _ in alone], blocks=[b for _, b in alone])
        self.waiters.deliver(partitions)
        count = len(partitions.specs)
        return count, partitions.rows, 1 if split else 1 + count

    def _split(self, cursor: Cursor) -> UnitPartitions | None:
        """The wanted partitions of the read's result, checked; None (logged when the query
        failed) when they are to be read one by one.

        Raises:
            Exception: a transient error, or any once the fetcher is stopping.
        """
        read = self.read
        try:
            table = cursor.fetch(read.sql, read.params)
            sums = None
            if read.hashed:
                table, sums = unit_contents(table, read)
            data = table.select(range(table.num_columns - read.key_columns))
            check_result_schema(data.schema, self.layout, read.describe)
            blocks = unit_blocks(table, read, self.layout)
            if blocks is not None and sums is not None:
                check_unit_contents(read, sums)
            return blocks
        except Exception as error:
            if self.stop.is_set() or is_transient(self.backend, error):
                raise
            _log.warning(
                "fetching %s failed with %s: %s; fetching its partitions one by one",
                self.label(),
                type(error).__name__,
                redact_uri(str(error)),
            )
            return None

    def _stream(self, cursor: Cursor) -> tuple[int, int, int]:
        """Deliver the pieces asked for, then return (park); the pieces and rows delivered, the
        queries sent. An error closes the result: the next run reads again from the first row."""
        claims = self.waiters
        assert isinstance(claims, Claims)
        with claims.running():
            try:
                while (spec := claims.next_claim()) is not None:
                    if self._rows is None:
                        self._counts[2] += 1
                        self._open(cursor, claims)
                    self._alone = spec
                    block = self._piece(spec)
                    claims.deliver(UnitPartitions((spec,), blocks=[block]))
                    self._counts[0] += 1
                    self._counts[1] += block.rows
            except BaseException:
                self._end_result()  # before the retry loop drops the cursor its reader may still use
                raise
        # what a run that failed before a retry delivered is reported with the run after it
        delivered, rows, queries = self._counts
        self._counts = [0, 0, 0]
        return delivered, rows, queries

    def _open(self, cursor: Cursor, claims: Claims) -> None:
        """Start the query on ``cursor``, a fresh one opened on this thread."""
        claims.opened()
        read = self.read
        # verify=True: every row read (skipped or delivered) is hashed, so the last piece checks all
        self._digest = HashSum()
        tables = read_batches(cursor, read.sql, read.params, read.cells[0].rows)
        self._rows = _Rows(self._digest.stripping(tables) if read.hashed else tables)
        self._at = 0

    def _piece(self, spec: PartitionSpec) -> Block:
        """Piece ``spec``'s rows, checked against planning (skipping the rows before it)."""
        rows, read = self._rows, self.read
        assert rows is not None
        first = read.first_rows[spec.position]
        while self._at < first:
            skipped = rows.take(min(first - self._at, spec.rows))
            if skipped is None:
                raise _changed(spec, read, first, self._at)
            self._at += skipped.num_rows
        table = rows.take(spec.rows)
        self._at += 0 if table is None else table.num_rows
        if table is None or table.num_rows != spec.rows:
            raise _changed(spec, read, first, self._at)
        check_result_schema(table.schema, self.layout, lambda: spec.describe(read))
        block = to_block(read.in_order(spec, table), self.layout)
        if spec.position == read.cells[-1].position:
            if (extra := rows.take(1)) is not None and extra.num_rows:
                raise _changed(spec, read, first, self._at + extra.num_rows)
            fingerprint = read.cells[0].fingerprint
            if fingerprint is not None and self._digest.total != fingerprint.content:
                pieces = len(read.cells)
                raise content_mismatch(
                    f"{spec.describe(read)}, read in {pieces} pieces" if pieces > 1 else spec.describe(read),
                    spec.params,
                    self._at,
                    fingerprint.content,
                    self._digest.total,
                )
        return block

    def _end_result(self) -> None:
        rows, self._rows = self._rows, None
        if rows is not None:
            rows.close()

    def close(self) -> None:
        """End a streamed read: its result, then its cursor (whose connection the result's own
        cleanup may still use). Called once it ended and no thread runs it."""
        self._end_result()
        if self._slot is not None:
            self._slot.drop()

    def fail(self, failure: ThreadFailure) -> None:
        self.waiters.fail(failure)

    def cancel(self) -> None:
        self.waiters.cancel()

    def describe(self) -> str:
        return self.read.describe() if self._alone is None else self._alone.describe()

    def label(self) -> str:
        return self.name


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


def _changed(spec: PartitionSpec, read: Read, first: int, rows: int) -> ValueError:
    planned = first + spec.rows
    found = f"ended after {rows} rows" if rows < planned else f"returned {rows} rows"
    return ValueError(
        f"{spec.describe(read)} {found}, but planning counted {planned} up to the end of this piece: "
        f"the data changed after the loader was built (len(), the windows and the sample order "
        f"all rest on those counts); build the loader again"
    )
