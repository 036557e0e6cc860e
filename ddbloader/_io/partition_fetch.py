"""Single-partition fetch: one partition, fetched by its own subquery, as a fetch-thread job.

A partition's block is delivered only if it holds the rows planning counted for it (and, with
``verify=True``, the planned content hash): ``len()``, the windows and the sample order all rest on
those counts, so a partition that changed after planning is refused, never served.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core.engine import Cursor
from .._sql.fingerprint import content_mismatch, strip_hash
from .._sql.layout import ColumnLayout
from .._sql.plan import PartitionSpec
from .._sql.read import whole_read
from .block import Block
from .convert import check_result_schema, to_block
from .threads import Pending, ThreadFailure

__all__ = ["PartitionJob", "as_planned", "fetch_partition"]


@dataclass(frozen=True)
class PartitionJob:
    """One partition, fetched by its own subquery."""

    spec: PartitionSpec
    layout: ColumnLayout
    result: Pending[Block]

    def run(self, cursor: Cursor) -> tuple[int, int, int]:
        block = fetch_partition(cursor, self.spec, self.layout)
        self.result.set(block)
        return 1, block.rows, 1

    def fail(self, failure: ThreadFailure) -> None:
        self.result.fail(failure)

    def cancel(self) -> None:
        self.result.cancel()

    @property
    def own_slot(self) -> None:
        return None

    def describe(self) -> str:
        return self.spec.describe()

    def label(self) -> str:
        spec = self.spec
        return f"partition {spec.position} of group {spec.group} (parameters {list(spec.params)!r})"


def fetch_partition(cursor: Cursor, spec: PartitionSpec, layout: ColumnLayout) -> Block:
    read = whole_read(spec)
    table = cursor.fetch(read.sql, read.params)
    fingerprint = spec.fingerprint
    if fingerprint is not None:  # verify=True: the hash column goes before anything else sees the rows
        table, content = strip_hash(table)
    check_result_schema(table.schema, layout, spec.describe)
    block = as_planned(spec, to_block(spec.in_order(table), layout))
    if fingerprint is not None and content != fingerprint.content:
        raise content_mismatch(spec.describe(), spec.key_params, spec.rows, fingerprint.content, content)
    return block


def as_planned(spec: PartitionSpec, block: Block) -> Block:
    """``block``, if it has the rows planning counted for ``spec``: ``len()``, the windows and the
    sample order all rest on those counts, and the gather does not check its rows."""
    if block.rows != spec.rows:
        raise ValueError(
            f"{spec.describe()} returned {block.rows} rows, but planning counted {spec.rows}: the data "
            f"changed after the loader was built (len(), the windows and the sample order all rest on "
            f"those counts); build the loader again"
        )
    return block
