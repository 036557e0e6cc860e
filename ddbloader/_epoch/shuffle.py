"""Every random choice of an epoch, as pure functions of ``(seed, epoch, ...)``.

Each choice draws from its own generator keyed by what it decides (group order, one group's
partition order, the pool's draws, the steps' sample orders), so no generator is shared between
threads and no order depends on thread timing; two groups never share a permutation. The pool's
draws and the sample orders are streams of one epoch, consumed by the assembler thread in an
order that is itself a pure function of ``(plan, seed, epoch)`` (and of the shard).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np
import numpy.random  # imported with ddbloader, not in the first epoch (~20 ms)

__all__ = ["Purpose", "SampleOrders", "SourceDraws", "generator", "visit_order"]


class Purpose(IntEnum):
    """Keys that separate the random streams of one epoch."""

    GROUP_ORDER = 1
    PARTITION_ORDER = 2
    SAMPLE_ORDER = 3
    POOL_DRAWS = 4


def generator(seed: int, epoch: int, purpose: Purpose, *key: int) -> np.random.Generator:
    """A generator determined by ``(seed, epoch, purpose, *key)`` alone.

    The seed is the entropy and the rest the spawn key, which SeedSequence keeps apart (it pads
    the entropy to a fixed width): a flat list would let a seed above 2**32 (two words) alias a
    smaller seed whose epoch equals its high word.
    """
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(epoch, int(purpose), *key)))


def visit_order(
    count: int, shuffle: bool, seed: int, epoch: int, purpose: Purpose, *key: int
) -> np.ndarray[Any, Any]:
    """Order in which ``count`` items (groups, or one group's partitions) are visited."""
    if not shuffle or count < 2:  # one item has one order: no generator to build (~50 µs)
        return np.arange(count)
    return generator(seed, epoch, purpose, *key).permutation(count)


class SourceDraws:
    """The pool's per-sample draws of an epoch: which active slot gives each sample.

    Sample ``k`` of the epoch's draws goes to slot ``floor(u_k * active)``, where ``u_k`` is the
    ``k``-th uniform of ``generator(seed, epoch, POOL_DRAWS)``: uniform over the slots active when
    it is drawn, and a pure function of ``(seed, epoch)`` and the sequence of ``active`` counts.
    The uniforms are drawn ``block`` at a time, so a batch costs no generator call of its own,
    and their slots among ``pool`` slots (the full pool: most draws of an epoch) are computed
    once per block. Not thread-safe (the assembler owns it).
    """

    def __init__(self, seed: int, epoch: int, block: int = 4096, pool: int = 0) -> None:
        self._rng = generator(seed, epoch, Purpose.POOL_DRAWS)
        self._block = block
        self._pool = pool
        self._uniforms = np.empty(0)
        self._pool_slots: np.ndarray[Any, Any] | None = None
        self._used = 0

    def counts(self, active: int, size: int) -> np.ndarray[Any, Any]:
        """How many of the next ``size`` samples each of ``active`` slots gives."""
        if self._used + size > len(self._uniforms):
            fresh = self._rng.random(max(self._block, size))
            self._uniforms = np.concatenate([self._uniforms[self._used :], fresh])
            self._pool_slots = None
            self._used = 0
        first = self._used
        self._used += size
        if active == self._pool:
            if self._pool_slots is None:
                self._pool_slots = _slots(self._uniforms, active)
            return np.bincount(self._pool_slots[first : first + size], minlength=active)
        return np.bincount(_slots(self._uniforms[first : first + size], active), minlength=active)


def _slots(uniforms: np.ndarray[Any, Any], active: int) -> np.ndarray[Any, Any]:
    # u <= 1 - 2**-53, so u * active rounds to below active (active < 2**52): its floor is a slot
    return (uniforms * active).astype(np.intp)


class SampleOrders:
    """The order in which each step of an epoch emits its samples, in the order steps are loaded.

    Without shuffle a step's samples come in index order. With shuffle, the ``k``-th step loaded
    in the epoch is permuted by the ``k``-th draw of one stream, ``generator(seed, epoch,
    SAMPLE_ORDER)`` (a uniformly random permutation, different for every step): one generator per
    epoch rather than one per step, which cost ~50 µs a step, one step per small group. The
    sequence of steps is a pure function of ``(plan, seed, epoch)`` and the shard (the pool loads
    them in the order its draws decide, and a fast-forward to a resume point loads the same
    steps), so the orders are too. Not thread-safe (the assembler owns it).
    """

    def __init__(self, shuffle: bool, seed: int, epoch: int) -> None:
        self._rng = generator(seed, epoch, Purpose.SAMPLE_ORDER) if shuffle else None

    def order(self, first: int, stop: int) -> np.ndarray[Any, Any]:
        """Sample indices ``[first, stop)`` in the order the next step emits them."""
        if self._rng is None or stop - first < 2:
            return np.arange(first, max(first, stop), dtype=np.int64)
        # the draws of permutation(stop - first), which shuffles arange(stop - first) in place,
        # without the shift after it (0.5 µs a step, one step per small group)
        indices = np.arange(first, stop, dtype=np.int64)
        self._rng.shuffle(indices)
        return indices
