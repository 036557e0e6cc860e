"""A partition's whole read: its own subquery, checked against planning (the reference every
other read of its rows falls back to, see :mod:`ddbloader._io.reader`).

A partition's block is delivered only if it holds the rows planning counted for it (and, with
``verify=True``, the planned content hash): ``len()``, the windows and the sample order all rest on
those counts, so a partition that changed after planning is refused, never served.
"""

from __future__ import annotations

from .._core.engine import Cursor
from .._sql.fingerprint import content_mismatch, strip_hash
from .._sql.layout import ColumnLayout
from .._sql.plan import PartitionSpec
from .._sql.read import whole_read
from .block import Block
from .convert import check_result_schema, to_block

__all__ = ["as_planned", "fetch_partition"]


def fetch_partition(cursor: Cursor, spec: PartitionSpec, layout: ColumnLayout) -> Block:
    """``spec``'s rows, read by :func:`~ddbloader._sql.read.whole_read`; refused (ValueError)
    when they are not the rows (and content) planned."""
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
