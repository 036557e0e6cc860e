"""Window arithmetic and strided window views.

Rows of a group are numbered ``0 .. n-1`` across its partitions in repartition order. Sample
``i`` starts at row ``s = i * stride``; x is rows ``[s, s + x_window)`` and y is rows
``[s + offset, s + offset + y_window)``. A sample exists only if every row it touches exists, so
it needs ``span = max(x_window, offset + y_window)`` rows from ``s``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .config import LoaderConfig

__all__ = ["WindowGeometry", "window_view"]


@dataclass(frozen=True)
class WindowGeometry:
    """Window shape of a loader. Invariants as in :class:`~ddbloader._core.config.LoaderConfig`."""

    x_window: int
    y_window: int
    stride: int
    offset: int
    windowed: bool

    @classmethod
    def from_config(cls, config: LoaderConfig) -> WindowGeometry:
        return cls(config.x_window, config.y_window, config.stride, config.offset, config.windowed)

    @functools.cached_property  # read several times per step, so per small group
    def span(self) -> int:
        return max(self.x_window, self.offset + self.y_window)

    def sample_count(self, rows: int) -> int:
        """Samples of a group of ``rows`` rows."""
        if rows < self.span:
            return 0
        return (rows - self.span) // self.stride + 1

    def samples_completed_by(self, first: int, stop: int, lo: int, hi: int, total: int) -> range:
        """Samples that touch rows ``[first, stop)`` and lie wholly inside rows ``[lo, hi)``.

        These are the samples a newly loaded partition ``[first, stop)`` completes when rows
        ``[lo, hi)`` (itself plus the edge rows of loaded neighbours) are at hand. The result is
        a contiguous range of sample indices below ``total``.
        """
        span = self.span
        begin = max(lo, first - span + 1)
        i_first = -(-begin // self.stride)
        i_last = min((stop - 1) // self.stride, (hi - span) // self.stride if hi >= span else -1, total - 1)
        return range(i_first, max(i_first, i_last + 1))


def window_view(block: torch.Tensor, length: int) -> torch.Tensor:
    """All windows of ``length`` consecutive rows of a row-major ``[rows, F]`` block.

    Returns a ``[rows - length + 1, length, F]`` view sharing the block's memory; window ``k`` is
    rows ``[k, k + length)`` (one contiguous run of memory when the block is contiguous).
    """
    rows, features = block.shape
    row_stride, column_stride = block.stride()
    count = max(rows - length + 1, 0)
    return block.as_strided((count, length, features), (row_stride, row_stride, column_stride))
