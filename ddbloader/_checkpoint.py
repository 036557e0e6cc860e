"""Checkpoints: a loader's ``state_dict`` and ``load_state_dict``, counting batches handed out.

A state names an epoch and where in it the consumer stands (a
:class:`~ddbloader._epoch.state.Resume`); it is small, JSON-serialisable and the same on every
rank. Loading one makes the next iteration resume that epoch after its last batch, also under
another world size (see :mod:`ddbloader._epoch.elastic`). :class:`LoaderCheckpoint` is a base of
:class:`~ddbloader.DDBDataLoader`, over the claim bookkeeping of :mod:`ddbloader._claims`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._claims import EpochClaims
from ._epoch.shard import shard_samples
from ._epoch.state import Resume, check_state, make_state, resume_of
from ._pipeline.batch import batch_count
from ._sql.plan_fingerprint import plan_fingerprint

__all__ = ["LoaderCheckpoint"]


class LoaderCheckpoint(EpochClaims):
    """The checkpoint methods of :class:`~ddbloader.DDBDataLoader` (see the module docstring).

    A state is where the epoch claims stand, so these methods read and set the claim bookkeeping
    of :class:`~ddbloader._claims.EpochClaims`, whose attributes the loader sets.
    """

    if TYPE_CHECKING:  # the loader's own, used here

        def _stop_iterator(self, reason: str) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: small, JSON-serialisable, counting batches handed out.

        A fresh loader built with the same arguments that loads this state yields exactly the
        rest of the interrupted epoch, then the following epochs as if never interrupted. Taken
        after an epoch's last batch but inside the loop, the state still names that epoch (so the
        resumed loop finishes it, empty, and the next pass runs the next epoch, as in a checkpoint
        taken at the last step); once the iteration has ended it names the next epoch. Every rank
        reaches the same state, so rank 0's state may be loaded on every rank, also under another
        world size (then the rest of the epoch is what no old rank had handed out, split anew).
        """
        return self._state(ended_names_next=True)

    def _state(self, ended_names_next: bool) -> dict[str, Any]:
        """:meth:`state_dict`; an ended iteration names its own epoch, fully served, unless
        ``ended_names_next`` (see :meth:`DDBIterableDataset.state_dict`)."""
        sharding = self.sharding
        fresh = Resume((), sharding.world_size, sharding.even_batches, 1, 0, 0, (0,))
        if self._progress is None:
            epoch, place = self._epoch, self._resume or fresh
        else:
            epoch, batches, finished = self._progress
            assert self._running is not None
            place = self._running.at(batches)
            if finished and ended_names_next:
                epoch, place = epoch + 1, fresh
        return make_state(epoch, self.config, self.plan, sharding.rank, place)

    def state_at(self, epoch: int, batch: int) -> dict[str, Any]:
        """The state :meth:`state_dict` returns after an iteration of ``epoch`` under the current
        world size handed out its first ``batch`` batches on this rank, computed from the plan
        alone: nothing is fetched or iterated. Loading it skips exactly those batches (under
        another world size or worker count, elastically, as any state), so batches ``k`` to
        ``m`` of an epoch are skipped by loading ``state_at(epoch, m + 1)`` after batch ``k - 1``,
        and replayed by loading ``state_at(epoch, k)`` and taking ``m - k + 1`` batches.

        Raises:
            TypeError: ``epoch`` or ``batch`` is not an int.
            ValueError: ``epoch`` is negative, or ``batch`` is outside ``[0, batches of an epoch]``.
        """
        for name, value in (("epoch", epoch), ("batch", batch)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"state_at: {name} must be an int, got {type(value).__name__} {value!r}")
        sharding = self.sharding
        samples = shard_samples(self.plan.samples, sharding.world_size, sharding.even_batches)
        whole = batch_count(samples, self.config.batch_size, self.config.drop_last)
        if epoch < 0 or not 0 <= batch <= whole:
            raise ValueError(
                f"state_at(epoch={epoch}, batch={batch}): the epoch must be >= 0 and the batch within "
                f"[0, {whole}], the batches an epoch has on each of {sharding.world_size} rank(s)"
            )
        place = Resume((), sharding.world_size, sharding.even_batches, 1, 0, batch, (batch,))
        return make_state(epoch, self.config, self.plan, sharding.rank, place)

    def _checked(self, state: Mapping[str, Any]) -> Resume:
        """Where ``state`` stopped, checked against this loader (see :meth:`load_state_dict`)."""
        if not self._replans:
            return check_state(state, self.config, self.plan)
        try:
            boundary = not resume_of(state).started
        except (KeyError, TypeError, ValueError):
            boundary = False  # malformed: check_state names what is wrong
        if boundary:
            plan = self.plan
            fresh = {"samples": plan.samples, "partitions": plan.partitions, "plan": plan_fingerprint(plan)}
            state = {**state, **fresh}
        try:
            return check_state(state, self.config, self.plan)
        except ValueError as error:
            if boundary:
                raise
            raise ValueError(
                f"{error}. Under replan='epoch' the snapshot this state's epoch was planned on is gone "
                f"(every epoch plans on a fresh one, and the data changed since): resume from a state "
                f"saved at an epoch's end, or with replan='never' on data that does not change"
            ) from error

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next iteration resumes that epoch after its last batch.

        A state saved under another world size, ``even_batches`` or DataLoader worker count is
        resumed elastically: the rest of its epoch is the samples no old rank had handed out,
        split among this world's ranks with equal batch counts (see :mod:`ddbloader._epoch.elastic`).

        Raises:
            ValueError: the state belongs to another plan (sample count, or partition count:
                streamed pieces depend on ``fetch_bytes``), batch size, shuffle, drop_last,
                group_pool_size or version, or is malformed. Under ``replan="epoch"`` a state
                saved at an epoch's boundary resumes on this loader's plan (a fresh one is
                what that epoch would have planned); one saved inside an epoch needs its plan.
        """
        resume = self._checked(state)
        self._stop_iterator("this DDBDataLoader iteration was superseded by load_state_dict()")
        self._peek = None
        if state["seed"] != self.config.seed:
            self.config = dataclasses.replace(self.config, seed=int(state["seed"]))
        self._epoch = int(state["epoch"])
        self._resume = resume
        self._progress = None
