"""How well a shuffled epoch mixes the rows: figures for ``loader.stats()`` and a warning.

An epoch's batches are a pure function of (plan, seed, epoch, shard) (the schedule,
:class:`~ddbloader._epoch.schedule.BatchSchedule`), so its mixing is measured from the schedule
alone, without data and without a hook in the batch path: nothing is paid per batch. It is
computed when asked for (``stats()``), and once per loader at the end of its first shuffled
epoch of a plan that can come close to row order (:func:`can_follow_row_order`), to warn when that epoch came
close to row order. The schedule of an epoch of 2M samples
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
  order; near +1 (or -1): the epoch walks the rows front to back (or back to front). A range
  piece's rows are placed where the planning query ranked them (its runs: see
  :mod:`ddbloader._sql.pieces`), so the figure is the served order's, not a model of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.config import LoaderConfig
from .._core.errors import warn_caller
from .._core.window import WindowGeometry
from .._epoch.schedule import BatchSchedule
from .._epoch.visits import visit_weights
from .._sql.order_runs import order_runs
from .._sql.plan import QueryPlan, WorkUnit

__all__ = [
    "CORRELATION_SAMPLES",
    "JUDGED_SAMPLES",
    "MEASURED_BATCHES",
    "ORDERED_BLOCKS_BELOW",
    "ROW_ORDER",
    "SAMPLED_BATCHES",
    "Mixing",
    "MixingWatch",
    "can_follow_row_order",
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

    One entry per run of :func:`~ddbloader._sql.order_runs.order_runs` (a partition read as it lies,
    a run of a range piece, a stripe of a combed piece of windows), so a sample is placed at the
    row the pieces as read serve it from."""

    def __init__(self, plan: QueryPlan) -> None:
        groups = plan.groups
        group_rows = np.fromiter((float(g.rows) for g in groups), np.float64, len(groups))
        self._firsts = np.cumsum(group_rows) - group_rows
        starts: list[float] = []  # an entry's first row in the group's partitions laid end to end
        bases: list[float] = []  # the position in the query's order of that row
        partitions: list[int] = []
        index = 0  # the first partition's index over the plan
        for group, group_first in zip(groups, self._firsts.tolist(), strict=True):
            for start, base, position in order_runs(group):
                starts.append(group_first + start)
                bases.append(group_first + base)
                partitions.append(index + position)
            index += len(group.partitions)
        order = np.argsort(np.array(starts, np.float64), kind="stable")
        self._starts = np.array(starts, np.float64)[order]
        self._bases = np.array(bases, np.float64)[order]
        self._partitions = np.array(partitions, np.int64)[order]

    def of(
        self, groups: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """For samples whose first rows are ``rows`` of ``groups``: each one's partition (an index
        over the plan) and its position in the query's order."""
        at = self._firsts[groups] + rows
        # side="right": a partition of no rows starts where the next one does, and holds none
        entry = np.searchsorted(self._starts, at, side="right") - 1
        position = self._bases[entry] + (at - self._starts[entry])
        return self._partitions[entry], position


#: A shuffled plan of at least this many equal visit blocks (see :func:`can_follow_row_order`) does
#: not come close to row order: its rank correlation has a spread of about ``1/sqrt(blocks - 1)``
#: (Spearman's of a random permutation), so :data:`ROW_ORDER` is more than 5 spreads away.
ORDERED_BLOCKS_BELOW = 32


def can_follow_row_order(units: Sequence[WorkUnit], geometry: WindowGeometry) -> bool:
    """Whether a shuffled epoch serving ``units`` may come close to row order (:data:`ROW_ORDER`).

    Units touching a piece of a subquery read in pieces may (a streamed subquery is served front
    to back, one query reading its pieces; range pieces are measured rather than bounded: see
    :func:`~ddbloader._epoch.visits.visit_weights`). Everything else a shuffled epoch serves is a
    random order of visit blocks (a partition), each block's samples permuted, and the pool mixes
    its blocks further: its rank correlation is at most that of a random permutation of the
    blocks, weighted by their rows.
    With blocks of ``n_i`` rows the effective count is ``(sum n_i)**2 / sum n_i**2``; only below
    :data:`ORDERED_BLOCKS_BELOW` may it come close to row order by chance. An epoch of fewer
    than :data:`JUDGED_SAMPLES` samples is never judged.
    """
    if sum(u.samples for u in units) < JUDGED_SAMPLES:
        return False
    weights: list[int] = []
    for unit in units:
        blocks = visit_weights(unit, geometry)
        if blocks is None:
            return True
        weights.extend(blocks)
    rows = np.array(weights, np.float64)
    return float(rows.sum()) ** 2 / float((rows**2).sum()) < ORDERED_BLOCKS_BELOW


class MixingWatch:
    """A loader's mixing: measured per epoch when asked for, and checked once, at the end of the
    first shuffled epoch, warning when it came close to row order. Thread-safe enough: the
    check runs in the consumer's thread, at most once per loader that warns.

    Only a plan that can come close to row order is checked (:func:`can_follow_row_order`), so a
    fresh loader's first epoch pays for no measurement (a schedule drawn again: 15-50 µs a
    batch) unless it can warn.
    """

    def __init__(self, plan: QueryPlan, config: LoaderConfig) -> None:
        self._plan = plan
        self._config = config
        self._checked = not config.shuffle

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
        """The epoch ended: check the first shuffled one, measured only if it may have come close to
        row order (see :class:`MixingWatch`)."""
        watch = self._watch
        if watch._checked:
            return
        if can_follow_row_order(self._units, watch._plan.geometry):
            watch.check(self.get())
        watch._checked = True
