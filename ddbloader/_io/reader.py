"""The reader: one fetch-pool job runs one :class:`~ddbloader._sql.read.Read` that is not
streamed and hands each wanted partition's block to its waiters.

A whole read (a partition's own subquery, :func:`~ddbloader._sql.read.whole_read`) is the
reference: its block is delivered only if it holds the rows planning counted (and, with
``verify=True``, the planned content hash), else the read is refused (see
:func:`~ddbloader._io.partition_fetch.fetch_partition`). A read of many partitions is split among
them (:func:`~ddbloader._io.unit_split.unit_blocks`); if its query fails on a non-transient
error, or its result does not split into exactly the planned partitions (or, with
``verify=True``, a cell hashes otherwise than planned), the wanted partitions are read one by one
by their whole reads, whose rows and errors are the reference.

Thread model: a :class:`ReadJob` runs on one pool thread at a time (the retry loop of
:mod:`ddbloader._io.retry` runs it again on a transient error); its :class:`Waiters` are called
from that thread, or from the thread that closes the fetcher.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import pyarrow as pa

from .._core.engine import Backend, Cursor, redact_uri
from .._sql.fingerprint import content_mismatch, strip_hash
from .._sql.layout import ColumnLayout
from .._sql.plan import PartitionSpec
from .._sql.read import Read
from .block import Block
from .convert import check_result_schema
from .partition_fetch import fetch_partition
from .retry import is_transient
from .threads import Pending, ThreadFailure
from .unit_split import UnitPartitions, split_by_key, unit_blocks

__all__ = ["Alone", "ReadJob", "Waiters"]

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


def _unit_contents(table: pa.Table, read: Read) -> tuple[pa.Table, list[int] | None]:
    """A hashed read's result without its hash column (before its key columns), and each cell's
    hash sum; None when the result does not split into the planned cells (then neither does the
    data, and the read falls back to its partitions' whole reads)."""
    at = table.num_columns - read.key_columns - 1
    hashed = split_by_key(
        table.select([at, *range(at + 1, table.num_columns)]), read.cells, cell_index=read.split == "cells"
    )
    sums = None if hashed is None else [strip_hash(part, 0)[1] for part in hashed]
    return table.remove_column(at), sums


def _check_unit_contents(read: Read, sums: list[int]) -> None:
    """Refuse a read whose cells hash otherwise than planned (it falls back to reading them one
    by one: a cell split wrongly by the client is then told from changed data)."""
    for spec, content in zip(read.cells, sums, strict=True):
        assert spec.fingerprint is not None
        if content != spec.fingerprint.content:
            raise content_mismatch(
                f"{spec.describe()} in {read.describe()}",
                spec.key_params,
                spec.rows,
                spec.fingerprint.content,
                content,
            )


class ReadJob:
    """Run ``read`` on a pool thread's cursor and deliver its wanted partitions to ``waiters``
    (see the module); ``name`` names it in log lines."""

    def __init__(
        self,
        read: Read,
        waiters: Waiters,
        name: str,
        layout: ColumnLayout,
        backend: Backend,
        stop: threading.Event,
    ) -> None:
        self.read = read
        self.waiters = waiters
        self.name = name
        self.layout = layout
        self.backend = backend
        self.stop = stop
        self._alone: PartitionSpec | None = None

    @property
    def own_slot(self) -> None:
        return None

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        read = self.read
        if read.split == "whole":
            block = fetch_partition(cursor, read.cells[0], self.layout)
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
                    alone.append((spec, fetch_partition(cursor, spec, self.layout)))
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
                table, sums = _unit_contents(table, read)
            data = table.select(range(table.num_columns - read.key_columns))
            check_result_schema(data.schema, self.layout, read.describe)
            blocks = unit_blocks(table, read, self.layout)
            if blocks is not None and sums is not None:
                _check_unit_contents(read, sums)
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

    def fail(self, failure: ThreadFailure) -> None:
        self.waiters.fail(failure)

    def cancel(self) -> None:
        self.waiters.cancel()

    def describe(self) -> str:
        return self.read.describe() if self._alone is None else self._alone.describe()

    def label(self) -> str:
        return self.name
