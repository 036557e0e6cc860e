"""PartitionSource: the claim/release protocol between the pool and whatever brings partitions.

The pool (the assembler thread) claims each partition it loads with :meth:`~PartitionSource.submit`
and, when a work unit ends, releases every partition the unit needed with
:meth:`~PartitionSource.release`, claimed or not: a fetch unit brings the rows of all its
partitions, and keeps the ones nobody claimed until they are released, so a missed release holds
rows to the end of the epoch. :class:`~ddbloader._io.fetch.Fetcher` and
:class:`~ddbloader._io.cache.CachedFetcher` implement it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .._epoch.visits import PartitionKey
from .._sql.partition import PartitionSpec
from .block import Block
from .threads import Pending

__all__ = ["PartitionSource"]


class PartitionSource(Protocol):
    """Partitions by spec, claimed and released by one thread (the assembler)."""

    def submit(self, spec: PartitionSpec) -> Pending[Block]:
        """Claim ``spec``'s rows: they arrive through the returned :class:`~ddbloader._io.threads.Pending`."""
        ...

    def release(self, keys: Sequence[PartitionKey]) -> None:
        """The pool will not ask for ``keys`` again: drop whatever is kept for them, end their streams."""
        ...
