"""Gather samples into one batch: one allocation per tensor, one index_select per piece.

The output is allocated once, where it is going to be read: in pinned host memory (torch's
caching host allocator, so no ``cudaHostAlloc`` per batch) when it will be copied to a CUDA
device, or on the device itself when the windows are built there (``window_on_device``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .dtypes import torch_dtype
from .manager import Piece, Segment
from .source import ColumnLayout
from .window import WindowGeometry

__all__ = ["WindowSource", "batch_count", "gather"]

#: A segment's ``(x_windows, y_windows)``, wherever they live (see :class:`~ddbloader.manager.Segment`).
WindowSource = Callable[[Segment], tuple[torch.Tensor, torch.Tensor]]


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``samples`` samples, as torch's DataLoader counts them."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _host_windows(segment: Segment) -> tuple[torch.Tensor, torch.Tensor]:
    return segment.x_windows, segment.y_windows


#: torch runs a kernel below this many elements in the calling thread (at::internal::GRAIN_SIZE).
_SERIAL_ELEMENTS = 32768


def _select(windows: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    """``out[:] = windows[index]``, on the host in chunks small enough to run serially.

    A whole batch is big enough for torch to split the copy across its OpenMP threads; on a few
    cores shared with the engine's threads and the training loop, the assembler then spends most
    of its time waiting for those workers (measured: ~5x slower under load). Serial chunks copy
    at memory speed in this thread alone and leave the other cores to the engine and the model.
    """
    if windows.device.type != "cpu":
        torch.index_select(windows, 0, index, out=out)
        return
    per_window = max(1, out[0].numel()) if len(out) else 1
    step = max(1, _SERIAL_ELEMENTS // per_window)
    for first in range(0, len(index), step):
        torch.index_select(windows, 0, index[first : first + step], out=out[first : first + step])


def gather(
    pieces: Sequence[Piece],
    geometry: WindowGeometry,
    layout: ColumnLayout,
    pin: bool,
    *,
    device: torch.device | None = None,
    windows: WindowSource = _host_windows,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble ``pieces`` into ``(x, y)``.

    Shapes: x ``[B, x_window, *x_shape]`` and y ``[B, y_window, *y_shape]`` with windows, else
    ``[B, *x_shape]`` and ``[B, *y_shape]`` (``x_shape`` is ``(Fx,)`` unless x is one tensor
    column, see :class:`~ddbloader.source.ColumnLayout`). The tensors are freshly allocated on
    ``device`` (default: the host; pinned when ``pin``), so the caller owns them. ``windows``
    gives each segment's window views; they must live on ``device``.
    """
    size = sum(len(p.starts) for p in pieces)
    x_rows: tuple[int, ...] = (size, geometry.x_window) if geometry.windowed else (size,)
    y_rows: tuple[int, ...] = (size, geometry.y_window) if geometry.windowed else (size,)
    on_host = device is None or device.type == "cpu"
    x = torch.empty(
        (*x_rows, layout.x_features),
        dtype=torch_dtype(layout.x_dtype),
        device=device,
        pin_memory=pin and on_host,
    )
    y = torch.empty(
        (*y_rows, layout.y_features),
        dtype=torch_dtype(layout.y_dtype),
        device=device,
        pin_memory=pin and on_host,
    )
    filled = 0
    for piece in pieces:
        x_windows, y_windows = windows(piece.segment)
        starts = torch.from_numpy(piece.starts).to(x_windows.device)
        count = len(starts)
        _select(x_windows, starts, x[filled : filled + count])
        _select(y_windows, starts + geometry.offset, y[filled : filled + count])
        filled += count
    return x.view(*x_rows, *layout.x_shape), y.view(*y_rows, *layout.y_shape)
