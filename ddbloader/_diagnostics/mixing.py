"""How well a shuffled epoch mixes the rows: figures for ``loader.stats()`` and a warning.

An epoch's batches are a pure function of (plan, seed, epoch, shard) (the schedule,
:class:`~ddbloader._epoch.schedule.BatchSchedule`), so its mixing is measured from the schedule
alone, without data and without a hook in the batch path: nothing is paid per batch. It is
computed when asked for (``stats()``), and once per loader at the end of its first shuffled
epoch, to warn when that epoch came close to row order. The schedule of an epoch of 2M samples
takes ~0.1 s to draw; a longer epoch is measured on its first :data:`MEASURED_BATCHES` batches,
and the figures are those of at most :data:`SAMPLED_BATCHES` of them, evenly strided (a whole
measurement: 14 ms for the 1,555 batches of 10 groups x 10,000 rows, 45 ms for 1,250 batches over
4,000 groups).

Two figures:

* ``partitions_per_batch``: the median number of distinct partitions (range pieces count as
  partitions) holding a batch's samples, over the batches measured.
* ``rank_correlation``: Spearman's correlation between a sample's position in the epoch and its
  first row's position in the query's order (groups in plan order), over at most
  :data:`CORRELATION_SAMPLES` samples spread evenly over the epoch. Near 0: no trace of row
  order; near +1 (or -1): the epoch walks the rows front to back (or back to front). A combed
  range piece (see :mod:`ddbloader._sql.pieces`) spreads its rows over its band, so its rows are
  placed there by their rank within the piece: an approximation of their exact positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.config import LoaderConfig
from .._core.errors import warn_caller
from .._epoch.schedule import BatchSchedule
from .._sql.plan import GroupPlan, QueryPlan, WorkUnit

__all__ = [
    "CORRELATION_SAMPLES",
    "JUDGED_SAMPLES",
    "MEASURED_BATCHES",
    "ROW_ORDER",
    "SAMPLED_BATCHES",
    "Mixing",
    "MixingWatch",
    "measure",
]

#: Samples the rank correlation is computed over at most (evenly strided over the batches measured).
CORRELATION_SAMPLES = 65_536
#: Batches drawn at most, from the epoch's first: drawing the schedule costs ~15-50 µs a batch, so
#: a measurement stays under ~0.4 s however long the epoch.
MEASURED_BATCHES = 8192
#: Batches measured at most, evenly strided over those drawn (every batch of a shorter epoch): a
#: batch's lookup costs ~40-100 µs, the figures of 512 spread over the epoch are those of all of
#: them to within their noise, and the draw, not the lookup, is then most of the cost.
SAMPLED_BATCHES = 512
#: A shuffled epoch whose rank correlation is at least this (in absolute value) is close to row
#: order: the loader warns (a uniform shuffle of 2M rows: |rho| < 0.01; pieces visited in a random
#: order: |rho| about 1/sqrt(pieces); a walk front to back with a local shuffle: 0.98 and more).
ROW_ORDER = 0.9
#: Fewer samples than this in an epoch say nothing about its order (a few windows of a few
#: groups often come out in row order by chance): no warning.
JUDGED_SAMPLES = 4096


@dataclass(frozen=True)
class Mixing:
    """One epoch's mixing (see the module); NaN figures when the epoch has no samples."""

    batches: int
    samples: int
    partitions_per_batch: float
    rank_correlation: float

    @property
    def close_to_row_order(self) -> bool:
        """Whether enough samples (:data:`JUDGED_SAMPLES`) came close to row order (:data:`ROW_ORDER`)."""
        return self.samples >= JUDGED_SAMPLES and abs(self.rank_correlation) >= ROW_ORDER


