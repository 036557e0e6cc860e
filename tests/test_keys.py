"""Sample keys (``key_col=``): each batch's third element names the rows its samples predict.

The table's keys are derived from rid (a unique row id, ``y = rid + 0.5``), so every sample's
keys can be checked against its own y, whatever the order: shuffled, sharded, split over
workers or resumed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import pytest
import torch
from conftest import series_file
from torch.utils.data import DataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset

KEYS_SQL = (
    "SELECT gid, part, rid, f0, y, 'S' || gid::VARCHAR AS symbol, "
    "TIMESTAMP '2024-01-01' + INTERVAL (pos) MINUTE AS ts, DATE '2024-01-01' + pos::INTEGER AS day "
    "FROM series ORDER BY gid, part, pos"
)
EPOCH = dt.datetime(1970, 1, 1)
ARGS: dict[str, Any] = {
    "batch_size": 7,
    "shuffle": True,
    "seed": 5,
    "window_size": 3,
    "input_col": ["f0"],
    "group_col": "gid",
    "repartition_col": "part",
    "key_col": ["symbol", "ts", "rid", "day"],
    "dtype": torch.float64,  # y - 0.5 is the rid (above 2^24: not exact in float32)
}


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(series_file(tmp_path / "keys.duckdb", [[10, 7, 12], [15, 6], [8, 9, 11, 10]]))


def check(batches: Iterable[Any], windowed: bool = True) -> int:
    """Every sample's keys are those of its first y row; returns the samples checked."""
    checked = 0
    for batch in batches:
        assert len(batch) == 3
        _, y, keys = batch
        assert set(keys) == {"symbol", "ts", "rid", "day"}
        rids = (y[:, 0, 0] if windowed else y[:, 0]) - 0.5
        assert isinstance(keys["symbol"], list) and keys["ts"].dtype == torch.int64
        assert keys["rid"].tolist() == rids.long().tolist()
        for rid, symbol, ts, day in zip(
            rids.long().tolist(), keys["symbol"], keys["ts"].tolist(), keys["day"].tolist(), strict=True
        ):
            gid, pos = divmod(rid, 1_000_000)
            assert symbol == f"S{gid}"
            assert EPOCH + dt.timedelta(microseconds=ts) == dt.datetime(2024, 1, 1) + dt.timedelta(
                minutes=pos
            )
            assert day == (dt.date(2024, 1, 1) - dt.date(1970, 1, 1)).days + pos
            checked += 1
    return checked


def test_keys_name_each_samples_first_y_row_under_shuffle(path: str) -> None:
    with DDBDataLoader(path, KEYS_SQL, "y", **ARGS) as loader:
        assert check(loader) == loader.plan.samples == 79
        assert "keys: symbol, ts, rid, day" in repr(loader)


def test_without_windows_the_keys_are_the_samples_row(path: str) -> None:
    args = {**ARGS, "window_size": None, "offset": None}
    with DDBDataLoader(path, KEYS_SQL, "y", **args) as loader:
        assert check(loader, windowed=False) == 88


def test_without_key_col_a_batch_is_x_and_y(path: str) -> None:
    args = {k: v for k, v in ARGS.items() if k != "key_col"}
    with DDBDataLoader(path, KEYS_SQL, "y", **args) as loader:
        assert all(len(batch) == 2 for batch in loader)


def test_keys_follow_ddp_shards(path: str) -> None:
    checked = 0
    for rank in range(3):
        with DDBDataLoader(path, KEYS_SQL, "y", rank=rank, world_size=3, **ARGS) as loader:
            checked += check(loader)
    assert checked == 3 * 27  # 79 samples padded to 3 equal shares


@pytest.mark.multiprocess
def test_keys_follow_dataloader_workers(path: str) -> None:
    data = DDBIterableDataset(path, KEYS_SQL, "y", num_workers=2, **ARGS)
    assert check(DataLoader(data, batch_size=None, num_workers=2)) == 79


