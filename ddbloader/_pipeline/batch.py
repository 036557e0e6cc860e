"""Gather samples into one batch: one allocation per tensor, one row gather per run of pieces and tensor.

The output is allocated once, where it is going to be read: in pinned host memory (torch's
caching host allocator, so no ``cudaHostAlloc`` per batch) when it will be copied to a CUDA
device, or on the device itself when the windows are built there (``window_on_device``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .._core.dtypes import torch_dtype
from .._core.window import WindowGeometry, window_view
from .._io.block import Block
from .._io.key_arrays import KeyArrays, Keys
from .._sql.layout import ColumnLayout
from .arena import Piece, Segment

__all__ = ["RowSource", "batch_count", "gather", "gather_keys", "gather_on_device"]

#: A segment's ``(x_rows, y_rows)`` (``[rows, F]`` each) on the device the batch is built on.
RowSource = Callable[[Segment], tuple[torch.Tensor, torch.Tensor]]


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``samples`` samples, as torch's DataLoader counts them."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


_NO_ROWS = np.empty(0, np.int64)


@functools.cache
def _row_steps(length: int) -> np.ndarray[Any, Any]:
    steps = np.arange(length, dtype=np.int64)
    steps.setflags(write=False)
    return steps


def _row_numbers(starts: np.ndarray[Any, Any], length: int) -> np.ndarray[Any, Any]:
    """The rows of windows of ``length`` rows that start at ``starts``, window after window."""
    if length == 1:
        return starts
    rows: np.ndarray[Any, Any] = starts[:, None] + _row_steps(length)
    return rows.reshape(-1)


def _windows(geometry: WindowGeometry) -> tuple[int, int]:
    """Rows per sample of x and y: the window lengths, or 1 and 1 unwindowed."""
    return (geometry.x_window, geometry.y_window) if geometry.windowed else (1, 1)


def _batch_shapes(
    size: int, geometry: WindowGeometry, layout: ColumnLayout
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of a batch's x and y (see :func:`gather`)."""
    if geometry.windowed:
        return (size, geometry.x_window, *layout.x_shape), (size, geometry.y_window, *layout.y_shape)
    return (size, *layout.x_shape), (size, *layout.y_shape)


def _host_buffer(
    shape: tuple[int, ...], dtype: np.dtype[Any], pin: bool
) -> tuple[torch.Tensor, np.ndarray[Any, Any]]:
    """An uninitialised host tensor, pinned when ``pin``, and a numpy array over the same memory.

    Unpinned, numpy allocates and torch wraps. Pinned, torch allocates and the tensor itself must
    reach the caller: the caching host allocator finds its block through the tensor's storage to
    record the stream of a ``non_blocking`` copy and keep the block until that copy is done; a
    ``torch.from_numpy`` wrapper would hide the block, which could then be reused mid-copy.
    """
    if pin:
        tensor = torch.empty(shape, dtype=torch_dtype(dtype), pin_memory=True)
        return tensor, tensor.numpy()
    array = np.empty(shape, dtype=dtype)
    return torch.from_numpy(array), array


