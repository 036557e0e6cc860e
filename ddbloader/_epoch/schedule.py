"""BatchSchedule: an epoch's batches as a pure, data-free function of (plan, seed, epoch, shard).

Which samples each batch holds, and when each partition is claimed from the fetchers, loaded,
dropped and released, depend only on the planned row counts, the window geometry, the loader's
configuration, the epoch and the (rank, worker)'s work units: never on data or thread timing.
:class:`BatchSchedule` computes them from those alone, so the epoch's order has one definition
that tests can check without an engine (exactly-once, shard disjointness, equal batch counts, the
memory bound) and that a resume can skip into.

The order it defines (the pool's, see :class:`~ddbloader._pipeline.pool.GroupPool`):

* Units enter a pool of ``group_pool_size`` slots in the given order. Without shuffle the pool
  serves them one after another; with shuffle sample ``k`` of a batch's draw goes to slot
  ``floor(u_k * active)`` (:class:`~ddbloader._epoch.shuffle.SourceDraws`), each slot serves its
  share in slot order, a unit that runs out hands its slot (and the rest of its share) to the next
  waiting unit, and once none waits the shares of closed slots are drawn again among the rest.
* A unit loads the partitions its samples touch in :func:`~ddbloader._epoch.visits.partition_visits`
  order, keeping the first and last ``span - 1`` rows of each; a loaded partition's *step* holds
  the unit's samples that it completes (those whose rows are now all at hand), permuted by the
  next draw of :class:`~ddbloader._epoch.shuffle.SampleOrders` when it is loaded. A combed piece
  of windows (:mod:`ddbloader._sql.window_pieces`) holds every row its samples read: its step
  holds the unit's samples that start in its stripes, and nothing is kept. A step is loaded
  when its unit is next asked for a sample after the one before it ran out.
* Fetches are queued within a budget of ``group_pool_size x prepartition_num`` partitions held
  (queued, in flight or being served), at most ``prepartition_num`` per unit: the active units'
  next partitions first, then the first partition of each next waiting unit, in their order, while
  the budget has room (a shuffled pool drains its units at one pace, so several end together and
  each successor should be on its way).

The events and batches it yields are defined in :mod:`ddbloader._epoch.events`. A shuffled pool
of :data:`~ddbloader._epoch.slots.RUNS_FROM` slots or more draws the same batches in runs (see
:class:`~ddbloader._epoch.slots.Slots`). Not thread-safe: one consumer iterates it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from .._core.config import LoaderConfig
from .._core.window import WindowGeometry
from .._sql.plan import QueryPlan, WorkUnit
from .events import Event, EventKind, Recorder, ScheduledBatch
from .shuffle import SampleOrders, SourceDraws
from .slots import RUNS_FROM, Slots
from .unit_steps import UnitSteps

__all__ = [
    "DDB_POOL",
    "FILL_SHARE",
    "POOL_BYTES",
    "BatchSchedule",
    "Event",
    "EventKind",
    "ScheduledBatch",
    "pool_size",
]

#: DolphinDB's pool: the groups a batch draws from by default there (``group_pool_size=3``).
DDB_POOL = 3

#: The bytes the first partitions of a sized pool's groups take at most (see :func:`pool_size`):
#: DolphinDB's pool of :data:`DDB_POOL` groups of partitions of ``fetch_bytes``' default.
POOL_BYTES = DDB_POOL * 8 * 2**20

#: A sized pool's first partitions are at most this share of the plan's rows (see :func:`pool_size`).
FILL_SHARE = 4


def pool_size(plan: QueryPlan, config: LoaderConfig) -> int:
    """``config.group_pool_size``, or when it is 0 (``None`` given) the pool sized from ``plan``.

    Shuffled, the pool holds as many groups as a batch has samples (a batch of ``B`` draws from
    ``P`` groups holds about ``P * (1 - (1 - 1/P)**B)`` distinct ones: ``0.63 B`` at ``P = B``,
    at least half of a uniform shuffle's, which is at most ``B``), and no more than the plan's
    groups, within two bounds on ``P x`` the largest partition's planned rows (at least
    :data:`DDB_POOL` groups):

    * its bytes at most :data:`POOL_BYTES`: the memory of DolphinDB's pool over pieces of the
      default ``fetch_bytes``;
    * at most ``1 /`` :data:`FILL_SHARE` of the plan's rows: the first batch draws from every
      active group, so it waits for their first partitions, a fetch no assembly overlaps (a pool
      of every group of one partition each would fetch the whole table first).

    The size depends on the plan and the batch size, not on ``fetch_bytes`` (which only changes
    how rows travel). Without shuffle the pool serves one unit at a time: :data:`DDB_POOL`.
    """
    if config.group_pool_size:
        return config.group_pool_size
    if not config.shuffle:
        return DDB_POOL
    sizes = [p.rows for g in plan.groups for p in g.partitions]
    largest = max(max(sizes, default=0), 1)
    fitting = min(
        POOL_BYTES // (largest * max(plan.layout.row_bytes, 1)), sum(sizes) // (FILL_SHARE * largest)
    )
    return max(DDB_POOL, min(config.batch_size, len(plan.groups), fitting))


class BatchSchedule:
    """The batches of one (rank, worker)'s epoch: ``units`` in its group order (see
    :func:`~ddbloader._epoch.shard.epoch_units`), ``batches`` batches of ``batch_size`` samples
    (the last one shorter unless ``drop_last`` cut it).

    Iterating yields one :class:`ScheduledBatch` per batch; :attr:`high_water` is the most
    partitions held at once so far in the latest iteration (at most ``group_pool_size x
    prepartition_num``). A resume after ``k`` batches serves the items from ``k`` on.
    """

    def __init__(
        self,
        units: Sequence[WorkUnit],
        geometry: WindowGeometry,
        config: LoaderConfig,
        epoch: int,
        batches: int,
    ) -> None:
        self.units = units
        self.geometry = geometry
        self.config = config
        self._epoch = epoch
        self.batches = batches
        self._log = Recorder()
        #: whether some batches are drawn in runs (see :class:`~ddbloader._epoch.slots.Slots`)
        self.in_runs = config.shuffle and config.group_pool_size >= RUNS_FROM

    @property
    def high_water(self) -> int:
        return self._log.high_water

    def __iter__(self) -> Iterator[ScheduledBatch]:
        """The epoch's batches from the first (each iteration starts the epoch afresh)."""
        config = self.config
        log = self._log = Recorder()
        pool, shuffle = config.group_pool_size, config.shuffle
        budget = pool * config.prepartition_num
        units = self.units
        waiting = deque(i for i, u in enumerate(units) if u.samples > 0)
        # a shuffled pool of many units draws in runs (see Slots), its active units in slots.units
        slots = Slots[UnitSteps](pool, config.batch_size, log) if self.in_runs else None
        active: list[UnitSteps] = [] if slots is None else slots.units
        ahead: deque[UnitSteps] = deque()
        draws = SourceDraws(config.seed, self._epoch, pool=pool)
        orders = SampleOrders(shuffle, config.seed, self._epoch)
        topped_up_at = -1

        def make(index: int) -> UnitSteps:
            return UnitSteps(index, units[index], config, self.geometry, self._epoch, log)

        def following() -> UnitSteps | None:
            if ahead:
                return ahead.popleft()
            return make(waiting.popleft()) if waiting else None

        def top_up() -> None:
            nonlocal topped_up_at
            for unit in active:
                if not unit.queued:
                    unit.top_up(budget - log.held)
            while log.held < budget and waiting:
                unit = make(waiting.popleft())
                unit.top_up(1)
                ahead.append(unit)
            topped_up_at = log.held

        left = sum(u.samples for u in self.units)
        for index in range(self.batches):
            count = min(config.batch_size, left)
            left -= count
            while count > 0:
                if len(active) < pool:
                    while len(active) < pool and (unit := following()) is not None:
                        active.append(unit)
                    top_up()
                if not active:
                    raise RuntimeError(f"the epoch ran out of samples with {count} still owed")
                if not shuffle:
                    give = min(count, active[0].remaining)
                    active[0].take(give, orders)
                    count -= give
                    if active[0].remaining == 0:
                        del active[0]
                    continue
                if slots is not None:
                    count -= slots.draw(draws.counts(len(active), count), orders, following)
                    continue
                for slot, share in enumerate(draws.counts(len(active), count).tolist()):
                    owed = share
                    while owed:
                        unit = active[slot]
                        give = min(owed, unit.remaining)
                        unit.take(give, orders)
                        count -= give
                        owed -= give
                        if unit.remaining == 0:
                            passed = following()
                            if passed is None:
                                break
                            active[slot] = passed
                active = [unit for unit in active if unit.remaining > 0]
            if log.held < budget and log.held != topped_up_at:
                top_up()
            yield log.batch(index)
