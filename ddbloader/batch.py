"""Gather samples into one batch: one allocation per tensor, one index_select per piece."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .manager import Piece
from .source import ColumnLayout
from .window import WindowGeometry

__all__ = ["batch_count", "gather"]


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``samples`` samples, as torch's DataLoader counts them."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def gather(
    pieces: Sequence[Piece], geometry: WindowGeometry, layout: ColumnLayout, pin: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble ``pieces`` into ``(x, y)``.

    Shapes: x ``[B, x_window, Fx]`` and y ``[B, y_window, Fy]`` with windows, else ``[B, Fx]`` and
    ``[B, Fy]``. The tensors are freshly allocated (pinned when ``pin``), so the caller owns them.
    """
    size = sum(len(p.starts) for p in pieces)
    x_shape: tuple[int, ...] = (size, len(layout.x_names))
    y_shape: tuple[int, ...] = (size, len(layout.y_names))
    if geometry.windowed:
        x_shape = (size, geometry.x_window, len(layout.x_names))
        y_shape = (size, geometry.y_window, len(layout.y_names))
    x = torch.empty(x_shape, dtype=_torch_dtype(layout.x_dtype), pin_memory=pin)
    y = torch.empty(y_shape, dtype=_torch_dtype(layout.y_dtype), pin_memory=pin)
    filled = 0
    for piece in pieces:
        starts = torch.from_numpy(piece.starts)
        count = len(starts)
        torch.index_select(piece.segment.x_windows, 0, starts, out=x[filled : filled + count])
        torch.index_select(
            piece.segment.y_windows, 0, starts + geometry.offset, out=y[filled : filled + count]
        )
        filled += count
    return x, y
