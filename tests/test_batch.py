"""Batch counting and gathering samples into one batch."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from ddbloader._core.window import WindowGeometry
from ddbloader._io.block import Block
from ddbloader._pipeline.arena import Piece, Segment
from ddbloader._pipeline.batch import _window_copies, batch_count, gather, gather_on_device
from ddbloader._sql.layout import ColumnLayout


@settings(max_examples=60, deadline=None)
@given(samples=st.integers(0, 50), batch_size=st.integers(1, 12), drop_last=st.booleans())
def test_batch_count_matches_torch(samples: int, batch_size: int, drop_last: bool) -> None:
    dataset = TensorDataset(torch.arange(samples))
    torch_loader = DataLoader(dataset, batch_size=batch_size, drop_last=drop_last)
    assert batch_count(samples, batch_size, drop_last) == len(torch_loader) == len(list(torch_loader))


@pytest.mark.parametrize(
    ("samples", "batch_size", "drop_last", "count"),
    [
        (0, 3, False, 0),
        (0, 3, True, 0),
        (2, 3, False, 1),
        (2, 3, True, 0),
        (9, 3, True, 3),
        (10, 3, False, 4),
    ],
)
def test_batch_count_examples(samples: int, batch_size: int, drop_last: bool, count: int) -> None:
    assert batch_count(samples, batch_size, drop_last) == count


def layout(fx: int, fy: int, x_dtype: Any, y_dtype: Any) -> ColumnLayout:
    return ColumnLayout(
        tuple(f"x{j}" for j in range(fx)),
        tuple(f"y{j}" for j in range(fy)),
        np.dtype(x_dtype),
        np.dtype(y_dtype),
        frozenset(),
    )


def block(rows: int, fx: int, fy: int, x_dtype: Any, y_dtype: Any, base: int) -> Block:
    """x[r, j] = base + 10 r + j and y[r, j] = -(base + 10 r + j): every value names its row."""
    x = base + 10 * np.arange(rows)[:, None] + np.arange(fx)[None, :]
    y = base + 10 * np.arange(rows)[:, None] + np.arange(fy)[None, :]
    return Block(np.ascontiguousarray(x, dtype=x_dtype), np.ascontiguousarray(-y, dtype=y_dtype))


def piece(segment: Segment, starts: list[int]) -> Piece:
    return Piece(segment, np.array(starts, dtype=np.int64))


@pytest.mark.parametrize(
    ("x_dtype", "y_dtype"), [(np.float32, np.float32), (np.int32, np.float64), (np.int64, np.int64)]
)
def test_gather_windowed(x_dtype: Any, y_dtype: Any) -> None:
    geometry = WindowGeometry(x_window=3, y_window=2, stride=1, offset=4, windowed=True)
    first, second = block(9, 2, 1, x_dtype, y_dtype, 0), block(7, 2, 1, x_dtype, y_dtype, 1000)
    pieces = [
        piece(Segment(first), [3, 0]),
        piece(Segment(second), [1]),
    ]
    x, y = gather(pieces, geometry, layout(2, 1, x_dtype, y_dtype), pin=False)
    assert x.shape == (3, 3, 2)
    assert y.shape == (3, 2, 1)
    assert x.dtype == torch.from_numpy(np.empty(0, x_dtype)).dtype
    assert y.dtype == torch.from_numpy(np.empty(0, y_dtype)).dtype
    expected_x = [first.x[3:6], first.x[0:3], second.x[1:4]]
    expected_y = [first.y[7:9], first.y[4:6], second.y[5:7]]
    for k in range(3):
        assert np.array_equal(x[k].numpy(), expected_x[k])
        assert np.array_equal(y[k].numpy(), expected_y[k])
    assert x.is_contiguous()
    assert y.is_contiguous()
    assert not x.is_pinned()


def test_gather_unwindowed_with_offset() -> None:
    geometry = WindowGeometry(x_window=1, y_window=1, stride=1, offset=2, windowed=False)
    rows = block(6, 3, 2, np.float64, np.float64, 0)
    x, y = gather([piece(Segment(rows), [0, 3, 1])], geometry, layout(3, 2, "f8", "f8"), pin=False)
    assert x.shape == (3, 3)
    assert y.shape == (3, 2)
    assert np.array_equal(x.numpy(), rows.x[[0, 3, 1]])
    assert np.array_equal(y.numpy(), rows.y[[2, 5, 3]])


def test_gather_copies_out_of_the_segments() -> None:
    geometry = WindowGeometry(x_window=2, y_window=1, stride=1, offset=2, windowed=True)
    rows = block(5, 1, 1, np.float32, np.float32, 0)
    segment = Segment(rows)
    x, y = gather([piece(segment, [0, 1])], geometry, layout(1, 1, "f4", "f4"), pin=False)
    before = x.clone(), y.clone()
    rows.x[:] = -1
    rows.y[:] = -1
    assert torch.equal(x, before[0])
    assert torch.equal(y, before[1])
    assert segment.x_rows[0, 0].item() == -1  # the segment itself views the block


def test_gather_nothing() -> None:
    geometry = WindowGeometry(x_window=4, y_window=2, stride=1, offset=4, windowed=True)
    x, y = gather([], geometry, layout(3, 2, "f4", "f8"), pin=False)
    assert x.shape == (0, 4, 3)
    assert y.shape == (0, 2, 2)
    assert y.dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs an accelerator")
def test_gather_pins_when_asked() -> None:
    geometry = WindowGeometry(x_window=1, y_window=1, stride=1, offset=0, windowed=False)
    rows = block(3, 1, 1, np.float32, np.float32, 0)
    x, y = gather([piece(Segment(rows), [2])], geometry, layout(1, 1, "f4", "f4"), pin=True)
    assert x.is_pinned()
    assert y.is_pinned()
    assert x.item() == 20.0


_GATHER_DEVICES = [torch.device("cpu"), *([torch.device("cuda")] if torch.cuda.is_available() else [])]


def _rows_on(device: torch.device, segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
    return segment.x_rows.to(device), segment.y_rows.to(device)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    windowed=st.booleans(),
    x_window=st.integers(1, 5),
    y_window=st.integers(1, 3),
    offset=st.integers(0, 6),
    fx=st.integers(1, 4),
    fy=st.integers(1, 3),
    dtypes=st.sampled_from([(np.float64, np.float32), (np.int16, np.int64), (np.bool_, np.float64)]),
    views=st.booleans(),
)
def test_gather_and_gather_on_device_match_slicing_the_rows(
    data: st.DataObject,
    windowed: bool,
    x_window: int,
    y_window: int,
    offset: int,
    fx: int,
    fy: int,
    dtypes: tuple[Any, Any],
    views: bool,
) -> None:
    """Segments of blocks of their own, or (``views``) of views of one block, as a fetch unit's
    partitions are: those share a base, and their pieces gather as one run."""
    if not windowed:
        x_window = y_window = 1
    geometry = WindowGeometry(x_window, y_window, stride=1, offset=offset, windowed=windowed)
    span = max(x_window, offset + y_window)
    blocks = [
        block(span + data.draw(st.integers(0, 6)), fx, fy, *dtypes, base=1000 * base)
        for base in range(data.draw(st.integers(0, 3)))
    ]
    if views and blocks:
        whole = Block.concatenate([block(2, fx, fy, *dtypes, base=-1000), *blocks])
        bounds = list(itertools.accumulate((b.rows for b in blocks), initial=2))
        blocks = [whole.view(a, b) for a, b in itertools.pairwise(bounds)]
    pieces, want_x, want_y = [], [], []
    for rows in blocks:
        starts = data.draw(st.lists(st.integers(0, rows.rows - span), max_size=5))
        pieces.append(piece(Segment(rows), starts))
        for s in starts:
            want_x.append(rows.x[s : s + x_window] if windowed else rows.x[s])
            want_y.append(rows.y[s + offset : s + offset + y_window] if windowed else rows.y[s + offset])
    x_shape = (len(want_x), x_window, fx) if windowed else (len(want_x), fx)
    y_shape = (len(want_y), y_window, fy) if windowed else (len(want_y), fy)
    batches = [gather(pieces, geometry, layout(fx, fy, *dtypes), pin=False)]
    # the device path builds the windows where the rows are: on the CPU everywhere, and on an
    # accelerator (its start rows pinned and copied non_blocking) where one is present
    for device in _GATHER_DEVICES:
        batches.append(
            gather_on_device(
                pieces,
                geometry,
                layout(fx, fy, *dtypes),
                device,
                functools.partial(_rows_on, device),
                device.type != "cpu",
            )
        )
    for x, y in batches:
        assert x.shape == x_shape and y.shape == y_shape
        assert x.dtype == torch.from_numpy(np.empty(0, dtypes[0])).dtype
        if want_x:
            assert np.array_equal(x.cpu().numpy(), np.stack(want_x))
            assert np.array_equal(y.cpu().numpy(), np.stack(want_y))


def test_gather_one_run_reads_read_only_rows_and_returns_writable_tensors() -> None:
    """Rows nobody may write are gathered into a batch the caller may."""
    geometry = WindowGeometry(x_window=4, y_window=2, stride=1, offset=3, windowed=True)
    rows = block(12, 3, 2, np.float64, np.float32, 0)
    rows.x.setflags(write=False)
    rows.y.setflags(write=False)
    x, y = gather([piece(Segment(rows), [7, 0, 5, 5])], geometry, layout(3, 2, "f8", "f4"), pin=False)
    assert np.array_equal(x.numpy(), np.stack([rows.x[s : s + 4] for s in (7, 0, 5, 5)]))
    assert np.array_equal(y.numpy(), np.stack([rows.y[s + 3 : s + 5] for s in (7, 0, 5, 5)]))
    assert x.dtype == torch.float64 and y.dtype == torch.float32
    assert x.is_contiguous() and y.is_contiguous()
    x += 1  # the batch is the caller's: writable, and not the segment's memory
    assert rows.x[0, 0] == 0


def test_gather_one_run_of_rows_that_are_not_one_array() -> None:
    """x as every other column of a wider array (rows that are not one contiguous array)."""
    geometry = WindowGeometry(x_window=3, y_window=1, stride=1, offset=3, windowed=True)
    wide = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
    rows = Block(wide[:, ::2], np.ascontiguousarray(wide[:, :1]))
    assert not rows.x.flags.c_contiguous
    x, y = gather([piece(Segment(rows), [4, 1])], geometry, layout(3, 1, "i4", "i4"), pin=False)
    assert np.array_equal(x.numpy(), np.stack([rows.x[4:7], rows.x[1:4]]))
    assert np.array_equal(y.numpy(), np.stack([rows.y[7:8], rows.y[4:5]]))


def test_gather_one_run_with_tensor_columns() -> None:
    """x as one tensor column of shape (2, 2) per row: one run and several give the same batch."""
    geometry = WindowGeometry(x_window=2, y_window=1, stride=1, offset=2, windowed=True)
    rows = block(6, 4, 1, np.float32, np.float32, 0)
    tensor_layout = ColumnLayout(
        ("x",), ("y0",), np.dtype("f4"), np.dtype("f4"), frozenset(), shapes=(("x", (2, 2)),)
    )
    one_run = [piece(Segment(rows), [3, 0])]
    x, y = gather(one_run, geometry, tensor_layout, pin=False)
    assert x.shape == (2, 2, 2, 2)
    assert np.array_equal(x.numpy(), np.stack([rows.x[3:5], rows.x[0:2]]).reshape(2, 2, 2, 2))
    other = block(6, 4, 1, np.float32, np.float32, 0)
    two_runs = [*one_run, piece(Segment(other), [])]
    split_x, split_y = gather(two_runs, geometry, tensor_layout, pin=False)
    assert torch.equal(x, split_x) and torch.equal(y, split_y)


@pytest.mark.parametrize(("x_dtype", "y_dtype"), [(np.float32, np.float32), (np.int32, np.float64)])
def test_gather_of_one_base_copies_each_window_as_a_block(x_dtype: Any, y_dtype: Any) -> None:
    # two segments viewing one base (as an arena's do) are one run: its windows are copied as
    # blocks from a window view of the base, and are the rows a row-wise gather would give
    geometry = WindowGeometry(x_window=3, y_window=2, stride=1, offset=4, windowed=True)
    base = block(20, 2, 1, x_dtype, y_dtype, 0)
    first, second = Segment(base.view(0, 9)), Segment(base.view(9, 20))
    assert first.base is second.base
    x, y = gather(
        [piece(first, [3, 0]), piece(second, [1, 5])], geometry, layout(2, 1, x_dtype, y_dtype), pin=False
    )
    expected_x = [base.x[3:6], base.x[0:3], base.x[10:13], base.x[14:17]]
    expected_y = [base.y[7:9], base.y[4:6], base.y[14:16], base.y[18:20]]
    assert x.shape == (4, 3, 2) and y.shape == (4, 2, 1)
    for k in range(4):
        assert np.array_equal(x[k].numpy(), expected_x[k])
        assert np.array_equal(y[k].numpy(), expected_y[k])
    assert x.is_contiguous() and y.is_contiguous()
    with pytest.raises(IndexError):  # a window past the base's rows is refused, never clipped
        gather([piece(second, [9])], geometry, layout(2, 1, x_dtype, y_dtype), pin=False)


def test_window_copies_of_rows_that_are_not_row_major() -> None:
    rows = np.arange(60, dtype=np.float64).reshape(10, 6)[:, ::2]  # every other column: strided rows
    assert not rows.flags.c_contiguous
    copied = _window_copies(rows, 3, np.array([0, 7], np.int64))
    assert copied.tolist() == [rows[0:3].tolist(), rows[7:10].tolist()]
    with pytest.raises(IndexError):
        _window_copies(rows, 3, np.array([8], np.int64))
