"""``state_at(epoch, batch)``: the state after a batch, computed from the plan alone.

The oracle is the loader itself: the state ``state_dict()`` returns after iterating to that batch,
and the batches an uninterrupted epoch yields after it.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
import torch
from conftest import SERIES_SQL, examples, make_series
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader import DDBDataLoader

PARTS = [[30, 17], [5], [44, 3, 9], [12]]


def _loader(con: duckdb.DuckDBPyConnection, **args: Any) -> DDBDataLoader:
    options: dict[str, Any] = {
        "input_col": ["rid"],
        "group_col": "gid",
        "batch_size": 7,
        "shuffle": True,
        "seed": 11,
        "window_size": 3,
        "fetch_bytes": 256,
        **args,
    }
    return DDBDataLoader(con, SERIES_SQL, "y", **options)


def _ids(batches: Any) -> list[list[float]]:
    return [x[:, 0, 0].tolist() for x, _ in batches]


@pytest.fixture(scope="module")
def con() -> Any:
    connection = duckdb.connect()
    make_series(connection, PARTS)
    yield connection
    connection.close()


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_state_at_is_the_state_after_iterating_to_that_batch(
    con: duckdb.DuckDBPyConnection, data: Any
) -> None:
    world = data.draw(st.sampled_from([1, 2, 3]), "world")
    rank = data.draw(st.integers(0, world - 1), "rank")
    epoch = data.draw(st.integers(0, 3), "epoch")
    drop_last = data.draw(st.booleans(), "drop_last")
    with _loader(con, rank=rank, world_size=world, drop_last=drop_last) as loader:
        whole = len(loader)
        batch = data.draw(st.integers(0, whole), "batch")
        loader.set_epoch(epoch)
        iterator = iter(loader)
        served = [next(iterator) for _ in range(batch)]
        assert len(served) == batch
        assert loader.state_at(epoch, batch) == loader.state_dict()
        rest = _ids(iterator)
    with _loader(con, rank=rank, world_size=world, drop_last=drop_last) as resumed:
        resumed.load_state_dict(resumed.state_at(epoch, batch))
        assert len(resumed) == whole - batch
        assert _ids(resumed) == rest


def test_a_range_of_batches_is_skipped_and_replayed(con: duckdb.DuckDBPyConnection) -> None:
    """The recipes: skip batches 5..9 of epoch 2 after batch 4; replay batches 5..9."""
    with _loader(con) as reference:
        reference.set_epoch(2)
        epoch = _ids(reference)
    with _loader(con) as skipping:
        skipping.set_epoch(2)
        head = _ids(batch for _, batch in zip(range(5), skipping, strict=False))
        skipping.load_state_dict(skipping.state_at(2, 10))
        assert head + _ids(skipping) == epoch[:5] + epoch[10:]
    with _loader(con) as replaying:
        replaying.load_state_dict(replaying.state_at(2, 5))
        assert _ids(batch for _, batch in zip(range(5), replaying, strict=False)) == epoch[5:10]


def test_a_state_at_one_world_resumes_under_another(con: duckdb.DuckDBPyConnection) -> None:
    """Computed under 2 ranks, loaded by 1: the rest is the samples no rank had handed out."""
    states, handed = [], []
    for rank in range(2):
        with _loader(con, rank=rank, world_size=2) as loader:
            iterator = iter(loader)
            handed += [x[:, 0, 0] for x, _ in (next(iterator) for _ in range(3))]
            states.append(loader.state_at(0, 3))
    assert states[0]["batches"] == states[1]["batches"] == 3
    with _loader(con) as whole:
        everything = sorted(torch.cat([x[:, 0, 0] for x, _ in whole]).tolist())
    with _loader(con) as resumed:
        resumed.load_state_dict(states[0])
        rest = [x[:, 0, 0] for x, _ in resumed]
    assert sorted(torch.cat(handed + rest).tolist()) == everything


def test_state_at_refuses_what_no_epoch_has(con: duckdb.DuckDBPyConnection) -> None:
    with _loader(con) as loader:
        with pytest.raises(ValueError, match=r"within \[0, \d+\]"):
            loader.state_at(0, len(loader) + 1)
        with pytest.raises(ValueError, match="epoch must be >= 0"):
            loader.state_at(-1, 0)
        with pytest.raises(TypeError, match="batch must be an int"):
            loader.state_at(0, 1.5)  # type: ignore[arg-type]
