"""The device path: pinning, the side-stream stage, window_on_device and collate on the device.

This machine has no CUDA device: every option runs on ``cpu`` (values) and ``meta`` (shapes and
host → device byte counts, the same code path a CUDA device takes, without data). The tests
marked ``needs_cuda`` run wherever a CUDA device is present (benchmarks/gpu_check.py covers
overlap and throughput there).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
import torch
from conftest import SERIES_SQL, make_series
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from ddbloader import DDBDataLoader, DDBIterableDataset
from ddbloader._pipeline.device import DeviceStage, Staged
from ddbloader.transforms import tensors

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
cpu_only = pytest.mark.skipif(CUDA, reason="checks the CPU-only behaviour")
SPLIT = {"group_col": "gid", "repartition_col": "part"}
Batch = tuple[torch.Tensor, torch.Tensor]


def load(con: duckdb.DuckDBPyConnection, **kwargs: Any) -> DDBDataLoader:
    arguments: dict[str, Any] = {"batch_size": 5, "window_size": 3, "input_col": ["f0", "f1"], "seed": 11}
    arguments.update(SPLIT)
    arguments.update(kwargs)
    return DDBDataLoader(con, SERIES_SQL, "y", **arguments)


def epoch(loader: DDBDataLoader) -> tuple[list[Batch], int]:
    """The epoch's batches (moved to the host, except meta tensors) and its host → device bytes."""
    with loader:
        iterator = iter(loader)
        out = [(x if x.is_meta else x.cpu(), y if y.is_meta else y.cpu()) for x, y in iterator]
        return out, iterator.host_to_device_bytes


def equal(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )


# --- CPU-only machine: every option degrades cleanly -----------------------------------------


@cpu_only
def test_pin_memory_auto_pins_nothing_and_copies_nothing_on_a_cpu_only_machine(
    series: duckdb.DuckDBPyConnection,
) -> None:
    loader = load(series)
    assert loader.config.pin_memory is False
    batches, moved = epoch(loader)
    assert batches and not any(x.is_pinned() or y.is_pinned() for x, y in batches)
    assert moved == 0


@cpu_only
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"pin_memory": True}, "pin_memory=True needs a CUDA device"), ({"device": "cuda"}, "needs CUDA")],
)
def test_cuda_options_without_cuda_are_refused_by_name(
    series: duckdb.DuckDBPyConnection, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        load(series, **kwargs)


def test_window_on_device_must_be_a_bool(series: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(TypeError, match="window_on_device must be a bool"):
        load(series, window_on_device="yes")


def test_the_stage_hands_cpu_batches_over_as_they_are() -> None:
    stage = DeviceStage(torch.device("cpu"), pin=False, window_on_device=False)
    x, y = torch.ones(2, 3), torch.zeros(2, 1)
    assert stage.deliver(Staged(x, y, None)) == (x, y)
    assert stage.bytes_to_device == 0


# --- window_on_device builds the same batches where the rows are -----------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:samples need")  # drawn groups shorter than a window yield no samples
@settings(max_examples=40, deadline=None)
@given(
    parts=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=3),
    window=st.one_of(st.none(), st.integers(1, 4)),
    stride=st.integers(1, 3),
    offset=st.integers(0, 3),
    batch_size=st.integers(1, 7),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_window_on_device_gives_the_same_batches(
    parts: list[list[int]],
    window: int | None,
    stride: int,
    offset: int,
    batch_size: int,
    shuffle: bool,
    seed: int,
) -> None:
    span = max(window, offset + 1) if window else 1  # window_size=w: x window w, y window 1
    assume(max(sum(sizes) for sizes in parts) >= span)  # else the loader refuses: no sample at all
    connection = duckdb.connect()
    make_series(connection, parts)
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "window_size": window,
        "window_stride": stride if window else None,
        "offset": offset if window else None,
        "shuffle": shuffle,
        "seed": seed,
    }
    host, _ = epoch(load(connection, **kwargs))
    built, moved = epoch(load(connection, window_on_device=True, **kwargs))
    assert equal(host, built)
    assert moved == 0  # the CPU is the device: nothing to ship
    connection.close()


def image_like(columns: dict[str, Any]) -> dict[str, Any]:
    """A [rows, 2, 3] column per row, built from f0, so every value names its row."""
    f0 = columns["f0"]
    grid = f0[:, None, None] + torch.arange(6, dtype=f0.dtype).reshape(1, 2, 3)
    return {"grid": grid, "y": columns["y"]}


def test_window_on_device_keeps_per_row_tensor_shapes(series: duckdb.DuckDBPyConnection) -> None:
    kwargs: dict[str, Any] = {"input_col": "grid", "transform": tensors(image_like), "window_size": 2}
    host, _ = epoch(load(series, **kwargs))
    built, _ = epoch(load(series, window_on_device=True, **kwargs))
    assert equal(host, built)
    x, _ = host[0]
    assert x.shape == (5, 2, 2, 3)
    assert torch.equal(x[:, 1] - x[:, 0], torch.ones(5, 2, 3, dtype=x.dtype))  # consecutive rows


# --- meta: the device code path, with shapes and byte counts ---------------------------------


@pytest.mark.parametrize("window_on_device", [False, True])
def test_meta_batches_have_the_host_shapes_and_dtypes(
    series: duckdb.DuckDBPyConnection, window_on_device: bool
) -> None:
    host, _ = epoch(load(series, dtype=torch.float32))
    meta, _ = epoch(load(series, dtype=torch.float32, device="meta", window_on_device=window_on_device))
    assert len(meta) == len(host)
    for (mx, my), (hx, hy) in zip(meta, host, strict=True):
        assert mx.is_meta and my.is_meta
        assert (mx.shape, my.shape, mx.dtype, my.dtype) == (hx.shape, hy.shape, hx.dtype, hy.dtype)


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=needs_cuda)])
def test_window_on_device_ships_each_row_about_once(con: duckdb.DuckDBPyConnection, device: str) -> None:
    make_series(con, [[200, 150], [120, 180, 90]])
    window = 6
    loader = load(con, window_size=window, device=device)
    plan, layout = loader.plan, loader.plan.layout
    _, copied = epoch(loader)
    _, shipped = epoch(load(con, window_size=window, device=device, window_on_device=True))
    # Copying batches moves every sample's x and y windows.
    x_bytes = window * layout.x_features * layout.x_dtype.itemsize
    y_bytes = layout.y_features * layout.y_dtype.itemsize
    assert copied == plan.samples * (x_bytes + y_bytes)
    # Shipping segments moves every row once, plus at most the edge rows of both neighbours.
    edges = 2 * (plan.geometry.span - 1) * plan.partitions
    assert plan.rows * layout.row_bytes <= shipped <= (plan.rows + edges) * layout.row_bytes
    assert shipped * 4 < copied  # x is 6 rows of 2 features, y 1 row of 1: ~4.3x fewer bytes