@pytest.mark.parametrize(
    ("pool", "fetch_bytes"),
    [(8, 8 * 2**20), (8, 0), (3, 0)],
    ids=["arena-whole-partitions-units", "arena-whole-partitions-per-partition", "small-pool-per-partition"],
)
def test_keys_follow_every_serving_path(tmp_path: Path, pool: int, fetch_bytes: int) -> None:
    """Many groups, a pool that copies whole partitions into the arena and serves a batch as one
    piece, fetch units or one query per partition: the keys still travel with their rows."""
    parts = [[5 + (g * 7 + p * 3) % 11 for p in range(1 + g % 3)] for g in range(12)]
    many = str(series_file(tmp_path / "many.duckdb", parts))
    args = {**ARGS, "group_pool_size": pool, "fetch_bytes": fetch_bytes}
    with DDBDataLoader(many, KEYS_SQL, "y", **args) as loader:
        assert check(loader) == loader.plan.samples > 0


def test_keys_come_from_the_cache_in_later_epochs(path: str) -> None:
    with DDBDataLoader(path, KEYS_SQL, "y", cache_bytes=2**20, **ARGS) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            assert check(loader) == 79


def test_keys_follow_a_resume(path: str) -> None:
    with DDBDataLoader(path, KEYS_SQL, "y", **ARGS) as first:
        iterator = iter(first)
        served = [next(iterator) for _ in range(4)]
        state = first.state_dict()
    with DDBDataLoader(path, KEYS_SQL, "y", **ARGS) as resumed:
        resumed.load_state_dict(state)
        assert check(served) + check(resumed) == 79


def test_keys_are_read_from_the_query_even_when_a_transform_drops_them(path: str) -> None:
    def only_features(table: Any) -> Any:
        return table.select(["f0", "y"])

    with DDBDataLoader(path, KEYS_SQL, "y", transform=only_features, **ARGS) as loader:
        assert check(loader) == 79


def test_an_unknown_key_column_is_refused_naming_the_argument_and_the_query_columns(path: str) -> None:
    columns = r"\['gid', 'part', 'rid', 'f0', 'y', 'symbol', 'ts', 'day'\]"
    with pytest.raises(
        ValueError,
        match=rf"key_col names 'sym' \(did you mean 'symbol'\?\), which is not a column of the query; "
        rf"columns: {columns}",
    ):
        DDBDataLoader(path, KEYS_SQL, "y", **{**ARGS, "key_col": ["rid", "sym"]})


def test_key_columns_are_left_out_of_a_derived_x(path: str) -> None:
    args = {**ARGS, "input_col": None, "key_col": ["symbol", "ts", "day", "rid"]}
    with DDBDataLoader(path, KEYS_SQL, "y", **args) as loader:
        # gid and part are group_col and repartition_col: keys, out of x as key_col's columns are
        assert loader.plan.layout.x_names == ("f0", "y")


@pytest.mark.filterwarnings("ignore:target_col .* stays in x:UserWarning")  # tests/test_columns.py checks it
def test_a_null_timestamp_key_is_refused_by_name() -> None:
    with duckdb.connect() as con:
        ts = "CASE WHEN i = 2 THEN NULL ELSE TIMESTAMP '2024-01-01' END AS ts"
        con.execute(f"CREATE TABLE t AS SELECT i * 1.0 AS y, {ts} FROM range(4) r(i)")
        with (
            DDBDataLoader(con, "SELECT * FROM t", "y", input_col="y", key_col="ts", batch_size=4) as loader,
            pytest.raises(ValueError, match=r"key_col 'ts' \(timestamp\[us\]\) holds NULL"),
        ):
            list(loader)


def test_integer_key_with_nulls_keeps_every_id_exact_in_every_batch() -> None:
    # float64 per partition merged ids above 2^53 into one value and crashed on a NULL beside one.
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE a AS SELECT i // 5 AS g, i::DOUBLE AS y, "
        "CASE WHEN i = 3 THEN NULL ELSE 9007199254740993 + i END AS account, "
        "(9007199254740993 + i)::DECIMAL(20, 0) AS amount FROM range(20) r(i)"
    )
    sql = "SELECT g, y, account, amount FROM a ORDER BY y"
    with DDBDataLoader(
        con, sql, "y", input_col=["y"], group_col="g", key_col=["account", "amount"], batch_size=3
    ) as loader:
        batches = list(loader)
    accounts = [a for _, _, keys in batches for a in keys["account"]]
    assert all(isinstance(keys["account"], list) for _, _, keys in batches)  # one form in every batch
    assert accounts == [None if i == 3 else 9007199254740993 + i for i in range(20)]
    amounts = [int(a) for _, _, keys in batches for a in keys["amount"]]
    assert amounts == [9007199254740993 + i for i in range(20)]
    con.close()
