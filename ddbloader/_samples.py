"""LoaderSamples: a loader's samples where torch code reads ``DataLoader.dataset`` or ``.sampler``.

It holds no data and no state of its own: every answer is the loader's at the moment it is asked.
"""

from __future__ import annotations

from typing import Protocol

from ._epoch.shard import Sharding, shard_samples
from ._sql.plan import QueryPlan

__all__ = ["LoaderSamples", "SampledLoader"]


class SampledLoader(Protocol):
    """What :class:`LoaderSamples` reads of its loader (a :class:`~ddbloader.DDBDataLoader`)."""

    @property
    def plan(self) -> QueryPlan: ...
    @property
    def sharding(self) -> Sharding: ...
    def set_epoch(self, epoch: int) -> None: ...


class LoaderSamples:
    """A loader's samples where torch code reads ``DataLoader.dataset`` or ``.sampler``.

    ``len()`` is the epoch's samples (``per_rank``: this rank's, padding included) under the
    current world size; ``set_epoch`` is the loader's. It holds no data: the loader serves it.
    """

    def __init__(self, loader: SampledLoader, per_rank: bool = False) -> None:
        self.loader = loader
        self._per_rank = per_rank

    def __len__(self) -> int:
        samples = self.loader.plan.samples
        if not self._per_rank:
            return samples
        sharding = self.loader.sharding
        return shard_samples(samples, sharding.world_size, sharding.even_batches)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __repr__(self) -> str:
        kind = "this rank's samples" if self._per_rank else "samples"
        return f"<{len(self)} {kind} of a DDBDataLoader>"
