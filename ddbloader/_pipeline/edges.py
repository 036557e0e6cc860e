"""KeptEdges: the edge rows a unit keeps of every partition it loaded, and their stitching.

A window may span partitions: a step's segment is its partition with up to ``span - 1`` rows of
its loaded neighbours on each side (how many, the schedule's LOAD event says). So a unit of a
group of several partitions keeps the first and last ``span - 1`` rows of each partition it
loads, until it ends. Owned by the pool (the assembler thread); not thread-safe.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

from .._io.block import Block
from .._io.threads import Pending
from .._sql.plan import WorkUnit

__all__ = ["KeptEdges"]

#: A partition of one unit of the schedule: (unit index, position in its group).
_Key = tuple[int, int]


class KeptEdges:
    """The kept rows of the partitions loaded by units of groups of several partitions.

    ``claim`` brings a partition's rows again: a partition loaded while a resume replayed the
    batches it skips is known by its row count only (:meth:`passed`), and is claimed (once) when
    a step joins its kept rows.
    """

    def __init__(self, units: Sequence[WorkUnit], span: int, claim: Callable[[_Key], Pending[Block]]) -> None:
        self._units = units
        self._edge = span - 1
        self._claim = claim
        #: (head, tail) by partition; None for one loaded during a replay, not claimed yet
        self._kept: dict[_Key, tuple[Block, Block] | None] = {}
        self._early: dict[_Key, Pending[Block]] = {}
        self._bounds: dict[int, list[int]] = {}

    def first_row(self, unit: int, position: int) -> int:
        """The row of its group that partition ``position`` starts at."""
        if position == 0:
            return 0
        return self._group_bounds(unit)[position]

    def rows(self, unit: int, position: int) -> int:
        return self._units[unit].group.partitions[position].rows

    def _group_bounds(self, unit: int) -> list[int]:
        group = self._units[unit].group
        bounds = self._bounds.get(group.index)
        if bounds is None:
            bounds = self._bounds[group.index] = list(
                itertools.accumulate((p.rows for p in group.partitions), initial=0)
            )
        return bounds

    def _keeps(self, unit: int) -> bool:
        group = self._units[unit].group
        return self._edge > 0 and len(group.partitions) > 1 and not group.combed_windows

    def keep(self, key: _Key, block: Block) -> None:
        """Keep the first and last ``span - 1`` rows of ``key``'s ``block`` (copies: the block may go)."""
        if self._keeps(key[0]):
            keep = min(self._edge, block.rows)
            self._kept[key] = (block.rows_between(0, keep), block.rows_between(block.rows - keep, block.rows))

    def passed(self, key: _Key) -> None:
        """``key`` was loaded during a replay: its kept rows are claimed when a step joins them."""
        if self._keeps(key[0]):
            self._kept[key] = None

    def forget(self, keys: Iterable[_Key]) -> None:
        """The unit of ``keys`` ended: nothing joins their rows any more."""
        for key in keys:
            self._kept.pop(key, None)
            self._early.pop(key, None)

    def _walk(self, key: _Key, direction: int, rows: int) -> list[tuple[int, int]]:
        """The neighbours (position, rows taken) whose kept rows make up ``rows`` on one side,
        nearest first, as the schedule counted them."""
        unit, position = key
        partitions = self._units[unit].group.partitions
        walk = []
        neighbour = position + direction
        while rows > 0:
            if (unit, neighbour) not in self._kept:
                raise RuntimeError(
                    f"internal error: partition {neighbour} of group {partitions[0].group} joins a step "
                    f"without being loaded"
                )
            take = min(rows, self._edge, partitions[neighbour].rows)
            walk.append((neighbour, take))
            rows -= take
            neighbour += direction
        return walk

    def claim_early(self, key: _Key, left: int, right: int) -> None:
        """Claim now the neighbours not at hand whose kept rows ``key``'s step joins (``left`` and
        ``right`` rows): awaited when :meth:`around` joins them."""
        for direction, rows in ((-1, left), (+1, right)):
            for neighbour, _ in self._walk(key, direction, rows):
                at = (key[0], neighbour)
                if self._kept[at] is None and at not in self._early:
                    self._early[at] = self._claim(at)

    def around(
        self,
        key: _Key,
        block: Block,
        left: int,
        right: int,
        wait: Callable[[Pending[Block]], Block],
        reach: tuple[bool, bool] = (True, True),
    ) -> list[Block]:
        """``key``'s ``block`` with ``left`` kept rows of its neighbours before it and ``right``
        after (``wait`` awaits a neighbour claimed again). A side not in ``reach`` (no remaining
        sample of a resumed step reads it) is zeros."""
        blocks = [block]
        if left:
            blocks[:0] = self._side(key, -1, left, wait) if reach[0] else [block.zeros(left)]
        if right:
            blocks += self._side(key, +1, right, wait) if reach[1] else [block.zeros(right)]
        return blocks

    def _side(
        self, key: _Key, direction: int, rows: int, wait: Callable[[Pending[Block]], Block]
    ) -> list[Block]:
        pieces = []
        for neighbour, take in self._walk(key, direction, rows):
            at = (key[0], neighbour)
            kept = self._kept[at]
            if kept is None:
                pending = self._early.pop(at, None) or self._claim(at)
                self.keep(at, wait(pending))
                kept = self._kept[at]
                assert kept is not None
            part = kept[1] if direction < 0 else kept[0]
            pieces.append(part.view(part.rows - take, part.rows) if direction < 0 else part.view(0, take))
        return pieces[::-1] if direction < 0 else pieces
