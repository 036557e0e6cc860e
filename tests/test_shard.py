"""Rank and worker splitting: disjoint, complete, balanced, equal counts per rank."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader._epoch.shard import WorkUnit, shard_samples, split_units
from ddbloader._sql.plan import GroupPlan


def _groups(sizes: list[int]) -> list[GroupPlan]:
    return [GroupPlan(index=i, value=i, partitions=(), samples=n) for i, n in enumerate(sizes)]


def _samples(units: list[WorkUnit]) -> list[tuple[int, int]]:
    return [(u.group.index, i) for u in units for i in range(u.first, u.stop)]


@settings(max_examples=examples(200), deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    world=st.integers(1, 5),
    workers=st.integers(1, 4),
    even=st.sampled_from(["pad", "drop"]),
)
def test_ranks_are_disjoint_complete_and_equal(sizes: list[int], world: int, workers: int, even: str) -> None:
    groups = _groups(sizes)
    total = sum(sizes)
    per_rank = shard_samples(total, world, even)  # type: ignore[arg-type]
    everything: Counter[tuple[int, int]] = Counter()
    for rank in range(world):
        rank_samples: list[tuple[int, int]] = []
        for worker in range(workers):
            rank_samples += _samples(split_units(groups, rank, world, worker, workers, even))  # type: ignore[arg-type]
        assert len(rank_samples) == per_rank
        assert rank_samples == _samples(split_units(groups, rank, world, 0, 1, even))  # type: ignore[arg-type]
        everything.update(rank_samples)
    universe = {(g, i) for g, n in enumerate(sizes) for i in range(n)}
    assert set(everything) <= universe
    if even == "pad":
        assert set(everything) == universe
        assert sum(everything.values()) - total == world * per_rank - total
    else:
        assert all(count == 1 for count in everything.values())
        assert total - len(everything) < world


def test_a_single_group_is_cut_between_ranks() -> None:
    groups = _groups([10])
    shards = [split_units(groups, r, 3, 0, 1, "pad") for r in range(3)]
    assert [[(u.first, u.stop) for u in s] for s in shards] == [[(0, 3), (0, 1)], [(3, 6), (3, 4)], [(6, 10)]]


def test_the_shorter_rank_wraps_its_own_first_sample() -> None:
    shards = [split_units(_groups([3, 4]), r, 2, 0, 1, "pad") for r in range(2)]
    assert [[(u.group.index, u.first, u.stop) for u in s] for s in shards] == [
        [(0, 0, 3), (0, 0, 1)],
        [(1, 0, 4)],
    ]
    dropped = [split_units(_groups([3, 4]), r, 2, 0, 1, "drop") for r in range(2)]
    assert sum(u.samples for u in dropped[0]) == sum(u.samples for u in dropped[1]) == 3


@pytest.mark.parametrize("world", [2, 4])
def test_fewer_samples_than_ranks_still_gives_every_rank_one(world: int) -> None:
    for rank in range(world):
        units = split_units(_groups([1]), rank, world, 0, 1, "pad")
        assert _samples(units) == [(0, 0)]
