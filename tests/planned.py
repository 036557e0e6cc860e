"""What the plan says of how each partition is read, for tests: one view per partition over
its :class:`~ddbloader._sql.partition.PartitionSpec` and its group's read facts (the spec
itself holds no read kind)."""

from __future__ import annotations

from typing import Any

from ddbloader._sql.pieces import KeyRanges
from ddbloader._sql.plan import GroupPlan, QueryPlan
from ddbloader._sql.window_rows import WindowRows


class Planned:
    """Partition ``position`` of ``group`` with its read's facts; the spec's fields read through."""

    def __init__(self, group: GroupPlan, position: int) -> None:
        self.spec = group.partitions[position]
        self.read = group.reads[position]
        self.tagged = group.read_runs[position] is not None
        self.windows: WindowRows | None = group.row_maps[position]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spec, name)

    @property
    def streamed(self) -> bool:
        return self.read is not None

    @property
    def pieces(self) -> int:
        return 1 if self.read is None else len(self.read.cells)

    @property
    def piece(self) -> int:
        return 0 if self.read is None else self.spec.position - self.read.cells[0].position

    @property
    def first_row(self) -> int:
        return 0 if self.read is None else self.read.first_rows[self.spec.position]

    @property
    def ranges(self) -> KeyRanges | None:
        return None if self.read is None else self.read.ranges_of(self.spec)

    @property
    def sql(self) -> str:
        """The SQL that reads it (a range piece's reads only its ranges)."""
        return self.spec.sql if self.read is None else self.read.sql

    @property
    def params(self) -> tuple[Any, ...]:
        return self.spec.params if self.read is None else self.read.params


def views(where: QueryPlan | GroupPlan) -> list[Planned]:
    """Every partition of ``where`` (a plan's groups in order), with its read's facts."""
    groups = where.groups if isinstance(where, QueryPlan) else (where,)
    return [Planned(g, position) for g in groups for position in range(len(g.partitions))]
