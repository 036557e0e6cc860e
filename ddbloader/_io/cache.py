"""PartitionCache: partitions kept in memory from one epoch to the next (``cache_bytes=``).

When the plan's partitions fit the budget the user allows, the first epoch keeps every partition
it receives, and later epochs take them from memory instead of querying the engine again. The
blocks are the ones the fetch threads converted (read-only by convention everywhere), so the
batches, their order, exactly-once and resume are what they would be without the cache: only
where a partition comes from changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from .._epoch.visits import PartitionKey
from .._sql.partition import PartitionSpec
from .block import Block
from .source import PartitionSource
from .threads import Pending

__all__ = ["CachedFetcher", "PartitionCache"]


class PartitionCache:
    """Blocks by ``(group, position)``. Read and written by one assembler thread at a time."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[int, int], Block] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def around(self, fetcher: PartitionSource) -> CachedFetcher:
        """``fetcher`` (a :class:`~ddbloader._io.fetch.Fetcher`) behind this cache, for one epoch."""
        return CachedFetcher(self, fetcher)

    def holds(self, partitions: int) -> bool:
        """Whether the cache holds ``partitions`` partitions (all of a plan's: nothing to fetch)."""
        return len(self._blocks) >= partitions

    def get(self, spec: PartitionSpec) -> Block | None:
        return self._blocks.get(spec.key)

    def keep(self, spec: PartitionSpec, block: Block) -> None:
        self._blocks[spec.key] = block


class CachedFetcher:
    """A :class:`~ddbloader._io.source.PartitionSource` whose partitions come from the cache when
    it has them, and from ``fetcher`` otherwise, kept when the assembler receives them."""

    def __init__(self, cache: PartitionCache, fetcher: PartitionSource) -> None:
        self._cache = cache
        self._fetcher = fetcher

    def submit(self, spec: PartitionSpec) -> Pending[Block]:
        """The partition of ``spec``: from the cache (ready at once), else fetched and kept.

        A partition served from the cache is released to the fetcher at once, as one never
        submitted there: its fetch unit (if it runs for the partitions not cached) brings its
        rows too, and must not keep them."""
        block = self._cache.get(spec)
        if block is not None:
            self._fetcher.release((spec.key,))
            return Pending.of(block)
        return _Kept(self._fetcher.submit(spec), lambda block: self._cache.keep(spec, block))

    def release(self, keys: Sequence[PartitionKey]) -> None:
        """As :meth:`~ddbloader._io.fetch.Fetcher.release` (the cache keeps its own blocks)."""
        self._fetcher.release(keys)


class _Kept(Pending[Block]):
    """A fetch whose block is handed to ``keep`` when the assembler receives it."""

    def __init__(self, fetch: Pending[Block], keep: Callable[[Block], None]) -> None:
        super().__init__(fetch.what)
        self._fetch = fetch
        self._keep = keep

    def done(self) -> bool:
        return self._fetch.done()

    def cancel(self) -> None:
        self._fetch.cancel()

    def wait(self, stop: threading.Event, timeout: float) -> Block:
        block = self._fetch.wait(stop, timeout)
        self._keep(block)
        return block
