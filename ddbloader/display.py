"""What a loader will do, as text and HTML, from the cached plan alone (nothing is fetched)."""

from __future__ import annotations

import html
from typing import Any

from .config import LoaderConfig
from .plan import QueryPlan
from .shard import Sharding

__all__ = ["plan_html", "plan_rows", "plan_text"]


def _shape(batch: int, window: int | None, features: int) -> str:
    return "[" + ", ".join(str(d) for d in (batch, window, features) if d is not None) + "]"


def plan_rows(
    plan: QueryPlan, config: LoaderConfig, sharding: Sharding, batches: int
) -> list[tuple[str, str]]:
    """(label, value) pairs describing the plan; credentials never appear (engine names are redacted)."""
    layout = plan.layout
    x_window = config.x_window if config.windowed else None
    y_window = config.y_window if config.windowed else None
    batch_bytes = config.batch_size * (
        config.x_window * len(layout.x_names) * layout.x_dtype.itemsize
        + config.y_window * len(layout.y_names) * layout.y_dtype.itemsize
    )
    rows: list[tuple[str, str]] = [
        ("engine", plan.engine),
        ("groups × repartitions", f"{len(plan.groups):,} groups, {plan.partitions:,} partitions"),
        ("rows", f"{plan.rows:,}"),
        ("windows per epoch", f"{plan.samples:,}"),
        ("batches per epoch", f"{batches:,}" + (" (drop_last)" if config.drop_last else "")),
        ("x", f"{_shape(config.batch_size, x_window, len(layout.x_names))} {layout.x_dtype}"),
        ("y", f"{_shape(config.batch_size, y_window, len(layout.y_names))} {layout.y_dtype}"),
        ("bytes per batch", f"{batch_bytes / 1e6:,.2f} MB"),
        ("order", f"shuffle={config.shuffle}, seed={config.seed}"),
    ]
    if sharding.world_size > 1:
        rows.append(
            ("rank", f"{sharding.rank} of {sharding.world_size} (even_batches={sharding.even_batches})")
        )
    return rows


def plan_text(rows: list[tuple[str, str]]) -> str:
    return "DDBDataLoader(" + ", ".join(f"{label}: {value}" for label, value in rows) + ")"


def plan_html(rows: list[tuple[str, str]], columns: dict[str, Any]) -> str:
    """An HTML table of the plan, then the x and y column names."""
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
        for label, value in rows
    )
    names = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)} columns</th>"
        f"<td>{html.escape(', '.join(map(str, v)))}</td></tr>"
        for k, v in columns.items()
    )
    return f"<table><caption><b>DDBDataLoader</b></caption>{cells}{names}</table>"
