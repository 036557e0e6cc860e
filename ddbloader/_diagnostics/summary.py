"""A loader's plan as (label, value) rows, which :mod:`ddbloader._core.display` renders as text or HTML.

Read from the cached plan only (counts, layout, config): never a query.
"""

from __future__ import annotations

from .._core.config import LoaderConfig
from .._core.display import human_bytes
from .._epoch.shard import Sharding
from .._sql.plan import QueryPlan
from .._sql.read import piece_notes

__all__ = ["plan_rows"]


def _shape(batch: int, window: int | None, sample: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in (batch, window, *sample) if d is not None) + "]"


def _split(plan: QueryPlan, config: LoaderConfig) -> str:
    """``'5 groups × 12 repartitions = 60 partitions'``; a range when groups differ; ``'whole group'``
    without a repartition column (each group is one partition); the subqueries larger than
    ``fetch_bytes`` and the pieces they are streamed in, and the range pieces (each a partition),
    when there are any."""
    groups = len(plan.groups)
    per_group = sorted({g.subqueries for g in plan.groups}) or [0]
    subqueries = sum(g.subqueries for g in plan.groups)
    notes = piece_notes(plan)
    pieces = f" ({', '.join(notes)})" if notes else ""
    spread = str(per_group[0]) if len(per_group) == 1 else f"{per_group[0]}–{per_group[-1]}"
    split = (
        "whole group"
        if config.repartition_col is None
        else f"{spread} repartition{'' if spread == '1' else 's'}"
    )
    return (
        f"{groups:,} group{'' if groups == 1 else 's'} × {split} = "
        f"{subqueries:,} partition{'' if subqueries == 1 else 's'}{pieces}"
    )


def plan_rows(
    plan: QueryPlan, config: LoaderConfig, sharding: Sharding, batches: int
) -> list[tuple[str, str]]:
    """(label, value) pairs describing the plan, from the cached plan only.

    Credentials never appear: the engine is named by its short name, and the query text is not
    shown (a connection string may hide in it).
    """
    layout = plan.layout
    x_window = config.x_window if config.windowed else None
    y_window = config.y_window if config.windowed else None
    batch_bytes = config.batch_size * (
        config.x_window * layout.x_features * layout.x_dtype.itemsize
        + config.y_window * layout.y_features * layout.y_dtype.itemsize
    )
    rows: list[tuple[str, str]] = [
        ("engine", plan.engine),
        ("groups × repartitions", _split(plan, config)),
    ]
    if config.group_col is not None:
        rows.append(("grouped by", config.group_col))
    if config.repartition_col is not None:
        rows.append(("repartitioned by", config.repartition_col))
    rows += [
        ("rows", f"{plan.rows:,}"),
        ("windows per epoch", f"{plan.samples:,}"),
        ("batches per epoch", f"{batches:,}" + (" (drop_last)" if config.drop_last else "")),
        ("x", f"{_shape(config.batch_size, x_window, layout.x_shape)} {layout.x_dtype}"),
        ("y", f"{_shape(config.batch_size, y_window, layout.y_shape)} {layout.y_dtype}"),
        ("bytes per batch", human_bytes(batch_bytes)),
        ("order", f"shuffle={config.shuffle}, seed={config.seed}"),
    ]
    if layout.key_names:
        rows.append(("keys", ", ".join(layout.key_names)))
    if sharding.world_size > 1:
        rows.append(
            ("rank", f"{sharding.rank} of {sharding.world_size} (even_batches={sharding.even_batches})")
        )
    return rows
