"""The resume state: where a consumer is in an epoch, as small JSON that names its plan.

A state is a plain dict of JSON values: the epoch, the batches handed out, the seed, and what
decides the batch sequence (the plan's fingerprint, world size, batch size, shuffle, drop_last,
even_batches, group_pool_size). :func:`check_state` refuses a state whose batches would not
continue this loader's sequence, naming what differs; a state from another world size, number of
DataLoader workers or even_batches is accepted (its :class:`Resume` names the stretches of the
epoch served so far, see :mod:`ddbloader._epoch.elastic`). Pure functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._core.config import LoaderConfig
from .._sql.plan import QueryPlan
from .._sql.plan_fingerprint import plan_differences, plan_fingerprint
from .elastic import Stretch
from .shard import EvenBatches

__all__ = ["STATE_VERSION", "Resume", "check_state", "make_state", "merge_worker_states", "resume_of"]

#: Raised whenever a state's meaning changes: its keys, or the batch order that a seed gives (2: one
#: generator of sample orders per epoch, group_pool_size and partitions recorded; 3: a finished
#: unit hands its pool slot to the next unit; 4: ``worker``, ``num_workers`` and ``resumed`` added
#: for elastic resume). A version 3 state reads as a version 4 one without those (same order).
STATE_VERSION = 4
_READABLE = (3, STATE_VERSION)


@dataclass(frozen=True)
class Resume:
    """Where a saved state stopped: the epoch's earlier ``stretches`` (each served under its own
    world, see :class:`~ddbloader._epoch.elastic.Stretch`), then ``batches`` by worker ``worker`` of
    ``num_workers`` of each of ``world_size`` ranks. ``worker_batches`` is every worker's count when
    the state knows them all (one worker, or a merge of the workers' states), else None."""

    stretches: tuple[Stretch, ...]
    world_size: int
    even_batches: EvenBatches
    num_workers: int
    worker: int
    batches: int
    worker_batches: tuple[int, ...] | None

    @property
    def started(self) -> bool:
        """Whether anything of the epoch was handed out before this state."""
        return bool(self.stretches) or self.batches > 0 or any(self.worker_batches or ())

    def at(self, batches: int) -> Resume:
        """The same place, ``batches`` batches into its stretch (a running iteration's progress)."""
        known = (batches,) if self.num_workers == 1 else None
        return dataclasses.replace(self, batches=batches, worker_batches=known)

    def stretch(self) -> Stretch | None:
        """This stretch, to resume elsewhere; None if the state knows only one worker's count."""
        if self.worker_batches is None:
            return None
        return Stretch(self.world_size, self.even_batches, self.worker_batches)

    def continued_by(
        self, world_size: int, even_batches: EvenBatches, worker: int, num_workers: int
    ) -> tuple[tuple[Stretch, ...], int]:
        """How worker ``worker`` of ``num_workers`` of a rank of ``world_size`` goes on from here:
        the stretches of the epoch served before its schedule, and the batches of it to skip.

        Under this state's world size, even_batches and worker count the schedule is the saved
        one, continued after the batches handed out (bit for bit); from any other place this
        stretch joins the earlier ones, and the rest of the epoch is split for the new world (see
        :mod:`ddbloader._epoch.elastic`), skipping nothing.

        Raises:
            ValueError: a single worker's state (which knows only its own batches) continued by
                another worker or under another world.
        """
        if (self.world_size, self.even_batches, self.num_workers) == (world_size, even_batches, num_workers):
            if self.worker_batches is not None:
                return self.stretches, self.worker_batches[worker]
            if self.worker == worker:
                return self.stretches, self.batches
        stretch = self.stretch()
        if stretch is None:
            raise ValueError(
                f"the loaded state is DataLoader worker {self.worker}'s of {self.num_workers}, which "
                f"names only its own batches; this is worker {worker} of {num_workers} under "
                f"world_size={world_size}, even_batches={even_batches!r}: load each worker's own state "
                f"under the same place, or every worker's counts at once (see "
                f"DDBIterableDataset.merge_worker_states)"
            )
        return ((*self.stretches, stretch) if any(stretch.batches) else self.stretches), 0

    def to_state(self) -> dict[str, Any]:
        """The state's keys that say where it stopped."""
        return {
            "batches": self.batches,
            "world_size": self.world_size,
            "even_batches": self.even_batches,
            "worker": self.worker,
            "num_workers": self.num_workers,
            "resumed": [[s.world_size, s.even_batches, list(s.batches)] for s in self.stretches],
        }


def _ordering(config: LoaderConfig) -> dict[str, Any]:
    """The arguments besides the plan and the world that decide the batch sequence."""
    return {
        "batch_size": config.batch_size,
        "shuffle": config.shuffle,
        "drop_last": config.drop_last,
        "group_pool_size": config.group_pool_size,
    }


def make_state(
    epoch: int, config: LoaderConfig, plan: QueryPlan, rank: int, resume: Resume
) -> dict[str, Any]:
    """The state of rank ``rank``'s consumer stopped at ``resume`` in ``epoch``."""
    place = resume.to_state()
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches": place.pop("batches"),
        "seed": config.seed,
        "samples": plan.samples,
        "world_size": place.pop("world_size"),
        "rank": rank,
        **_ordering(config),
        "even_batches": place.pop("even_batches"),
        "partitions": plan.partitions,
        "plan": plan_fingerprint(plan),
        **place,
    }


