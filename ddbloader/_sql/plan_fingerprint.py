"""The plan fingerprint: a short text naming a :class:`~ddbloader._sql.plan.QueryPlan`, and what
differs between two of them.

One 8-hex-digit digest per :data:`FINGERPRINT_PARTS` entry, built from reprs (not ``hash()``), so
equal plans give equal fingerprints in any process; a saved state carries it, and a resume names
the parts that changed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from typing import Any

from .plan import QueryPlan
from .read import read_shape

__all__ = ["FINGERPRINT_PARTS", "plan_differences", "plan_fingerprint"]


#: What a plan fingerprint identifies, one digest each, in the fingerprint's order.
FINGERPRINT_PARTS = (
    ("query", "the query text"),
    ("schemes", "the group and repartition values, in order"),
    ("counts", "the planned row counts per partition (and a split's first sample per group)"),
    ("layout", "the columns of x, y and key_col, and their dtypes"),
    ("window", "the window arguments (window_size, window_stride, offset)"),
)


def _canonical(value: Any) -> Any:
    """``value`` with every zone-aware timestamp in UTC: the same instant reprs alike whatever the
    session's time zone (DuckDB returns TIMESTAMPTZ values in the machine's zone)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [_canonical(getattr(value, field.name)) for field in dataclasses.fields(value)]
    return value


def plan_fingerprint(plan: QueryPlan) -> str:
    """A short text naming ``plan``: one 8-hex-digit digest per :data:`FINGERPRINT_PARTS` entry,
    joined by dots. Equal for equal plans in any process (built from reprs, not ``hash()``)."""
    layout = plan.layout
    parts = {
        "query": plan.query.text if plan.query is not None else "",
        "schemes": repr(
            _canonical([(g.value, [p.repartition_value for p in g.partitions]) for g in plan.groups])
        ),
        "counts": repr(
            [
                [(p.rows, *_canonical(read_shape(g, p.position))) for p in g.partitions]
                + ([("first sample", g.first_sample)] if g.first_sample else [])
                for g in plan.groups
            ]
        ),
        "layout": repr(
            (layout.x_names, layout.y_names, str(layout.x_dtype), str(layout.y_dtype), layout.key_names)
        ),
        "window": repr(dataclasses.astuple(plan.geometry)),
    }
    return ".".join(hashlib.sha256(parts[name].encode()).hexdigest()[:8] for name, _ in FINGERPRINT_PARTS)


def plan_differences(saved: str, current: str) -> list[str]:
    """What differs between two :func:`plan_fingerprint` texts, described (empty: the same plan)."""
    if saved == current:
        return []
    pairs = list(zip(saved.split("."), current.split("."), strict=False))
    if len(pairs) != len(FINGERPRINT_PARTS):
        return ["the plan's fingerprint format"]
    return [label for (_, label), (a, b) in zip(FINGERPRINT_PARTS, pairs, strict=True) if a != b]