def gather(
    pieces: Sequence[Piece], geometry: WindowGeometry, layout: ColumnLayout, pin: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble ``pieces`` into ``(x, y)`` on the host, pinned when ``pin``.

    Shapes: x ``[B, x_window, *x_shape]`` and y ``[B, y_window, *y_shape]`` with windows, else
    ``[B, *x_shape]`` and ``[B, *y_shape]`` (``x_shape`` is ``(Fx,)`` unless x is one tensor
    column, see :class:`~ddbloader._sql.layout.ColumnLayout`). The tensors are freshly allocated, so
    the caller owns them.

    Consecutive pieces whose segments share a base (an :class:`~ddbloader._pipeline.arena.Arena`) are
    one run, and each run costs one ``ndarray.take`` over row numbers per tensor (a batch drawn
    from many groups is then one take, not one per group): it copies in the calling
    thread at memory speed with the GIL released, where torch's ``index_select`` over a window
    view measured half as fast per thread and splits large copies across OpenMP workers that
    compete with the engine's threads and the training loop. ``mode="clip"`` because the rows
    are in range by construction, and ``"raise"`` would buffer the result before writing ``out``.
    The copies write through numpy views (a torch call costs microseconds of dispatch, which at
    thousands of batches per second is a visible share of the assembler's time). A windowed batch
    of one run, unpinned, is instead one indexing of a view of windows per tensor (see
    :func:`_window_copies`), whose result is the batch: a block copy per window, about twice a
    row-wise take's speed when the rows are spread over many groups.
    """
    size = sum(len(p.starts) for p in pieces)
    x_window, y_window = _windows(geometry)
    x_shape, y_shape = _batch_shapes(size, geometry, layout)
    offset = geometry.offset
    runs = list(_runs(pieces))
    if len(runs) == 1 and not pin and geometry.windowed:
        base, starts = runs[0]
        if base.x.dtype == layout.x_dtype and base.y.dtype == layout.y_dtype:
            x_array = _window_copies(base.x, x_window, starts)
            y_array = _window_copies(base.y, y_window, starts + offset)
            return torch.from_numpy(x_array.reshape(x_shape)), torch.from_numpy(y_array.reshape(y_shape))
    x, x_array = _host_buffer(x_shape, layout.x_dtype, pin)
    y, y_array = _host_buffer(y_shape, layout.y_dtype, pin)
    x_rows = x_array.reshape(size * x_window, layout.x_features)
    y_rows = y_array.reshape(size * y_window, layout.y_features)
    filled = 0
    for base, starts in runs:
        stop = filled + len(starts)
        base.x.take(_row_numbers(starts, x_window), 0, x_rows[filled * x_window : stop * x_window], "clip")
        base.y.take(
            _row_numbers(starts + offset, y_window), 0, y_rows[filled * y_window : stop * y_window], "clip"
        )
        filled = stop
    return x, y


def _window_copies(
    rows: np.ndarray[Any, Any], length: int, starts: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """The windows of ``length`` rows of ``rows`` (``[R, F]``) that start at ``starts``, copied into
    a fresh ``[len(starts), length, F]`` array by one indexing of a view whose items are the
    windows: about twice a row-wise take's speed when the rows are spread over many groups; numpy
    checks the bounds (a window past the rows raises) and releases the GIL for the copy of an
    index of over 500 windows.

    Row-major rows: an item is a window's bytes (one ``memcpy`` each); otherwise a window view.
    One ``void`` item per window, not a row of a ``[windows, bytes]`` byte view, whose index
    releases the GIL for any count but copies a subarray per window at a cost per item (1.4x an
    epoch's CPU over windows of 16 x 8 float32; the loop benchmark felt no difference)."""
    count, features = rows.shape
    windows = max(count - length + 1, 0)
    if rows.flags.c_contiguous and windows and features:
        item = np.dtype((np.void, length * features * rows.itemsize))
        blocks = np.ndarray((windows,), item, rows, 0, (rows.strides[0],))
        copied: np.ndarray[Any, Any] = blocks[starts].view(rows.dtype).reshape(len(starts), length, features)
        return copied
    view = np.lib.stride_tricks.as_strided(
        rows,
        (windows, length, features),
        (rows.strides[0], rows.strides[0], rows.strides[1]),
        writeable=False,
    )
    copies: np.ndarray[Any, Any] = view[starts]
    return copies


def _runs(pieces: Sequence[Piece]) -> Iterator[tuple[Block, np.ndarray[Any, Any]]]:
    """Consecutive pieces whose segments share a base (an arena, or the conversion of a fetch
    unit whose partitions they are), as one run of start rows in it."""
    run: list[np.ndarray[Any, Any]] = []
    base: Block | None = None
    for piece in pieces:
        segment = piece.segment
        if segment.base is not base:
            if run:
                assert base is not None
                yield base, run[0] if len(run) == 1 else np.concatenate(run)
            base, run = segment.base, []
        run.append(piece.starts + segment.first if segment.first else piece.starts)
    if run:
        assert base is not None
        yield base, run[0] if len(run) == 1 else np.concatenate(run)


def gather_on_device(
    pieces: Sequence[Piece],
    geometry: WindowGeometry,
    layout: ColumnLayout,
    device: torch.device,
    rows: RowSource,
    pin: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gather` on ``device``, from each segment's rows there (``rows``): one
    ``index_select`` over a window view per piece and tensor.

    The batch's start rows travel in one copy (pinned and ``non_blocking`` when ``pin``): a
    pageable copy waits for the stream's queued work, once per copy."""
    size = sum(len(p.starts) for p in pieces)
    x_window, y_window = _windows(geometry)
    x_shape, y_shape = _batch_shapes(size, geometry, layout)
    x = torch.empty((size, x_window, layout.x_features), dtype=torch_dtype(layout.x_dtype), device=device)
    y = torch.empty((size, y_window, layout.y_features), dtype=torch_dtype(layout.y_dtype), device=device)
    starts = pieces[0].starts if len(pieces) == 1 else np.concatenate([_NO_ROWS, *(p.starts for p in pieces)])
    host = torch.from_numpy(starts)
    x_starts = (host.pin_memory() if pin else host).to(device, non_blocking=pin)
    y_starts = x_starts + geometry.offset if geometry.offset else x_starts
    filled = 0
    for piece in pieces:
        x_rows, y_rows = rows(piece.segment)
        stop = filled + len(piece.starts)
        torch.index_select(window_view(x_rows, x_window), 0, x_starts[filled:stop], out=x[filled:stop])
        torch.index_select(window_view(y_rows, y_window), 0, y_starts[filled:stop], out=y[filled:stop])
        filled = stop
    return x.view(x_shape), y.view(y_shape)


def _keys_of(piece: Piece) -> KeyArrays:
    keys = piece.segment.block.keys
    if keys is None:
        raise RuntimeError("internal error: a block without keys reached a batch that needs them")
    return keys


def gather_keys(pieces: Sequence[Piece], names: Sequence[str], offset: int) -> Keys:
    """The keys of a batch's samples: each sample's first y row (``start + offset``), in batch order."""
    keys: Keys = {}
    for name in names:
        parts = [_keys_of(p)[name].take(p.starts + offset) for p in pieces]
        values = np.concatenate(parts) if len(parts) != 1 else parts[0]
        keys[name] = values.tolist() if values.dtype == object else torch.from_numpy(values)
    return keys
