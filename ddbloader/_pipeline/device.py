"""Host → device: batches reach the device on a side CUDA stream, ahead of the consumer.

CCV prefetches on two stream contexts in ping-pong; Caffe's SyncedMemory pushes host data to the
GPU asynchronously on a stream. Here the assembler thread (see :mod:`ddbloader._io.threads`) builds
each batch and, for a CUDA device, enqueues its copy on a side stream owned by this stage,
recording an event after it. The consumer, when it takes the batch, makes its own current stream
wait on that event (a device-side wait: the host does not block) and calls ``record_stream``, so
the caching allocator keeps the batch's memory until the consumer's queued work is done. The copy
of the next batches thus overlaps the current training step, up to ``prefetch_batch`` ahead.

Two ways to reach the device:

* default: gather on the host into pinned buffers (torch's caching host allocator, which also
  keeps a pinned buffer alive until its asynchronous copy is done), then copy the batch
  ``non_blocking``. Every row travels ``window_size`` times, once per window that holds it.
* ``window_on_device=True``: ship each loaded segment's rows (a partition plus the edge rows of
  its neighbours) to the device once, and build the windows there with strided views and an
  ``index_select``: host → device bytes drop by about the window length.

On a CPU device nothing is copied and no stream exists; ``meta`` runs the same code path with
tensors that have shapes but no data (the byte count is what a real device would receive).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._core.config import Collate
from .._core.errors import add_note, step_name
from .._core.window import WindowGeometry
from .._io.key_arrays import Keys
from .._sql.layout import ColumnLayout
from .arena import Piece, Segment
from .batch import gather, gather_keys, gather_on_device

__all__ = ["Batch", "DeviceStage", "Staged"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Staged:
    """A batch on its way to the consumer: ``ready`` is recorded on the side stream after its
    last device operation (None when there is no stream to wait on)."""

    x: torch.Tensor
    y: torch.Tensor
    ready: torch.cuda.Event | None
    keys: Keys | None = None


class DeviceStage:
    """Assemble batches (in the assembler thread) and hand them over (in the consumer thread).

    ``assemble`` is called from one thread at a time and ``deliver`` from the consumer; the only
    state they share is each :class:`Staged` batch, passed through the prefetch queue.
    ``bytes_to_device`` counts the host → device bytes enqueued so far (0 on a CPU device).

    Args:
        device: where batches are delivered.
        pin: assemble host batches in pinned memory (and pin what is shipped to the device).
        window_on_device: build windows where the rows are, from segments shipped once.
        collate: applied to each assembled ``(x, y)`` batch, before the copy to the device (or on
            the device, with ``window_on_device``); it must return an ``(x, y)`` pair of tensors.
    """

    def __init__(
        self, device: torch.device, pin: bool, window_on_device: bool, collate: Collate | None = None
    ) -> None:
        self.device = device
        self.pin = pin
        self.window_on_device = window_on_device
        self.collate = collate
        self.bytes_to_device = 0
        self._batches = 0
        self._stream = (
            torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            if device.type == "cuda"
            else None
        )
        self._resident: weakref.WeakKeyDictionary[Segment, Batch] = weakref.WeakKeyDictionary()
        # made once: a context manager built per batch is a visible share of the assembler's time
        self._on_side_stream: contextlib.AbstractContextManager[Any] = (
            torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        )
        # on the host the rows are where the windows are built already
        self.gathers_on_device = window_on_device and device.type != "cpu"
        # a batch for the CPU, collated as it is: no stream, no copy, no collate call to make
        self._on_host = device.type == "cpu" and collate is None

    def assemble(self, pieces: Sequence[Piece], geometry: WindowGeometry, layout: ColumnLayout) -> Staged:
        """Gather ``pieces`` into a batch and start it towards the device."""
        self._batches += 1
        ready = None
        if self._on_host:
            x, y = gather(pieces, geometry, layout, self.pin)
        else:
            with self._on_side_stream:
                if self.gathers_on_device:
                    x, y = gather_on_device(
                        pieces, geometry, layout, self.device, self._resident_rows, self.pin
                    )
                    x, y = self._collate(x, y)
                else:
                    x, y = self._collate(*gather(pieces, geometry, layout, self.pin))
                    x, y = self._ship(x), self._ship(y)
                if self._stream is not None:
                    ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    ready.record(self._stream)
        keys = gather_keys(pieces, layout.key_names, geometry.offset) if layout.key_names else None
        return Staged(x, y, ready, keys)

    def deliver(self, staged: Staged) -> Batch | tuple[torch.Tensor, torch.Tensor, Keys]:
        """The batch, safe to use on the consumer's current stream; ``(x, y, keys)`` with keys."""
        if staged.ready is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(staged.ready)
            for tensor in (staged.x, staged.y):
                if tensor.is_cuda:
                    tensor.record_stream(consumer)
        if staged.keys is not None:
            return staged.x, staged.y, staged.keys
        return staged.x, staged.y

    def _collate(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        if self.collate is None:
            return x, y
        where = f"collate {step_name(self.collate)} (batch {self._batches} assembled this epoch)"
        try:
            batch = self.collate((x, y))
        except Exception as error:
            add_note(error, f"ddbloader was applying {where}")
            raise
        if (
            not isinstance(batch, (tuple, list))
            or len(batch) != 2
            or not all(isinstance(t, torch.Tensor) for t in batch)
        ):
            raise TypeError(
                f"{where} returned {type(batch).__name__}; it must return an (x, y) pair of tensors"
            )
        return batch[0], batch[1]

    def _ship(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the device, its copy enqueued on the current (side) stream."""
        if self.device.type == "cpu" or tensor.device.type != "cpu":  # a collate may move it itself
            return tensor
        if self.pin and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        self.bytes_to_device += tensor.nbytes
        return tensor.to(self.device, non_blocking=self.pin)

    def _resident_rows(self, segment: Segment) -> Batch:
        """The segment's rows on the device, shipped on first use."""
        cached = self._resident.get(segment)
        if cached is None:
            cached = (self._ship(segment.x_rows), self._ship(segment.y_rows))
            self._resident[segment] = cached
        return cached
