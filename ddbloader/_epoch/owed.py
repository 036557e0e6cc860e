"""Work units that serve only some samples of their range: an elastic resume's remainder.

A :class:`~ddbloader._sql.plan.WorkUnit` with ``owed`` set serves only those samples of its range
``[first, stop)`` (see :mod:`ddbloader._epoch.elastic`). Its steps are drawn as for the whole
range and then keep the owed samples only (:func:`keep_owed`, deterministic: a filter of a pure
order), and its stream loads only the partitions some owed sample's rows touch
(:func:`owed_partitions`), so a partition holding no owed sample is not fetched. Pure functions.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .._core.window import WindowGeometry
from .._sql.plan import GroupPlan, WorkUnit

__all__ = ["keep_owed", "owed_partitions", "owed_unit"]


def owed_unit(group: GroupPlan, owed: np.ndarray[Any, Any]) -> WorkUnit:
    """The unit serving samples ``owed`` of ``group`` (sorted, distinct, non-empty int64).

    A contiguous run is a plain unit (``owed`` None), which serves as before without filtering.
    """
    first, stop = int(owed[0]), int(owed[-1]) + 1
    if stop - first == len(owed):
        return WorkUnit(group, first, stop)
    return WorkUnit(group, first, stop, owed)


def keep_owed(unit: WorkUnit, order: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``order`` (samples of ``unit``'s range, in a step's emission order) without the samples that
    ``unit`` does not owe; the order of the rest is kept."""
    owed = unit.owed
    if owed is None or not len(order):
        return order
    at = np.minimum(np.searchsorted(owed, order), len(owed) - 1)
    kept: np.ndarray[Any, Any] = order[owed[at] == order]
    return kept


def owed_partitions(unit: WorkUnit, geometry: WindowGeometry) -> list[int]:
    """Positions of the partitions of ``unit.group`` whose rows some owed sample touches, ascending.

    Every partition an owed sample's rows lie in is among them, so the steps that load them
    complete that sample (a sample's rows are joined from its loaded partitions' kept edge rows,
    and those partitions are contiguous); a partition between two owed runs that no owed sample
    reaches is skipped.
    """
    assert unit.owed is not None
    bounds = np.fromiter(itertools.accumulate((p.rows for p in unit.group.partitions), initial=0), np.int64)
    first_rows = unit.owed * geometry.stride
    lows = np.searchsorted(bounds, first_rows, side="right") - 1
    highs = np.searchsorted(bounds, first_rows + geometry.span - 1, side="right") - 1
    marks = np.zeros(len(bounds), np.int64)
    np.add.at(marks, lows, 1)
    np.add.at(marks, highs + 1, -1)
    positions: list[int] = np.flatnonzero(np.cumsum(marks)[:-1] > 0).tolist()
    return positions