def measure(
    plan: QueryPlan, units: Sequence[WorkUnit], config: LoaderConfig, epoch: int, batches: int
) -> Mixing:
    """The mixing of the epoch that ``units`` (one rank's and worker's) serve in ``batches`` batches."""
    positions = _Positions(plan)
    stride = plan.geometry.stride
    drawn = min(batches, MEASURED_BATCHES)
    every = max(-(-drawn // SAMPLED_BATCHES), 1)
    per_batch: list[int] = []
    rows: list[np.ndarray[Any, Any]] = []
    for batch in BatchSchedule(units, plan.geometry, config, epoch, drawn):
        if batch.index % every or not batch.chunks:
            continue
        partition, position = positions.of(batch.groups, batch.samples * stride)
        per_batch.append(len(np.unique(partition)))
        rows.append(position)
    if not rows:
        return Mixing(0, 0, math.nan, math.nan)
    order = np.concatenate(rows)
    step = max(len(order) // CORRELATION_SAMPLES, 1)
    return Mixing(len(per_batch), len(order), float(np.median(per_batch)), _spearman(order[::step]))


def _spearman(values: np.ndarray[Any, Any]) -> float:
    """Spearman's correlation between ``values``' positions and ``values`` (ties by position)."""
    if len(values) < 2:
        return math.nan
    ranks = np.empty(len(values), np.float64)
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    positions = np.arange(len(values), dtype=np.float64)
    spread = float(np.std(ranks))
    if spread == 0.0:
        return math.nan
    return float(np.corrcoef(positions, ranks)[0, 1])


class _Positions:
    """Where each partition's rows lie in the query's order, over the plan's groups laid end to end
    (a sample's group and first row become one coordinate: one lookup for a whole batch).

    One entry per partition, or per stripe of a combed piece of windows (its windows start at
    their own rows of the series, whose coordinates are their positions)."""

    def __init__(self, plan: QueryPlan) -> None:
        groups = plan.groups
        counts = np.fromiter((len(g.partitions) for g in groups), np.int64, len(groups))
        sizes = np.fromiter((p.rows for g in groups for p in g.partitions), np.float64, int(counts.sum()))
        group_rows = np.fromiter((float(g.rows) for g in groups), np.float64, len(groups))
        self._firsts = np.cumsum(group_rows) - group_rows
        ends = np.concatenate([[0.0], np.cumsum(sizes)])
        first_partitions = np.cumsum(counts) - counts  # (a plan of no groups: empty, not [0])
        # each partition's first row within its group, moved to where its group begins
        starts = ends[:-1] - np.repeat(ends[first_partitions], counts) + np.repeat(self._firsts, counts)
        bases = starts.copy()
        scales = np.ones(len(sizes))
        kept = np.ones(len(sizes), bool)
        stripes: list[tuple[float, int]] = []
        for group, first, group_first in zip(groups, first_partitions.tolist(), self._firsts, strict=True):
            members = slice(first, first + len(group.partitions))
            if group.combed_windows:
                kept[members] = False
                stripes += [
                    (group_first + low, first + position)
                    for position, p in enumerate(group.partitions)
                    if p.windows is not None
                    for low, _ in p.windows.starts
                ]
            elif any(p.ranges is not None and p.ranges.band is not None for p in group.partitions):
                _comb(group, members, starts, bases, scales)
        stripe_starts = np.array([at for at, _ in stripes], np.float64)
        entries = np.concatenate([starts[kept], stripe_starts])
        order = np.argsort(entries, kind="stable")
        self._starts = entries[order]
        self._partitions = np.concatenate(
            [np.flatnonzero(kept), np.array([at for _, at in stripes], np.int64)]
        ).astype(np.int64)[order]
        self._bases = np.concatenate([bases[kept], stripe_starts])[order]
        self._scales = np.concatenate([scales[kept], np.ones(len(stripes))])[order]

    def of(
        self, groups: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """For samples whose first rows are ``rows`` of ``groups``: each one's partition (an index
        over the plan) and its position in the query's order."""
        at = self._firsts[groups] + rows
        # side="right": a partition of no rows starts where the next one does, and holds none
        entry = np.searchsorted(self._starts, at, side="right") - 1
        position = self._bases[entry] + (at - self._starts[entry]) * self._scales[entry]
        return self._partitions[entry], position


def _comb(
    group: GroupPlan,
    members: slice,
    starts: np.ndarray[Any, Any],
    bases: np.ndarray[Any, Any],
    scales: np.ndarray[Any, Any],
) -> None:
    """Place ``group``'s combed pieces (its partitions are ``members`` of the plan's arrays): each
    begins where its band does in the query's order, its consecutive rows its band's rows over its
    own apart."""
    partitions = group.partitions
    sizes = [float(p.rows) for p in partitions]
    offset = members.start
    position = 0
    while position < len(partitions):
        ranges = partitions[position].ranges
        end = position + 1
        if ranges is not None and ranges.band is not None:
            while end < len(partitions) and _same_band(partitions[end], partitions[position]):
                end += 1
            band_rows = sum(sizes[position:end])
            for member in range(position, end):
                bases[offset + member] = starts[offset + position]
                scales[offset + member] = band_rows / max(sizes[member], 1.0)
        position = end


def _same_band(a: Any, b: Any) -> bool:
    return bool(
        a.ranges is not None
        and b.ranges is not None
        and a.ranges.band == b.ranges.band
        and repr(a.repartition_value) == repr(b.repartition_value)
    )


class MixingWatch:
    """A loader's mixing: measured per epoch when asked for, and checked once, at the end of the
    first shuffled epoch, warning when it came close to row order. Thread-safe enough: the
    check runs in the consumer's thread, at most once per loader that warns."""

    def __init__(self, plan: QueryPlan, config: LoaderConfig) -> None:
        self._plan = plan
        self._config = config
        self._checked = False

    def check(self, mixing: Mixing) -> None:
        """Warn once when a shuffled epoch is close to row order, naming what would fix it."""
        if self._checked or not self._config.shuffle or mixing.batches == 0:
            return
        self._checked = True
        if not mixing.close_to_row_order:
            return
        fixes = [
            "order the query by a column it selects (then a partition larger than fetch_bytes is "
            "cut into pieces by key ranges and shuffled across the epoch)",
            "split it with repartition_col",
            "set fetch_bytes=0 (each partition read whole, at the memory it takes)",
        ]
        if len(self._plan.groups) > 1:
            fixes.append(f"raise group_pool_size (now {self._config.group_pool_size}) to mix more groups")
        warn_caller(
            f"shuffle=True, but this epoch came close to row order: the rank correlation between a "
            f"sample's position in the epoch and its row's position in the query is "
            f"{mixing.rank_correlation:+.2f}, with a median of {mixing.partitions_per_batch:g} "
            f"partition(s) per batch; to mix better, {'; or '.join(fixes)}"
        )

    def epoch(self, units: Sequence[WorkUnit], epoch: int, batches: int) -> EpochMixing:
        """The mixing of one epoch (measured when first asked for)."""
        return EpochMixing(self, units, epoch, batches)


class EpochMixing:
    """One epoch's :class:`Mixing`, measured once when first asked for."""

    def __init__(self, watch: MixingWatch, units: Sequence[WorkUnit], epoch: int, batches: int) -> None:
        self._watch = watch
        self._units = units
        self._epoch = epoch
        self._batches = batches
        self._measured: Mixing | None = None

    @property
    def shuffled(self) -> bool:
        return self._watch._config.shuffle

    def get(self) -> Mixing:
        if self._measured is None:
            watch = self._watch
            self._measured = measure(watch._plan, self._units, watch._config, self._epoch, self._batches)
        return self._measured

    def finished(self) -> None:
        """The epoch ended: check the first shuffled one (see :meth:`MixingWatch.check`)."""
        if not self._watch._checked and self._watch._config.shuffle:
            self._watch.check(self.get())
