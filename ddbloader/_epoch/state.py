"""The resume state: where a consumer is in an epoch, as small JSON that names its plan.

A state is a plain dict of JSON values: the epoch, the batches handed out, the seed, and what
decides the batch sequence (the plan's fingerprint, world size, batch size, shuffle, drop_last,
even_batches, group_pool_size). :func:`check_state` refuses a state whose batches would not
continue this loader's sequence, naming what differs. Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core.config import LoaderConfig
from .._sql.plan import QueryPlan, plan_differences, plan_fingerprint
from .shard import Sharding

__all__ = ["STATE_VERSION", "check_state", "make_state"]

#: Raised whenever a state's meaning changes: its keys, or the batch order that a seed gives (2: one
#: generator of sample orders per epoch, group_pool_size and partitions recorded; 3: a finished
#: unit hands its pool slot to the next unit).
STATE_VERSION = 3


def _ordering(config: LoaderConfig, sharding: Sharding) -> dict[str, Any]:
    """The arguments besides the plan that decide the batch sequence."""
    return {
        "batch_size": config.batch_size,
        "shuffle": config.shuffle,
        "drop_last": config.drop_last,
        "even_batches": sharding.even_batches,
        "group_pool_size": config.group_pool_size,
    }


def make_state(
    epoch: int, batches: int, config: LoaderConfig, plan: QueryPlan, sharding: Sharding
) -> dict[str, Any]:
    """The state of a consumer that has had ``batches`` batches of ``epoch``."""
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches": batches,
        "seed": config.seed,
        "samples": plan.samples,
        "world_size": sharding.world_size,
        "rank": sharding.rank,
        **_ordering(config, sharding),
        "partitions": plan.partitions,
        "plan": plan_fingerprint(plan),
    }


def check_state(state: Mapping[str, Any], config: LoaderConfig, plan: QueryPlan, sharding: Sharding) -> None:
    """Refuse a state whose saved position would not name the same samples in this loader's epoch.

    Raises:
        ValueError: the state belongs to another plan (sample count, or partition count:
            streamed pieces depend on ``fetch_bytes``), world size, batch size, shuffle,
            drop_last, even_batches, group_pool_size or version; the message names what differs.
    """
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"state version {state.get('version')!r} is not {STATE_VERSION}: it was saved by a "
            f"ddbloader whose batches for the same seed differ, so it cannot be resumed exactly"
        )
    if state["samples"] != plan.samples:
        raise ValueError(
            f"state was saved by a loader with {state['samples']} samples per epoch; this one has "
            f"{plan.samples}: the query, the data or the window arguments differ"
        )
    if state["world_size"] != sharding.world_size:
        raise ValueError(
            f"state was saved with world_size={state['world_size']}; this loader has "
            f"world_size={sharding.world_size}, which splits the epoch differently"
        )
    if "partitions" in state and state["partitions"] != plan.partitions:
        raise ValueError(
            f"state was saved by a loader whose plan has {state['partitions']} partitions; this one "
            f"has {plan.partitions}: the schemes or fetch_bytes differ (a partition larger than "
            f"fetch_bytes is read in pieces, and the pieces decide the sample order)"
        )
    differences = plan_differences(state["plan"], plan_fingerprint(plan)) if "plan" in state else []
    if differences:
        raise ValueError(
            f"state was saved by a loader with another plan (it differs in {'; '.join(differences)}), "
            f"so the saved position names other samples in this loader's epoch"
        )
    for name, value in _ordering(config, sharding).items():
        if name in state and state[name] != value:
            raise ValueError(
                f"state was saved with {name}={state[name]!r}; this loader has {name}={value!r}, "
                f"so its batches would not continue the saved sequence"
            )
