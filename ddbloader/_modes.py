"""``mode=``: the loader's batches as NumPy arrays, JAX arrays or TensorFlow tensors.

Every mode serves the same batches — the same samples in the same order, the same shapes,
dtypes and keys — because the loader assembles them as torch tensors on the host in every mode,
and :class:`Handover` converts each one in the consumer's thread as it is handed out (after the
stats have counted it). A ``collate=`` function therefore still receives and returns torch
tensors.

Ownership (why no copy is needed and no buffer is reused under a consumer): every batch is
gathered into memory allocated for that batch alone (see
:func:`~ddbloader._pipeline.batch.gather`); the arena keeps partition rows, never batches. The
converted array is a view of that memory which holds a reference to it (a NumPy array's ``base``
is the tensor; a DLPack capsule keeps the tensor until the framework's deleter runs), so the
memory lives while any view does and is never written again. Hence the rule: hand the batch's
own memory over, zero-copy, wherever the framework accepts it — NumPy always; TensorFlow on the
CPU; JAX on the CPU when the memory is 64-byte aligned (XLA's requirement: torch's allocations
are, NumPy's only by chance, so JAX copies most batches once, in the consumer's thread). A
framework device other than the host's memory (a GPU) gets one copy, made by the framework.

The frameworks are optional: importing ddbloader imports none of them; the loader imports its
mode's framework at construction and names the extra to install when it is missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

from ._core.config import LoaderConfig
from ._pipeline.epoch import Delivered, EpochIterator, EpochSource
from ._sql.plan import QueryPlan

__all__ = ["MODES", "Handover", "tf_dataset"]

#: mode → (the module imported, the extra that installs it)
MODES: Mapping[str, tuple[str, str] | None] = {
    "pytorch": None,
    "numpy": ("numpy", ""),
    "jax": ("jax", "jax"),
    "tensorflow": ("tensorflow", "tensorflow"),
}


def _framework(mode: str) -> Any:
    module, extra = MODES[mode] or ("torch", "")
    try:
        return importlib.import_module(module)  # a dict lookup once imported
    except ImportError as error:
        raise ImportError(
            f"mode={mode!r} needs {module}, which is not installed: pip install 'ddbloader[{extra}]'"
        ) from error


class Handover:
    """Converts the batches of one loader into its mode's arrays, on its mode's device.

    Args (read from the loader's ``args``; ``given`` names those the caller passed):
        mode: ``"pytorch"``, ``"numpy"``, ``"jax"`` or ``"tensorflow"`` (any case).
        device: the framework's device: for JAX a ``jax.Device`` or a platform name (``"cpu"``,
            ``"gpu"``, ``"gpu:1"``); for TensorFlow a device name (``"/GPU:0"``, ``"/CPU:0"``,
            ``"gpu"``); for NumPy the host (``"cpu"``). Not given (or ``None``): the framework's
            default device (JAX's first device; TensorFlow places the tensor itself).
        pin_memory: the loader's argument; pinning applies to torch only.

    Raises:
        ValueError: an unknown mode, a device the framework does not have, or ``pin_memory=True``
            outside torch.
        ImportError: the mode's framework is not installed (naming the extra).
    """

    def __init__(self, args: Mapping[str, Any], given: Collection[str]) -> None:
        mode, pin_memory = args["mode"], args["pin_memory"]
        device = args["device"] if "device" in given else None
        name = mode.lower() if isinstance(mode, str) else mode
        if name not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {sorted(MODES)}")
        self.mode: str = name
        _framework(name)  # installed, or an error naming the extra, now rather than at the first batch
        self.device: Any = None
        if name == "pytorch":
            return
        if pin_memory is True:
            raise ValueError(f"pin_memory=True pins torch batches; mode={name!r} does not use them")
        if name == "numpy" and device is not None and str(device).lower() != "cpu":
            raise ValueError(f"device={device!r} with mode='numpy': NumPy arrays live on the host ('cpu')")
        if name == "jax":
            self.device = self._jax_device(device)
        elif name == "tensorflow" and device is not None:
            self.device = self._tf_device(device)

    @property
    def framework(self) -> Any:
        """The mode's module (not held: a loader in torch mode is sent to DataLoader workers)."""
        return _framework(self.mode)

    @property
    def torch_arguments(self) -> dict[str, Any]:
        """The loader arguments that change under this mode: batches assembled on the host, unpinned."""
        return {} if self.mode == "pytorch" else {"device": "cpu", "pin_memory": False}

    def _jax_device(self, device: Any) -> Any:
        jax = self.framework
        if device is None:
            return jax.devices()[0]
        if isinstance(device, jax.Device):
            return device
        platform, _, index = str(device).lower().partition(":")
        try:
            return jax.devices("gpu" if platform == "cuda" else platform)[int(index or 0)]
        except (RuntimeError, IndexError, ValueError) as error:
            raise ValueError(f"device={device!r} is not a JAX device here: {error}") from error

    def _tf_device(self, device: Any) -> str:
        kind, _, index = str(device).strip("/").upper().removeprefix("DEVICE:").partition(":")
        name = f"/{kind}:{index or 0}"
        present = {
            d.name.upper().replace("/DEVICE:", "/") for d in self.framework.config.list_logical_devices()
        }
        if name not in present:
            raise ValueError(f"device={device!r} is not a TensorFlow device here (it has {sorted(present)})")
        return name

    def check(self, plan: QueryPlan) -> None:
        """Refuse, before iterating, a batch dtype the framework would change: JAX without
        ``jax_enable_x64`` turns 64-bit arrays into 32-bit ones (an int64 timestamp loses its value).

        Raises:
            ValueError: naming the tensors and the fix.
        """
        if self.mode != "jax" or self.framework.config.jax_enable_x64:
            return
        wide = [f"{name} ({dtype})" for name, dtype in batch_dtypes(plan).items() if dtype.itemsize == 8]
        if wide:
            raise ValueError(
                f"mode='jax' would truncate {', '.join(wide)} to 32 bits (jax_enable_x64 is off): call "
                f"jax.config.update('jax_enable_x64', True) first, or give dtype=torch.float32 (for x and "
                f"y) or 32-bit key columns"
            )

    def iterator(self, source: EpochSource) -> EpochIterator:
        """An epoch's iteration whose batches are this mode's."""
        if self.mode == "pytorch":
            return EpochIterator(source)
        return _Converting(source, self)

    def convert(self, batch: Delivered) -> Delivered:
        """``batch`` (``(x, y)`` or ``(x, y, keys)`` of host tensors) as this mode's arrays."""
        x, y, *keys = batch
        converted = [self.array(x), self.array(y)]
        if keys:
            converted.append(
                {k: self.array(v) if isinstance(v, torch.Tensor) else v for k, v in keys[0].items()}
            )
        return tuple(converted)

    def array(self, tensor: torch.Tensor) -> Any:
        """``tensor`` as this mode's array, sharing its memory where the framework allows."""
        if self.mode == "numpy":
            return tensor.numpy()
        if self.mode == "jax":
            jax = self.framework
            array = jax.numpy.from_dlpack(tensor)
            if array.dtype != tensor.numpy().dtype:  # jax_enable_x64 was switched off after check()
                raise ValueError(f"JAX changed a batch's dtype from {tensor.dtype} to {array.dtype}")
            return array if self.device in array.devices() else jax.device_put(array, self.device)
        tf = self.framework
        result = tf.experimental.dlpack.from_dlpack(tensor.__dlpack__())
        if self.device is None:
            return result
        with tf.device(self.device):
            return tf.identity(result)


def batch_dtypes(plan: QueryPlan) -> dict[str, np.dtype[Any]]:
    """The dtype of every array a batch carries: ``x``, ``y`` and each numeric key column."""
    layout = plan.layout
    dtypes: dict[str, np.dtype[Any]] = {"x": layout.x_dtype, "y": layout.y_dtype}
    types = dict(zip(layout.result_names, layout.result_types, strict=True))
    for name in layout.key_names:
        kind = types.get(name)
        if name in layout.key_objects or kind is None:
            continue
        if pa.types.is_temporal(kind):
            dtypes[name] = np.dtype(np.int64)
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            dtypes[name] = np.dtype(kind.to_pandas_dtype())
    return dtypes


class _Converting(EpochIterator):
    """An :class:`EpochIterator` that hands out its batches converted by a :class:`Handover`."""

    def __init__(self, source: EpochSource, handover: Handover) -> None:
        super().__init__(source)
        self._handover = handover

    def __next__(self) -> Delivered:
        return self._handover.convert(super().__next__())


class TFSource(Protocol):
    """What :func:`tf_dataset` reads of its loader (a :class:`~ddbloader.DDBDataLoader`)."""

    _handover: Handover
    plan: QueryPlan
    config: LoaderConfig

    def __len__(self) -> int: ...
    def __iter__(self) -> EpochIterator: ...


def tf_dataset(loader: TFSource) -> Any:
    """A ``tf.data.Dataset`` of ``loader``'s batches (``mode="tensorflow"``), for ``model.fit``.

    Each iteration of the dataset (each Keras epoch) iterates the loader once, so it runs the
    loader's next epoch; its cardinality is ``len(loader)``. Elements are ``(x, y)`` or
    ``(x, y, keys)``, with the plan's shapes and dtypes (the batch dimension is unknown unless
    ``drop_last``). Keys that are lists (strings, decimals) cannot be typed: refused, as is a
    ``collate`` (whose output shapes the plan does not know).

    Raises:
        ValueError: another mode, a collate, or keys that are lists.
    """
    handover, config = loader._handover, loader.config
    if handover.mode != "tensorflow":
        raise ValueError(f"as_tf_dataset() needs mode='tensorflow', not {handover.mode!r}")
    if config.collate is not None:
        raise ValueError("as_tf_dataset() cannot type what collate= returns: leave collate out")
    tf = handover.framework
    layout, geometry = loader.plan.layout, loader.plan.geometry
    dtypes = batch_dtypes(loader.plan)
    listed = [name for name in layout.key_names if name not in dtypes]
    if listed:
        raise ValueError(
            f"as_tf_dataset(): key_col {listed} come as lists (non-numeric values) that a "
            f"tf.data.Dataset cannot type; select numeric or temporal key columns"
        )
    batch = config.batch_size if config.drop_last else None
    windows = ((geometry.x_window,), (geometry.y_window,)) if geometry.windowed else ((), ())
    spec: list[Any] = [
        tf.TensorSpec((batch, *windows[0], *layout.x_shape), tf.as_dtype(dtypes["x"])),
        tf.TensorSpec((batch, *windows[1], *layout.y_shape), tf.as_dtype(dtypes["y"])),
    ]
    if layout.key_names:
        spec.append({k: tf.TensorSpec((batch,), tf.as_dtype(dtypes[k])) for k in layout.key_names})

    def batches() -> Iterator[Delivered]:
        iterator = iter(loader)
        try:
            yield from iterator
        finally:  # a pass TensorFlow drops early frees the loader for the next pass, in any thread
            iterator.close()

    dataset = tf.data.Dataset.from_generator(batches, output_signature=tuple(spec))
    return dataset.apply(tf.data.experimental.assert_cardinality(len(loader)))
