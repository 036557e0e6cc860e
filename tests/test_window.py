"""Window arithmetic and strided window views: exact small examples and a brute-force oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddbloader._core.window import WindowGeometry, window_view


def geometry(x_window: int, y_window: int, stride: int = 1, offset: int | None = None) -> WindowGeometry:
    return WindowGeometry(x_window, y_window, stride, x_window if offset is None else offset, True)


@pytest.mark.parametrize(
    ("shape", "span"),
    [
        (geometry(3, 1), 4),  # y is the row after x
        (geometry(3, 2, offset=0), 3),  # y inside x: x is the longer reach
        (geometry(4, 2, offset=1), 4),
        (geometry(2, 3, offset=5), 8),  # a gap between x and y still counts
        (WindowGeometry(1, 1, 1, 0, False), 1),  # unwindowed: a sample is one row
        (WindowGeometry(1, 1, 1, 2, False), 3),
    ],
)
def test_span(shape: WindowGeometry, span: int) -> None:
    assert shape.span == span


@pytest.mark.parametrize(
    ("shape", "rows", "count"),
    [
        (geometry(3, 1), 10, 7),  # starts 0..6: 6 + 4 = 10
        (geometry(3, 1), 4, 1),  # exactly one span
        (geometry(3, 1), 3, 0),  # one row short
        (geometry(3, 1), 0, 0),
        (geometry(3, 1, stride=2), 10, 4),  # starts 0, 2, 4, 6
        (geometry(3, 1, stride=2), 9, 3),  # start 6 would need row 9
        (geometry(3, 1, stride=3), 10, 3),  # starts 0, 3, 6
        (geometry(2, 3, offset=5), 8, 1),
        (geometry(2, 3, offset=5), 12, 5),
        (geometry(1, 1, stride=7), 1, 0),  # span 2
        (geometry(1, 1, stride=7), 9, 2),  # starts 0, 7
        (WindowGeometry(1, 1, 1, 0, False), 5, 5),
        (WindowGeometry(1, 1, 2, 0, False), 5, 3),
        (WindowGeometry(1, 1, 1, 3, False), 5, 2),
    ],
)
def test_sample_count(shape: WindowGeometry, rows: int, count: int) -> None:
    assert shape.sample_count(rows) == count


def test_samples_completed_by_examples() -> None:
    # 10 rows cut [0, 4) [4, 7) [7, 10); span 3, stride 1: samples start at 0..7.
    shape = geometry(2, 1)
    assert shape.span == 3
    total = shape.sample_count(10)
    assert total == 8
    # The middle partition alone completes only the sample wholly inside it.
    assert shape.samples_completed_by(4, 7, 4, 7, total) == range(4, 5)
    # With the left neighbour's two edge rows, the two samples straddling row 4 join it.
    assert shape.samples_completed_by(4, 7, 2, 7, total) == range(2, 5)
    # With both neighbours' edges, every sample that touches rows 4..6.
    assert shape.samples_completed_by(4, 7, 2, 9, total) == range(2, 7)
    # The last partition loaded first: only sample 7 (rows 7..9).
    assert shape.samples_completed_by(7, 10, 7, 10, total) == range(7, 8)
    # Loaded after the middle one (its two edge rows at hand): samples 5..7.
    assert shape.samples_completed_by(7, 10, 5, 10, total) == range(5, 8)
    # A partition shorter than the span completes nothing alone.
    short = geometry(3, 2)
    assert short.samples_completed_by(4, 6, 4, 6, short.sample_count(20)) == range(4, 4)


def test_samples_completed_by_stride_skips_untouched_rows() -> None:
    # span 2, stride 4: samples start at 0, 4, 8 and touch rows {0,1}, {4,5}, {8,9}.
    shape = geometry(1, 1, stride=4)
    total = shape.sample_count(10)
    assert total == 3
    assert shape.samples_completed_by(2, 4, 2, 4, total) == range(1, 1)  # rows 2, 3 feed no sample
    assert shape.samples_completed_by(5, 8, 4, 10, total) == range(1, 2)  # only sample 1 touches row 5
    assert shape.samples_completed_by(0, 10, 0, 10, total) == range(0, 3)


@settings(max_examples=60, deadline=None)
@given(
    x_window=st.integers(1, 5),
    y_window=st.integers(1, 4),
    stride=st.integers(1, 5),
    offset=st.integers(0, 6),
    rows=st.integers(0, 40),
    data=st.data(),
)
def test_samples_completed_by_matches_definition(
    x_window: int, y_window: int, stride: int, offset: int, rows: int, data: st.DataObject
) -> None:
    shape = geometry(x_window, y_window, stride, offset)
    total = shape.sample_count(rows)
    first = data.draw(st.integers(0, rows))
    stop = data.draw(st.integers(first, rows))
    lo = data.draw(st.integers(max(0, first - shape.span), first))
    hi = data.draw(st.integers(stop, min(rows, stop + shape.span)))
    expected = [
        i
        for i in range(total)
        if i * stride <= stop - 1
        and i * stride + shape.span - 1 >= first
        and i * stride >= lo
        and i * stride + shape.span <= hi
    ]
    got = shape.samples_completed_by(first, stop, lo, hi, total)
    assert list(got) == expected
    assert got.step == 1


def test_window_view_shape_values_and_memory() -> None:
    block = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    view = window_view(block, 3)
    assert view.shape == (4, 3, 2)
    for k in range(4):
        assert torch.equal(view[k], block[k : k + 3])
    assert view[2, 0, 1].item() == 5.0
    assert view.data_ptr() == block.data_ptr()
    assert view.untyped_storage().data_ptr() == block.untyped_storage().data_ptr()
    block[4, 1] = -1.0  # one row is seen by every window that holds it
    assert view[2, 2, 1].item() == -1.0
    assert view[3, 1, 1].item() == -1.0
    assert view[1, 2, 0].item() == block[3, 0].item()


def test_window_view_of_a_row_slice_keeps_its_offset() -> None:
    base = torch.arange(20, dtype=torch.int32).reshape(10, 2)
    block = base[3:8]
    view = window_view(block, 2)
    assert view.shape == (4, 2, 2)
    assert torch.equal(view[0], base[3:5])
    assert torch.equal(view[3], base[6:8])
    assert view.data_ptr() == block.data_ptr()


@pytest.mark.parametrize(("rows", "length", "count"), [(3, 3, 1), (2, 3, 0), (0, 1, 0), (5, 1, 5)])
def test_window_view_edge_lengths(rows: int, length: int, count: int) -> None:
    block = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    view = window_view(block, length)
    assert view.shape == (count, length, 3)
    if count:
        assert torch.equal(view[-1], block[rows - length :])
