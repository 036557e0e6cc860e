"""Split an epoch's samples across DDP ranks and DataLoader workers.

The groups, in the epoch's (shuffled) group order, are laid end to end as one sequence of
samples; that sequence is cut into ``world_size`` contiguous runs of equal length (±1), and a
rank's run is cut again the same way for its workers. A run may start or end inside a group: a
:class:`WorkUnit` is one group's contiguous range of samples, and serving it loads only the
partitions that range touches (a cut group costs one extra partition fetch on each side). A group
of combed pieces of windows is laid out piece by piece instead (its
:meth:`~ddbloader._sql.plan.GroupPlan.piece_order`), since each of its pieces holds windows from
all over the series: a share of it is the samples of a few pieces, served as owed samples.

Every rank yields the same number of samples: with ``even_batches="pad"`` (the default, as
``DistributedSampler``) a shorter rank repeats the first sample(s) of its own shard; with
``"drop"`` every rank stops at the shortest rank's count and the remainder is dropped. The split
is a pure function of (plan, seed, epoch, rank, world_size, worker, num_workers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from .._core.config import LoaderConfig
from .._sql.plan import GroupPlan, QueryPlan, WorkUnit
from .._sql.plan_fingerprint import plan_differences
from .owed import owed_unit
from .shuffle import Purpose, visit_order

__all__ = [
    "EvenBatches",
    "Sharding",
    "WorkUnit",
    "agree_ranks",
    "distributed_world_size",
    "epoch_units",
    "from_rank0",
    "part_range",
    "refuse_a_rank_without_a_process_group",
    "resolve_sharding",
    "shard_samples",
    "share_units",
    "split_units",
]

EvenBatches = Literal["pad", "drop"]


def shard_samples(total: int, world_size: int, even_batches: EvenBatches) -> int:
    """Samples every rank yields: the same number on every rank."""
    return -(-total // world_size) if even_batches == "pad" else total // world_size


def part_range(total: int, parts: int, index: int) -> range:
    """Positions of part ``index`` when ``total`` positions are cut into ``parts`` near-equal runs."""
    return range(index * total // parts, (index + 1) * total // parts)


def _cut(units: Sequence[WorkUnit], begin: int, end: int) -> list[WorkUnit]:
    """The units covering positions ``[begin, end)`` of the concatenated sample sequence."""
    cut: list[WorkUnit] = []
    position = 0
    for unit in units:
        lo, hi = max(begin, position), min(end, position + unit.samples)
        if lo < hi:
            sequence = _sequence(unit)
            if sequence is None:
                offset = unit.first - position
                cut.append(WorkUnit(unit.group, lo + offset, hi + offset))
            else:
                cut.append(owed_unit(unit.group, np.sort(sequence[lo - position : hi - position])))
        position += unit.samples
    return cut


def _sequence(unit: WorkUnit) -> np.ndarray[Any, Any] | None:
    """``unit``'s samples in the order shards cut them: its group's
    :meth:`~ddbloader._sql.plan.GroupPlan.piece_order` (combed pieces of windows) restricted to
    them, else its owed samples, else None (``[first, stop)`` in index order)."""
    order = unit.group.piece_order() if unit.group.combed_windows else None
    if order is None:
        return unit.owed
    if unit.owed is not None:
        kept: np.ndarray[Any, Any] = order[np.isin(order, unit.owed)]
        return kept
    if unit.first == unit.group.first_sample and unit.stop == unit.group.sample_stop:
        return order
    inside: np.ndarray[Any, Any] = order[(order >= unit.first) & (order < unit.stop)]
    return inside


def _share(units: Sequence[WorkUnit], parts: int, index: int, size: int, total: int) -> list[WorkUnit]:
    """Part ``index`` of ``parts`` near-equal contiguous runs, topped up to ``size`` samples."""
    part = part_range(total, parts, index)
    share = _cut(units, part.start, min(part.stop, part.start + size))
    missing = size - sum(u.samples for u in share)
    source = share or list(units)
    while missing > 0 and source:
        wrap = _cut(source, 0, missing)
        share += wrap
        missing -= sum(u.samples for u in wrap)
    return share


def split_units(
    groups_in_order: Sequence[GroupPlan],
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    even_batches: EvenBatches,
) -> list[WorkUnit]:
    """The work units of one (rank, worker), in the order it serves them.

    Invariants: over all ranks, the units without padding cover every sample exactly once; each
    rank holds :func:`shard_samples` samples; workers of a rank split its units disjointly.
    """
    whole = [g.whole for g in groups_in_order if g.samples > 0]
    return share_units(whole, rank, world_size, worker, num_workers, even_batches)


def share_units(
    units: Sequence[WorkUnit],
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    even_batches: EvenBatches,
) -> list[WorkUnit]:
    """The share of one (rank, worker) of ``units`` laid end to end, as :func:`split_units` cuts it
    (units that owe only some samples are cut among those)."""
    rank_units = list(units)
    if world_size > 1:
        total = sum(u.samples for u in units)
        rank_units = _share(units, world_size, rank, shard_samples(total, world_size, even_batches), total)
    if num_workers == 1:
        return rank_units
    part = part_range(sum(u.samples for u in rank_units), num_workers, worker)
    return _cut(rank_units, part.start, part.stop)


def epoch_units(
    plan: QueryPlan,
    config: LoaderConfig,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    even_batches: EvenBatches = "pad",
) -> list[WorkUnit]:
    """The work units one (rank, worker) serves in ``epoch``, in the epoch's group order."""
    order = visit_order(len(plan.groups), config.shuffle, config.seed, epoch, Purpose.GROUP_ORDER)
    groups = plan.groups
    return split_units(
        [groups[i] for i in order.tolist()], rank, world_size, worker, num_workers, even_batches
    )


