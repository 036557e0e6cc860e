"""What torch code reads of a DataLoader: its samples (``.dataset``, ``.sampler``) and settings.

:class:`LoaderSamples` holds no data and no state of its own: every answer is the loader's at the
moment it is asked. :class:`DataLoaderFace` is a base of :class:`~ddbloader.DDBDataLoader` that
gives it the attributes frameworks read from a ``torch.utils.data.DataLoader`` (``batch_size``,
``drop_last``, ``dataset``, ``sampler``, ...), from the loader's configuration.
"""

from __future__ import annotations

from typing import Protocol

from ._core.config import LoaderConfig
from ._epoch.shard import Sharding, shard_samples
from ._sql.plan import QueryPlan

__all__ = ["DataLoaderFace", "LoaderSamples", "SampledLoader"]


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


class DataLoaderFace:
    """The attributes frameworks read from a DataLoader (see the module docstring).

    It holds no state of its own: the loader sets ``config``, and is a :class:`SampledLoader`.
    """

    config: LoaderConfig

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last batch may hold fewer unless ``drop_last``)."""
        return self.config.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether the final partial batch of an epoch is dropped."""
        return self.config.drop_last

    @property
    def shuffle(self) -> bool:
        """Whether group, partition and sample order are random (a function of seed and epoch)."""
        return self.config.shuffle

    @property
    def pin_memory(self) -> bool:
        """Whether host batches are pinned (``"auto"`` resolved: when CUDA is available)."""
        return self.config.pin_memory

    #: DataLoader's worker-process count: ddbloader fetches in threads of this process.
    num_workers = 0

    @property
    def dataset(self: SampledLoader) -> LoaderSamples:
        """The epoch's samples, as ``DataLoader.dataset``: ``len(loader.dataset)`` counts them all."""
        return LoaderSamples(self)

    @property
    def sampler(self: SampledLoader) -> LoaderSamples:
        """``DataLoader.sampler``'s place: ``loader.sampler.set_epoch(e)`` pins the next epoch and
        ``len(loader.sampler)`` counts this rank's samples, as with ``DistributedSampler``."""
        return LoaderSamples(self, per_rank=True)
