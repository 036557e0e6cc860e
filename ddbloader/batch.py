"""Gather samples into one batch: one allocation per tensor, one row gather per piece and tensor.

The output is allocated once, where it is going to be read: in pinned host memory (torch's
caching host allocator, so no ``cudaHostAlloc`` per batch) when it will be copied to a CUDA
device, or on the device itself when the windows are built there (``window_on_device``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .dtypes import torch_dtype
from .manager import Piece, Segment
from .source import ColumnLayout
from .window import WindowGeometry, window_view

__all__ = ["RowSource", "batch_count", "gather"]

#: A segment's ``(x_rows, y_rows)`` (``[rows, F]`` each), wherever they live.
RowSource = Callable[[Segment], tuple[torch.Tensor, torch.Tensor]]


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``samples`` samples, as torch's DataLoader counts them."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _host_rows(segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
    return segment.x_rows, segment.y_rows


def _take_windows(rows: torch.Tensor, starts: np.ndarray[Any, Any], length: int, out: torch.Tensor) -> None:
    """``out[k] = rows[starts[k] : starts[k] + length]`` (``length`` 0: ``rows[starts[k]]``), on the host.

    One ``numpy.take`` over row numbers: it copies row by row in the calling thread at memory
    speed and releases the GIL, where torch's ``index_select`` over a window view measured half
    as fast per thread and splits large copies across OpenMP workers that compete with the
    engine's threads and the training loop. ``mode="clip"`` because the rows are in range by
    construction, and ``"raise"`` would buffer the whole result before writing ``out``.
    """
    index = starts if length == 0 else (starts[:, None] + np.arange(length)).reshape(-1)
    target = out.numpy().reshape(len(index), rows.shape[1])
    np.take(rows.numpy(), index, axis=0, out=target, mode="clip")


def _select_windows(rows: torch.Tensor, starts: torch.Tensor, length: int, out: torch.Tensor) -> None:
    """:func:`_take_windows` on an accelerator: one ``index_select`` over a window view."""
    windows = rows if length == 0 else window_view(rows, length)
    torch.index_select(windows, 0, starts, out=out)


def gather(
    pieces: Sequence[Piece],
    geometry: WindowGeometry,
    layout: ColumnLayout,
    pin: bool,
    *,
    device: torch.device | None = None,
    rows: RowSource = _host_rows,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble ``pieces`` into ``(x, y)``.

    Shapes: x ``[B, x_window, *x_shape]`` and y ``[B, y_window, *y_shape]`` with windows, else
    ``[B, *x_shape]`` and ``[B, *y_shape]`` (``x_shape`` is ``(Fx,)`` unless x is one tensor
    column, see :class:`~ddbloader.source.ColumnLayout`). The tensors are freshly allocated on
    ``device`` (default: the host; pinned when ``pin``), so the caller owns them. ``rows`` gives
    each segment's rows; they must live on ``device``.
    """
    size = sum(len(p.starts) for p in pieces)
    x_lead: tuple[int, ...] = (size, geometry.x_window) if geometry.windowed else (size,)
    y_lead: tuple[int, ...] = (size, geometry.y_window) if geometry.windowed else (size,)
    on_host = device is None or device.type == "cpu"
    x = torch.empty(
        (*x_lead, layout.x_features),
        dtype=torch_dtype(layout.x_dtype),
        device=device,
        pin_memory=pin and on_host,
    )
    y = torch.empty(
        (*y_lead, layout.y_features),
        dtype=torch_dtype(layout.y_dtype),
        device=device,
        pin_memory=pin and on_host,
    )
    x_length = geometry.x_window if geometry.windowed else 0
    y_length = geometry.y_window if geometry.windowed else 0
    filled = 0
    for piece in pieces:
        x_rows, y_rows = rows(piece.segment)
        count = len(piece.starts)
        if count == 0:
            continue
        x_out, y_out = x[filled : filled + count], y[filled : filled + count]
        if on_host:
            _take_windows(x_rows, piece.starts, x_length, x_out)
            _take_windows(y_rows, piece.starts + geometry.offset, y_length, y_out)
        else:
            starts = torch.from_numpy(piece.starts).to(x_rows.device)
            _select_windows(x_rows, starts, x_length, x_out)
            _select_windows(y_rows, starts + geometry.offset, y_length, y_out)
        filled += count
    return x.view(*x_lead, *layout.x_shape), y.view(*y_lead, *layout.y_shape)