@dataclass(frozen=True)
class Sharding:
    """This process's place among DDP ranks. Invariant: ``0 <= rank < world_size``."""

    rank: int
    world_size: int
    even_batches: EvenBatches


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def distributed_world_size() -> int:
    """torch.distributed's world size where a process group is initialised, else 1 (cheap enough
    to ask once per batch)."""
    return torch.distributed.get_world_size() if _distributed() else 1


def resolve_sharding(rank: int | None, world_size: int | None, even_batches: str) -> Sharding:
    """Explicit ``rank``/``world_size``, else torch.distributed's when initialised, else (0, 1).

    Raises:
        ValueError: only one of rank/world_size given, a rank out of range, or an unknown
            ``even_batches``.
    """
    if even_batches not in ("pad", "drop"):
        raise ValueError(f"even_batches must be 'pad' or 'drop', got {even_batches!r}")
    if rank is None and world_size is None:
        rank, world_size = (
            (torch.distributed.get_rank(), torch.distributed.get_world_size()) if _distributed() else (0, 1)
        )
    if rank is None or world_size is None:
        raise ValueError("give both rank and world_size, or neither (to read them from torch.distributed)")
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size}")
    return Sharding(rank, world_size, even_batches)  # type: ignore[arg-type]


def _group_of(sharding: Sharding) -> bool:
    """Whether torch.distributed is initialised with ``sharding``'s world size (so ranks can talk)."""
    return _distributed() and torch.distributed.get_world_size() == sharding.world_size > 1


def from_rank0(value: Any, sharding: Sharding) -> Any:
    """Rank 0's ``value`` (picklable), broadcast where torch.distributed is initialised with
    ``sharding``'s world size (a collective: every rank calls it); else ``value``."""
    if not _group_of(sharding):
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def agree_ranks(drawn: int, fingerprint: str, sharding: Sharding, shuffle: bool, content: int = 0) -> int:
    """The seed every rank uses when the user gave none, rank 0's; and a check that every rank
    planned the same plan (its :func:`~ddbloader._sql.plan_fingerprint.plan_fingerprint`, and
    ``content``, the sum of its partitions' row hashes where ``verify=True`` planned them).

    Ranks cut one shuffled sequence of one plan: with independently drawn seeds their shards would
    overlap and miss samples, and with plans of different data (the table changed between two
    ranks' constructions) their shards would lose or repeat samples silently. When
    torch.distributed is initialised with this world size, every rank's (seed, fingerprint) is
    gathered (a collective: every rank calls it), so every rank refuses alike, none is left waiting
    in the training step's collective.

    Raises:
        RuntimeError: a rank's plan differs from rank 0's; names the ranks and what differs.
        ValueError: ``shuffle`` over several ranks with no process group to agree on a seed.
    """
    if sharding.world_size == 1:
        return drawn
    if not _group_of(sharding):
        if shuffle:
            raise ValueError(
                f"shuffle=True with world_size={sharding.world_size} and seed=None: give the same seed "
                "on every rank (without torch.distributed each rank would draw its own, and shards would "
                "overlap)"
            )
        return drawn
    gathered: list[Any] = [None] * sharding.world_size
    torch.distributed.all_gather_object(gathered, (drawn, fingerprint, content))
    (seed, *first), *_ = gathered
    others = {rank: plan for rank, (_, *plan) in enumerate(gathered) if plan != first}
    if others:
        differences = {d for plan, _ in others.values() for d in plan_differences(first[0], plan)}
        if any(sums != first[1] for _, sums in others.values()):
            differences.add("the rows' content (verify=True's row hashes)")
        raise RuntimeError(
            f"rank(s) {sorted(others)} planned another plan than rank 0 (it differs in "
            f"{'; '.join(sorted(differences))}): the data changed between the ranks' constructions of their "
            f"loaders, and their shards would lose or repeat samples; build the loaders from data that "
            f"does not change meanwhile, or on PostgreSQL read a snapshot (ADBCBackend's default: "
            f"every rank then reads rank 0's)"
        )
    return int(seed)


def refuse_a_rank_without_a_process_group() -> None:
    """Refuse to serve one of several ranks (torchrun's ``WORLD_SIZE``/``RANK`` in the
    environment) while no process group says which: every rank would serve the whole epoch.

    Raises:
        RuntimeError: ``WORLD_SIZE`` > 1 in the environment and torch.distributed not initialised.
    """
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1:
        return
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    raise RuntimeError(
        f"this process was launched as rank {os.environ.get('RANK', '?')} of {world} (WORLD_SIZE and RANK "
        f"in the environment, as torchrun sets them), but no torch.distributed process group is "
        f"initialised, so every rank would serve the whole epoch: call "
        f"torch.distributed.init_process_group() before the first batch (with Accelerate on a CPU "
        f"machine, Accelerator(cpu=True), which initialises one), or give the loader rank= and "
        f"world_size= (rank=0, world_size=1 serves every process the whole epoch)"
    )