def test_collate_runs_where_the_batch_is_assembled(series: duckdb.DuckDBPyConnection) -> None:
    seen: list[torch.device] = []

    def halve(batch: Batch) -> Batch:
        seen.append(batch[0].device)
        return batch[0][:, ::2], batch[1]

    plain, _ = epoch(load(series, device="meta", collate=halve))
    built, _ = epoch(load(series, device="meta", collate=halve, window_on_device=True))
    assert set(seen[: len(plain)]) == {torch.device("cpu")}  # on the host, then shipped
    assert set(seen[len(plain) :]) == {torch.device("meta")}  # on the device
    assert all(x.shape[1] == 2 and x.is_meta for x, _ in plain + built)


# --- CUDA (run where a device is present; see also benchmarks/gpu_check.py) ------------------


@needs_cuda
def test_pinned_host_batches_are_pinned(series: duckdb.DuckDBPyConnection) -> None:
    batches, moved = epoch(load(series, pin_memory=True))
    assert all(x.is_pinned() and y.is_pinned() for x, y in batches)
    assert moved == 0


@needs_cuda
@pytest.mark.parametrize("window_on_device", [False, True])
def test_cuda_batches_survive_a_consumer_that_queues_slow_work(
    series: duckdb.DuckDBPyConnection, window_on_device: bool
) -> None:
    host, _ = epoch(load(series, shuffle=True))
    sums: list[torch.Tensor] = []
    with load(series, shuffle=True, device="cuda", window_on_device=window_on_device) as loader:
        for x, y in loader:
            assert x.is_cuda and y.is_cuda
            # The read queues behind a long kernel and the batch is dropped at once: without
            # record_stream the next batch's copy could reuse its memory before the read runs.
            torch.cuda._sleep(1_000_000)
            sums.append(torch.stack([x.sum(), y.sum()]))
    assert len(sums) == len(host)
    expected = torch.stack([torch.stack([x.sum(), y.sum()]) for x, y in host])
    torch.testing.assert_close(torch.stack(sums).cpu(), expected)


@pytest.mark.multiprocess
@needs_cuda
def test_workers_forked_from_a_process_that_pinned_memory_serve_each_sample_once(db_path: str) -> None:
    """A parent that used pinned memory leaves free pinned blocks in torch's host allocator, which
    forked workers inherit: workers that pinned their batches wrote them into the same memory."""
    arguments: dict[str, Any] = {"batch_size": 5, "window_size": 3, "input_col": ["f0", "f1"], "seed": 11}
    arguments.update(SPLIT, shuffle=True, key_col=["rid"])
    with DDBDataLoader(db_path, SERIES_SQL, "y", **arguments) as loader:
        assert loader.pin_memory  # what the workers would have used
        expected = sorted(int(rid) for _, _, keys in loader for rid in keys["rid"])
    for size in (2**k for k in range(6, 16)):  # free pinned blocks of every size a batch takes
        torch.empty(size, dtype=torch.uint8, pin_memory=True)
    data = DDBIterableDataset(db_path, SERIES_SQL, "y", num_workers=2, **arguments)
    served: list[int] = []
    for _ in range(3):
        workers = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork")
        for x, y, keys in workers:
            rids = keys["rid"].to(x.dtype)  # the sample's first y row; f0 = rid, y = rid + 0.5
            assert torch.equal(y[:, 0, 0] - 0.5, rids) and torch.equal(x[:, 0, 0] + 3, rids)
            served.extend(int(rid) for rid in keys["rid"])
        assert sorted(served) == expected
        served.clear()