def _natural(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def resume_of(state: Mapping[str, Any]) -> Resume:
    """Where ``state`` (checked by :func:`check_state`) stopped.

    Raises:
        ValueError: a malformed ``worker``, ``num_workers``, ``batches`` or ``resumed``.
    """
    workers, worker, batches = state.get("num_workers", 1), state.get("worker", 0), state["batches"]
    world, even = state["world_size"], state["even_batches"]
    if not (_natural(workers, 1) and _natural(worker) and worker < workers and _natural(world, 1)):
        raise ValueError(
            f"state has world_size={world!r}, worker={worker!r}, num_workers={workers!r}: not a place "
            f"in a world (ints, 0 <= worker < num_workers)"
        )
    if even not in ("pad", "drop"):
        raise ValueError(f"state has even_batches={even!r}, neither 'pad' nor 'drop'")
    stretches = []
    for entry in state.get("resumed", []):
        if not (
            isinstance(entry, (list, tuple))
            and len(entry) == 3
            and _natural(entry[0], 1)
            and entry[1] in ("pad", "drop")
            and isinstance(entry[2], (list, tuple))
            and entry[2]
            and all(_natural(b) for b in entry[2])
        ):
            raise ValueError(
                f"state's resumed entry {entry!r} is not [world_size, even_batches, [batches, ...]]"
            )
        stretches.append(Stretch(entry[0], entry[1], tuple(entry[2])))
    if isinstance(batches, (list, tuple)):  # every worker's count: a merge of the workers' states
        if len(batches) != workers or not all(_natural(b) for b in batches):
            raise ValueError(f"state has batches={batches!r}: not one count per worker of {workers}")
        return Resume(tuple(stretches), world, even, workers, worker, batches[worker], tuple(batches))
    if not _natural(batches):
        raise ValueError(f"state has batches={batches!r}, not a count")
    known = (batches,) if workers == 1 else None
    return Resume(tuple(stretches), world, even, workers, worker, batches, known)


def _positive(value: Any) -> bool:
    return _natural(value, 1)


#: Every key a state may hold, and what its value must be; those a state must hold are _REQUIRED.
_FIELDS: dict[str, tuple[str, Any]] = {
    "version": ("an int", _natural),
    "epoch": ("an int >= 0", _natural),
    "batches": ("an int >= 0 (or one per worker)", lambda v: isinstance(v, (list, tuple)) or _natural(v)),
    "seed": ("an int >= 0", _natural),
    "samples": ("an int >= 0", _natural),
    "world_size": ("an int >= 1", _positive),
    "rank": ("an int >= 0", _natural),
    "batch_size": ("an int >= 1", _positive),
    "shuffle": ("a bool", lambda v: isinstance(v, bool)),
    "drop_last": ("a bool", lambda v: isinstance(v, bool)),
    "group_pool_size": ("an int >= 1", _positive),
    "even_batches": ("'pad' or 'drop'", lambda v: v in ("pad", "drop")),
    "partitions": ("an int >= 0", _natural),
    "plan": ("a fingerprint string", lambda v: isinstance(v, str)),
    "worker": ("an int >= 0", _natural),
    "num_workers": ("an int >= 1", _positive),
    "resumed": ("a list", lambda v: isinstance(v, (list, tuple))),
}
_REQUIRED = ("version", "epoch", "batches", "seed", "samples", "world_size", "even_batches")


def _check_fields(state: Any) -> None:
    """Refuse what is not a ddbloader state, or a field of the wrong type, naming it.

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: a key missing (not a ddbloader state) or a value of the wrong type.
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            f"load_state_dict takes a ddbloader state, the dict state_dict() returns; got "
            f"{type(state).__name__} {state!r:.80}"
        )
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        keys = sorted(map(str, state))
        hint = (
            ": this is a torchdata StatefulDataLoader's state; load it into the StatefulDataLoader, or "
            "DDBIterableDataset.merge_worker_states(it) into a dataset"
            if "_snapshot" in state or "dataset_state" in state
            else ""
        )
        raise ValueError(
            f"not a ddbloader state (from DDBDataLoader.state_dict()): it lacks {missing}; its keys: "
            f"{keys[:12]}{' ...' if len(keys) > 12 else ''}{hint}"
        )
    for key, (kind, valid) in _FIELDS.items():
        if key in state and not valid(state[key]):
            raise ValueError(
                f"state has {key}={state[key]!r}, which is not {kind}: not a state_dict() of a loader"
            )


def check_state(state: Mapping[str, Any], config: LoaderConfig, plan: QueryPlan) -> Resume:
    """Refuse a state whose saved position would not name the same samples in this loader's epoch;
    else say where it stopped. Another world size, worker count or even_batches is accepted.

    Every field is checked by type first, so a malformed state fails here, never at the first batch.

    Raises:
        TypeError: ``state`` is not a mapping (``None``, say).
        ValueError: not a ddbloader state (a key missing, a value of the wrong type), or a state
            of another plan (sample count, or partition count: streamed pieces depend on
            ``fetch_bytes``), batch size, shuffle, drop_last, group_pool_size or version; the
            message names what differs.
    """
    _check_fields(state)
    if state.get("version") not in _READABLE:
        raise ValueError(
            f"state version {state.get('version')!r} is not {STATE_VERSION}: it was saved by a "
            f"ddbloader whose batches for the same seed differ, so it cannot be resumed exactly"
        )
    if state["samples"] != plan.samples:
        raise ValueError(
            f"state was saved by a loader with {state['samples']} samples per epoch; this one has "
            f"{plan.samples}: the query, the data or the window arguments differ"
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
    for name, value in _ordering(config).items():
        if name in state and state[name] != value:
            raise ValueError(
                f"state was saved with {name}={state[name]!r}; this loader has {name}={value!r}, "
                f"so its batches would not continue the saved sequence"
            )
    return resume_of(state)


def merge_worker_states(stateful: Mapping[str, Any]) -> dict[str, Any]:
    """One state from torchdata ``StatefulDataLoader.state_dict()``'s per-worker dataset states:
    every worker's batch count at once (``batches`` a list, one per worker), which resumes on any
    world size and worker count (a single worker's state names only its own progress).

    Raises:
        ValueError: not a StatefulDataLoader state of a DDBIterableDataset, a worker without a
            batch handed out yet, or workers whose states differ in more than their worker and
            batches (another epoch, plan or stretch).
    """
    if "dataset_state" in stateful:  # num_workers=0: the dataset's own state, one worker
        return dict(stateful["dataset_state"])
    try:
        snapshots = stateful["_snapshot"]["_worker_snapshots"]
        states = [snapshots[f"worker_{i}"]["dataset_state"] for i in range(len(snapshots))]
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"not a torchdata StatefulDataLoader state (no _snapshot/_worker_snapshots/worker_i/"
            f"dataset_state: {error!r})"
        ) from error
    for worker, state in enumerate(states):
        place = (state.get("worker"), state.get("num_workers")) if isinstance(state, Mapping) else None
        if place != (worker, len(states)):
            raise ValueError(
                f"worker {worker}'s dataset state is not that of DDBIterableDataset worker {worker} of "
                f"{len(states)} in an epoch (a worker that has not handed out a batch yet has none): "
                f"save the state after at least num_workers batches"
            )
    shared = [{k: v for k, v in s.items() if k not in ("worker", "batches", "rank")} for s in states]
    for worker, state in enumerate(shared):
        if state != shared[0]:
            differs = sorted(k for k in state.keys() | shared[0].keys() if state.get(k) != shared[0].get(k))
            raise ValueError(f"worker {worker}'s state differs from worker 0's in {', '.join(differs)}")
    return {**states[0], "worker": 0, "batches": [int(s["batches"]) for s in states]}
