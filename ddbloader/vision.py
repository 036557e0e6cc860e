"""Image columns: a BLOB column of encoded images (PNG, JPEG, ...) decoded in the fetch threads.

:func:`decode_images` is a transform step (see :mod:`ddbloader.transforms`): for every fetched
partition it decodes the column's images with ``torchvision.io.decode_image`` into ``[C, H, W]``
tensors, runs each through an optional pipeline (any ``torchvision.transforms.v2`` transform, or
any callable on a ``[C, H, W]`` tensor), and stacks them into a ``[rows, C, H, W]`` column. With
``input_col=`` naming that column, x is ``[B, C, H, W]`` (``[B, window, C, H, W]`` with windows).
This is CCV's read_image + random_jitter + batch, running in the background while training runs.

torchvision is the optional extra ``ddbloader[vision]``. Without it, ``decoder="pillow"``
decodes with Pillow into the same ``[C, H, W]`` uint8 tensors, and the pipeline may be any
callable on tensors.

Invariants: every image of the query must come out of the pipeline with one shape (planning
probes the first rows of the smallest partition to learn it; give the pipeline a ``Resize`` or a
crop when the images differ). A random pipeline draws from torch's global generator, which the
training thread shares, so augmented values are not reproducible run to run (the batch order and
membership are). The step keeps its configuration only, so it pickles with the loader.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from ._core.errors import add_note
from .transforms.pipeline import Accepts, Frame, numpy_to_arrow

__all__ = ["ImageColumn", "decode_images"]

Mode = Literal["UNCHANGED", "GRAY", "GRAY_ALPHA", "RGB", "RGB_ALPHA"]
Decoder = Literal["torchvision", "pillow"]

_PILLOW_MODES: dict[str, str | None] = {
    "UNCHANGED": None,
    "GRAY": "L",
    "GRAY_ALPHA": "LA",
    "RGB": "RGB",
    "RGB_ALPHA": "RGBA",
}


def _import_torchvision() -> Any:
    # Through importlib: torchvision is optional, and mypy must not need it installed.
    try:
        return importlib.import_module("torchvision.io")
    except ImportError as exc:
        raise ImportError(
            "decode_images needs torchvision, which is not installed: pip install 'ddbloader[vision]' "
            "(or pass decoder='pillow' to decode with Pillow)"
        ) from exc
    except Exception as exc:  # a torchvision built for another torch fails to load its operators
        raise ImportError(
            f"torchvision is installed but does not load with torch {torch.__version__} "
            f"({type(exc).__name__}: {exc}); install a matching one: pip install 'ddbloader[vision]' "
            f"(or pass decoder='pillow' to decode with Pillow)"
        ) from exc


def _import_pillow() -> Any:
    try:
        return importlib.import_module("PIL.Image")
    except ImportError as exc:
        raise ImportError(
            "decoder='pillow' needs Pillow, which is not installed: pip install pillow"
        ) from exc


def _decode_torchvision(blob: bytes, mode: Mode) -> torch.Tensor:
    tv_io = _import_torchvision()
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    image: torch.Tensor = tv_io.decode_image(data, mode=tv_io.ImageReadMode[mode])
    return image


def _decode_pillow(blob: bytes, mode: Mode) -> torch.Tensor:
    image_module = _import_pillow()
    with image_module.open(io.BytesIO(blob)) as image:
        target = _PILLOW_MODES[mode]
        if target is None and image.mode == "P":
            target = "RGBA" if "transparency" in image.info else "RGB"
        pixels = np.asarray(image.convert(target) if target else image)
    chw = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    # A copy: Pillow's pixels are read-only, and the pipeline may write in place.
    return torch.from_numpy(np.array(chw))


_DECODERS: dict[str, Callable[[bytes, Mode], torch.Tensor]] = {
    "torchvision": _decode_torchvision,
    "pillow": _decode_pillow,
}


class ImageColumn:
    """Decode, transform and stack one image column (see :func:`decode_images`)."""

    accepts: Accepts = "any"

    def __init__(
        self,
        column: str,
        pipeline: Callable[[torch.Tensor], torch.Tensor] | None,
        mode: Mode,
        decoder: Decoder,
        name: str | None,
    ) -> None:
        if decoder not in _DECODERS:
            raise ValueError(f"decode_images: decoder must be one of {list(_DECODERS)}, got {decoder!r}")
        if mode not in _PILLOW_MODES:
            raise ValueError(f"decode_images: mode must be one of {list(_PILLOW_MODES)}, got {mode!r}")
        if pipeline is not None and not callable(pipeline):
            raise TypeError(f"decode_images: pipeline must be callable, got {pipeline!r}")
        if decoder == "torchvision":
            _import_torchvision()
        else:
            _import_pillow()
        self.column = column
        self.pipeline = pipeline
        self.mode: Mode = mode
        self.decoder: Decoder = decoder
        self.name = name or column

    def __repr__(self) -> str:
        parts = [repr(self.column), f"mode={self.mode!r}", f"decoder={self.decoder!r}"]
        if self.pipeline is not None:
            parts.append(f"pipeline={self.pipeline!r}")
        if self.name != self.column:
            parts.append(f"name={self.name!r}")
        return f"decode_images({', '.join(parts)})"

    def __call__(self, frame: Frame) -> Frame:
        if isinstance(frame, pa.Table):
            if self.column not in frame.column_names:
                raise KeyError(f"{self!r}: no column {self.column!r}; columns: {frame.column_names}")
            blobs = frame.column(self.column).to_pylist()
        else:
            if self.column not in frame:
                raise KeyError(f"{self!r}: no column {self.column!r}; columns: {list(frame)}")
            blobs = list(frame[self.column])
        if not blobs:
            raise ValueError(f"{self!r} cannot tell the image size from zero rows")
        images = [self._image(row, blob) for row, blob in enumerate(blobs)]
        shape = images[0].shape
        for row, image in enumerate(images):
            if image.shape != shape:
                raise ValueError(
                    f"{self!r}: row {row} gives an image of shape {list(image.shape)}, row 0 one of "
                    f"{list(shape)}; every image must come out with one shape: add a Resize or a crop "
                    f"to the pipeline"
                )
        stacked = torch.stack(images)
        if isinstance(frame, pa.Table):
            array = numpy_to_arrow(stacked.numpy())
            if self.name in frame.column_names:
                return frame.set_column(frame.column_names.index(self.name), self.name, array)
            return frame.append_column(self.name, array)
        out = dict(frame)
        out[self.name] = stacked
        return out

    def _image(self, row: int, blob: Any) -> torch.Tensor:
        if blob is None:
            raise ValueError(f"{self!r}: row {row} of column {self.column!r} is NULL")
        try:
            image = _DECODERS[self.decoder](bytes(blob), self.mode)
            if self.pipeline is not None:
                image = self.pipeline(image)
        except Exception as error:
            add_note(error, f"ddbloader was decoding row {row} of image column {self.column!r}")
            raise
        if not isinstance(image, torch.Tensor):
            raise TypeError(
                f"{self!r}: the pipeline returned {type(image).__name__} for row {row}; "
                f"it must return a tensor"
            )
        return image


def decode_images(
    column: str,
    pipeline: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    mode: Mode = "RGB",
    decoder: Decoder = "torchvision",
    name: str | None = None,
) -> ImageColumn:
    """A transform step: decode the encoded images of BLOB column ``column`` into a tensor column.

    Each image is decoded into a ``[C, H, W]`` uint8 tensor (``mode`` as torchvision's
    ``ImageReadMode``: ``"GRAY"`` gives C=1, ``"RGB"`` C=3, ``"UNCHANGED"`` the file's own), then
    passed through ``pipeline`` (e.g. ``torchvision.transforms.v2.Compose([...])``); the results
    replace the column (or fill a new column ``name``) as ``[rows, C, H, W]``.

    Raises:
        ImportError: torchvision (``decoder="torchvision"``) or Pillow (``decoder="pillow"``) is
            missing; the message says what to install.
        ValueError: an unknown mode or decoder.
    """
    return ImageColumn(column, pipeline, mode, decoder, name)
